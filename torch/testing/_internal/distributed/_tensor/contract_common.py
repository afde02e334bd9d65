# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The test base the strategy-contract tests share.

Strategy functions only need meshes and metadata, never real collectives, so
the tests run in one process on a fake process group of 8 ranks, enough for
every mesh in :data:`MESH_SHAPES`, and hold strategies to the contract of
``torch.distributed.tensor._ops.strategy_contract``.
"""

import itertools
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import cast

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    format_violations,
    infer_output_metas,
    OutputMetas,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


# The fake world: large enough for the biggest mesh below.
WORLD_SIZE = 8

# Meshes the contract tests run on: 1-D, the two 2-D shapes (square and not, so a
# mix-up of mesh dims shows) and a 3-D mesh.
MESH_SHAPES: tuple[tuple[int, ...], ...] = ((4,), (2, 2), (2, 4), (2, 2, 2))

# 1-D, 2-D and 3-D meshes for per-op tests; all fit the fake world of 8 ranks.
OP_MESHES: tuple[tuple[int, ...], ...] = ((4,), (2, 2), (2, 2, 2))

# Tests that compare with stock torch run it in another interpreter, named by this
# variable when it is not the stock venv beside the running one.
STOCK_PYTHON_ENV = "DTENSOR_STOCK_PYTHON"


def stock_python(fallback_venv: str) -> str | None:
    """The stock torch interpreter: ``$DTENSOR_STOCK_PYTHON``, else the stock venv
    beside the running one (``.venv`` -> ``.venv-stock``, ``.venv-2.14.1`` ->
    ``.venv-2.14.1-stock``), else ``fallback_venv``'s; ``None`` if there is none."""
    env = os.environ.get(STOCK_PYTHON_ENV)
    if env:
        return env
    for venv in (sys.prefix + "-stock", fallback_venv):
        candidate = os.path.join(venv, "bin", "python")
        if os.path.exists(candidate):
            return candidate
    return None


def mesh_name(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


def short_dtype(dtype: torch.dtype) -> str:
    return {
        torch.float32: "f32",
        torch.bfloat16: "bf16",
        torch.float16: "f16",
        torch.int64: "i64",
        torch.int32: "i32",
    }.get(dtype, str(dtype))


def describe(spec: object) -> str:
    """An output spec's metadata, for tables: dtype[shape]/stride, or None."""
    if spec is None:
        return "None"
    if not isinstance(spec, DTensorSpec):
        return type(spec).__name__
    meta = spec.tensor_meta
    if meta is None:
        return "no meta"
    return f"{short_dtype(meta.dtype)}{list(meta.shape)}/{tuple(meta.stride)}"


def output_tuple(spec: OpSpec) -> tuple[object, ...]:
    out = spec.output_specs
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


class StrategyContractTestBase(TestCase):
    """Base class for strategy contract tests.

    Creates one in-process fake process group per test class (unless the process
    already has one, which is then left alone) and hands out cached CPU meshes.
    """

    _owns_process_group: bool = False
    _meshes: dict[tuple[int, ...], DeviceMesh]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not dist.is_initialized():
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
            )
            cls._owns_process_group = True
        cls._meshes = {}

    @classmethod
    def tearDownClass(cls) -> None:
        # Meshes hold sub-groups of the default group: drop them with it.
        cls._meshes = {}
        if cls._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        cls._owns_process_group = False
        super().tearDownClass()

    def mesh(self, shape: Sequence[int]) -> DeviceMesh:
        """A CPU mesh of ``shape`` over ranks ``0..n-1``, built once per class."""
        key = tuple(shape)
        if key not in self._meshes:
            n = math.prod(key)
            if n > WORLD_SIZE:
                raise ValueError(
                    f"mesh {key} needs {n} ranks, the fake world has {WORLD_SIZE}"
                )
            self._meshes[key] = DeviceMesh("cpu", torch.arange(n).reshape(key))
        return self._meshes[key]

    def assert_contract(
        self,
        op_schema: OpSchema,
        strategy: StrategyType,
        output_metas: OutputMetas = None,
    ) -> None:
        """Fail, listing every violation, unless ``strategy`` meets the contract.

        ``output_metas`` defaults to shape inference on ``op_schema``; pass it
        explicitly when inference cannot run (e.g. for a data-dependent op).
        """
        if output_metas is None:
            output_metas = infer_output_metas(op_schema)
        violations = check_strategy_contract(op_schema, strategy, output_metas)
        if violations:
            self.fail(
                f"{len(violations)} contract violation(s) for {op_schema.op}:\n"
                + format_violations(violations)
            )

    def specs_of(self, strategy: StrategyType) -> list[OpSpec]:
        self.assertIsInstance(strategy, OpStrategy)
        self.assertGreater(len(strategy.strategies), 0)
        return list(strategy.strategies)

    def assert_output_metas(
        self, strategy: StrategyType, expected: Sequence[TensorMeta | None]
    ) -> None:
        """Every OpSpec's outputs carry exactly ``expected`` (None where None)."""
        for i, spec in enumerate(self.specs_of(strategy)):
            outs = output_tuple(spec)
            self.assertEqual(len(outs), len(expected), f"OpSpec {i}: {outs}")
            for pos, (out, meta) in enumerate(zip(outs, expected)):
                where = f"OpSpec {i} output {pos}"
                if meta is None:
                    self.assertIsNone(out, where)
                else:
                    self.assertIsInstance(out, DTensorSpec, where)
                    self.assertEqual(out.tensor_meta, meta, where)

    def foreach_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Two foreach lists whose elements differ in shape, so a per-element mix-up shows."""
        xs = [torch.randn(8, 12), torch.randn(4), torch.randn(2, 4, 4)]
        return xs, [torch.randn_like(t) for t in xs]

    def assert_children(
        self,
        strategy: StrategyType,
        expected: Sequence[TensorMeta | None],
        n_inputs: int,
    ) -> None:
        """A TupleStrategy with one child per element: ``expected`` output metas,
        ``n_inputs`` input specs each."""
        self.assertIsInstance(strategy, TupleStrategy)
        children = cast(TupleStrategy, strategy).children
        self.assertEqual(len(children), len(expected))
        for i, (child, meta) in enumerate(zip(children, expected)):
            with self.subTest(child=i):
                self.assert_output_metas(child, [meta])
                for spec in self.specs_of(child):
                    self.assertEqual(len(spec.input_specs or ()), n_inputs)


def planner_candidates(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """Every placement tuple a planner would consider for a tensor with ``meta``.

    Per mesh dim: ``Replicate()``, ``Shard(d)`` for each tensor dim, and
    ``Partial()`` for floating dtypes; tuples are taken in ``itertools.product``
    order. A tuple is dropped when a tensor dim is split into more pieces than it
    has elements, so that every rank holds a non-empty shard. The order is fixed,
    which keeps strategy indices in failure messages stable.
    """
    per_dim: list[Placement] = [Replicate()]
    per_dim += [Shard(d) for d in range(len(meta.shape))]
    if meta.dtype.is_floating_point:
        per_dim.append(Partial())
    candidates = []
    for combo in itertools.product(per_dim, repeat=mesh.ndim):
        pieces = [1] * len(meta.shape)
        for mesh_dim, p in enumerate(combo):
            if isinstance(p, Shard):
                pieces[p.dim] *= mesh.size(mesh_dim)
        if all(n <= size for n, size in zip(pieces, meta.shape)):
            candidates.append(combo)
    return candidates


def sharded_candidate(
    avoid: Sequence[int] = (),
) -> Callable[[DeviceMesh, TensorMeta], list[tuple[Placement, ...]]]:
    """One evenly sharded candidate per input: mesh dim i shards the first
    tensor dim from i on (cyclically, skipping ``avoid``) that divides evenly,
    and replicates when none does."""

    def candidates(mesh: DeviceMesh, meta: TensorMeta) -> list[tuple[Placement, ...]]:
        ndim = len(meta.shape)
        pieces = [1] * ndim
        placements: list[Placement] = []
        for mesh_dim in range(mesh.ndim):
            chosen: Placement = Replicate()
            for k in range(ndim):
                d = (mesh_dim + k) % ndim
                n = pieces[d] * mesh.size(mesh_dim)
                if d not in avoid and meta.shape[d] % n == 0:
                    pieces[d] = n
                    chosen = Shard(d)
                    break
            placements.append(chosen)
        return [tuple(placements)]

    return candidates


Call = tuple[torch._ops.OpOverload, tuple[object, ...], dict[str, object]]


def attention_calls(
    batch: int = 4, heads: int = 4, seq: int = 8, head_dim: int = 16
) -> dict[torch._ops.OpOverload, Call]:
    """One call of each fused attention kernel and of its backward, tensors as metas.

    ``scaled_dot_product_attention`` on CPU only reaches the CPU flash kernel, so
    no OpInfo sample calls the CUDA kernels DTensor has strategies for. Their
    meta kernels run on fake CPU tensors: the forward calls run there, and each
    backward call gets the forward's real results (the padded ``logsumexp``, the
    RNG state), as autograd would pass them. Only the ops this torch has appear.
    """
    from torch._subclasses import FakeTensorMode

    aten = torch.ops.aten
    calls: dict[torch._ops.OpOverload, Call] = {}

    def metas(x: object) -> object:
        if isinstance(x, torch.Tensor):
            return TensorMeta(x.shape, x.stride(), x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(metas(e) for e in x)
        return x

    def add(op: torch._ops.OpOverload, *args: object) -> tuple[object, ...]:
        calls[op] = (op, cast(tuple[object, ...], metas(args)), {})
        return cast(tuple[object, ...], op(*args))

    with FakeTensorMode():
        q, k, v, grad = (torch.randn(batch, heads, seq, head_dim) for _ in range(4))
        bias = torch.randn(batch, heads, seq, seq)
        out, lse, seed, offset = add(
            aten._scaled_dot_product_efficient_attention.default, q, k, v, bias, True
        )
        add(
            aten._scaled_dot_product_efficient_attention_backward.default,
            grad,
            q,
            k,
            v,
            bias,
            out,
            lse,
            seed,
            offset,
            0.0,
            [True, True, True, True],
        )
        out, lse, cum_q, cum_k, max_q, max_k, rng, unused, _ = add(
            aten._scaled_dot_product_flash_attention.default, q, k, v
        )
        add(
            aten._scaled_dot_product_flash_attention_backward.default,
            grad,
            q,
            k,
            v,
            out,
            lse,
            cum_q,
            cum_k,
            max_q,
            max_k,
            0.0,
            False,
            rng,
            unused,
        )
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = add(
            aten._scaled_dot_product_cudnn_attention.default, q, k, v, None, True
        )
        add(
            aten._scaled_dot_product_cudnn_attention_backward.default,
            grad,
            q,
            k,
            v,
            out,
            lse,
            seed,
            offset,
            None,
            cum_q,
            cum_k,
            max_q,
            max_k,
            0.0,
            False,
        )
        out, lse = add(
            aten._scaled_dot_product_flash_attention_for_cpu.default, q, k, v
        )
        add(
            aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad,
            q,
            k,
            v,
            out,
            lse,
            0.0,
            False,
        )
    return calls
