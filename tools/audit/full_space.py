"""Does DTensor's planner answer hold every strategy a planner's own expansion finds?

A planner wanting every way to run an op (autoparallel's ``_try_single_dim_strategy``
is one) takes the op's rule from ``ShardingPropagator.op_single_dim_strategy_funcs``
and expands it itself (``contract_sweep.author_rules``, then
``expand_to_full_mesh_op_strategy`` over the query's input strategies). Whatever that
finds and ``get_op_strategy`` on the same schema lacks, the planner must keep its own
expansion for. Each such strategy is ``missing``, or not valid for the op with the
reason the rule's registration gives (which the expansion does not read). Built torch
only: stock has no ``get_op_strategy``::

    python -m tools.audit --only built --ops view_as_complex --full-space audit,replicated,partials
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast, TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from torch._ops import OpOverload
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy


NOT_VALID = "not valid for the op: "
_FOREACH_PREFIXES = ("aten::_foreach_", "aten::_amp_foreach_", "aten::_fused_")

# One spec's placements by name (None: no spec); a strategy is its results' and inputs' placements.
Placed = tuple[str, ...] | None
StrategyKey = tuple[tuple[Placed, ...], tuple[Placed, ...]]


@dataclass
class Comparison:
    """One schema: both answers' sizes, and what the expansion finds that DTensor's answer lacks."""

    op: str
    dtensor: int = 0
    planner: int = 0
    missing: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _placements(spec: Any) -> Placed:
    # By name: a _MaskPartial equals only itself (its mask buffer compares by identity),
    # while the name carries every other field (reduce op, split factor, offsets).
    return None if spec is None else tuple(str(p) for p in spec.placements)


def strategy_key(spec: OpSpec, returned: Sequence[bool]) -> StrategyKey:
    """Every result's and input's placements; a result the op does not return is ``None``."""
    outs = spec.output_specs
    results = outs if isinstance(outs, tuple) else (outs,)
    placed = tuple(_placements(o) if i < len(returned) and returned[i] else None for i, o in enumerate(results))
    return placed, tuple(_placements(i) for i in spec.input_specs or ())


def _returned(metas: object) -> list[bool]:
    """Per result position, whether the op returns a tensor there."""
    from torch.distributed.tensor._dtensor_spec import TensorMeta

    if metas is None:
        return []
    if isinstance(metas, TensorMeta):
        return [True]
    return [m is not None for m in cast("Sequence[Any]", metas)]


def describe(key: StrategyKey) -> str:
    def one(p: Placed) -> str:
        return "None" if p is None else "(" + ", ".join(p) + ")"

    return f"{', '.join(map(one, key[0]))} <- {', '.join(map(one, key[1]))}"


def planner_expansion(op_schema: OpSchema, mesh: DeviceMesh, metas: object, info: Any) -> OpStrategy:
    """The rule as a planner calling the utility expands it: without what its registration adds."""
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.testing._internal.distributed._tensor.contract_sweep import author_rules

    rules, n_outputs = author_rules(op_schema, info, _returned(metas))
    return expand_to_full_mesh_op_strategy(
        mesh, op_schema, cast(Any, rules), input_index=n_outputs, output_tensor_meta=cast(Any, metas))


def why_not_valid(op_schema: OpSchema, mesh: DeviceMesh, spec: OpSpec, info: Any, inplace: bool) -> str | None:
    """Why the rule's registration rules ``spec`` out (``None``: it does not).

    It reads what the expansion does not: an in-place op's ``self`` (so its result)
    keeps a placement it has, unbacked dims the rule does not shard, its full-mesh filter.
    """
    from torch.distributed.tensor._ops.utils import is_tensor_shardable

    inputs = list(spec.input_specs or ())
    if inplace and inputs:
        if inputs[0].placements not in [c.output_spec.placements for c in op_schema.args_strategy[0].strategies]:
            return "in-place: self would need a placement it has not got (it cannot be redistributed)"
        out = spec.output_specs
        first = out[0] if isinstance(out, tuple) else out
        if first is not None and first.placements != inputs[0].placements:
            return "in-place: the result is self, yet placed differently"
    if info.allow_unbacked_sharding is not None:
        sources = [*op_schema.args_strategy, *op_schema.kwargs_strategy]
        for src, target in zip(sources, inputs):
            if not is_tensor_shardable(src.shape, target, allow_unbacked_sharding=info.allow_unbacked_sharding):
                return "shards a dim of unbacked size, which the rule does not allow"
    flt = getattr(info, "full_mesh_strategy_filter", None)  # torch 2.13.0's registrations have none
    if flt is not None and spec.output_specs is not None and not flt(mesh, op_schema, inputs, spec.output_specs):
        return f"rejected by the rule's full-mesh filter {getattr(flt, '__name__', flt)}"
    return None


def _element_schema(op_schema: OpSchema, index: int) -> OpSchema:
    """Element ``index`` of a foreach-like schema, on the one-tensor overload DTensor translates it to."""
    from torch.distributed.tensor._op_schema import OpSchema, TupleStrategy
    from torch.distributed.tensor._ops.single_dim_strategy import _resolve_foreach_elementwise_overload

    args = tuple(a.children[index] if isinstance(a, TupleStrategy) else a for a in op_schema.args_schema)
    return OpSchema(_resolve_foreach_elementwise_overload(op_schema.op) or op_schema.op, args, op_schema.kwargs_schema)


def _gaps(result: Comparison, answer: Any, schema: OpSchema, mesh: DeviceMesh, info: Any, inplace: bool,
          metas: object, where: str = "") -> None:
    from torch.distributed.tensor._op_schema import OpStrategy

    if not isinstance(answer, OpStrategy):
        raise TypeError(f"{schema.op}{where}: expected an OpStrategy, got {type(answer).__name__}")
    own = planner_expansion(schema, mesh, metas, info)
    returned = _returned(metas)
    have = {strategy_key(s, returned) for s in answer.strategies}
    result.dtensor += len(have)
    result.planner += len(own.strategies)
    seen = set(have)
    for spec in own.strategies:
        key = strategy_key(spec, returned)
        if key in seen:
            continue
        seen.add(key)
        reason = why_not_valid(schema, mesh, spec, info, inplace)
        if reason is None:
            result.missing.append(where + describe(key))
        else:
            result.invalid.append(NOT_VALID + reason)


def compare(op_schema: OpSchema, mesh: DeviceMesh | None = None) -> Comparison:
    """DTensor's planner answer for a strategy schema against a planner's own expansion.

    Foreach-like ops are compared element by element; an op without a single-dim
    rule raises ``ValueError``.
    """
    from torch.distributed.tensor._op_schema import TupleStrategy
    from torch.distributed.tensor._ops.single_dim_strategy import _writes_first_argument
    from torch.distributed.tensor._ops.strategy_contract import element_output_metas, infer_output_metas

    op = op_schema.op
    info = _propagator().op_single_dim_strategy_funcs.get(op)
    if info is None:
        raise ValueError(f"{op} has no single-dim rule to expand")
    if mesh is None:
        mesh = op_schema.get_mesh_from_args(validate=False)
    inplace = _writes_first_argument(op)
    metas = infer_output_metas(op_schema)
    answer = _propagator().get_op_strategy(op_schema)
    result = Comparison(str(op))
    is_list = op.name().startswith(_FOREACH_PREFIXES) and any(isinstance(a, TupleStrategy) for a in op_schema.args_schema)
    if not is_list:
        _gaps(result, answer, op_schema, mesh, info, inplace, metas)
        return result
    if not isinstance(answer, TupleStrategy):
        raise TypeError(f"{op}: expected a TupleStrategy, got {type(answer).__name__}")
    for index, child in enumerate(answer.children):
        # element metas are None for an in-place foreach op, which returns nothing
        _gaps(result, child, _element_schema(op_schema, index), mesh, info, inplace,
              element_output_metas(op, metas, index), f"element {index}: ")
    return result


@dataclass
class Summary:
    """:func:`compare` over many calls: counts, and examples per op."""

    ops: set[str] = field(default_factory=set)
    schemas: int = 0
    missing: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    not_compared: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, where: str, c: Comparison) -> None:
        self.ops.add(c.op)
        self.schemas += 1
        self.missing[c.op] += len(c.missing)
        self.reasons.update(c.invalid)
        if c.missing and len(self.examples.setdefault(c.op, [])) < 3:
            self.examples[c.op].append(f"{where}: DTensor {c.dtensor}, planner {c.planner}; missing e.g. {c.missing[0]}")

    def as_dict(self) -> dict[str, Any]:
        return {"ops_compared": len(self.ops), "schemas_compared": self.schemas, "missing": sum(self.missing.values()),
                "ops_missing": sorted(op for op, n in self.missing.items() if n),
                "invalid_with_reason": dict(self.reasons), "examples": self.examples,
                "not_compared": self.not_compared, "errors": self.errors}


def _signature(op: OpOverload) -> tuple[tuple[str, str, bool], ...]:
    return tuple((a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments)


def borrowed_calls(calls: Mapping[OpOverload, Sequence[Any]]) -> dict[OpOverload, list[Any]]:
    """Calls for the single-dim ops no sample reaches, from the captured ops of the same signature.

    OpInfo samples call ``bitwise_xor.Tensor``, never ``__xor__.Tensor``: the latter
    is asked with the former's arguments.
    """
    by_signature: dict[object, list[Any]] = {}
    for op in sorted(calls, key=str):
        by_signature.setdefault(_signature(op), []).extend(calls[op][:1])
    return {op: by_signature[_signature(op)] for op in sorted(_propagator().op_single_dim_strategy_funcs, key=str)
            if op not in calls and _signature(op) in by_signature}


def compare_calls(calls: Mapping[OpOverload, Sequence[Any]], meshes: Iterable[tuple[str, DeviceMesh]],
                  candidates: Any) -> Summary:
    """:func:`compare` for every captured call of a single-dim op, and for the borrowed calls.

    A borrowed op is asked once, with the first lent call shape inference accepts.
    """
    from torch.distributed.tensor._ops.strategy_contract import infer_output_metas
    from torch.testing._internal.distributed._tensor import contract_sweep

    summary = Summary()
    rules = _propagator().op_single_dim_strategy_funcs
    borrowed = borrowed_calls(calls)
    for mesh_name, mesh in meshes:
        for op, op_calls in [*calls.items(), *borrowed.items()]:
            if op not in rules:
                continue
            lent = op in borrowed
            for call in op_calls:
                where = f"{op} on mesh {mesh_name}, " + (f"with the arguments of {call}" if lent else str(call))
                try:
                    schema = contract_sweep.strategy_schema(mesh, op, call.args, call.kwargs, candidates)
                    if lent:
                        try:
                            infer_output_metas(schema)
                        except Exception:
                            continue  # another op's arguments this op does not take
                    summary.add(where, compare(schema, mesh))
                except ValueError as e:
                    summary.not_compared.setdefault(str(op), str(e))
                except Exception as e:  # reported per op, the sweep goes on
                    summary.errors.setdefault(str(op), f"{where}: {type(e).__name__}: {e}"[:400])
                if lent:
                    break
    return summary


def candidates(mode: str, limit: int) -> Any:
    """The candidate function of a mode: ``audit``, the audit's planner candidates;
    ``replicated``, the one candidate eager dispatch offers a replicated input (what can
    the op do from there?); ``partials``, the audit's with every ``Partial`` kind, so that
    a rule's ``Partial`` pass-throughs show."""
    from torch.testing._internal.distributed._tensor import contract_candidates as cs

    funcs = {"audit": lambda: cs.first_candidates(limit), "replicated": lambda: cs.replicated_candidate,
             "partials": lambda: cs.first_candidates(limit, ("sum", "avg", "max", "min"))}
    if mode not in funcs:
        raise ValueError(f"candidate mode must be one of {', '.join(funcs)}, got {mode!r}")
    return funcs[mode]()


def audit(calls: Mapping[OpOverload, Sequence[Any]], meshes: Iterable[tuple[str, DeviceMesh]], max_candidates: int,
          modes: Sequence[str]) -> dict[str, Any]:
    """Per candidate mode, :meth:`Summary.as_dict`; ``{"skipped": why}`` on a torch without a planner entry point."""
    if not hasattr(_propagator(), "get_op_strategy"):
        return {"skipped": "this torch has no planner entry point (get_op_strategy)"}
    meshes = list(meshes)
    return {mode: compare_calls(calls, meshes, candidates(mode, max_candidates)).as_dict() for mode in modes}
