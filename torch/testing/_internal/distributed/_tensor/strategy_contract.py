# mypy: allow-untyped-defs
# Owner(s): ["oncall: distributed"]
"""
Checks what DTensor's sharding strategies hand their consumers. Every ``OpSpec``
of a strategy for ``op(*args, **kwargs)``, from any registry, satisfies:

C1  each output position where the op returns a tensor holds a ``DTensorSpec``
    whose ``tensor_meta`` (shape, stride, dtype) is the op's result on the
    global inputs, an all-``Replicate`` one where dispatch returns the result
    as the rank's own local tensor (the attention ops' RNG state);
C2  each position where the op returns ``None`` holds ``None``, and no other;
    one tensor result is a ``DTensorSpec``, several results (or a
    ``Tensor[]``) a tuple with one entry each, and no tensor result
    ``output_specs=None``;
C3  ``input_specs`` holds one ``DTensorSpec`` per tensor input (flattened
    arguments, then keyword arguments), each with that input's meta;
C4  ``redistribute_cost`` holds one row per tensor input, as long as that
    input's candidate list, without negative or NaN values;
C5  each child of a ``TupleStrategy`` satisfies C1-C4 for its element.

Expected metas come from running the op on fake tensors here, apart from
DTensor's own shape inference, so the check can judge any build.
"""

import dataclasses
import functools
import itertools
import math
from typing import Any

import torch
import torch.distributed as dist
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.common_utils import TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_any, tree_flatten, tree_map, tree_map_only


Metas = TensorMeta | tuple[TensorMeta | None, ...] | None  # None: no tensor result


def _leaf_meta(x: object) -> TensorMeta | None:
    spec = x.strategies[0].output_spec if isinstance(x, OpStrategy) else x
    return spec.tensor_meta if isinstance(spec, DTensorSpec) else None


def expected_output_metas(op_schema: OpSchema) -> Metas:
    """What ``op_schema.op`` returns on its global inputs, as metas."""
    mode = FakeTensorMode()

    def fake(x: object) -> object:
        if isinstance(x, TupleStrategy):
            return [fake(c) for c in x.children]
        meta = _leaf_meta(x)
        if meta is None:
            return x
        with mode:
            return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype)

    leaf = lambda x: isinstance(x, (OpStrategy, TupleStrategy, DTensorSpec))  # noqa: E731
    args, kwargs = tree_map(fake, (op_schema.args_schema, op_schema.kwargs_schema), is_leaf=leaf)
    with mode:
        out = op_schema.op(*args, **kwargs)
    as_meta = lambda t: TensorMeta(t.shape, t.stride(), t.dtype)  # noqa: E731
    if isinstance(out, torch.Tensor):
        return as_meta(out)
    if isinstance(out, (tuple, list)) and any(isinstance(o, torch.Tensor) for o in out):
        return tuple(as_meta(o) if isinstance(o, torch.Tensor) else None for o in out)
    return None


def _same_meta(a: TensorMeta | None, b: TensorMeta) -> bool:
    # The stride of a size-1 dim carries no information; kernels differ there.
    return (
        a is not None
        and a.dtype == b.dtype
        and a.shape == b.shape
        and all(n == 1 or s == t for n, s, t in zip(b.shape, a.stride, b.stride))
    )


def _spec_violations(spec: OpSpec, inputs: list[OpStrategy], expected: Metas, as_list: bool) -> list[str]:
    found = []
    outs = spec.output_specs
    if expected is None:
        if outs is not None and not (isinstance(outs, tuple) and not any(outs)):
            found.append(f"C2 output_specs {outs} where the op returns no tensor")
    elif isinstance(expected, TensorMeta) and not as_list:
        if not isinstance(outs, DTensorSpec):
            found.append(f"C2 output_specs {outs} where the op returns a tensor")
        elif not _same_meta(outs.tensor_meta, expected):
            found.append(f"output: C1 tensor_meta {outs.tensor_meta}, expected {expected}")
    else:
        metas = (expected,) if isinstance(expected, TensorMeta) else expected
        if not isinstance(outs, tuple) or len(outs) != len(metas):
            return [f"C2 output_specs {outs} for {len(metas)} results"]
        for i, (out, meta) in enumerate(zip(outs, metas)):
            if meta is None and out is not None:
                found.append(f"output {i}: C2 {out} where the op returns None")
            elif meta is not None and not isinstance(out, DTensorSpec):
                found.append(f"output {i}: C2 {out} where the op returns a tensor")
            elif meta is not None and not _same_meta(out.tensor_meta, meta):
                found.append(f"output {i}: C1 tensor_meta {out.tensor_meta}, expected {meta}")
    if spec.input_specs is None or len(spec.input_specs) != len(inputs):
        found.append(f"C3 input_specs {spec.input_specs} for {len(inputs)} tensor inputs")
    else:
        for i, (s, inp) in enumerate(zip(spec.input_specs, inputs)):
            if not _same_meta(s.tensor_meta, _leaf_meta(inp)):
                found.append(f"input {i}: C3 tensor_meta {s.tensor_meta}")
    costs = spec.redistribute_cost
    if costs is None or [len(row) for row in costs] != [len(i.strategies) for i in inputs]:
        found.append(f"C4 redistribute_cost {costs} for inputs of {[len(i.strategies) for i in inputs]} candidates")
    elif any(math.isnan(c) or c < 0 for row in costs for c in row):
        found.append(f"C4 redistribute_cost {costs}")
    return found


def contract_violations(
    op_schema: OpSchema,
    strategy: StrategyType,
    expected: Metas,
    rank_local: frozenset[int] = frozenset(),
) -> list[str]:
    """Every way ``strategy``, the answer for ``op_schema``, breaks C1-C5, each
    naming the op, the child and ``OpSpec`` index, the position and the clause.
    ``expected`` is :func:`expected_output_metas` of ``op_schema``, and
    ``rank_local`` holds the positions dispatch returns as local tensors."""
    op = op_schema.op
    if isinstance(strategy, TupleStrategy):
        found = []
        for i, child in enumerate(strategy.children):
            pick = lambda x: x.children[i] if isinstance(x, TupleStrategy) else x  # noqa: E731
            leaf = lambda x: isinstance(x, TupleStrategy)  # noqa: E731
            element = OpSchema(op, *tree_map(pick, (op_schema.args_schema, op_schema.kwargs_schema), is_leaf=leaf))
            # A list result gives each element its entry; an in-place op, self.
            want = expected[i] if isinstance(expected, tuple) and not isinstance(expected, TensorMeta) else (
                _leaf_meta(_inputs(element)[0]))
            found += [f"child {i}: {v}" for v in _violations(element, child, want, False)]
        return found
    as_list = any(isinstance(r.type, torch.ListType) for r in op._schema.returns)
    found = _violations(op_schema, strategy, expected, as_list)
    specs = strategy.strategies if isinstance(strategy, OpStrategy) else []
    for k, spec in enumerate(specs):
        outs = spec.output_specs if isinstance(spec.output_specs, tuple) else ()
        for i in sorted(p for p in rank_local if p < len(outs)):
            out = outs[i]
            if isinstance(out, DTensorSpec) and not out.is_replicated():
                found.append(f"{op} OpSpec {k} output {i}: C1 placed {out.placements}")
    return found


def _violations(op_schema: OpSchema, strategy: StrategyType, expected: Metas, as_list: bool) -> list[str]:
    op = op_schema.op
    if not isinstance(strategy, OpStrategy) or not strategy.strategies:
        return [f"{op}: C5 {strategy} is not a non-empty OpStrategy"]
    inputs = _inputs(op_schema)
    return [
        f"{op} OpSpec {k} {v}"
        for k, spec in enumerate(strategy.strategies)
        for v in _spec_violations(spec, inputs, expected, as_list)
    ]


def _inputs(op_schema: OpSchema) -> list[OpStrategy]:
    leaves, _ = tree_flatten((op_schema.args_schema, op_schema.kwargs_schema))
    return [x for x in leaves if isinstance(x, OpStrategy)]


def _propagator() -> Any:
    return DTensor._op_dispatcher.sharding_propagator


def registry(op: OpOverload) -> str | None:
    """Which registry answers ``op``: ``single_dim``, ``op_strategy``, ``decomposition``."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    if op in _propagator().op_single_dim_strategy_funcs:
        return "single_dim"
    return "op_strategy" if op in _propagator().op_strategy_funcs else (
        "decomposition" if DecompShardingStrategy.has_decomp(op) else None)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[OpOverload, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # Metas as they are at the call: a later in-place call may resize.
        meta = lambda x: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")  # noqa: E731
        call = (func, *tree_map_only(torch.Tensor, meta, (args, kwargs or {})))
        out = func(*args, **(kwargs or {}))
        self.calls.append(call)
        return out


@functools.cache
def opinfo_calls() -> list[tuple[str, OpOverload, tuple, dict]]:
    """Every distinct aten call that the first CPU float32 sample of an OpInfo
    in ``op_db`` makes, has a tensor input and a registry answers (once per process)."""
    from torch.testing._internal.common_methods_invocations import op_db

    seen, found = set(), []
    for opinfo in op_db:
        recorder = _Recorder()
        for sample in itertools.islice(opinfo.sample_inputs("cpu", torch.float32), 1):
            try:
                with recorder:
                    opinfo.op(sample.input, *sample.args, **sample.kwargs)
            except Exception:
                continue  # a sample the op rejects on CPU says nothing about DTensor
        for op, args, kwargs in recorder.calls:
            key = repr((op, tree_map(lambda x: (x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x,
                                     (args, kwargs))))
            if key not in seen and registry(op) and tree_any(lambda x: isinstance(x, torch.Tensor), (args, kwargs)):
                seen.add(key)
                found.append((opinfo.name, op, args, kwargs))
    return found


def _options(t: torch.Tensor, mesh: DeviceMesh) -> list[Placement]:
    dims = [d for d in range(t.dim()) if t.shape[d] and t.shape[d] % mesh.size() == 0]
    return [Replicate(), *map(Shard, dims)]


def runtime_candidate(t: torch.Tensor, mesh: DeviceMesh) -> list[tuple[Placement, ...]]:
    """The one candidate dispatch sees: sharded on the first evenly shardable dim."""
    options = _options(t, mesh)
    return [(options[min(1, len(options) - 1)],) * mesh.ndim]


def planner_candidates(t: torch.Tensor, mesh: DeviceMesh) -> list[tuple[Placement, ...]]:
    """A planner's candidates: ``Replicate`` and each evenly shardable dim per mesh dim (six at most)."""
    return list(itertools.islice(itertools.product(_options(t, mesh), repeat=mesh.ndim), 6))


def strategy_schema(op: OpOverload, args: tuple, kwargs: dict, mesh: DeviceMesh, candidates=runtime_candidate) -> OpSchema:
    """The schema a strategy function receives: each tensor an ``OpStrategy`` of
    ``candidates``, each tensor list a ``TupleStrategy``."""
    prop = _propagator()
    if registry(op) == "decomposition":
        prop.decomp_strategy.ensure_schema_info(op)

    def wrap(x: object) -> object:
        if isinstance(x, torch.Tensor):
            meta = TensorMeta(x.shape, x.stride(), x.dtype)
            return OpStrategy([OpSpec(DTensorSpec(mesh, c, tensor_meta=meta)) for c in candidates(x, mesh)])
        if isinstance(x, (list, tuple)) and x and all(isinstance(e, torch.Tensor) for e in x):
            return TupleStrategy([wrap(e) for e in x])
        return type(x)(wrap(e) for e in x) if isinstance(x, (list, tuple)) else x

    info = prop.op_to_schema_info.get(op) or prop.op_to_schema_info_for_single_dim_strategy.get(op)
    return OpSchema(op, tuple(map(wrap, args)), {k: wrap(v) for k, v in kwargs.items()}, schema_info=info)


def query_strategy(op_schema: OpSchema, mesh: DeviceMesh, runtime: bool) -> StrategyType | None:
    """The registry's strategy for ``op_schema``, asked as dispatch asks it (``runtime``:
    metas on the schema) or as a planner does (``ShardingPropagator.enumerate_strategies``)."""
    from torch.distributed.tensor._ops.single_dim_strategy import _expand_single_dim_strategy_to_mesh
    op, prop = op_schema.op, _propagator()
    if not runtime:
        return prop.enumerate_strategies(op_schema)
    spec = lambda x: x.strategies[0].output_spec if isinstance(x, OpStrategy) else (  # noqa: E731
        [spec(c) for c in x.children] if isinstance(x, TupleStrategy) else x)
    specs = OpSchema(op, *tree_map(spec, (op_schema.args_schema, op_schema.kwargs_schema),
                                   is_leaf=lambda x: isinstance(x, (OpStrategy, TupleStrategy))),
                     schema_info=op_schema.schema_info)
    metas = prop._propagate_tensor_meta_non_cached(specs)
    op_schema = dataclasses.replace(op_schema, output_tensor_meta=metas)
    if registry(op) == "single_dim":
        info = prop.op_single_dim_strategy_funcs[op]
        return _expand_single_dim_strategy_to_mesh(mesh, op_schema, info, metas)(
            op, op_schema.args_meta, op_schema.kwargs_meta)
    if registry(op) == "op_strategy":
        return prop.op_strategy_funcs[op](op_schema)
    try:
        return prop.decomp_strategy.propagate_strategy(specs, metas)
    except Exception as e:
        # Dispatch turns any failure of the decomposition path into this.
        raise NotImplementedError(f"{op} has no sharding strategy") from e


class StrategyContractTestCase(TestCase):
    """A fake process group of four ranks in this process, and the meshes
    strategies are checked on: ``"4"`` and ``"2x2"``."""

    world_size = 4

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cls.world_size)
        ranks = torch.arange(cls.world_size)
        cls.meshes = {"4": DeviceMesh("cpu", ranks), "2x2": DeviceMesh("cpu", ranks.reshape(2, 2))}

    @classmethod
    def tearDownClass(cls) -> None:
        dist.destroy_process_group()
        super().tearDownClass()
