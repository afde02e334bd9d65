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

# Ops (``str(OpOverload)``) whose queries say nothing about the contract, each
# with why. They are still queried and reported; an entry never excuses a
# violation or a crash of a strategy that can be judged.
CONTRACT_SKIPS: dict[str, str] = {}

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
    """Which runtime refusal ``exc`` is, or ``None`` when it is none.

    The key is the :data:`RUNTIME_REFUSALS` message fragment ``exc`` carries,
    or the name of the :data:`RUNTIME_REFUSAL_TYPES` type it is or was raised
    from (DTensor's dispatch re-raises strategy failures inside a
    ``RuntimeError``); only explicit causes count, not an error raised while
    another was handled. Reports group refusals by it.
    """
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
    """Why ``exc``, raised by a runtime query, is DTensor refusing the input, or ``None``.

    A refusal is a right answer, not a failure: sweeps count it per query
    instead of excusing whole ops. Only runtime queries can refuse; the same
    exception from a planner query is an error.
    """
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
    """A strategy schema for ``op(*args, **kwargs)`` as DTensor builds one.

    Every tensor (or ``TensorMeta``) in ``args``/``kwargs`` becomes an
    :class:`OpStrategy` whose candidates are ``candidates(mesh, meta)``; a list
    made only of tensors becomes a :class:`TupleStrategy`, and a list mixing
    tensors and ``None`` stays a list, as in DTensor's own wrapping. The schema
    carries the op's registered ``RuntimeSchemaInfo``, as eager dispatch sets it.
    """

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
    """The schema DTensor's dispatch builds for ``op(*args, **kwargs)`` on DTensors.

    Tensors (or ``TensorMeta``) become ``DTensorSpec``s taking the entries of
    ``placements`` in flattened argument order (args, then kwargs); tensor lists
    stay lists. ``ShardingPropagator._wrap_with_op_strategy`` of the result is
    the strategy schema of a runtime query.
    """
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
    """Which registry DTensor's runtime asks for ``op``'s strategies, or ``None``.

    The order is the runtime's: single-dim strategies, then registered op
    strategies, then the decomposition-derived strategy.
    """
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


def registry_coverage(
    ops: Iterable[torch._ops.OpOverload],
) -> dict[str, tuple[int, int]]:
    """Per registry: how many of ``ops`` it answers for, and how many it holds.

    The decomposition registry holds the ops with an explicit decomposition
    that no other registry answers; ops with a CompositeImplicitAutograd kernel
    reach it too, uncounted.
    """
    from torch._decomp import decomposition_table
    from torch.distributed.tensor import DTensor

    propagator = DTensor._op_dispatcher.sharding_propagator
    single_dim = set(propagator.op_single_dim_strategy_funcs)
    strategies = set(propagator.op_strategy_funcs) - single_dim
    registered = {
        "single_dim": len(single_dim),
        "op_strategy": len(strategies),
        "decomposition": len(set(decomposition_table) - single_dim - strategies),
    }
    reached = dict.fromkeys(REGISTRIES, 0)
    for op in ops:
        registry = strategy_registry(op)
        if registry is not None:
            reached[registry] += 1
    return {r: (reached[r], registered[r]) for r in REGISTRIES}


def _case_op(case: object) -> torch._ops.OpOverload:
    op = case if isinstance(case, torch._ops.OpOverload) else case[0]  # type: ignore[index]
    if not isinstance(op, torch._ops.OpOverload):
        raise TypeError(
            f"a case is an OpOverload or a tuple starting with one, got {case!r}"
        )
    return op


def answered_by(registry: str, candidates: Sequence[_Case]) -> _Case:
    """The first of ``candidates`` (ops, or tuples starting with the op) whose
    op ``registry`` answers on this torch.

    Releases move ops between registries; a test that needs an op of some kind
    in a given registry lists the ones that would do, and skips, naming what this
    torch lacks, when the registry answers none of them.
    """
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
    """Ask DTensor's strategy machinery for ``op_schema``'s strategy.

    ``op_schema`` is a strategy schema (see :func:`strategy_schema`). Without
    ``runtime`` this is a planner's query: output metas are left for the
    machinery to infer. ``runtime`` is the ``DTensorSpec`` schema ``op_schema``
    wraps in a runtime query, and the registry is then called as dispatch calls
    it: single-dim expansion gets the output metas dispatch computes, the
    decomposition gets the runtime schema. Returns ``None`` when the registry
    declines the query (the decomposition may) and raises ``ValueError`` for an
    op no registry knows.

    The registries are asked directly, not through
    ``ShardingPropagator.get_op_strategy``: stock torch 2.13.0 has no planner
    entry point, and a sweep must ask both torches the same way to compare
    them. Everything used here exists on stock and changed torch alike.
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
    """What DTensor's dispatch selects for the ``DTensorSpec`` schema ``runtime``.

    The uncached propagation dispatch runs (the strategy, the cheapest spec,
    any redistribution of the inputs), so every call computes afresh; it exists
    on stock torch too, so selections of both torches compare.
    """
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
    """``op``'s single-dim rules expanded the way a downstream rule author does.

    The rules DTensor registers for ``op`` (``None`` if it has none, or if the
    schema holds tensor lists, which an author expands per element), resolved by
    :func:`author_rules`, handed to ``expand_to_full_mesh_op_strategy`` with no
    output metas: whatever the result lacks, the utility left out.
    """
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
