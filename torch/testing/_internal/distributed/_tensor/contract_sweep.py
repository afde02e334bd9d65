# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy queries the way DTensor's dispatch, a planner and a rule author ask them.

Upstream's ``strategy_validation`` hands single-dim rules bare metas and expands
them for one mesh dim. The contract needs more, each kept here for that reason:

* :func:`strategy_schema` / :func:`runtime_schema`: the schemas DTensor builds,
  with the candidates of ``contract_candidates`` per input;
* :func:`query_strategy`, :func:`runtime_selection`, :func:`utility_strategy`:
  every registry asked as dispatch, a planner or a downstream author asks it;
* :func:`author_rules`: a rule resolved over a mesh as an author resolves it
  (``_StridedShard`` per split factor, the all-``Replicate`` rule);
* :func:`runtime_refusal`: DTensor refusing a runtime input on purpose, told
  from a failure per query.

Only APIs of torch 2.13.0 as released are used and nothing that judges
strategies is imported: the audit loads this module by path into an unpatched
torch too, so that both torches are asked the same way.
"""

import functools
import unittest
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import torch
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpStrategy,
    OutputSharding,
    RuntimeSchemaInfo,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.distributed._tensor.contract_candidates import (
    CandidateFunc,
    meta_of,
    op_strategy,
    replicated_candidate,
)


REGISTRIES = ("single_dim", "op_strategy", "decomposition")

MODES = ("runtime", "planner", "utility")

# Message fragments of the exceptions by which DTensor deliberately refuses an
# input placement at runtime, each with why a refusal is the right answer. Stock
# torch refuses the same queries with the same messages. A planner query never
# refuses: candidates a strategy cannot serve drop out of its answer instead.
RUNTIME_REFUSALS: dict[str, str] = {
    "in-place operations that require placement changes are not supported": (
        "an in-place op writes into its self argument, which cannot be "
        "redistributed behind the caller's back; a self placement none of the "
        "op's specs keeps is rejected rather than silently changed"
    ),
    "Attempted to unbind along the sharded dimension": (
        "unbind returns views of the input's slices along a dim; with that dim "
        "sharded a rank holds only some slices, and a view cannot redistribute "
        "its input"
    ),
    "Cannot flatten unevenly sharded tensor": (
        "a view merging dims needs each rank's shard to stay contiguous in the "
        "result, which uneven sharding breaks, and a view cannot redistribute "
        "its input"
    ),
}

# Exception types by which a runtime query is refused whatever the message:
# shape inference raises them when a result's size (or value) depends on the
# input's data, each with why. Stock torch refuses the same queries the same way.
RUNTIME_REFUSAL_TYPES: dict[type[BaseException], str] = {
    DynamicOutputShapeException: (
        "the result's size depends on the input's values (a boolean-mask index, "
        "nonzero, masked_select); eager DTensor needs a concrete global shape "
        "before it runs an op, so it refuses, while a planner query of the same "
        "call gets unbacked symbolic sizes"
    ),
    DataDependentOutputException: (
        "the result depends on the input's values (item(), a data-dependent "
        "scalar), which shape inference on metadata cannot know; eager DTensor "
        "refuses rather than guess"
    ),
}


def runtime_refusal_key(exc: BaseException) -> str | None:
    """Which runtime refusal ``exc`` is (reports group by it), or ``None``: the
    :data:`RUNTIME_REFUSALS` fragment it carries, or the :data:`RUNTIME_REFUSAL_TYPES`
    type it is or was explicitly raised from (dispatch wraps strategy failures)."""
    message = str(exc)
    for pattern in RUNTIME_REFUSALS:
        if pattern in message:
            return pattern
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not e for e in seen):
        for refused in RUNTIME_REFUSAL_TYPES:
            if isinstance(current, refused):
                return refused.__name__
        seen.append(current)
        current = current.__cause__
    return None


def runtime_refusal(exc: BaseException) -> str | None:
    """Why ``exc``, raised by a runtime query, is DTensor refusing the input, or
    ``None``. A refusal is a right answer, counted per query; the same exception
    from a planner query is an error."""
    key = runtime_refusal_key(exc)
    reasons = {t.__name__: r for t, r in RUNTIME_REFUSAL_TYPES.items()}
    return None if key is None else {**RUNTIME_REFUSALS, **reasons}[key]


def _sharding_propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def _is_tensor(x: object) -> bool:
    return isinstance(x, (torch.Tensor, TensorMeta))


def _as_meta(x: Any) -> TensorMeta:
    return meta_of(x) if isinstance(x, torch.Tensor) else x


def _schema_info(op: OpOverload) -> RuntimeSchemaInfo | None:
    """The ``RuntimeSchemaInfo`` DTensor's dispatch puts on ``op``'s schemas."""
    propagator = _sharding_propagator()
    if strategy_registry(op) == "decomposition":
        # Registered on the op's first dispatch; queries here come after one.
        propagator.decomp_strategy.ensure_schema_info(op)
    return propagator.op_to_schema_info.get(
        op
    ) or propagator.op_to_schema_info_for_single_dim_strategy.get(op)


def strategy_schema(
    mesh: DeviceMesh,
    op: OpOverload,
    args: Sequence[object],
    kwargs: Mapping[str, object] | None = None,
    candidates: CandidateFunc = replicated_candidate,
) -> OpSchema:
    """A strategy schema for ``op(*args, **kwargs)`` as DTensor builds one: each
    tensor (or ``TensorMeta``) an :class:`OpStrategy` of ``candidates(mesh, meta)``,
    a tensor list a :class:`TupleStrategy` (a list mixing in ``None`` stays a list),
    with the op's registered ``RuntimeSchemaInfo``."""

    def input_strategy(x: object) -> OpStrategy:
        meta = _as_meta(x)
        return op_strategy(mesh, meta, *candidates(mesh, meta))

    def wrap(x: object) -> object:
        if _is_tensor(x):
            return input_strategy(x)
        if isinstance(x, (list, tuple)) and len(x) > 0:
            is_tensor = [_is_tensor(e) for e in x]
            if all(is_tensor):
                children = [input_strategy(e) for e in x]
                return TupleStrategy(
                    tuple(children) if isinstance(x, tuple) else children
                )
            if any(is_tensor):
                return [wrap(e) for e in x]
        return x

    return OpSchema(
        op,
        tuple(wrap(a) for a in args),
        {k: wrap(v) for k, v in (kwargs or {}).items()},
        schema_info=_schema_info(op),
    )


def runtime_schema(
    mesh: DeviceMesh,
    op: OpOverload,
    args: Sequence[object],
    kwargs: Mapping[str, object] | None,
    placements: Sequence[Sequence[Placement]],
) -> OpSchema:
    """The schema DTensor's dispatch builds for ``op(*args, **kwargs)`` on DTensors:
    tensors become ``DTensorSpec``s taking ``placements`` in flattened argument
    order; wrapped with ``_wrap_with_op_strategy`` it is a runtime query's schema."""
    remaining = iter(placements)

    def convert(x: object) -> object:
        if _is_tensor(x):
            return DTensorSpec(mesh, tuple(next(remaining)), tensor_meta=_as_meta(x))
        if isinstance(x, (list, tuple)) and any(_is_tensor(e) for e in x):
            return type(x)(convert(e) for e in x)
        return x

    return OpSchema(
        op,
        tuple(convert(a) for a in args),
        {k: convert(v) for k, v in (kwargs or {}).items()},
        schema_info=_schema_info(op),
    )


def strategy_registry(op: OpOverload) -> str | None:
    """Which registry DTensor's runtime asks for ``op``'s strategies, in the
    runtime's order (single-dim, op strategy, decomposition), or ``None``."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    propagator = _sharding_propagator()
    if op in propagator.op_single_dim_strategy_funcs:
        return "single_dim"
    if op in propagator.op_strategy_funcs:
        return "op_strategy"
    if DecompShardingStrategy.has_decomp(op):
        return "decomposition"
    return None


_Case = TypeVar("_Case")


def ops_by_registry(
    ops: Iterable[torch._ops.OpOverload],
) -> dict[str | None, list[str]]:
    """``ops`` grouped by the registry that answers each on this torch (``None``:
    no registry), so a test can check its cases reach every registry without
    naming where a release put each op."""
    grouped: dict[str | None, list[str]] = {}
    for op in ops:
        grouped.setdefault(strategy_registry(op), []).append(str(op))
    return grouped


def _case_op(case: object) -> torch._ops.OpOverload:
    op = case if isinstance(case, torch._ops.OpOverload) else case[0]  # type: ignore[index]
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(
            f"a case is an OpOverload or a tuple starting with one, got {case!r}"
        )
    return op


def answered_by(registry: str, candidates: Sequence[_Case]) -> _Case:
    """The first of ``candidates`` (ops, or tuples starting with the op) that
    ``registry`` answers on this torch; releases move ops between registries, so a
    test lists the ops that would do and skips, naming them, when none is there."""
    if registry not in REGISTRIES:
        raise ValueError(f"unknown registry {registry!r}, expected one of {REGISTRIES}")
    for case in candidates:
        if strategy_registry(_case_op(case)) == registry:
            return case
    names = ", ".join(str(_case_op(c)) for c in candidates)
    raise unittest.SkipTest(f"this torch's {registry} registry answers none of {names}")


def query_strategy(
    op_schema: OpSchema,
    mesh: DeviceMesh | None = None,
    runtime: OpSchema | None = None,
) -> StrategyType | None:
    """Ask the registry holding ``op_schema``'s op for its strategy.

    Without ``runtime`` this is a planner's query (output metas left to the
    machinery); with it, the registry is called as dispatch calls it for that
    ``DTensorSpec`` schema. ``None`` when the registry declines (the decomposition
    may); ``ValueError`` for an op no registry knows. The registries are asked
    directly, not through ``get_op_strategy``, which stock torch 2.13.0 lacks:
    both torches must be asked the same way to compare them.
    """
    from torch.distributed.tensor._ops.single_dim_strategy import (
        _expand_single_dim_strategy_to_mesh,
    )

    op = op_schema.op
    propagator = _sharding_propagator()
    registry = strategy_registry(op)
    if registry == "single_dim":
        if mesh is None:
            mesh = op_schema.get_mesh_from_args(validate=False)
        metas = (
            None
            if runtime is None
            else propagator._propagate_tensor_meta_non_cached(runtime)
        )
        expand = _expand_single_dim_strategy_to_mesh(
            mesh, op_schema, propagator.op_single_dim_strategy_funcs[op], metas
        )
        return expand(op, op_schema.args_meta, op_schema.kwargs_meta)
    if registry == "op_strategy":
        return propagator.op_strategy_funcs[op](op_schema)
    if registry == "decomposition":
        propagator.decomp_strategy.ensure_schema_info(op)
        return propagator.decomp_strategy.propagate_strategy(
            op_schema if runtime is None else runtime
        )
    raise ValueError(f"DTensor has no sharding strategy for {op}")


def runtime_selection(runtime: OpSchema) -> OutputSharding:
    """What DTensor's dispatch selects for the ``DTensorSpec`` schema ``runtime``,
    computed afresh by the uncached propagation stock torch has too."""
    return _sharding_propagator().propagate_op_sharding_non_cached(runtime)


def author_rules(
    op_schema: OpSchema, rule: Any, returned: Sequence[bool] | None = None
) -> tuple[list[list[Placement | None]], int]:
    """``op_schema``'s single-dim rules, resolved as a rule author or planner does.

    ``rule`` is the op's ``op_single_dim_strategy_funcs`` entry. Each
    ``_ShardingPlaceholder`` becomes ``Shard`` and, once per ``_StridedShard``
    split factor the inputs' candidates carry, ``_StridedShard``; the
    all-``Replicate`` rule is added unless present, with ``None`` where
    ``returned`` (per result, whether the op returns a tensor there) says the op
    returns ``None``. Returns the rules and the number of results they lead with.
    Only what the rule says is used, none of what its registration adds.
    """
    from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
    from torch.distributed.tensor.placement_types import _StridedShard

    op = op_schema.op
    inputs = [*op_schema.args_strategy, *op_schema.kwargs_strategy]
    rules = rule.func(op, op_schema.args_meta, op_schema.kwargs_meta)
    if rules:
        n_outputs = len(rules[0]) - len(inputs)
    elif returned is not None:
        n_outputs = len(returned)
    else:
        n_outputs = sum("Tensor" in str(r.type) for r in op._schema.returns)
    factors = {
        int(p.split_factor)
        for strategy in inputs
        for candidate in strategy.strategies
        for p in candidate.output_spec.placements
        if isinstance(p, _StridedShard)
    }
    builders: list[Callable[[int], Placement]] = [Shard]
    builders += [
        functools.partial(_StridedShard, split_factor=f) for f in sorted(factors)
    ]
    resolved: list[list[Placement | None]] = []
    for r in rules:
        if not any(isinstance(p, _ShardingPlaceholder) for p in r):
            resolved.append(list(r))
            continue
        for build in builders:
            resolved.append(
                [build(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in r]
            )
    if not any(all(p is None or isinstance(p, Replicate) for p in r) for r in resolved):
        outputs: list[Placement | None] = [
            None
            if returned is not None and i < len(returned) and not returned[i]
            else Replicate()
            for i in range(n_outputs)
        ]
        resolved.insert(0, outputs + [Replicate()] * len(inputs))
    return resolved, n_outputs


def utility_strategy(op_schema: OpSchema, mesh: DeviceMesh) -> OpStrategy | None:
    """``op``'s registered single-dim rules, resolved by :func:`author_rules` and
    expanded by ``expand_to_full_mesh_op_strategy`` without output metas, as a
    downstream author does (``None`` without rules or with tensor lists)."""
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    op = op_schema.op
    info = _sharding_propagator().op_single_dim_strategy_funcs.get(op)
    args = (*op_schema.args_schema, *op_schema.kwargs_schema.values())
    if info is None or any(isinstance(x, (TupleStrategy, list, tuple)) for x in args):
        return None
    if any(isinstance(r.type, torch.ListType) for r in op._schema.returns) and not (
        info.func(op, op_schema.args_meta, op_schema.kwargs_meta)
    ):
        # A Tensor[] result takes one placement per element: only rules say how many.
        return None
    rules, n_outputs = author_rules(op_schema, info)
    return expand_to_full_mesh_op_strategy(
        mesh,
        op_schema,
        rules,  # type: ignore[arg-type]
        input_index=n_outputs,
        inplace_op=op.name().split("::")[-1].split(".")[0].endswith("_"),
        allow_uneven_sharding=info.allow_uneven_sharding,
    )
