# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Targeted strategy-contract tests for the ops planners query most.

Every test asks DTensor's strategy machinery for an op's strategy the way a
planner or a direct caller does (see ``query_strategy``), on a 1-D, a 2-D and a
3-D mesh, in three modes:

* ``replicate``: every tensor input offers one replicated candidate (eager
  dispatch of replicated DTensors),
* ``sharded``: every tensor input offers one sharded candidate (eager dispatch
  of sharded DTensors),
* ``planner``: every tensor input offers many candidates at once.

Each strategy is held to the contract C1-C5, and then to the one property of
the op a consumer is most likely to get wrong when it reads the specs as they
are: masked-off gradients, index dtypes, view strides, per-element list
results, in-place placements, factory dtypes, ops without tensor results.
Expected metadata comes from eager kernels on real tensors wherever they run on
CPU, so the tests do not lean on the shape inference the machinery itself uses.
"""

import random
from collections.abc import Callable, Sequence

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor, DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.strategy_contract import (
    infer_output_metas,
    op_has_tensor_returns,
    tensor_inputs,
)
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor.placement_types import (
    _StridedShard,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    meta_of,
    planner_candidates,
    query_strategy,
    replicated_candidate,
    strategy_registry,
    strategy_schema,
    StrategyContractTestBase,
)
from torch.utils import _pytree as pytree


aten = torch.ops.aten
prims = torch.ops.prims

# 1-D, 2-D and 3-D meshes; all fit the harness's fake world of 8 ranks.
MESHES: tuple[tuple[int, ...], ...] = ((4,), (2, 2), (2, 2, 2))
MODES = ("replicate", "sharded", "planner")

# A planner query offers at most this many candidates per tensor input. All of
# them would make 3-D queries of multi-input ops take seconds each; a fixed
# sample still mixes Replicate, every Shard(d) and Partial across mesh dims.
PLANNER_CANDIDATE_LIMIT = 12

Candidates = Callable[[DeviceMesh, TensorMeta], Sequence[Sequence[Placement]]]


def mesh_name(shape: tuple[int, ...]) -> str:
    return "x".join(str(s) for s in shape)


def sharded_candidate(avoid: Sequence[int] = ()) -> Candidates:
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


def sampled_planner_candidates(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """``planner_candidates``, cut to a fixed sample of at most the limit.

    The replicated candidate and an evenly sharded one are always kept, so a
    planner query offers what both runtime queries offer (unless they avoid dims).
    """
    everything = planner_candidates(mesh, meta)
    if len(everything) <= PLANNER_CANDIDATE_LIMIT:
        return everything
    keep = {everything[0], *map(tuple, sharded_candidate()(mesh, meta))}
    rest = [c for c in everything if c not in keep]
    picked = set(random.Random(len(everything)).sample(rest, PLANNER_CANDIDATE_LIMIT - len(keep)))
    return [c for c in everything if c in keep or c in picked]


def mode_candidates(mode: str, avoid: Sequence[int] = ()) -> Candidates:
    """The candidates of ``mode``. ``avoid`` lists tensor dims the ``sharded``
    mode leaves alone, because the op refuses them at runtime (e.g. the dim
    ``unbind`` removes); a planner query offers them anyway and the strategy
    must drop them, not fail."""
    if mode == "replicate":
        return replicated_candidate
    if mode == "sharded":
        return sharded_candidate(avoid)
    if mode == "planner":
        return sampled_planner_candidates
    raise ValueError(mode)


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


class TestStrategyContractOps(StrategyContractTestBase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # Test-only ops for the bad-strategy tests, so no real op's registration
        # is touched; they are defined while this class runs.
        lib = cls.enterClassContext(
            torch.library._scoped_library("strategy_contract_ops_test", "DEF")
        )
        lib.define("one_out(Tensor x) -> Tensor")
        lib.define("two_out(Tensor x) -> (Tensor, Tensor)")
        lib.define("list_out(Tensor[] xs) -> Tensor[]")
        lib.impl("one_out", lambda x: x.clone(), "CompositeExplicitAutograd")
        lib.impl("two_out", lambda x: (x.clone(), x.sum(0)), "CompositeExplicitAutograd")
        lib.impl("list_out", lambda xs: [x.clone() for x in xs], "CompositeExplicitAutograd")

    # ---- helpers ----

    def query(
        self,
        shape: tuple[int, ...],
        mode: str,
        op: torch._ops.OpOverload,
        args: Sequence[object],
        kwargs: dict[str, object] | None = None,
        avoid: Sequence[int] = (),
    ) -> tuple[OpSchema, StrategyType]:
        """Query ``op``'s strategy in ``mode`` and assert the contract on it."""
        mesh = self.mesh(shape)
        schema = strategy_schema(mesh, op, args, kwargs, mode_candidates(mode, avoid))
        strategy = query_strategy(schema, mesh)
        self.assertIsNotNone(
            strategy,
            f"{op} ({strategy_registry(op)}) gave no strategy for a {mode} query",
        )
        self.assert_contract(schema, strategy)
        return schema, strategy

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

    def output_table(
        self, cases: Sequence[tuple[str, torch._ops.OpOverload, tuple, dict]]
    ) -> str:
        """Query every case on every mesh in every mode (asserting the contract)
        and tabulate, per case and output position, the distinct output metas
        found across all OpSpecs; one entry per cell means every spec agrees."""
        rows = []
        for label, op, args, kwargs in cases:
            cells: list[list[str]] = []
            for shape in MESHES:
                for mode in MODES:
                    with self.subTest(case=label, mesh=shape, mode=mode):
                        _, strategy = self.query(shape, mode, op, args, kwargs)
                        for spec in self.specs_of(strategy):
                            for pos, out in enumerate(output_tuple(spec)):
                                while len(cells) <= pos:
                                    cells.append([])
                                text = describe(out)
                                if text not in cells[pos]:
                                    cells[pos].append(text)
            rows.append(f"{label}: " + " | ".join(" / ".join(c) for c in cells))
        return "\n".join(rows)

    # ---- backward ops with output masks ----

    def test_convolution_backward_output_mask(self) -> None:
        x, w = torch.randn(4, 3, 8, 8), torch.randn(6, 3, 3, 3)
        grad_out = torch.randn(4, 6, 4, 4)  # stride 2, padding 1
        conv = ([6], [2, 2], [1, 1], [1, 1], False, [0, 0], 1)
        cases = []
        for bits in range(8):
            mask = [bool(bits & 4), bool(bits & 2), bool(bits & 1)]
            label = "".join("T" if m else "F" for m in mask)
            cases.append(
                (label, aten.convolution_backward.default, (grad_out, x, w, *conv, mask), {})
            )
        # channels-last activations: grad_input and grad_weight follow that format
        x_cl = x.to(memory_format=torch.channels_last)
        g_cl = grad_out.to(memory_format=torch.channels_last)
        cases.append(
            ("TTT cl", aten.convolution_backward.default, (g_cl, x_cl, w, *conv, [True] * 3), {})
        )
        self.assertExpectedInline(
            self.output_table(cases),
            """\
FFF: None | None | None
FFT: None | None | f32[6]/(1,)
FTF: None | f32[6, 3, 3, 3]/(27, 9, 3, 1) | None
FTT: None | f32[6, 3, 3, 3]/(27, 9, 3, 1) | f32[6]/(1,)
TFF: f32[4, 3, 8, 8]/(192, 64, 8, 1) | None | None
TFT: f32[4, 3, 8, 8]/(192, 64, 8, 1) | None | f32[6]/(1,)
TTF: f32[4, 3, 8, 8]/(192, 64, 8, 1) | f32[6, 3, 3, 3]/(27, 9, 3, 1) | None
TTT: f32[4, 3, 8, 8]/(192, 64, 8, 1) | f32[6, 3, 3, 3]/(27, 9, 3, 1) | f32[6]/(1,)
TTT cl: f32[4, 3, 8, 8]/(192, 1, 24, 3) | f32[6, 3, 3, 3]/(27, 1, 9, 3) | f32[6]/(1,)""",
        )

    def test_native_layer_norm_backward_output_mask(self) -> None:
        x, grad = torch.randn(4, 6, 8), torch.randn(4, 6, 8)
        mean, rstd = torch.randn(4, 6, 1), torch.rand(4, 6, 1)
        w, b = torch.randn(8), torch.randn(8)
        op = aten.native_layer_norm_backward.default
        cases = []
        for bits in range(8):
            mask = [bool(bits & 4), bool(bits & 2), bool(bits & 1)]
            label = "".join("T" if m else "F" for m in mask)
            cases.append((label, op, (grad, x, [8], mean, rstd, w, b, mask), {}))
        # without affine parameters, with the masks autograd passes then
        no_affine = (grad, x, [8], mean, rstd, None, None, [True, False, False])
        cases.append(("TFF no w/b", op, no_affine, {}))
        cases.append(("TTF no b", op, (grad, x, [8], mean, rstd, w, None, [True, True, False]), {}))
        # a 0-element input: shape inference gives grad_weight/grad_bias without
        # weight/bias, so every rule (sharded ones too) must place them
        x0, m0 = torch.randn(4, 0, 2), torch.randn(4, 1, 1)
        cases.append(("TTT 0-elem no w/b", op, (x0, x0, [0, 2], m0, m0, None, None, [True] * 3), {}))
        self.assertExpectedInline(
            self.output_table(cases),
            """\
FFF: None | None | None
FFT: None | None | f32[8]/(1,)
FTF: None | f32[8]/(1,) | None
FTT: None | f32[8]/(1,) | f32[8]/(1,)
TFF: f32[4, 6, 8]/(48, 8, 1) | None | None
TFT: f32[4, 6, 8]/(48, 8, 1) | None | f32[8]/(1,)
TTF: f32[4, 6, 8]/(48, 8, 1) | f32[8]/(1,) | None
TTT: f32[4, 6, 8]/(48, 8, 1) | f32[8]/(1,) | f32[8]/(1,)
TFF no w/b: f32[4, 6, 8]/(48, 8, 1) | None | None
TTF no b: f32[4, 6, 8]/(48, 8, 1) | f32[8]/(1,) | None
TTT 0-elem no w/b: f32[4, 0, 2]/(2, 2, 1) | f32[0, 2]/(2, 1) | f32[0, 2]/(2, 1)""",
        )

    def test_fused_rms_norm_backward_output_mask(self) -> None:
        x, grad = torch.randn(4, 6, 8), torch.randn(4, 6, 8)
        rstd, w = torch.rand(4, 6, 1), torch.randn(8)
        op = aten._fused_rms_norm_backward.default
        cases = []
        for bits in range(4):
            mask = [bool(bits & 2), bool(bits & 1)]
            label = "".join("T" if m else "F" for m in mask)
            cases.append((label, op, (grad, x, [8], rstd, w, mask), {}))
        cases.append(("TF no w", op, (grad, x, [8], rstd, None, [True, False]), {}))
        x0, r0 = torch.randn(4, 0, 2), torch.randn(4, 1, 1)
        cases.append(("TT 0-elem no w", op, (x0, x0, [0, 2], r0, None, [True, True]), {}))
        self.assertExpectedInline(
            self.output_table(cases),
            """\
FF: None | None
FT: None | f32[8]/(1,)
TF: f32[4, 6, 8]/(48, 8, 1) | None
TT: f32[4, 6, 8]/(48, 8, 1) | f32[8]/(1,)
TF no w: f32[4, 6, 8]/(48, 8, 1) | None
TT 0-elem no w: f32[4, 0, 2]/(2, 2, 1) | f32[0, 2]/(2, 1)""",
        )

    # ---- attention backward ----

    def sdpa_tensors(self) -> dict[str, torch.Tensor]:
        b, h, length, e = 4, 4, 8, 16
        return {
            "q": torch.randn(b, h, length, e),
            "k": torch.randn(b, h, length, e),
            "v": torch.randn(b, h, length, e),
            "out": torch.randn(b, h, length, e),
            "grad": torch.randn(b, h, length, e),
            "bias": torch.randn(b, h, length, length),
            "seed": torch.zeros((), dtype=torch.int64),
            "offset": torch.zeros((), dtype=torch.int64),
        }

    def test_efficient_attention_backward(self) -> None:
        t = self.sdpa_tensors()
        # the CUDA kernel pads logsumexp's last dim to a multiple of 32
        lse = torch.randn(4, 4, 32)
        op = aten._scaled_dot_product_efficient_attention_backward.default

        def args(bias, mask):
            return (t["grad"], t["q"], t["k"], t["v"], bias, t["out"], lse,
                    t["seed"], t["offset"], 0.0, mask)

        # Only grad_input_mask[3] (the bias) masks a result: the kernel computes
        # the q/k/v gradients whatever the mask, laid out (batch, seq, heads, dim).
        # grad_bias is a view of a buffer padded to a multiple of 16 in its last
        # dim, so its strides are not the bias's.
        cases = [
            ("bias TTTT", op, args(t["bias"], [True] * 4), {}),
            ("bias TTTF", op, args(t["bias"], [True, True, True, False]), {}),
            ("bias FTFT", op, args(t["bias"], [False, True, False, True]), {}),
            ("no bias TTTT", op, args(None, [True] * 4), {}),
            ("no bias TTTF", op, args(None, [True, True, True, False]), {}),
        ]
        self.assertExpectedInline(
            self.output_table(cases),
            """\
bias TTTT: f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 8]/(512, 128, 16, 1)
bias TTTF: f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | None
bias FTFT: f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 8]/(512, 128, 16, 1)
no bias TTTT: f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | None
no bias TTTF: f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | f32[4, 4, 8, 16]/(512, 16, 64, 1) | None""",  # noqa: B950
        )

    def test_flash_attention_backward(self) -> None:
        t = self.sdpa_tensors()
        lse = torch.randn(4, 4, 8)
        cum_seq = torch.empty(0, dtype=torch.int64)
        op = aten._scaled_dot_product_flash_attention_backward.default
        args = (t["grad"], t["q"], t["k"], t["v"], t["out"], lse, cum_seq, cum_seq,
                8, 8, 0.0, False, t["seed"], t["offset"])
        self.assertExpectedInline(
            self.output_table([("flash", op, args, {})]),
            """flash: f32[4, 4, 8, 16]/(512, 128, 16, 1) | f32[4, 4, 8, 16]/(512, 128, 16, 1) | f32[4, 4, 8, 16]/(512, 128, 16, 1)""",  # noqa: B950
        )

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_attention_rank_local_outputs(self, shape: tuple[int, ...]) -> None:
        """The attention ops return their RNG state (and unused buffers) as tensors
        no rule gives a placement: they stay None in every spec, as DTensor hands
        them back as plain per-rank tensors, and the other outputs carry metas."""
        q = torch.randn(2, 4, 8, 16)
        cases = [
            (aten._scaled_dot_product_efficient_attention.default,
             (q, q, q, None, False), (2, 3)),
            (aten._scaled_dot_product_flash_attention.default, (q, q, q), (2, 3, 7)),
        ]
        for op, args, local in cases:
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    for i, spec in enumerate(self.specs_of(strategy)):
                        outs = output_tuple(spec)
                        for pos in local:
                            self.assertIsNone(outs[pos], f"OpSpec {i} output {pos}")
                        self.assertIsInstance(outs[0], DTensorSpec, f"OpSpec {i}")

    def test_flash_attention_for_cpu(self) -> None:
        t = self.sdpa_tensors()
        op = aten._scaled_dot_product_flash_attention_for_cpu.default
        expected = [meta_of(r) for r in op(t["q"], t["k"], t["v"])]
        # logsumexp is laid out (batch, seq, heads): not contiguous
        self.assertFalse(torch.empty_strided(expected[1].shape, expected[1].stride).is_contiguous())
        for shape in MESHES:
            for mode in MODES:
                with self.subTest(mesh=shape, mode=mode):
                    _, strategy = self.query(shape, mode, op, (t["q"], t["k"], t["v"]))
                    self.assert_output_metas(strategy, expected)

    def test_flash_attention_for_cpu_backward(self) -> None:
        op = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
        if strategy_registry(op) is None:
            self.skipTest(f"{op} has no DTensor sharding strategy (no registry, no decomposition)")
        t = self.sdpa_tensors()
        fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
        out, lse = fwd(t["q"], t["k"], t["v"])
        args = (t["grad"], t["q"], t["k"], t["v"], out, lse, 0.0, False)
        expected = [meta_of(r) for r in op(*args)]
        for shape in MESHES:
            for mode in MODES:
                with self.subTest(mesh=shape, mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_output_metas(strategy, expected)

    # ---- index outputs ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_index_outputs_are_int64(self, shape: tuple[int, ...]) -> None:
        x = torch.randn(8, 12).bfloat16()
        cases = [
            (aten.max.dim, (x, 1), torch.max(x, 1)),
            (aten.min.dim, (x, 0, True), torch.min(x, 0, True)),
            (aten.sort.default, (x, 1), torch.sort(x, 1)),
            (aten.topk.default, (x, 3, 1), torch.topk(x, 3, 1)),
        ]
        for op, args, result in cases:
            values, indices = (meta_of(r) for r in result)
            self.assertEqual((values.dtype, indices.dtype), (torch.bfloat16, torch.int64))
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_output_metas(strategy, [values, indices])

    # ---- dtype conversion ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_dtype_conversion_output_dtype(self, shape: tuple[int, ...]) -> None:
        x = torch.randn(8, 12).bfloat16()
        cases = [
            (prims.convert_element_type.default, (x, torch.float32), {}),
            (aten._to_copy.default, (x,), {"dtype": torch.float32}),
        ]
        expected = meta_of(x.float())
        for op, args, kwargs in cases:
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, kwargs)
                    self.assert_output_metas(strategy, [expected])
                    for spec in self.specs_of(strategy):
                        self.assertEqual(spec.input_specs[0].tensor_meta.dtype, torch.bfloat16)

    # ---- view ops: the op's strides ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_view_ops_output_strides(self, shape: tuple[int, ...]) -> None:
        x, y, z = torch.randn(8, 12), torch.randn(4, 8, 8), torch.randn(4, 1, 8)
        # (op, args, avoid: tensor dims the sharded mode leaves alone, result)
        cases = [
            (aten.t.default, (x,), (), x.t()),
            (aten.transpose.int, (y, 0, 2), (), y.transpose(0, 2)),
            (aten.select.int, (y, 1, 2), (1,), y.select(1, 2)),
            (aten.diagonal.default, (y, 0, 1, 2), (1, 2), y.diagonal(0, 1, 2)),
            (aten.view.default, (y, [4, 64]), (1, 2), y.view(4, 64)),
            (aten.permute.default, (y, [2, 0, 1]), (), y.permute(2, 0, 1)),
            (aten.expand.default, (z, [4, 6, 8]), (1,), z.expand(4, 6, 8)),
        ]
        for op, args, avoid, result in cases:
            expected = meta_of(result)
            if op is not aten.view.default:
                # the test is only as good as the op's strides are its own
                self.assertFalse(result.is_contiguous(), str(op))
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, avoid=avoid)
                    self.assert_output_metas(strategy, [expected])

    # ---- list results ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_list_results_one_spec_per_element(self, shape: tuple[int, ...]) -> None:
        x, y = torch.randn(10, 8), torch.randn(4, 6, 8)
        cases = [
            (aten.split.Tensor, (x, 4), (0,), torch.split(x, 4)),  # 4, 4, 2
            (aten.chunk.default, (x, 3), (0,), torch.chunk(x, 3)),  # 4, 4, 2
            (aten.unbind.int, (y, 1), (1,), torch.unbind(y, 1)),
        ]
        for op, args, avoid, result in cases:
            expected = [meta_of(r) for r in result]
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, avoid=avoid)
                    self.assert_output_metas(strategy, expected)

    # ---- foreach and fused optimizer ops ----

    def foreach_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # elements of different shapes, so a per-element mix-up shows
        xs = [torch.randn(8, 12), torch.randn(4), torch.randn(2, 4, 4)]
        return xs, [torch.randn_like(t) for t in xs]

    def assert_children(
        self,
        strategy: StrategyType,
        expected: Sequence[TensorMeta | None],
        n_inputs: int,
    ) -> None:
        self.assertIsInstance(strategy, TupleStrategy)
        self.assertEqual(len(strategy.children), len(expected))
        for i, (child, meta) in enumerate(zip(strategy.children, expected)):
            with self.subTest(child=i):
                self.assert_output_metas(child, [meta])
                for spec in self.specs_of(child):
                    self.assertEqual(len(spec.input_specs), n_inputs)

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_foreach_ops_one_child_per_element(self, shape: tuple[int, ...]) -> None:
        xs, ys = self.foreach_lists()
        cases = [
            (aten._foreach_add.List, (xs, ys), torch._foreach_add(xs, ys), 2),
            (aten._foreach_mul.Scalar, (xs, 2.0), torch._foreach_mul(xs, 2.0), 1),
            (aten._foreach_norm.Scalar, (xs, 2), torch._foreach_norm(xs, 2), 1),
            # in place: the op returns nothing, so every element's output is None
            (aten._foreach_add_.List, (xs, ys), [None] * len(xs), 2),
        ]
        for op, args, result, n_inputs in cases:
            expected = [None if r is None else meta_of(r) for r in result]
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_children(strategy, expected, n_inputs)

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_fused_adam(self, shape: tuple[int, ...]) -> None:
        for op in (aten._fused_adam_.default, aten._fused_adamw_.default):
            if strategy_registry(op) is None:
                continue
            for amsgrad in (False, True):
                params, grads = self.foreach_lists()
                exp_avgs = [torch.randn_like(t) for t in params]
                exp_avg_sqs = [torch.rand_like(t) for t in params]
                max_sqs = [torch.rand_like(t) for t in params] if amsgrad else []
                steps = [torch.tensor(1.0) for _ in params]
                kwargs = dict(lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.01,
                              eps=1e-8, amsgrad=amsgrad, maximize=False)
                args = (params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps)
                for mode in MODES:
                    with self.subTest(op=str(op), amsgrad=amsgrad, mode=mode):
                        _, strategy = self.query(shape, mode, op, args, kwargs)
                        # one child per parameter, inputs: its element of each list
                        self.assert_children(strategy, [None] * 3, 6 if amsgrad else 5)

    # ---- output metas supplied by the caller ----

    def expand_with_metas(
        self, mesh: DeviceMesh, op: torch._ops.OpOverload, args: Sequence[object], metas: object
    ) -> tuple[OpSchema, StrategyType]:
        """Expand ``op``'s single-dim strategy with caller-supplied ``metas``, as
        DTensor's own callers and tests call ``_expand_single_dim_strategy_to_mesh``."""
        from torch.distributed.tensor._ops.single_dim_strategy import (
            _expand_single_dim_strategy_to_mesh,
        )

        self.assertEqual(strategy_registry(op), "single_dim")
        schema = strategy_schema(mesh, op, args, None, sharded_candidate())
        info = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[op]
        expand = _expand_single_dim_strategy_to_mesh(mesh, schema, info, metas)
        return schema, expand(op, schema.args_meta, schema.kwargs_meta)

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_caller_metas_for_inplace_foreach(self, shape: tuple[int, ...]) -> None:
        """In-place foreach ops return nothing; metas of the self list (what a
        caller naturally passes) must not be indexed as per-return metas."""
        xs, ys = self.foreach_lists()
        zs = [torch.rand_like(t) + 1 for t in xs]
        self_metas = [meta_of(t) for t in xs]
        cases = [
            (aten._foreach_addcdiv_.Scalar, (xs, ys, zs, 0.5), 3),
            (aten._foreach_lerp_.Scalar, (xs, ys, 0.5), 2),
        ]
        for op, args, n_inputs in cases:
            for metas in (self_metas, tuple(self_metas), None):
                with self.subTest(op=str(op), metas=type(metas).__name__):
                    schema, strategy = self.expand_with_metas(self.mesh(shape), op, args, metas)
                    self.assert_contract(schema, strategy)
                    self.assert_children(strategy, [None] * len(xs), n_inputs)

    def test_caller_metas_in_every_shape(self) -> None:
        """Caller metas that fit the op's returns are used as given; metas that do
        not fit (wrong structure, wrong length) give way to shape inference."""
        mesh = self.mesh((2, 2))
        x, y = torch.randn(8, 12), torch.randn(12, 4)
        mm_meta = meta_of(torch.mm(x, y))
        xs, ys = self.foreach_lists()
        add_metas = [meta_of(t) for t in torch._foreach_add(xs, ys)]
        g = torch.randn(8, 12)
        w, b = torch.randn(12), torch.randn(12)
        mean, rstd = torch.randn(8, 1), torch.rand(8, 1) + 0.5
        ln_args = (g, x, [12], mean, rstd, w, b, [False, True, True])
        ln_metas = (None, meta_of(w), meta_of(b))
        cases = [
            ("one meta", aten.mm.default, (x, y), mm_meta, [mm_meta]),
            ("one-element list", aten.mm.default, (x, y), [mm_meta], [mm_meta]),
            ("list for one tensor", aten.mm.default, (x, y), [mm_meta, mm_meta], [mm_meta]),
            ("per element", aten._foreach_add.List, (xs, ys), add_metas, None),
            ("too few elements", aten._foreach_add.List, (xs, ys), add_metas[:1], None),
            ("one meta for a list", aten._foreach_add.List, (xs, ys), add_metas[0], None),
            ("None entries", aten.native_layer_norm_backward.default, ln_args, ln_metas, ln_metas),
            ("too few outputs", aten.native_layer_norm_backward.default, ln_args, ln_metas[1:], ln_metas),
        ]
        for label, op, args, metas, expected in cases:
            with self.subTest(case=label):
                schema, strategy = self.expand_with_metas(mesh, op, args, metas)
                self.assert_contract(schema, strategy)
                if expected is None:
                    self.assert_children(strategy, add_metas, 2)
                else:
                    self.assert_output_metas(strategy, expected)

    def test_expand_when_shape_inference_cannot_run(self) -> None:
        """A schema that is no valid call of its op (tests build them around a
        stand-in op) still expands: inputs carry their metas, outputs none."""
        from torch.distributed.tensor._op_schema import RuntimeSchemaInfo
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

        mesh = self.mesh((4,))
        a, b = meta_of(torch.randn(8, 6)), meta_of(torch.randn(8, 10))
        schema = OpSchema(
            aten.add.Tensor,  # (8, 6) + (8, 10) does not broadcast
            tuple(self.single_candidate(mesh, m) for m in (a, b)),
            {},
            RuntimeSchemaInfo(),
        )
        rules = [[Shard(0), Shard(0), Shard(0)], [Replicate(), Replicate(), Replicate()]]
        strategy = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)
        for spec in self.specs_of(strategy):
            self.assertEqual([s.tensor_meta for s in spec.input_specs], [a, b])
            self.assertIsNone(spec.output_spec.tensor_meta)

    def single_candidate(self, mesh: DeviceMesh, meta: TensorMeta) -> OpStrategy:
        spec = DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=meta)
        return OpStrategy([OpSpec(spec)])

    # ---- in-place and out= ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_inplace_output_is_self(self, shape: tuple[int, ...]) -> None:
        x, y = torch.randn(8, 12), torch.randn(8, 12)
        for op in (aten.add_.Tensor, aten.mul_.Tensor):
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    schema, strategy = self.query(shape, mode, op, (x, y))
                    self_candidates = {
                        c.output_spec.placements for c in schema.args_schema[0].strategies
                    }
                    for i, spec in enumerate(self.specs_of(strategy)):
                        self_spec = spec.input_specs[0]
                        # the result is self: same placement, and self is never redistributed
                        self.assertEqual(
                            spec.output_specs.placements, self_spec.placements, f"OpSpec {i}"
                        )
                        self.assertIn(self_spec.placements, self_candidates, f"OpSpec {i}")
                        self.assertEqual(spec.output_specs.tensor_meta, meta_of(x))

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_out_variant_output_is_out(self, shape: tuple[int, ...]) -> None:
        a, b, c = torch.randn(8, 12), torch.randn(8, 12), torch.randn(12, 4)
        cases = [
            (aten.add.out, (a, b), torch.empty(8, 12)),
            (aten.mm.out, (a, c), torch.empty(8, 4)),
        ]
        for op, args, out in cases:
            if strategy_registry(op) is None:
                continue
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    schema, strategy = self.query(shape, mode, op, args, {"out": out})
                    out_candidates = {
                        c.output_spec.placements for c in schema.kwargs_schema["out"].strategies
                    }
                    for i, spec in enumerate(self.specs_of(strategy)):
                        out_spec = spec.input_specs[-1]  # kwargs come after args
                        self.assertEqual(
                            spec.output_specs.placements, out_spec.placements, f"OpSpec {i}"
                        )
                        self.assertIn(out_spec.placements, out_candidates, f"OpSpec {i}")
                        self.assertEqual(spec.output_specs.tensor_meta, meta_of(out))

    # ---- factory-like ops and ops without tensor results ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_factory_like_dtype_from_kwarg(self, shape: tuple[int, ...]) -> None:
        x = torch.randn(8, 12)
        cases = [
            (aten.zeros_like.default, (x,), {"dtype": torch.bfloat16}),
            (aten.empty_like.default, (x,), {"dtype": torch.float16}),
            (aten.new_zeros.default, (x, [4, 6]), {"dtype": torch.int32}),
            (aten.full_like.default, (x, 2), {"dtype": torch.int64}),
        ]
        for op, args, kwargs in cases:
            expected = meta_of(op(*args, **kwargs))
            self.assertEqual(expected.dtype, kwargs["dtype"])
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, kwargs)
                    self.assert_output_metas(strategy, [expected])

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_no_tensor_result(self, shape: tuple[int, ...]) -> None:
        x, y = torch.randn(8, 12), torch.randn(8, 12)
        cases = [
            (aten.equal.default, (x, y)),
            (aten.is_same_size.default, (x, y)),
            (aten._local_scalar_dense.default, (torch.tensor(3.0),)),
        ]
        for op, args in cases:
            if strategy_registry(op) is None:
                continue
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    for i, spec in enumerate(self.specs_of(strategy)):
                        self.assertIsNone(spec.output_specs, f"OpSpec {i}")
                        self.assertEqual(len(spec.input_specs), len(args))

    def test_histc_shards_only_with_bounds(self) -> None:
        """histc bins over each rank's own data range when min == max (the defaults),
        so only given, distinct bounds allow a sharded input; filling in the omitted
        defaults must not change that."""
        mesh = self.mesh((4,))
        x = torch.randn(8, 4)
        propagator = DTensor._op_dispatcher.sharding_propagator
        for args, sharded in [((x,), False), ((x, 10), False), ((x, 10, 0, 0), False),
                              ((x, 10, -1.0, 1.0), True)]:
            with self.subTest(args=len(args), bounds=args[2:]):
                schema = strategy_schema(mesh, aten.histc.default, args, None, planner_candidates)
                strategy = propagator.get_op_strategy(schema)
                self.assert_contract(schema, strategy)
                partial = any(
                    isinstance(p, Partial)
                    for spec in self.specs_of(strategy)
                    for p in spec.output_spec.placements
                )
                self.assertEqual(partial, sharded)

    # ---- shared strategy helpers called directly ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_shared_helpers_called_directly(self, shape: tuple[int, ...]) -> None:
        """The helpers a downstream rule author calls with an op schema hand out
        complete specs without any registry around them."""
        from torch.distributed.tensor._ops import _matrix_ops, _tensor_ops, utils

        mesh = self.mesh(shape)
        a, b, c = torch.randn(8, 12), torch.randn(12, 4), torch.randn(8, 4)
        cases = [
            ("replicate_op_strategy", aten.mm.default, (a, b), utils.replicate_op_strategy),
            ("propagate_single_input_strategy", aten.clone.default, (a,),
             _tensor_ops.propagate_single_input_strategy),
            ("replica_only_strategy", aten.clone.default, (a,), _tensor_ops.replica_only_strategy),
            ("_mm_like_strategy", aten.mm.default, (a, b),
             lambda s: _matrix_ops._mm_like_strategy("mk,kn->mn", mesh, s)),
            ("_addmm_like_strategy", aten.addmm.default, (c, a, b),
             lambda s: _matrix_ops._addmm_like_strategy("mk,kn->mn", mesh, s)),
        ]
        for name, op, args, helper in cases:
            for mode in MODES:
                with self.subTest(helper=name, mode=mode):
                    schema = strategy_schema(mesh, op, args, None, mode_candidates(mode))
                    self.assert_contract(schema, helper(schema))

    # ---- calls that leave optional arguments out ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_optional_args_omitted(self, shape: tuple[int, ...]) -> None:
        """Each call passes only the op's required arguments, as DTensor's dispatch
        sees a call whose optional arguments hold their defaults. One op per
        strategy function that reads an argument by a position the call may omit."""
        x = torch.randn(8, 12)
        spd = torch.eye(4).expand(2, 4, 4).contiguous()
        f8 = torch.randn(16, 32).to(torch.float8_e4m3fn)
        f8_t = torch.randn(16, 32).to(torch.float8_e4m3fn).t()  # column-major mat2
        scale = torch.tensor(1.0)
        bf = torch.randn(4, 8, 16, dtype=torch.bfloat16)
        bf_w = torch.randn(4, 16, 8, dtype=torch.bfloat16)
        cases: list[tuple[torch._ops.OpOverload, tuple, dict]] = [
            (aten._scaled_mm.default, (f8, f8_t, scale, scale), {}),
            (aten._grouped_mm.default, (bf, bf_w), {}),
            (aten.sum.default, (x,), {}),
            (aten.amax.out, (x,), {"out": torch.empty(())}),
            (aten.argmax.default, (x,), {}),
            (aten.std.correction, (x,), {}),
            (aten.var_mean.correction_out, (x,), {"out0": torch.empty(()), "out1": torch.empty(())}),
            (aten.linalg_vector_norm.default, (x,), {}),
            (aten._foreach_norm.Scalar, ([x, x],), {}),
            (aten.topk.default, (x, 3), {}),
            (aten.sort.default, (x,), {}),
            (aten.max.dim, (x, 1), {}),
            (aten.mode.default, (x,), {}),
            (aten.kthvalue.default, (x, 2), {}),
            (aten.cholesky.default, (spd,), {}),
            (aten.cat.default, ([x, x],), {}),
            (aten.stack.default, ([x, x],), {}),
            (aten.split.Tensor, (x, 4), {}),
            (aten.unbind.int, (x,), {}),
            (aten.slice_scatter.default, (x, x), {}),
            (aten.diagonal_scatter.default, (x, torch.randn(8)), {}),
            (aten.constant_pad_nd.default, (x, [1, 1]), {}),
            (aten.roll.default, (x, [1]), {}),
        ]
        for op, args, kwargs in cases:
            if strategy_registry(op) is None:
                continue
            required = sum(
                1
                for a in op._schema.arguments
                if not a.kwarg_only and not a.has_default_value()
            )
            self.assertEqual(len(args), required, f"{op}: the case must omit every optional argument")
            avoid = (0,) if op == aten.unbind.int else ()  # unbind refuses its sharded dim
            propagator = DTensor._op_dispatcher.sharding_propagator
            for mode in MODES:
                with self.subTest(op=str(op), mode=mode):
                    # the contract, whichever registry holds the op
                    self.query(shape, mode, op, args, kwargs, avoid)
                    # and through the planner entry point
                    mesh = self.mesh(shape)
                    candidates = mode_candidates(mode, avoid)
                    schema = strategy_schema(mesh, op, args, kwargs, candidates)
                    self.assert_contract(schema, propagator.get_op_strategy(schema))

    # ---- data-dependent results ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_data_dependent_outputs(self, shape: tuple[int, ...]) -> None:
        """A planner query about an op whose result size depends on the data gets
        specs whose metas carry unbacked symbolic sizes, from DTensor when a
        registry holds the op and from a downstream rule otherwise; eager DTensor
        still refuses these calls, as stock torch does."""
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        mesh = self.mesh(shape)
        propagator = DTensor._op_dispatcher.sharding_propagator
        x = torch.randn(8, 4)
        mask = x[:, 0] > 0
        counts = torch.tensor([1, 0, 2, 1, 1, 3, 0, 1])
        cases: list[tuple[torch._ops.OpOverload, tuple]] = [
            (aten.index.Tensor, (x, [mask])),
            (aten.repeat_interleave.self_Tensor, (x, counts, 0)),
            (aten.nonzero.default, (x,)),
            (aten._unique2.default, (x,)),
            (aten.masked_select.default, (x, mask[:, None])),
            (aten.repeat_interleave.Tensor, (counts,)),
            (aten._local_scalar_dense.default, (x.sum(),)),
        ]
        for op, args in cases:
            for mode in ("replicate", "planner"):
                with self.subTest(op=str(op), mode=mode):
                    schema = strategy_schema(mesh, op, args, None, mode_candidates(mode))
                    metas = infer_output_metas(schema)
                    leaves = [
                        m
                        for m in pytree.tree_leaves(metas, is_leaf=lambda m: isinstance(m, TensorMeta))
                        if isinstance(m, TensorMeta)
                    ]
                    if op_has_tensor_returns(op):
                        self.assertTrue(
                            any(free_unbacked_symbols(m.shape) for m in leaves),
                            f"{op}: expected an unbacked size in {metas}",
                        )
                        # eager DTensor keeps global shapes concrete: it refuses
                        with self.assertRaises(DynamicOutputShapeException):
                            infer_output_metas(schema, data_dependent=False)
                    if strategy_registry(op) is None:
                        with self.assertRaisesRegex(NotImplementedError, str(op)):
                            propagator.get_op_strategy(schema)
                        # a downstream rule for it: every input and result replicated
                        n_in = len(tensor_inputs(schema))
                        strategy = expand_to_full_mesh_op_strategy(
                            mesh, schema, [[Replicate()] * (len(leaves) + n_in)],
                            input_index=len(leaves),
                        )
                    else:
                        strategy = propagator.get_op_strategy(schema)
                    self.assert_contract(schema, strategy, metas)

    def test_data_dependent_eager_refuses(self) -> None:
        """Eager DTensor on a boolean-mask index fails as on stock torch, instead
        of handing back a DTensor whose global shape is symbolic."""
        mesh = self.mesh((4,))
        x = torch.randn(8, 4)
        dx = distribute_tensor(x, mesh, [Replicate()])
        dmask = distribute_tensor(x[:, 0] > 0, mesh, [Replicate()])
        with self.assertRaisesRegex(RuntimeError, "nonzero"):
            dx[dmask]

    # ---- ops whose decomposition is the only source ----

    @parametrize("shape", MESHES, name_fn=mesh_name)
    def test_decomposition_only_ops_answer_planners(self, shape: tuple[int, ...]) -> None:
        """Every decomposition-derived op answers a planner. Decompositions that make
        tensors of their own (arange, scalar_tensor, full) trace; those that reach an
        op with no strategy (as_strided, prims.fmod) answer with all-Replicate."""
        x, y = torch.randn(8, 8), torch.randn(8, 8)
        traced = [
            (aten.hardswish_backward.default, (x, y)),
            (aten.tril_.default, (x,)),
            (aten.cumsum_.default, (x, 0)),
            (aten.reflection_pad1d.default, (x, [1, 1])),
            (aten.im2col.default, (x[None, None], [2, 2], [1, 1], [0, 0], [1, 1])),
            (aten.multi_margin_loss.default, (x, torch.randint(0, 8, (8,)))),
        ]
        gathered = [
            (aten.unfold.default, (x, 0, 2, 1)),
            (aten.as_strided_copy.default, (x, [4, 4], [8, 1])),
            (aten.floor_divide_.Tensor, (x, y)),
            (aten.addbmm_.default, (x, torch.randn(2, 8, 3), torch.randn(2, 3, 8))),
        ]
        propagator = DTensor._op_dispatcher.sharding_propagator
        mesh = self.mesh(shape)
        for op, args in traced + gathered:
            self.assertEqual(strategy_registry(op), "decomposition", str(op))
            with self.subTest(op=str(op)):
                schema = strategy_schema(mesh, op, args, None, sampled_planner_candidates)
                strategy = propagator.get_op_strategy(schema)
                self.assert_contract(schema, strategy)
                outputs = {
                    p for spec in self.specs_of(strategy)
                    for out in output_tuple(spec) if out is not None
                    for p in out.placements
                }
                if (op, args) in gathered:
                    self.assertEqual(outputs, {Replicate()})
        # hardswish_backward is pointwise: its trace keeps shardings
        schema = strategy_schema(mesh, *traced[0], None, sampled_planner_candidates)
        strategy = propagator.get_op_strategy(schema)
        self.assertTrue(
            any(
                isinstance(p, Shard)
                for spec in self.specs_of(strategy)
                for p in spec.output_spec.placements
            )
        )

    # ---- planner queries with candidates a strategy cannot use ----

    @parametrize(
        "case",
        [("view", shape) for shape in MESHES]
        + [("view_strided", shape) for shape in MESHES[1:]]
        + [("unbind", shape) for shape in MESHES],
        name_fn=lambda case: f"{case[0]}_{mesh_name(case[1])}",
    )
    def test_planner_query_with_unusable_candidates(self, case) -> None:
        """A planner offers every candidate; one a strategy cannot use must be
        left out (or redistributed), not fail the whole query."""
        name, shape = case
        y = torch.randn(4, 6, 8)
        if name == "view":
            op, args = aten.view.default, (y, [4, 48])
            candidates = planner_candidates  # all of them, uneven ones included
        elif name == "view_strided":
            # merging dims 0 and 1 of a _StridedShard(1) input: the view rule raises
            # KeyError for that candidate (stock too), which must only drop out
            op, args = aten.view.default, (torch.randn(4, 16, 4, 16), [64, 64])
            candidates = lambda mesh, meta: [  # noqa: E731
                (Replicate(),) * mesh.ndim,
                (Shard(0),) + (Replicate(),) * (mesh.ndim - 1),
                (Replicate(), _StridedShard(1, split_factor=2))
                + (Replicate(),) * (mesh.ndim - 2),
            ]
        else:
            op, args = aten.unbind.int, (y, 1)
            candidates = lambda mesh, meta: [  # noqa: E731
                (Replicate(),) * mesh.ndim,
                (Shard(0),) + (Replicate(),) * (mesh.ndim - 1),
                (Shard(1),) + (Replicate(),) * (mesh.ndim - 1),
            ]
        mesh = self.mesh(shape)
        schema = strategy_schema(mesh, op, args, {}, candidates)
        strategy = query_strategy(schema, mesh)
        self.assertIsNotNone(strategy)
        self.assert_contract(schema, strategy)
        # the usable candidates still get their strategies (Shard(0) is one)
        self.assertTrue(
            any(
                spec.input_specs[0].placements[0] == Shard(0)
                for spec in self.specs_of(strategy)
            ),
            [spec.input_specs[0].placements for spec in self.specs_of(strategy)],
        )

    # ---- strategies that break the contract ----

    def register_temporarily(self, op, strategy_func) -> None:
        """Register ``strategy_func`` for ``op`` until the end of the test."""
        propagator = DTensor._op_dispatcher.sharding_propagator
        saved = (
            propagator.op_strategy_funcs.get(op),
            propagator.op_to_schema_info.get(op),
        )

        def restore() -> None:
            for registry, value in zip(
                (propagator.op_strategy_funcs, propagator.op_to_schema_info), saved
            ):
                if value is None:
                    registry.pop(op, None)
                else:
                    registry[op] = value
            propagator.propagate_op_sharding.cache_clear()

        self.addCleanup(restore)
        propagator.register_op_strategy(op, strategy_func)

    def assert_contract_error(
        self, op, strategy_func, args, position: str
    ) -> StrategyContractError:
        self.register_temporarily(op, strategy_func)
        mesh = self.mesh((2, 2))
        schema = strategy_schema(mesh, op, args, {}, sampled_planner_candidates)
        with self.assertRaises(StrategyContractError) as ctx:
            query_strategy(schema, mesh)
        message = str(ctx.exception)
        self.assertNotIsInstance(ctx.exception, AssertionError)
        self.assertIn(str(op), message)
        # the strategy function's name, quoted (a TupleStrategy child adds "(child i)")
        self.assertIn(f"strategy '{strategy_func.__name__}", message)
        self.assertIn(f"at {position}:", message)
        return ctx.exception

    def test_bad_strategy_none_for_tensor_output(self) -> None:
        op = torch.ops.strategy_contract_ops_test.one_out.default

        def none_output_strategy(op_schema: OpSchema) -> OpStrategy:
            inp = op_schema.args_schema[0]
            return OpStrategy(
                [OpSpec(None, input_specs=[c.output_spec]) for c in inp.strategies]
            )

        err = self.assert_contract_error(
            op, none_output_strategy, (torch.randn(4, 6),), "output"
        )
        self.assertIn("the op returns a tensor but the spec is None", str(err))

    def test_bad_strategy_wrong_number_of_outputs(self) -> None:
        op = torch.ops.strategy_contract_ops_test.two_out.default

        def three_outputs_strategy(op_schema: OpSchema) -> OpStrategy:
            inp = op_schema.args_schema[0]
            specs = []
            for c in inp.strategies:
                out = DTensorSpec(c.output_spec.mesh, c.output_spec.placements)
                specs.append(OpSpec((out, out, out), input_specs=[c.output_spec]))
            return OpStrategy(specs)

        err = self.assert_contract_error(
            op, three_outputs_strategy, (torch.randn(4, 6),), "output"
        )
        self.assertIn("the op has 2 results", str(err))

    def test_bad_strategy_list_child_none_output(self) -> None:
        op = torch.ops.strategy_contract_ops_test.list_out.default

        def bad_child_strategy(op_schema: OpSchema) -> TupleStrategy:
            children = []
            for i, child in enumerate(op_schema.args_schema[0].children):
                specs = [
                    OpSpec(
                        None if i == 1 else c.output_spec,
                        input_specs=[c.output_spec],
                    )
                    for c in child.strategies
                ]
                children.append(OpStrategy(specs))
            return TupleStrategy(children)

        err = self.assert_contract_error(
            op, bad_child_strategy, ([torch.randn(4, 6), torch.randn(8)],), "output"
        )
        self.assertIn("(child 1)", str(err))

    def test_bad_strategy_surfaces_at_runtime(self) -> None:
        """DTensor's own dispatch hits the same error, naming the op."""
        op = torch.ops.strategy_contract_ops_test.one_out.default

        def none_output_at_runtime(op_schema: OpSchema) -> OpStrategy:
            inp = op_schema.args_schema[0]
            return OpStrategy([OpSpec(None, input_specs=[inp.strategies[0].output_spec])])

        self.register_temporarily(op, none_output_at_runtime)
        mesh = self.mesh((4,))
        x = DTensor.from_local(torch.randn(3, 5), mesh, [Replicate()], run_check=False)
        with self.assertRaises(RuntimeError) as ctx:
            op(x)
        cause = ctx.exception
        while cause is not None and not isinstance(cause, StrategyContractError):
            cause = cause.__cause__ or cause.__context__
        self.assertIsInstance(cause, StrategyContractError, str(ctx.exception))
        self.assertIn("'none_output_at_runtime'", str(ctx.exception))


instantiate_parametrized_tests(TestStrategyContractOps)


if __name__ == "__main__":
    run_tests()
