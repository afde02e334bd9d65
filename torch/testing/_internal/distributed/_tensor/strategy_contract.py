"""Checks strategies against the contract stated on ``OpSpec`` (C1-C5), judging
each answer by the op's results on fake tensors, so that any build can be judged."""

import math
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses import fake_tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.distributed.tensor.placement_types import _StridedShard, Placement
from torch.utils._pytree import tree_flatten, tree_map


Metas = TensorMeta | tuple[TensorMeta | None, ...] | None  # None: no tensor result
Candidates = list[tuple[Placement, ...]]  # an input's placements per candidate
_PROP = DTensor._op_dispatcher.sharding_propagator


def _is_spec_or_strategy(x: object) -> bool:
    return isinstance(x, (OpStrategy, TupleStrategy, DTensorSpec))


def _leaf_meta(x: object) -> TensorMeta | None:
    spec = x.strategies[0].output_spec if isinstance(x, OpStrategy) else x
    return spec.tensor_meta if isinstance(spec, DTensorSpec) else None


def _args(op_schema: OpSchema) -> tuple[tuple[object, ...], dict[str, object]]:
    return op_schema.args_schema, op_schema.kwargs_schema


def expected_output_metas(op_schema: OpSchema) -> Metas:
    """What ``op_schema.op`` returns on its global inputs, as metas."""
    mode = fake_tensor.FakeTensorMode()
    mode.cache_enabled = False  # its cache returns an out= call's outs unresized

    def fake(x: object) -> object:
        if isinstance(x, TupleStrategy):
            return [fake(c) for c in x.children]
        if (meta := _leaf_meta(x)) is None:
            return x
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype)

    with mode:
        args, kwargs = tree_map(fake, _args(op_schema), is_leaf=_is_spec_or_strategy)
        out = op_schema.op(*args, **kwargs)

    def as_meta(t: object) -> Any:
        if isinstance(t, list):  # one of several lists (e.g. _fused_adam's)
            return tuple(map(as_meta, t))
        return TensorMeta(t.shape, t.stride(), t.dtype) if torch.is_tensor(t) else None

    if isinstance(out, (tuple, list)) and any(
        torch.is_tensor(o) or isinstance(o, list) for o in out
    ):
        return tuple(map(as_meta, out))
    return as_meta(out)


def _same_meta(a: TensorMeta | None, b: TensorMeta | None) -> bool:
    if a is None or b is None or (a.dtype, a.shape) != (b.dtype, b.shape):
        return False  # below: a size-1 dim's stride says nothing; kernels differ there
    return all(n == 1 or s == t for n, s, t in zip(b.shape, a.stride, b.stride))


def _output_violations(spec: OpSpec, expected: Metas, as_list: bool) -> list[str]:
    outs, local = spec.output_specs, spec.local_output_metas
    if expected is None:  # no tensor result: None, or a tuple of Nones
        ok = outs is None or isinstance(outs, tuple) and not any(outs)
        return [] if ok else [f"C2 output_specs {outs} where the op returns no tensor"]
    if isinstance(expected, TensorMeta) and not as_list:
        if not isinstance(outs, DTensorSpec):
            return [f"C2 output_specs {outs} where the op returns a tensor"]
        if not _same_meta(outs.tensor_meta, expected):
            return [f"output: C1 tensor_meta {outs.tensor_meta}, expected {expected}"]
        return []
    metas = (expected,) if isinstance(expected, TensorMeta) else expected
    if not isinstance(outs, tuple) or len(outs) != len(metas):
        return [f"C2 output_specs {outs} for {len(metas)} results"]
    found = []
    for i, (out, meta) in enumerate(zip(outs, metas)):
        if out is None and meta is not None:  # a rank-local result, with its meta
            if not (local and i < len(local) and _same_meta(local[i], meta)):
                found.append(f"output {i}: C2 None without local_output_metas {meta}")
        elif (
            meta is None and out is not None or not isinstance(out, DTensorSpec | None)
        ):
            found.append(f"output {i}: C2 {out} where the op returns {meta}")
        elif meta is not None and not _same_meta(out.tensor_meta, meta):
            found.append(f"output {i}: C1 tensor_meta {out.tensor_meta}, not {meta}")
    return found


def _spec_violations(
    spec: OpSpec, inputs: list[OpStrategy], expected: Metas, as_list: bool
) -> list[str]:
    found = _output_violations(spec, expected, as_list)
    targets, costs = spec.input_specs, spec.redistribute_cost
    if targets is None or len(targets) != len(inputs):
        found.append(f"C3 input_specs {targets} for {len(inputs)} inputs")
        targets = [None] * len(inputs)
    for i, (s, inp) in enumerate(zip(targets, inputs)):
        if s is not None and not _same_meta(s.tensor_meta, _leaf_meta(inp)):
            found.append(f"input {i}: C3 tensor_meta {s.tensor_meta}")
    sizes = [len(i.strategies) for i in inputs]
    if costs is None or [len(row) for row in costs] != sizes:
        found.append(f"C4 redistribute_cost {costs} for inputs of {sizes} candidates")
        return found
    for i, (row, inp, s) in enumerate(zip(costs, inputs, targets)):
        for cost, candidate in zip(row, inp.strategies):
            same = s is not None and candidate.output_spec.placements == s.placements
            if math.isnan(cost) or cost < 0 or (same and math.isinf(cost)):
                found.append(f"input {i}: C4 cost {cost} from {candidate.output_spec}")
    return found


def _inputs(op_schema: OpSchema) -> list[OpStrategy]:
    return [x for x in tree_flatten(_args(op_schema))[0] if isinstance(x, OpStrategy)]


def contract_violations(
    op_schema: OpSchema, strategy: StrategyType, expected: Metas
) -> list[str]:
    """Every way ``strategy`` breaks the contract, naming op, child, ``OpSpec``,
    position and clause; ``expected``: :func:`expected_output_metas` of the schema."""
    op = op_schema.op
    if not isinstance(strategy, TupleStrategy):
        as_list = any(isinstance(r.type, torch.ListType) for r in op._schema.returns)
        return _violations(op_schema, strategy, expected, as_list)
    found = []
    for i, child in enumerate(strategy.children):

        def pick(x: object, i: int = i) -> object:
            return x.children[i] if isinstance(x, TupleStrategy) else x

        args = tree_map(pick, _args(op_schema), is_leaf=_is_spec_or_strategy)
        element = OpSchema(op, *args)
        # A list result gives each element its entry, several lists their
        # entries (None past a list's end); an in-place op, self.
        want = _leaf_meta(_inputs(element)[0])
        if isinstance(expected, tuple) and not isinstance(expected, TensorMeta):
            want = expected[i]
            if expected and not isinstance(expected[0], TensorMeta | None):
                want = tuple(e[i] if i < len(e) else None for e in expected)
        found += [f"child {i}: {v}" for v in _violations(element, child, want, False)]
    return found


def _violations(
    op_schema: OpSchema, strategy: StrategyType, expected: Metas, as_list: bool
) -> list[str]:
    op = op_schema.op
    if not isinstance(strategy, OpStrategy) or not strategy.strategies:
        return [f"{op}: C5 {type(strategy).__name__} with no OpSpec"]
    inputs = _inputs(op_schema)
    return [
        f"{op} OpSpec {k} {v}"
        for k, spec in enumerate(strategy.strategies)
        for v in _spec_violations(spec, inputs, expected, as_list)
    ]


def registry(op: OpOverload) -> str | None:
    """Which registry answers ``op``: single_dim, op_strategy or decomposition."""
    if op in _PROP.op_single_dim_strategy_funcs:
        return "single_dim"
    if op in _PROP.op_strategy_funcs:
        return "op_strategy"
    return "decomposition" if DecompShardingStrategy.has_decomp(op) else None


def runtime_candidate(t: torch.Tensor, mesh: DeviceMesh) -> Candidates:
    """One candidate, as dispatch sees: the first evenly shardable dim, say."""
    dims = [d for d in range(t.dim()) if t.shape[d] and t.shape[d] % mesh.size() == 0]
    return [(Shard(dims[0]) if dims else Replicate(),) * mesh.ndim]


def planner_candidates(t: torch.Tensor, mesh: DeviceMesh) -> Candidates:
    """``Replicate``, ``Partial`` (floats), each dim's ``Shard`` (even or not); on a
    2-D mesh or more, two dims' ``Shard``s and FSDP2 with TP's ``_StridedShard``."""
    n, dims = mesh.ndim, [d for d in range(t.dim()) if t.shape[d]]
    found: Candidates = [(Replicate(),) * n]
    found += [(Partial(),) * n] if t.is_floating_point() else []
    found += [(Shard(d),) * n for d in dims]
    if n > 1 and len(dims) > 1:
        found.append((Shard(dims[0]),) + (Shard(dims[1]),) * (n - 1))
    if n > 1 and dims:
        strided = _StridedShard(dims[0], split_factor=mesh.size(n - 1))
        found.append((strided,) + (Replicate(),) * (n - 2) + (Shard(dims[0]),))
    return found


def strategy_schema(
    op: OpOverload,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    mesh: DeviceMesh,
    candidates: Callable[[torch.Tensor, DeviceMesh], Candidates] = runtime_candidate,
) -> OpSchema:
    """The schema a strategy function receives: each tensor an ``OpStrategy`` of
    ``candidates``, each tensor list a ``TupleStrategy``."""
    if registry(op) == "decomposition":
        _PROP.decomp_strategy.ensure_schema_info(op)

    def wrap(x: Any) -> Any:
        if torch.is_tensor(x):
            m = TensorMeta(x.shape, x.stride(), x.dtype)
            specs = (DTensorSpec(mesh, c, tensor_meta=m) for c in candidates(x, mesh))
            return OpStrategy([OpSpec(s) for s in specs])
        if not isinstance(x, (list, tuple)):
            return x
        if x and all(map(torch.is_tensor, x)):
            return TupleStrategy([wrap(e) for e in x])
        return type(x)(wrap(e) for e in x)

    info = _PROP.op_to_schema_info.get(op)
    info = info or _PROP.op_to_schema_info_for_single_dim_strategy.get(op)
    kwargs = {k: wrap(v) for k, v in kwargs.items()}
    return OpSchema(op, tuple(map(wrap, args)), kwargs, schema_info=info)


def query_strategy(op_schema: OpSchema, mesh: DeviceMesh) -> StrategyType:
    """The registry's strategy for ``op_schema``, asked as dispatch asks it: on the
    inputs' first candidates, with the metas dispatch infers."""
    op, prop = op_schema.op, _PROP

    def spec(x: object) -> object:
        if isinstance(x, OpStrategy):
            return x.strategies[0].output_spec
        return [spec(c) for c in x.children] if isinstance(x, TupleStrategy) else x

    args, kwargs = tree_map(spec, _args(op_schema), is_leaf=_is_spec_or_strategy)
    specs = OpSchema(op, args, kwargs, schema_info=op_schema.schema_info)
    metas = prop._propagate_tensor_meta_non_cached(specs)
    if registry(op) == "single_dim":
        info = prop.op_single_dim_strategy_funcs[op]
        expand = _expand_single_dim_strategy_to_mesh(mesh, op_schema, info, metas)
        return expand(op, op_schema.args_meta, op_schema.kwargs_meta)
    if registry(op) == "op_strategy":
        return prop.op_strategy_funcs[op](op_schema)
    try:  # as dispatch: any failure of the decomposition path is no strategy
        strategy = prop.decomp_strategy.propagate_strategy(specs, metas)
    except Exception as e:
        raise NotImplementedError(f"{op} has no sharding strategy") from e
    if strategy is None:
        raise NotImplementedError(f"{op} has no sharding strategy")
    return strategy


def check_call(
    op: OpOverload,
    args: tuple[object, ...],
    kwargs: dict[str, object],
    mesh: DeviceMesh,
    planner: Callable[[OpSchema], StrategyType] | None = None,
) -> list[str]:
    """How DTensor's answer for ``op(*args, **kwargs)``, asked as dispatch or by a
    planner's query function (on ``planner_candidates``), breaks the contract: a
    data-dependent result is not judged, a refusal raises."""
    candidates = planner_candidates if planner else runtime_candidate
    schema = strategy_schema(op, args, kwargs, mesh, candidates)
    strategy = planner(schema) if planner else query_strategy(schema, mesh)
    try:
        expected = expected_output_metas(schema)
    except (
        fake_tensor.DataDependentOutputException,
        fake_tensor.DynamicOutputShapeException,
    ):
        return []  # no meta to judge by: the result's shape or value is data
    return contract_violations(schema, strategy, expected)
