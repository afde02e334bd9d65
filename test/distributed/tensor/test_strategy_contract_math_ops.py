# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy-contract tests for the strategies of ``_ops/_math_ops.py`` this stack
changes: the normalization backward rules place exactly the gradients the op
returns (output masks, 0-element inputs without weight or bias), and ``histc``
shards only with given, distinct bounds. Two rule bugs of torch 2.14.1's
single-dim reductions are fixed too: the foreach norms read their ``dtype`` as a
``dim``, and the reduction ``out`` overloads registered by name leave ``out``
unplaced; those tests ask a planner query and run the op eagerly, every rank
simulated by ``LocalTensorMode``. See ``contract_common`` for the query modes
and meshes.
"""

from collections.abc import Callable, Sequence

import torch
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    StrategyOpsTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten


class TestMathOpsStrategyContract(StrategyOpsTestBase):
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

    # ---- reductions: every registry op answers a planner and runs eagerly ----

    def eager_ranks(
        self,
        mesh_shape: tuple[int, ...],
        fn: Callable[..., object],
        placed: Sequence[tuple[torch.Tensor, Sequence[Placement]]],
    ) -> list[list[torch.Tensor]]:
        """``fn`` on DTensors of ``placed``, every rank simulated by
        ``LocalTensorMode``: per output tensor, each rank's full value.

        Each rank gets its own copy of every input, as real ranks have: an op
        writing into an input (``out``) must not write into a tensor they share.
        """
        mesh = self.mesh(mesh_shape)
        with LocalTensorMode(frozenset(range(mesh.size()))):
            copies = [torch.empty(t.shape, dtype=t.dtype).copy_(t) for t, _ in placed]
            out = fn(*(distribute_tensor(c, mesh, list(p)) for c, (_, p) in zip(copies, placed)))
            outs = out if isinstance(out, (list, tuple)) else [out]
            values = []
            for o in outs:
                self.assertIsInstance(o, DTensor)
                full = o.full_tensor()
                self.assertIsInstance(full, LocalTensor)
                values.append([full._local_tensors[r] for r in sorted(full._local_tensors)])
            return values

    def test_foreach_norms_with_dtype(self) -> None:
        """The foreach norms take ``(ord, dtype)`` where the single-tensor norms
        take ``(ord, dim, keepdim)``: a dtype given must not be read as a dim
        (each tensor reduces over all of its dims, in that dtype)."""
        xs = [torch.randn(8, 6), torch.randn(4, 8)]
        propagator = DTensor._op_dispatcher.sharding_propagator
        for op in (aten._foreach_norm.Scalar, aten._foreach_powsum.Scalar):
            args = (xs, 2, torch.float64)
            expected = op(*args)
            for shape in ((4,), (2, 2)):
                with self.subTest(op=str(op), mesh=shape):
                    schema = strategy_schema(self.mesh(shape), op, args, None, planner_candidates)
                    self.assert_contract(schema, propagator.get_op_strategy(schema))
                    first, second = [Shard(0)] * len(shape), [Shard(1)] + [Replicate()] * (len(shape) - 1)
                    got = self.eager_ranks(
                        shape, lambda a, b: op([a, b], 2, torch.float64), [(xs[0], first), (xs[1], second)]
                    )
                    self.assertEqual(len(got), len(expected))
                    for want, per_rank in zip(expected, got):
                        for value in per_rank:
                            self.assertEqual(value, want, exact_dtype=True)

    def test_reduction_out_overloads_place_out(self) -> None:
        """``out`` is a tensor input the result is written into, so every OpSpec
        of an out overload places it exactly like the result; eagerly the result
        lands in ``out``, sharded or not."""
        x = torch.randn(8, 6)
        cases = [
            (aten.amax.out, x, lambda d: ([d], False)),
            (aten.amin.out, x, lambda d: ([d], False)),
            (aten.prod.int_out, x, lambda d: (d, False)),
            (aten.mean.out, x, lambda d: ([d], False)),
            (aten.any.out, x > 0, lambda d: (d, False)),
        ]
        propagator = DTensor._op_dispatcher.sharding_propagator
        for op, inp, rest in cases:
            # reducing dim 0 of a row-sharded input gives a partial result that a
            # replicated out cannot take; reducing dim 1 keeps the rows' sharding
            for dim, out_placement in ((0, Replicate()), (1, Shard(0))):
                args = (inp, *rest(dim))
                expected = op(*args, out=torch.empty(0, dtype=inp.dtype))
                out = torch.empty(expected.shape, dtype=expected.dtype)
                for shape in ((4,), (2, 2)):
                    with self.subTest(op=str(op), dim=dim, mesh=shape):
                        schema = strategy_schema(
                            self.mesh(shape), op, args, {"out": out}, planner_candidates
                        )
                        strategy = propagator.get_op_strategy(schema)
                        self.assert_contract(schema, strategy)
                        for spec in self.specs_of(strategy):
                            self.assertEqual(spec.input_specs[-1].placements, spec.output_spec.placements)
                        row_sharded = [Shard(0)] + [Replicate()] * (len(shape) - 1)
                        got = self.eager_ranks(
                            shape,
                            lambda a, o: (op(a, *rest(dim), out=o), o),
                            [(inp, row_sharded), (out, [out_placement] + [Replicate()] * (len(shape) - 1))],
                        )
                        for per_rank in got:
                            for value in per_rank:
                                self.assertEqual(value, expected, exact_dtype=True)


if __name__ == "__main__":
    run_tests()
