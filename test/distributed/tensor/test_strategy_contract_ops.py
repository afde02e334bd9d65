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
* ``planner``: every tensor input offers many candidates at once
  (``contract_common.QUERY_MODES``).

Each strategy is held to the contract C1-C5, and then to the one property of
the op a consumer is most likely to get wrong when it reads the specs as they
are: masked-off gradients (convolution, attention), index dtypes, foreach and
fused-optimizer children, in-place and ``out=`` placements, ops without tensor
results.
Expected metadata comes from eager kernels on real tensors wherever they run on
CPU, so the tests do not lean on the shape inference the machinery itself uses.
The ops whose strategy modules a step of the stack changes are tested next to
that step, with the same helpers (``contract_common.StrategyOpsTestBase``):
``test_strategy_contract_{math,tensor,view,matrix}_ops.py``.
"""


import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.distributed.tensor import distribute_tensor, DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
)
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.strategy_contract import (
    infer_output_metas,
    op_has_tensor_returns,
    tensor_inputs,
)
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor.placement_types import _StridedShard, Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    OP_MESHES,
    output_tuple,
    planner_candidates,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    mode_candidates,
    QUERY_MODES,
    sampled_planner_candidates,
    StrategyOpsTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    query_strategy,
    strategy_registry,
    strategy_schema,
)
from torch.utils import _pytree as pytree


aten = torch.ops.aten


class TestStrategyContractOps(StrategyOpsTestBase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        # Test-only ops for the bad-strategy tests, so no real op's registration
        # is touched; they are defined while this class runs.
        lib = cls.enterClassContext(
            torch.library._scoped_library("strategy_contract_ops_test", "DEF")
        )
        lib.define("two_out(Tensor x) -> (Tensor, Tensor)")
        lib.impl("two_out", lambda x: (x.clone(), x.sum(0)), "CompositeExplicitAutograd")

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

    def test_flash_attention_for_cpu(self) -> None:
        t = self.sdpa_tensors()
        op = aten._scaled_dot_product_flash_attention_for_cpu.default
        expected = [meta_of(r) for r in op(t["q"], t["k"], t["v"])]
        # logsumexp is laid out (batch, seq, heads): not contiguous
        self.assertFalse(torch.empty_strided(expected[1].shape, expected[1].stride).is_contiguous())
        for shape in OP_MESHES:
            for mode in QUERY_MODES:
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
        for shape in OP_MESHES:
            for mode in QUERY_MODES:
                with self.subTest(mesh=shape, mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_output_metas(strategy, expected)

    # ---- index outputs ----

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_output_metas(strategy, [values, indices])

    # ---- foreach and fused optimizer ops ----

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    self.assert_children(strategy, expected, n_inputs)

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
                for mode in QUERY_MODES:
                    with self.subTest(op=str(op), amsgrad=amsgrad, mode=mode):
                        _, strategy = self.query(shape, mode, op, args, kwargs)
                        # one child per parameter, inputs: its element of each list
                        self.assert_children(strategy, [None] * 3, 6 if amsgrad else 5)

    # ---- in-place and out= ----

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_inplace_output_is_self(self, shape: tuple[int, ...]) -> None:
        x, y = torch.randn(8, 12), torch.randn(8, 12)
        for op in (aten.add_.Tensor, aten.mul_.Tensor):
            for mode in QUERY_MODES:
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

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_out_variant_output_is_out(self, shape: tuple[int, ...]) -> None:
        a, b, c = torch.randn(8, 12), torch.randn(8, 12), torch.randn(12, 4)
        cases = [
            (aten.add.out, (a, b), torch.empty(8, 12)),
            (aten.mm.out, (a, c), torch.empty(8, 4)),
        ]
        for op, args, out in cases:
            if strategy_registry(op) is None:
                continue
            for mode in QUERY_MODES:
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

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args)
                    for i, spec in enumerate(self.specs_of(strategy)):
                        self.assertIsNone(spec.output_specs, f"OpSpec {i}")
                        self.assertEqual(len(spec.input_specs), len(args))

    # ---- calls that leave optional arguments out ----

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
        cholesky = getattr(aten, "cholesky", None)  # not in every release
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
            *([] if cholesky is None else [(cholesky.default, (spd,), {})]),
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
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    # the contract, whichever registry holds the op
                    self.query(shape, mode, op, args, kwargs, avoid)
                    # and through the planner entry point
                    mesh = self.mesh(shape)
                    candidates = mode_candidates(mode, avoid)
                    schema = strategy_schema(mesh, op, args, kwargs, candidates)
                    self.assert_contract(schema, propagator.get_op_strategy(schema))
        if cholesky is None:
            with self.subTest(op="aten.cholesky"):
                self.skipTest("this torch has no aten.cholesky")

    # ---- data-dependent results ----

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
            with self.subTest(op=str(op)):
                registry = strategy_registry(op)
                if registry != "decomposition":
                    self.skipTest(f"this torch answers {op} from its {registry} registry")
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
        [("view", shape) for shape in OP_MESHES]
        + [("view_strided", shape) for shape in OP_MESHES[1:]]
        + [("unbind", shape) for shape in OP_MESHES],
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

    def test_bad_strategy_surfaces_at_runtime(self) -> None:
        """DTensor's own dispatch hits the same error, naming the op, for a spec
        stock DTensor cannot run with either (three outputs for two results; the
        ones it can run with are used as given: test_strategy_contract_output_mask)."""
        op = torch.ops.strategy_contract_ops_test.two_out.default

        def three_outputs_at_runtime(op_schema: OpSchema) -> OpStrategy:
            spec = op_schema.args_schema[0].strategies[0].output_spec
            out = DTensorSpec(spec.mesh, spec.placements)
            return OpStrategy([OpSpec((out, out, out), input_specs=[spec])])

        self.register_temporarily(op, three_outputs_at_runtime)
        mesh = self.mesh((4,))
        x = DTensor.from_local(torch.randn(3, 5), mesh, [Replicate()], run_check=False)
        with self.assertRaises(RuntimeError) as ctx:
            op(x)
        cause = ctx.exception
        while cause is not None and not isinstance(cause, StrategyContractError):
            cause = cause.__cause__ or cause.__context__
        self.assertIsInstance(cause, StrategyContractError, str(ctx.exception))
        self.assertIn("'three_outputs_at_runtime'", str(ctx.exception))


instantiate_parametrized_tests(TestStrategyContractOps)


if __name__ == "__main__":
    run_tests()
