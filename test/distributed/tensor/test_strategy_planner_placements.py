# Owner(s): ["oncall: distributed"]
"""``enumerate_strategies`` on calls of each op family, with candidates from every
placement, even and uneven, on 1-, 2- and 3-D meshes: its answer meets the contract
or is ``NotImplementedError``, and a strategy drawn from it runs eagerly as torch."""

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple
from unittest import mock

import torch
import torch.distributed.tensor._sharding_prop as sharding_prop
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_validation import _create_partial_input
from torch.distributed.tensor._ops.utils import is_tensor_evenly_shardable
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_flatten, tree_map_only, tree_unflatten

aten = torch.ops.aten
PLANNER = DTensor._op_dispatcher.sharding_propagator.enumerate_strategies
MESH_SHAPES = ((8,), (2, 4), (2, 2, 2))
# Sizes that shard evenly and unevenly (or leave ranks empty) on those meshes.
SIZES = st.sampled_from((1, 2, 3, 4, 5, 6, 8))
REDUCTIONS = [aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default]
REDUCTIONS += [aten.logsumexp.default, aten.var.correction, aten.max.dim]
REDUCTIONS += [aten.argmax.default, aten.prod.dim_int]
POINTWISE = [aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.maximum.default]


class Call(NamedTuple):
    op: torch._ops.OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def shape(min_dims: int = 1, max_dims: int = 3) -> st.SearchStrategy[list[int]]:
    return st.lists(SIZES, min_size=min_dims, max_size=max_dims)


def randn(*sizes: int) -> torch.Tensor:
    return torch.randn(sizes)


@st.composite
def views(draw: st.DrawFn) -> Call:
    x = randn(*draw(shape()))
    n, dims = x.dim(), list(x.shape)
    dim = draw(st.integers(0, n - 1))
    kind = draw(st.sampled_from(("view", "flatten", "unflatten", "expand", "other")))
    if kind in ("view", "flatten"):  # merge a run of dims, or split one in two
        start = draw(st.integers(0, n - 1))
        end = draw(st.integers(start, n - 1))
        if kind == "flatten":
            return Call(aten.flatten.using_ints, (x, start, end), {})
        merged = dims[:start] + [math.prod(dims[start : end + 1])] + dims[end + 1 :]
        size = merged[start]
        factor = draw(st.sampled_from([f for f in (1, 2, 3, 4) if size % f == 0]))
        target = merged[:start] + [factor, size // factor] + merged[start + 1 :]
        if draw(st.booleans()):
            target[draw(st.integers(0, len(target) - 1))] = -1
        op = draw(st.sampled_from((aten.view.default, aten.reshape.default)))
        return Call(op, (x, target), {})
    if kind == "unflatten":
        factor = draw(st.sampled_from([f for f in (1, 2, 3) if dims[dim] % f == 0]))
        return Call(aten.unflatten.int, (x, dim, [factor, -1]), {})
    if kind == "expand":
        ones = randn(*[1 if draw(st.booleans()) else s for s in dims])
        lead = draw(st.lists(SIZES, max_size=1))
        return Call(aten.expand.default, (ones, lead + dims), {})
    other = draw(st.sampled_from(("permute", "transpose", "squeeze", "unsqueeze")))
    if other == "permute":
        perm = draw(st.permutations(range(n)))
        return Call(aten.permute.default, (x, perm), {})
    if other == "transpose":
        return Call(aten.transpose.int, (x, dim, draw(st.integers(0, n - 1))), {})
    if other == "squeeze":
        return Call(aten.squeeze.dim, (x, dim), {})
    return Call(aten.unsqueeze.default, (x, draw(st.integers(0, n))), {})


@st.composite
def unbinds(draw: st.DrawFn) -> Call:
    x = randn(*draw(shape()))
    return Call(aten.unbind.int, (x, draw(st.integers(0, x.dim() - 1))), {})


@st.composite
def splits(draw: st.DrawFn) -> Call:
    x = randn(*draw(shape()))
    dim = draw(st.integers(0, x.dim() - 1))
    size = x.shape[dim]
    kind = draw(st.sampled_from(("split", "split_with_sizes", "chunk")))
    if kind == "split":
        return Call(aten.split.Tensor, (x, draw(st.integers(1, size)), dim), {})
    if kind == "chunk":
        return Call(aten.chunk.default, (x, draw(st.integers(1, 4)), dim), {})
    first = draw(st.integers(0, size))
    return Call(aten.split_with_sizes.default, (x, [first, size - first], dim), {})


@st.composite
def cats(draw: st.DrawFn) -> Call:
    dims = draw(shape())
    dim = draw(st.integers(0, len(dims) - 1))
    count = draw(st.integers(1, 3))
    if draw(st.booleans()):
        return Call(aten.stack.default, ([randn(*dims) for _ in range(count)], dim), {})
    parts = [randn(*dims[:dim], draw(SIZES), *dims[dim + 1 :]) for _ in range(count)]
    return Call(aten.cat.default, (parts, dim), {})


@st.composite
def reductions(draw: st.DrawFn) -> Call:
    x = randn(*draw(shape()))
    dims = draw(st.lists(st.integers(0, x.dim() - 1), min_size=1, unique=True))
    keepdim = draw(st.booleans())
    op = draw(st.sampled_from(REDUCTIONS))
    if op is aten.var.correction:
        return Call(op, (x, dims), {"correction": 0, "keepdim": keepdim})
    if op in (aten.max.dim, aten.argmax.default, aten.prod.dim_int):
        return Call(op, (x, dims[0], keepdim), {})
    return Call(op, (x, dims, keepdim), {})


@st.composite
def matmuls(draw: st.DrawFn) -> Call:
    b, m, k, n = (draw(SIZES) for _ in range(4))
    kind = draw(st.sampled_from(("mm", "bmm", "addmm", "einsum")))
    if kind == "mm":
        return Call(aten.mm.default, (randn(m, k), randn(k, n)), {})
    if kind == "bmm":
        return Call(aten.bmm.default, (randn(b, m, k), randn(b, k, n)), {})
    if kind == "addmm":
        bias = randn(n) if draw(st.booleans()) else randn(m, n)
        return Call(aten.addmm.default, (bias, randn(m, k), randn(k, n)), {})
    return Call(
        aten.einsum.default, ("bmk,bkn->bmn", [randn(b, m, k), randn(b, k, n)]), {}
    )


@st.composite
def pointwise(draw: st.DrawFn) -> Call:
    dims = draw(shape())
    x = randn(*dims)
    tail = dims[draw(st.integers(0, len(dims) - 1)) :]  # broadcast from the right
    y = randn(*[1 if draw(st.booleans()) else s for s in tail])
    op = draw(st.sampled_from(POINTWISE))
    if draw(st.booleans()):
        return Call(aten.where.self, (x > 0, x, y), {})
    return Call(op, (x, y) if draw(st.booleans()) else (y, x), {})


@st.composite
def decomposed(draw: st.DrawFn) -> Call:
    dims = draw(shape())
    x = randn(*dims)
    kind = draw(st.sampled_from(("hardswish", "glu", "mse_loss", "trace", "softmax")))
    if kind == "hardswish":
        return Call(aten.hardswish.default, (x,), {})
    if kind == "glu":
        return Call(aten.glu.default, (randn(*dims[:-1], 2 * dims[-1]), -1), {})
    if kind == "mse_loss":
        reduction = draw(st.integers(0, 2))
        return Call(aten.mse_loss.default, (x, randn(*dims), reduction), {})
    if kind == "trace":
        return Call(aten.trace.default, (randn(*dims[:1], draw(SIZES)),), {})
    return Call(aten.softmax.int, (x, draw(st.integers(0, x.dim() - 1))), {})


@st.composite
def placements(draw: st.DrawFn, mesh: DeviceMesh, t: torch.Tensor) -> tuple:
    reduce_op = draw(st.sampled_from(("sum", "avg", "max", "min")))  # one per tensor
    dims, factors = st.integers(0, max(t.dim() - 1, 0)), st.sampled_from((2, 4))
    strided = st.builds(_StridedShard, dims, split_factor=factors)
    shards = [st.builds(Shard, dims), strided]
    options = [st.just(Replicate())] + shards * bool(t.dim())
    options += [st.just(Partial(reduce_op))] * t.is_floating_point()
    return tuple(draw(st.one_of(options)) for _ in range(mesh.ndim))


def meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def held_spec(mesh: DeviceMesh, placements: tuple, t: torch.Tensor) -> DTensorSpec:
    """A spec DTensor can hold, on 1-D and 2-D meshes: a ``_StridedShard`` as a shard
    order (FSDP2+TP, even or not) or an even layout; else ``Shard``."""
    spec = DTensorSpec(mesh, placements, tensor_meta=meta(t))
    if not any(isinstance(p, _StridedShard) for p in placements):
        return spec
    order = DTensorSpec._maybe_convert_StridedShard_to_shard_order(placements, mesh)
    if order and mesh.ndim < 3:  # 3-D: DTensor gathers neither reading back
        return spec
    strided = DTensorSpec(mesh, placements, meta(t), None, False)  # as a layout
    if is_tensor_evenly_shardable(t.shape, strided) and mesh.ndim < 3:
        return strided
    plain = tuple(
        Shard(p.dim) if isinstance(p, _StridedShard) else p for p in placements
    )
    return DTensorSpec(mesh, plain, tensor_meta=meta(t))


@st.composite
def planner_schema(draw: st.DrawFn, call: Call, mesh: DeviceMesh) -> OpSchema:
    """The planner's query: each tensor one to four candidate placements."""

    def candidates(t: torch.Tensor) -> OpStrategy:
        options = st.lists(placements(mesh, t), min_size=1, max_size=4)
        specs = dict.fromkeys(held_spec(mesh, p, t) for p in draw(options))
        return OpStrategy([OpSpec(s) for s in specs])

    def wrap(x: object) -> object:
        if isinstance(x, list) and x and all(map(torch.is_tensor, x)):
            return TupleStrategy([candidates(t) for t in x])
        return candidates(x) if torch.is_tensor(x) else x

    kwargs = {k: wrap(v) for k, v in call.kwargs.items()}
    return OpSchema(call.op, tuple(map(wrap, call.args)), kwargs)


def local_shards(t: torch.Tensor, mesh: DeviceMesh, spec: DTensorSpec) -> LocalTensor:
    """Each rank's piece of ``t`` placed by ``spec``, mesh dims split left to right;
    Partial pieces as ``strategy_validation`` makes them."""
    pieces = {}
    for coord in itertools.product(*map(range, mesh.shape)):
        local = t
        for dim, p in enumerate(spec.placements):
            if isinstance(p, Shard | _StridedShard):
                local = p._split_tensor(local, mesh.size(dim), with_padding=False)[0]
                local = local[coord[dim]]
            elif isinstance(p, Partial) and p.reduce_op == "product":
                local = local if coord[dim] == 0 else torch.ones_like(local)
            elif isinstance(p, Partial) and local.numel():
                split = _create_partial_input(local, p, mesh.size(dim), dim)
                local = split._local_tensors[coord[dim]]
        pieces[int(mesh.mesh[coord])] = local.clone()
    return LocalTensor(pieces)


def placements_of(spec: OpSpec) -> object:
    specs = (spec.input_specs, spec.output_specs)
    return tree_map_only(DTensorSpec, lambda s: s.placements, specs)


@contextlib.contextmanager
def choosing(op: torch._ops.OpOverload, spec: OpSpec) -> Iterator[None]:
    """Dispatch picks ``spec`` for ``op``, as a planner that chose it would."""
    select, wanted = sharding_prop._select_min_cost_strategy, placements_of(spec)

    def pick(strategy: OpStrategy, op_schema: OpSchema | None = None) -> OpSpec:
        if op_schema is None or op_schema.op != op:
            return select(strategy, op_schema)
        for candidate in strategy.strategies:
            if placements_of(candidate) == wanted:
                return candidate
        raise AssertionError(f"eager DTensor does not offer {spec}: {strategy}")

    _clear_sharding_prop_cache()
    try:
        with mock.patch.object(sharding_prop, "_select_min_cost_strategy", pick):
            yield
    finally:
        _clear_sharding_prop_cache()


FAMILIES = [views, unbinds, splits, cats, reductions, matmuls, pointwise, decomposed]


class TestPlannerPlacements(LocalDTensorTestBase):
    @property
    def world_size(self) -> int:
        return 8

    def check(self, data: st.DataObject, calls: st.SearchStrategy[Call]) -> None:
        mesh = init_device_mesh("cpu", data.draw(st.sampled_from(MESH_SHAPES)))
        torch.manual_seed(data.draw(st.integers(0, 2**16)))  # the values, per example
        call = data.draw(calls)
        schema = data.draw(planner_schema(call, mesh))
        try:
            strategy = PLANNER(schema)
        except NotImplementedError as e:
            event(f"refused: {call.op}")
            self.assertIn(str(call.op), str(e))
            return
        expected = sc.expected_output_metas(schema)
        violations = sc.contract_violations(schema, strategy, expected)
        self.assertFalse(violations, "\n".join(violations))
        self.assertIsInstance(strategy, OpStrategy)
        spec = data.draw(st.sampled_from(strategy.strategies))
        self.run_eagerly(call, mesh, spec)

    def run_eagerly(self, call: Call, mesh: DeviceMesh, spec: OpSpec) -> None:
        """``call`` on DTensors placed as ``spec`` asks, with ``spec`` chosen."""
        flat, tree = tree_flatten((call.args, call.kwargs))
        tensors = [x for x in flat if torch.is_tensor(x)]
        targets = [
            s.shallow_copy_with_tensor_meta(meta(t))
            for t, s in zip(tensors, spec.input_specs or ())
        ]
        pieces = [local_shards(t, mesh, s) for t, s in zip(tensors, targets)]
        expected = tree_flatten(call.op(*call.args, **call.kwargs))[0]
        # Composite ops reach DTensor's dispatch as called in inference mode
        with LocalTensorMode(frozenset(range(self.world_size))), torch.inference_mode():
            dtensors = iter(
                DTensor(p, s, requires_grad=False) for s, p in zip(targets, pieces)
            )
            flat = [next(dtensors) if torch.is_tensor(x) else x for x in flat]
            args, kwargs = tree_unflatten(flat, tree)
            with choosing(call.op, spec):
                results = tree_flatten(call.op(*args, **kwargs))[0]
            got = [r.full_tensor() if isinstance(r, DTensor) else r for r in results]
        self.assertEqual(len(got), len(expected))
        for g, w in zip(got, expected):
            torch.testing.assert_close(g, w, equal_nan=True, atol=1e-4, rtol=1e-4)

    @with_comms
    @parametrize("family", FAMILIES, name_fn=lambda f: f.__name__)
    @settings(deadline=None)  # examples: as the loaded profile asks (pytorch_ci: 50)
    @given(data=st.data())
    def test_family(self, family: Callable, data: st.DataObject) -> None:
        self.check(data, family())


instantiate_parametrized_tests(TestPlannerPlacements)

if __name__ == "__main__":
    run_tests()
