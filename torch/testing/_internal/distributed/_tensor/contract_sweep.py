# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
What the strategy-contract check needs beyond upstream's ``strategy_validation``.

``strategy_validation`` picks ops by name, makes OpInfo samples and asks the
single-dim rules which placements an op supports. The contract mode
(``torch.distributed.tensor._ops._contract_validation``, run as
``strategy_validation --contract``) reuses its op resolution and keeps here only
what it cannot do, each piece for a reason:

* :func:`capture_calls` / :class:`CallRecorder`: ``strategy_validation`` runs the
  forward of ``op_db`` samples and records calls after they ran; strategies are
  also registered for backward, in-place and foreach ops (so backward, the
  in-place variant and the foreach OpInfo lists run too), and an in-place call
  must be asked with its inputs as they were before the call.
* :func:`strategy_schema`, :func:`runtime_schema` and the candidate builders
  (:func:`capped_candidates`, :func:`first_candidates`): ``strategy_validation``
  hands rules bare metas; a contract query needs the schema DTensor builds, with
  one or several candidate placements per input.
* :func:`query_strategy`, :func:`utility_strategy`, :func:`runtime_selection`:
  every registry asked the way dispatch, a planner and a rule author ask it,
  where ``strategy_validation`` expands single-dim rules only.
* :func:`author_rules`: ``strategy_validation`` turns placeholders into
  ``Shard`` for one mesh dim; a rule author or planner expanding a rule over a
  mesh also needs ``_StridedShard`` per split factor and the all-``Replicate``
  rule, ``None`` where the op returns ``None``.
* :func:`runtime_refusal`: tells DTensor deliberately refusing a runtime input
  from a failure, per query; ``strategy_validation`` has no notion of refusals.

Only APIs of torch 2.13.0 as released are used, and nothing that judges
strategies is imported: the module is also loaded by file path into an
unpatched torch, so that stock and changed torch are swept the same way and
judged by the same checker.
"""

import functools
import itertools
import warnings
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    OpSpec,
    OpStrategy,
    OutputSharding,
    RuntimeSchemaInfo,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


__all__ = [
    "CONTRACT_SKIPS",
    "MODES",
    "REGISTRIES",
    "RUNTIME_REFUSALS",
    "RUNTIME_REFUSAL_TYPES",
    "CallRecorder",
    "CandidateFunc",
    "CapturedCall",
    "author_rules",
    "capped_candidates",
    "capture_calls",
    "first_candidates",
    "meta_of",
    "op_strategy",
    "opinfo_db",
    "query_strategy",
    "replicated_candidate",
    "runtime_refusal",
    "runtime_refusal_key",
    "runtime_selection",
    "runtime_schema",
    "select_calls",
    "strategy_registry",
    "strategy_schema",
    "utility_strategy",
]

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


# --------------------------------------------------------------------------------------
# Schemas and candidate placements
# --------------------------------------------------------------------------------------


def meta_of(tensor: torch.Tensor) -> TensorMeta:
    """The global ``TensorMeta`` of ``tensor``, as DTensor records it on a spec."""
    return TensorMeta(shape=tensor.shape, stride=tensor.stride(), dtype=tensor.dtype)


def op_strategy(
    mesh: DeviceMesh, meta: TensorMeta, *placements: Sequence[Placement]
) -> OpStrategy:
    """An input strategy: one candidate ``OpSpec`` per placement tuple.

    Candidates carry only an output spec, like the input strategies DTensor puts in
    a strategy schema. With no placements the input has a single, replicated
    candidate, which is what eager dispatch hands a strategy function.
    """
    if not placements:
        placements = ((Replicate(),) * mesh.ndim,)
    specs = []
    for p in placements:
        if len(p) != mesh.ndim:
            raise ValueError(f"placements {p} do not match a {mesh.ndim}-D mesh")
        specs.append(OpSpec(DTensorSpec(mesh, tuple(p), tensor_meta=meta)))
    return OpStrategy(specs)


def replicated_candidate(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """The single candidate eager dispatch offers for a replicated input."""
    return [(Replicate(),) * mesh.ndim]


# Chooses the candidate placements of one tensor input of a strategy schema.
CandidateFunc = Callable[[DeviceMesh, TensorMeta], Sequence[Sequence[Placement]]]


def capped_candidates(limit: int) -> CandidateFunc:
    """Planner candidates, at most ``limit`` per tensor input.

    Strategy expansion costs grow with the product of the inputs' candidate
    counts, so a sweep cannot offer every placement tuple. It still offers what
    strategies treat differently: all-``Replicate`` first, an evenly dividing
    ``Shard``, ``Partial`` for floating dtypes, then tuples picked greedily for
    the (mesh dim, placement) pairs they add, so that every mesh dim gets
    sharded. Every rank holds a non-empty shard, and the choice is
    deterministic, which keeps failure messages stable.
    """
    cache: dict[tuple[object, ...], list[tuple[Placement, ...]]] = {}

    def candidates(mesh: DeviceMesh, meta: TensorMeta) -> list[tuple[Placement, ...]]:
        key = (tuple(mesh.shape), tuple(meta.shape), meta.dtype)
        if key not in cache:
            cache[key] = _capped_candidates(mesh, meta, limit)
        return cache[key]

    return candidates


def _mesh_dim_options(
    mesh: DeviceMesh, meta: TensorMeta, partials: Sequence[str] = ("sum",)
) -> list[list[Placement]]:
    """Per mesh dim, the placements a candidate may take there: ``Replicate()``,
    ``Shard(d)`` for each tensor dim at least as long as the mesh dim, and
    ``Partial(k)`` for each kind of ``partials`` for floating and complex dtypes."""
    options: list[list[Placement]] = []
    for mesh_dim in range(mesh.ndim):
        opts: list[Placement] = [Replicate()]
        opts += [Shard(d) for d, n in enumerate(meta.shape) if n >= mesh.size(mesh_dim)]
        if meta.dtype.is_floating_point or meta.dtype.is_complex:
            opts += [Partial(k) for k in partials]
        options.append(opts)
    return options


def _capped_candidates(
    mesh: DeviceMesh, meta: TensorMeta, limit: int
) -> list[tuple[Placement, ...]]:
    options = _mesh_dim_options(mesh, meta)

    def pieces(combo: tuple[int, ...]) -> list[int]:
        n = [1] * len(meta.shape)
        for mesh_dim, i in enumerate(combo):
            p = options[mesh_dim][i]
            if isinstance(p, Shard):
                n[p.dim] *= mesh.size(mesh_dim)
        return n

    # Tuples of indices into options; fewest non-Replicate mesh dims first, then
    # leading mesh dims first.
    combos = sorted(
        (
            c
            for c in itertools.product(*(range(len(o)) for o in options))
            if all(k == 1 or k <= n for k, n in zip(pieces(c), meta.shape))
        ),
        key=lambda c: (sum(i != 0 for i in c), c[::-1]),
    )

    def even_shard(combo: tuple[int, ...]) -> bool:
        split = pieces(combo)
        return any(k > 1 for k in split) and all(
            n % k == 0 for n, k in zip(meta.shape, split)
        )

    def partial(combo: tuple[int, ...]) -> bool:
        return any(isinstance(options[d][i], Partial) for d, i in enumerate(combo))

    chosen = [combos[0]]
    for wanted in (even_shard, partial):
        hit = next((c for c in combos if wanted(c)), None)
        if hit is not None and hit not in chosen:
            chosen.append(hit)
    seen = {(d, i) for c in chosen for d, i in enumerate(c)}
    while len(chosen) < min(limit, len(combos)):
        best = max(
            (c for c in combos if c not in chosen),
            key=lambda c: sum((d, i) not in seen for d, i in enumerate(c)),
        )
        chosen.append(best)
        seen.update(enumerate(best))
    chosen = sorted(chosen[:limit], key=combos.index)
    return [tuple(options[d][i] for d, i in enumerate(c)) for c in chosen]


def first_candidates(limit: int, partials: Sequence[str] = ("sum",)) -> CandidateFunc:
    """Planner candidates in a fixed order, the first ``limit`` per tensor input.

    Per mesh dim the options are ``Replicate()``, ``Shard(d)`` for each tensor
    dim at least as long as the mesh dim, and ``Partial(k)`` per kind of
    ``partials`` for floating and complex dtypes (a planner's inputs are partial
    in every kind their producers' rules name). Tuples with fewer
    non-``Replicate`` mesh dims come first (all-``Replicate``, then each single
    sharding, then combinations), ties in option order. Unlike
    :func:`capped_candidates`, tuples that split a dim into more pieces than it
    has elements stay in: a planner may offer them, and strategies must answer
    for uneven and empty shards. Large limits reach every single-dim placement,
    which is what a wide audit wants.
    """
    if limit < 1:
        raise ValueError(f"first_candidates needs a limit of at least 1, got {limit}")

    def candidates(mesh: DeviceMesh, meta: TensorMeta) -> list[tuple[Placement, ...]]:
        options = _mesh_dim_options(mesh, meta, partials)
        combos = sorted(
            itertools.product(*(range(len(o)) for o in options)),
            key=lambda c: (sum(i != 0 for i in c), c),
        )
        return [
            tuple(options[d][i] for d, i in enumerate(c)) for c in combos[:limit]
        ]

    return candidates


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


# --------------------------------------------------------------------------------------
# Querying the registries
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Capturing calls from OpInfo samples
# --------------------------------------------------------------------------------------


def _describe(x: object) -> str:
    if isinstance(x, TensorMeta):
        dtype = str(x.dtype).removeprefix("torch.")
        return f"T{list(x.shape)}s{list(x.stride)}:{dtype}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_describe(e) for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    text = repr(x)
    # Objects without a value repr (generators) would make every call distinct.
    return f"<{type(x).__name__}>" if " at 0x" in text else text


def _tensor_leaves(x: object) -> list[TensorMeta]:
    if isinstance(x, TensorMeta):
        return [x]
    if isinstance(x, (list, tuple)):
        return [m for e in x for m in _tensor_leaves(e)]
    if isinstance(x, dict):
        return [m for e in x.values() for m in _tensor_leaves(e)]
    return []


@dataclass
class CapturedCall:
    """One aten call, each tensor argument replaced by its ``TensorMeta``.

    ``str()`` is the same text for the same call in any process, so it serves
    as a key and in messages. ``source`` names the OpInfo and the pass
    (forward, backward, inplace) that made the call.
    """

    op: OpOverload
    args: tuple[object, ...]
    kwargs: dict[str, object]
    source: str

    @property
    def tensor_metas(self) -> list[TensorMeta]:
        """Tensor arguments in flattened order (args, then kwargs), as schemas list them."""
        return _tensor_leaves((self.args, self.kwargs))

    def __str__(self) -> str:
        args = [_describe(a) for a in self.args]
        args += [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]
        return f"{self.op}({', '.join(args)})"


class _NotDense(Exception):
    pass


def _to_metas(x: object) -> object:
    # What a DTensorSpec cannot describe (sparse, other devices, subclasses) is
    # no call a strategy query could be about.
    if isinstance(x, torch.Tensor):
        if (
            type(x) not in (torch.Tensor, torch.nn.Parameter)
            or x.layout != torch.strided
            or x.device.type != "cpu"
        ):
            raise _NotDense
        return meta_of(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_metas(e) for e in x)
    return x


class CallRecorder(TorchDispatchMode):
    """Records, per op, up to ``pool_size`` distinct aten calls with tensor arguments.

    A call is kept only once it returned, so a call eager mode rejects is never
    queried; its metas are taken before it runs, as an in-place op may change
    its self. ``source`` labels the calls that follow. ``keep``, when set,
    chooses the ops recorded (a sweep restricted to some ops); it may be
    changed between samples.

    Calls without a tensor argument (factory calls) never reach DTensor, so
    they are not kept; ``tensorless`` counts them per op, so that a report can
    still say which ops the samples called. ``seen`` and ``not_dense`` count the
    aten calls looked at and those with a tensor a ``DTensorSpec`` cannot
    describe (sparse, another device, a subclass), which are dropped.
    """

    def __init__(
        self, pool_size: int = 8, keep: Callable[[OpOverload], bool] | None = None
    ) -> None:
        super().__init__()
        self.pool_size = pool_size
        self.keep = keep
        self.source = ""
        self.calls: dict[OpOverload, dict[str, CapturedCall]] = defaultdict(dict)
        self.tensorless: dict[OpOverload, int] = defaultdict(int)
        self.seen = 0
        self.not_dense = 0

    def __torch_dispatch__(  # type: ignore[no-untyped-def]
        self, func, types, args=(), kwargs=None
    ):
        kwargs = kwargs or {}
        call = None
        if func.namespace == "aten" and (self.keep is None or self.keep(func)):
            self.seen += 1
            try:
                call = CapturedCall(
                    func,
                    _to_metas(tuple(args)),  # type: ignore[arg-type]
                    {k: _to_metas(v) for k, v in kwargs.items()},
                    self.source,
                )
            except _NotDense:
                self.not_dense += 1
        out = func(*args, **kwargs)
        if call is not None:
            if not call.tensor_metas:
                self.tensorless[func] += 1
                return out
            pool = self.calls[func]
            key = str(call)
            if key not in pool and len(pool) < self.pool_size:
                pool[key] = call
        return out


def opinfo_db() -> list[Any]:
    """``op_db`` and the foreach OpInfo lists."""
    import torch.testing._internal.common_methods_invocations as cmi

    infos = list(cmi.op_db)
    for name in (
        "foreach_unary_op_db",
        "foreach_binary_op_db",
        "foreach_pointwise_op_db",
        "foreach_reduce_op_db",
        "foreach_other_op_db",
    ):
        infos += getattr(cmi, name, [])
    return infos


def capture_calls(
    opinfos: Iterable[Any],
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.int64, torch.bool),
    extra_dtypes: Sequence[torch.dtype] = (),
    samples: int = 1,
    backward: bool = True,
    foreach_tensors: int | None = 2,
    pool_size: int = 8,
    backward_dtypes: Collection[torch.dtype] | None = None,
    recorder: CallRecorder | None = None,
) -> tuple[CallRecorder, dict[str, int]]:
    """Run OpInfo samples under a :class:`CallRecorder`; return it and counters.

    Each OpInfo runs its first ``samples`` samples in the first of ``dtypes``
    it supports (so ops without a float variant are reached too) and in every
    one of ``extra_dtypes`` it supports: the call itself, backward of
    differentiable ops (for samples of a dtype in ``backward_dtypes``, by
    default every floating dtype), and the in-place variant on a copy.
    Foreach samples hold ``foreach_tensors`` tensors per list (``None``: the
    OpInfo default, 20). ``recorder`` lets a caller keep recording into one it made (with an op
    filter, or across several calls).

    Samples come from ``sample_inputs_func`` directly: ``OpInfo.sample_inputs``
    walks the stack looking for the running test, which would cost most of the
    capture once torch.distributed is imported. The RNG is seeded as
    ``OpInfo.sample_inputs`` seeds it outside a test (see :func:`_first_samples`),
    which fixes random arguments and the shapes data-dependent ops produce, so
    every process captures the same calls, whichever OpInfos ran before.
    """
    from torch.testing._internal.opinfo.core import ForeachFuncInfo

    if recorder is None:
        recorder = CallRecorder(pool_size)
    counts: dict[str, int] = defaultdict(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in opinfos:
            counts["opinfos"] += 1
            supported = info.supported_dtypes("cpu")
            run_in = [d for d in dtypes if d in supported][:1]
            run_in += [d for d in extra_dtypes if d in supported and d not in run_in]
            kwargs = {}
            if foreach_tensors is not None and isinstance(info, ForeachFuncInfo):
                kwargs["num_input_tensors"] = [foreach_tensors]
            for dtype in run_in:
                grad = (
                    backward
                    and info.supports_autograd
                    and (
                        dtype.is_floating_point
                        if backward_dtypes is None
                        else dtype in backward_dtypes
                    )
                )
                try:
                    batch = _first_samples(info, dtype, grad, samples, kwargs)
                except Exception:
                    counts["sample_inputs failed"] += 1
                    continue
                for sample in batch:
                    counts["samples"] += 1
                    _run_sample(recorder, info, sample, grad, counts)
    return recorder, dict(counts)


def _first_samples(
    info: Any, dtype: torch.dtype, grad: bool, n: int, kwargs: dict[str, Any]
) -> list[Any]:
    """The first ``n`` samples of ``info``, seeded as ``OpInfo.sample_inputs`` seeds them.

    Outside a test, ``OpInfo.sample_inputs`` resets the RNG to
    ``common_utils.SEED`` before each sample is made, so the sweep sees the
    values tests see. The RNG is also reset before the sample function is
    called, so that functions making their whole list at once do not depend on
    what ran before.
    """
    from torch.testing._internal.common_utils import SEED, set_rng_seed

    set_rng_seed(SEED)
    sample_iter = iter(info.sample_inputs_func(info, "cpu", dtype, grad, **kwargs))
    batch = []
    for _ in range(n):
        set_rng_seed(SEED)
        try:
            batch.append(next(sample_iter))
        except StopIteration:
            break
    return batch


def _run_sample(
    recorder: CallRecorder, info: Any, sample: Any, grad: bool, counts: dict[str, int]
) -> None:
    name = (
        f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name
    )
    try:
        with recorder:
            recorder.source = f"{name} forward"
            out = info(sample.input, *sample.args, **sample.kwargs)
            if grad:
                recorder.source = f"{name} backward"
                if _backward(out):
                    counts["backward runs"] += 1
    except Exception:
        counts["samples failed"] += 1
    inplace = info.get_inplace()
    if inplace is None:
        return
    inp, args, kwargs = pytree.tree_map_only(
        torch.Tensor,
        lambda t: t.detach().clone(),
        (sample.input, sample.args, sample.kwargs),
    )
    try:
        with recorder:
            recorder.source = f"{name} inplace"
            inplace(inp, *args, **kwargs)
        counts["in-place runs"] += 1
    except Exception:
        counts["in-place samples failed"] += 1


def _backward(out: object) -> bool:
    """Backward from the first differentiable result; whether there was one.

    A complex result (an FFT of a real input) goes through ``abs()``, so that
    the backward ops of complex-valued ops are reached too.
    """
    for t in pytree.tree_leaves(out):
        if (
            isinstance(t, torch.Tensor)
            and t.requires_grad
            and (t.is_floating_point() or t.is_complex())
        ):
            loss = t.abs().sum() if t.is_complex() else t.sum()
            loss.backward()
            return True
    return False


def select_calls(
    recorder: CallRecorder, per_op: int
) -> dict[OpOverload, list[CapturedCall]]:
    """Up to ``per_op`` calls of every op a registry knows, sorted by op name.

    After the first call, calls with dtypes, then passes, not picked yet come
    first: they are the likeliest to take another path through a strategy.
    """
    selected: dict[OpOverload, list[CapturedCall]] = {}
    for op in sorted(recorder.calls, key=str):
        if strategy_registry(op) is None:
            continue
        remaining = list(recorder.calls[op].values())
        picked: list[CapturedCall] = []
        while remaining and len(picked) < per_op:
            dtypes = {tuple(m.dtype for m in c.tensor_metas) for c in picked}
            passes = {c.source.rsplit(" ", 1)[-1] for c in picked}
            best = min(
                remaining,
                key=lambda c: (
                    tuple(m.dtype for m in c.tensor_metas) in dtypes,
                    c.source.rsplit(" ", 1)[-1] in passes,
                ),
            )
            remaining.remove(best)
            picked.append(best)
        selected[op] = picked
    return selected
