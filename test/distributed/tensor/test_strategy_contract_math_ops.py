# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy-contract tests for the strategies of ``_ops/_math_ops.py`` this stack
changes: the normalization backward rules place exactly the gradients the op
returns (output masks, 0-element inputs without weight or bias), and ``histc``
shards only with given, distinct bounds. See ``contract_common`` for the query
modes and meshes.
"""

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
    strategy_schema,
    StrategyOpsTestBase,
)


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


if __name__ == "__main__":
    run_tests()
