"""Does DTensor's planner answer hold every strategy a planner's own expansion finds?

A planner that wants every way to run an op (autoparallel's
``_try_single_dim_strategy`` is one) takes the op's single-dim rule from
``ShardingPropagator.op_single_dim_strategy_funcs`` and expands it itself: it
calls the rule on the inputs' metas, adds the all-``Replicate`` rule, turns each
``_ShardingPlaceholder`` into ``Shard`` (and into ``_StridedShard`` for the split
factors its inputs' candidates carry) and hands the rules to
``expand_to_full_mesh_op_strategy`` with the query's input strategies. If
DTensor's own answer, ``ShardingPropagator.get_op_strategy`` on the same schema,
lacks a strategy that expansion finds, the planner has to keep its expansion.

:func:`compare` judges one schema: each strategy the planner's expansion finds
and DTensor's answer lacks is either ``missing`` or ``not valid for the op:
<reason>``, the reason being what the rule's registration says (an in-place op's
``self`` cannot be redistributed, the rule's full-mesh filter, unbacked dims the
rule does not shard), which that expansion does not read. :func:`compare_calls`
sums it up over captured calls; the audit's worker runs it on the built torch
(stock torch has no planner entry point, nor the helpers used here)::

    python -m tools.audit --only built --ops view_as_complex --full-space audit,few,replicated,partials
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast, TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from torch._ops import OpOverload
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy


NOT_VALID = "not valid for the op: "

# One spec's placements by name, or None for no spec.
Placed = tuple[str, ...] | None
# (per result its placements, None where the op returns None; per input its placements)
StrategyKey = tuple[tuple[Placed, ...], tuple[Placed, ...]]


@dataclass
class Comparison:
    """One schema compared: sizes of both answers, and the strategies the planner's
    expansion finds that DTensor's answer lacks, missing or not valid (with why)."""

    op: str
    dtensor: int
    planner: int
    missing: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _placements(spec: Any) -> Placed:
    # By name: a _MaskPartial equals only itself (its mask buffer is compared by
    # identity), so two expansions' equal placements would never match; the names
    # carry every field but the buffer (reduce op, split factor, offsets).
    return None if spec is None else tuple(str(p) for p in spec.placements)


def strategy_key(spec: OpSpec, returned: Sequence[bool] | None = None) -> StrategyKey:
    """What tells two strategies apart: every result's and every input's placements.

    ``returned`` says, per result position, whether the op returns a tensor
    there; positions it does not are keyed ``None`` whatever the spec holds.
    """
    outs = spec.output_specs
    results = outs if isinstance(outs, tuple) else (outs,)
    inputs = spec.input_specs or ()
    placed = tuple(
        None if returned is not None and not (i < len(returned) and returned[i]) else _placements(o)
        for i, o in enumerate(results)
    )
    return placed, tuple(_placements(i) for i in inputs)


def _returned(metas: object) -> list[bool]:
    """Per result position, whether the op returns a tensor there (from its metas)."""
    from torch.distributed.tensor._dtensor_spec import TensorMeta

    if metas is None:
        return []
    if isinstance(metas, TensorMeta):
        return [True]
    return [m is not None for m in cast("Sequence[Any]", metas)]


def describe(key: StrategyKey) -> str:
    def one(p: Placed) -> str:
        return "None" if p is None else "(" + ", ".join(p) + ")"

    outs, ins = key
    return f"{', '.join(one(o) for o in outs)} <- {', '.join(one(i) for i in ins)}"


def planner_expansion(
    op_schema: OpSchema, mesh: DeviceMesh, metas: object, info: Any
) -> OpStrategy:
    """The op's single-dim rule expanded by a planner over the query's candidates.

    The rules as ``contract_sweep.author_rules`` resolves them: none of what the
    rule's registration adds (its full-mesh filter, in-place or uneven-sharding
    handling), which a planner calling the utility does not read.
    """
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.testing._internal.distributed._tensor.contract_sweep import author_rules

    rules, n_outputs = author_rules(op_schema, info, _returned(metas))
    return expand_to_full_mesh_op_strategy(
        mesh, op_schema, cast(Any, rules), input_index=n_outputs, output_tensor_meta=cast(Any, metas)
    )


def why_not_valid(
    op_schema: OpSchema, mesh: DeviceMesh, spec: OpSpec, info: Any, inplace: bool
) -> str | None:
    """Why ``spec`` is not a valid strategy for the op, from its rule's registration.

    ``None`` if the registration allows it. What is read: an in-place op's
    ``self`` (and so its result) must keep a placement it has (in-place from the
    schema, as the built torch's planner path reads it), whether the rule shards dims of
    unbacked size, and the rule's full-mesh filter.
    """
    from torch.distributed.tensor._ops.utils import is_tensor_shardable

    inputs = list(spec.input_specs or ())
    if inplace and inputs:
        own = [c.output_spec.placements for c in op_schema.args_strategy[0].strategies]
        if inputs[0].placements not in own:
            return "in-place: self would need a placement it has not got (it cannot be redistributed)"
        out = spec.output_specs
        first = out[0] if isinstance(out, tuple) else out
        if first is not None and first.placements != inputs[0].placements:
            return "in-place: the result is self, yet placed differently"
    sources = [*op_schema.args_strategy, *op_schema.kwargs_strategy]
    if info.allow_unbacked_sharding is not None:
        for src, target in zip(sources, inputs):
            if not is_tensor_shardable(
                src.shape, target, allow_unbacked_sharding=info.allow_unbacked_sharding
            ):
                return "shards a dim of unbacked size, which the rule does not allow"
    # torch 2.13.0's registrations have no full-mesh filter
    flt = getattr(info, "full_mesh_strategy_filter", None)
    if flt is not None and spec.output_specs is not None:
        if not flt(mesh, op_schema, inputs, spec.output_specs):
            return f"rejected by the rule's full-mesh filter {getattr(flt, '__name__', flt)}"
    return None


_FOREACH_PREFIXES = ("aten::_foreach_", "aten::_amp_foreach_", "aten::_fused_")


def _is_list_op(op_schema: OpSchema) -> bool:
    """Whether DTensor expands ``op_schema`` element by element (foreach, fused optimizers)."""
    from torch.distributed.tensor._op_schema import TupleStrategy

    return op_schema.op.name().startswith(_FOREACH_PREFIXES) and any(
        isinstance(a, TupleStrategy) for a in op_schema.args_schema
    )


def _element_schema(op_schema: OpSchema, index: int) -> OpSchema:
    """Element ``index`` of a foreach-like schema, as a planner expands it.

    List arguments are reduced to their ``index``-th element and the op to the
    one-tensor overload the foreach op applies (DTensor's own translation), so
    the rule reasons about one tensor at a time.
    """
    from torch.distributed.tensor._op_schema import OpSchema, TupleStrategy
    from torch.distributed.tensor._ops.single_dim_strategy import (
        _resolve_foreach_elementwise_overload,
    )

    args = tuple(a.children[index] if isinstance(a, TupleStrategy) else a for a in op_schema.args_schema)
    op = _resolve_foreach_elementwise_overload(op_schema.op) or op_schema.op
    return OpSchema(op, args, op_schema.kwargs_schema)


def _gaps(
    result: Comparison,
    answer: Any,
    own: OpStrategy,
    schema: OpSchema,
    mesh: DeviceMesh,
    info: Any,
    inplace: bool,
    metas: object,
    where: str = "",
) -> None:
    from torch.distributed.tensor._op_schema import OpStrategy

    if not isinstance(answer, OpStrategy):
        raise TypeError(f"{schema.op}{where}: expected an OpStrategy, got {type(answer).__name__}")
    returned = _returned(metas)
    have = {strategy_key(s, returned) for s in answer.strategies}
    result.dtensor += len(have)
    result.planner += len(own.strategies)
    seen: set[StrategyKey] = set()
    for spec in own.strategies:
        key = strategy_key(spec, returned)
        if key in have or key in seen:
            continue
        seen.add(key)
        reason = why_not_valid(schema, mesh, spec, info, inplace)
        if reason is None:
            result.missing.append(where + describe(key))
        else:
            result.invalid.append(NOT_VALID + reason)


def compare(op_schema: OpSchema, mesh: DeviceMesh | None = None) -> Comparison:
    """DTensor's planner answer for ``op_schema`` against a planner's own expansion.

    ``op_schema`` is a strategy schema (tensor inputs are ``OpStrategy``s, with
    any number of candidates) of an op with a registered single-dim rule; a
    foreach-like op is compared element by element. Raises ``ValueError`` for an
    op without a single-dim rule.
    """
    from torch.distributed.tensor._op_schema import TupleStrategy
    from torch.distributed.tensor._ops.single_dim_strategy import _writes_first_argument
    from torch.distributed.tensor._ops.strategy_contract import (
        element_output_metas,
        infer_output_metas,
    )

    op = op_schema.op
    info = _propagator().op_single_dim_strategy_funcs.get(op)
    if info is None:
        raise ValueError(f"{op} has no single-dim rule to expand")
    if mesh is None:
        mesh = op_schema.get_mesh_from_args(validate=False)
    inplace = _writes_first_argument(op)
    metas = infer_output_metas(op_schema)
    answer = _propagator().get_op_strategy(op_schema)
    result = Comparison(str(op), 0, 0)
    if not _is_list_op(op_schema):
        own = planner_expansion(op_schema, mesh, metas, info)
        _gaps(result, answer, own, op_schema, mesh, info, inplace, metas)
        return result
    if not isinstance(answer, TupleStrategy):
        raise TypeError(f"{op}: expected a TupleStrategy, got {type(answer).__name__}")
    for index, child in enumerate(answer.children):
        element = _element_schema(op_schema, index)
        # None for an in-place foreach op, which returns nothing
        element_metas = element_output_metas(op, metas, index)
        own = planner_expansion(element, mesh, element_metas, info)
        _gaps(result, child, own, element, mesh, info, inplace, element_metas, f"element {index}: ")
    return result


@dataclass
class Summary:
    """:func:`compare` over many calls: counts, and examples per op."""

    ops: set[str] = field(default_factory=set)
    schemas: int = 0
    missing: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    not_compared: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def add(self, where: str, c: Comparison) -> None:
        self.ops.add(c.op)
        self.schemas += 1
        self.missing[c.op] += len(c.missing)
        self.invalid[c.op] += len(c.invalid)
        self.reasons.update(c.invalid)
        if c.missing and len(self.examples.setdefault(c.op, [])) < 3:
            self.examples[c.op].append(
                f"{where}: DTensor {c.dtensor}, planner {c.planner}; missing e.g. {c.missing[0]}"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "ops_compared": len(self.ops),
            "schemas_compared": self.schemas,
            "missing": sum(self.missing.values()),
            "ops_missing": sorted(op for op, n in self.missing.items() if n),
            "invalid_with_reason": dict(self.reasons),
            "examples": self.examples,
            "not_compared": self.not_compared,
            "errors": self.errors,
        }


def _signature(op: OpOverload) -> tuple[tuple[str, str, bool], ...]:
    return tuple((a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments)


def borrowed_calls(calls: Mapping[OpOverload, Sequence[Any]]) -> dict[OpOverload, list[Any]]:
    """Calls for the ops with a single-dim rule that ``calls`` lacks.

    Such an op takes the calls of the ops of ``calls`` with the same signature
    (argument names, types, keyword-onliness): OpInfo samples call
    ``bitwise_xor.Tensor``, never ``__xor__.Tensor``.
    """
    by_signature: dict[object, list[Any]] = {}
    for op in sorted(calls, key=str):
        by_signature.setdefault(_signature(op), []).extend(calls[op][:1])
    return {
        op: by_signature[_signature(op)]
        for op in sorted(_propagator().op_single_dim_strategy_funcs, key=str)
        if op not in calls and _signature(op) in by_signature
    }


def compare_calls(
    calls: Mapping[OpOverload, Sequence[Any]],
    meshes: Iterable[tuple[str, DeviceMesh]],
    candidates: Callable[..., Any],
) -> Summary:
    """:func:`compare` for every captured call of an op with a single-dim rule.

    ``calls`` maps ops to ``contract_sweep.CapturedCall``s, ``candidates`` is a
    ``contract_sweep`` candidate function (the audit's planner candidates). An op
    with a single-dim rule no call reaches is asked about with the first call of
    :func:`borrowed_calls` that shape inference accepts.
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
                            continue  # another op's arguments the op does not take
                    summary.add(where, compare(schema, mesh))
                except ValueError as e:
                    summary.not_compared.setdefault(str(op), str(e))
                except Exception as e:  # reported per op, the sweep goes on
                    summary.errors.setdefault(str(op), f"{where}: {type(e).__name__}: {e}"[:400])
                if lent:
                    break
    return summary


CANDIDATE_CHOICES = ("audit", "few", "replicated", "partials")


def candidate_func(name: str, limit: int) -> Callable[..., Any]:
    """The ``contract_sweep`` candidate function a candidate mode names.

    ``audit``: the audit's planner candidates (``first_candidates``); ``few``:
    four per input (``capped_candidates``), so that many strategies place an
    input as none of its candidates does; ``replicated``: one all-``Replicate``
    candidate, a planner asking what an op can do from where its inputs are;
    ``partials``: the audit's candidates with every ``Partial`` kind, as
    producers hand them out (a contraction's ``sum``, ``amax``'s ``max``), so
    that a rule's ``Partial`` pass-throughs show.
    """
    from torch.testing._internal.distributed._tensor import contract_candidates

    if name == "audit":
        return contract_candidates.first_candidates(limit)
    if name == "few":
        return contract_candidates.capped_candidates(4)
    if name == "replicated":
        return contract_candidates.replicated_candidate
    if name == "partials":
        return contract_candidates.first_candidates(limit, ("sum", "avg", "max", "min"))
    raise ValueError(f"candidate mode must be one of {CANDIDATE_CHOICES}, got {name!r}")


def audit(
    calls: Mapping[OpOverload, Sequence[Any]],
    meshes: Iterable[tuple[str, DeviceMesh]],
    max_candidates: int,
    modes: Sequence[str] = ("audit", "few", "replicated"),
) -> dict[str, Any]:
    """The audit's entry point: per candidate mode, :meth:`Summary.as_dict` of the calls.

    A torch without ``ShardingPropagator.get_op_strategy`` (stock) has no planner
    answer to compare, and gets ``{"skipped": <why>}``.
    """
    if not hasattr(_propagator(), "get_op_strategy"):
        return {"skipped": "this torch has no planner entry point (get_op_strategy)"}
    meshes = list(meshes)
    return {
        mode: compare_calls(calls, meshes, candidate_func(mode, max_candidates)).as_dict()
        for mode in modes
    }
