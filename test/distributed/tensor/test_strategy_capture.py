# Owner(s): ["oncall: distributed"]
"""Captured calls' strategies meet the contract or are refused as eager DTensor is."""

import itertools
from unittest import mock

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._ops import strategy_validation
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed._tensor.strategy_capture import (
    capture_calls,
    eager_error,
    refused_alike,
)


aten = torch.ops.aten
BY_HAND = ("_scaled_dot_product_efficient_attention", "_grouped_mm", "_fused_adam_")
NAMES = {"mm", "view", "unbind", "stack", "nn.functional.pad", "_foreach_add"}
NAMES |= {str(getattr(aten, name).default) for name in BY_HAND}


class TestStrategyCapture(LocalDTensorTestBase):
    @with_comms
    def test_captured_calls(self) -> None:
        mesh = init_device_mesh("cpu", (2, 2))
        capture = capture_calls(NAMES, composites=False)
        ops = {op for _, op, _, _ in capture.calls}
        # backward, in-place, out=, foreach and CUDA-only calls are all asked
        want = {aten.mm.out, aten._foreach_add_.List, aten._fused_adam_.default}
        want |= {aten._scaled_dot_product_efficient_attention_backward.default}
        self.assertFalse(want - ops)
        # plain torch runs every forward sample; only some have no autograd
        self.assertLessEqual({r.split()[-2] for r in capture.failures}, {"backward"})
        planner = DTensor._op_dispatcher.sharding_propagator.enumerate_strategies
        for (source, op, args, kwargs), ask in itertools.product(
            capture.calls, (None, planner)
        ):
            with self.subTest(source=source, op=str(op), planner=bool(ask)):
                try:
                    found = sc.check_call(op, args, kwargs, mesh, ask)
                except Exception as e:  # a refusal: eager must refuse it alike
                    eager = eager_error(op, args, kwargs, mesh) or "runs it"
                    same = refused_alike(e, eager)
                    found = [] if same else [f"refused ({e!r}); eager DTensor: {eager}"]
                self.assertEqual(found, [])

    @with_comms
    def test_strategy_validation_contract(self) -> None:
        queries = 2 * len(capture_calls({"mm"}, composites=False).calls)
        self.assertEqual(strategy_validation.check_contract(["mm"], 4), 0)
        # judged against an op without results, every answer breaks C2
        with mock.patch.object(sc, "expected_output_metas", lambda schema: None):
            self.assertEqual(strategy_validation.check_contract(["mm"], 4), queries)


if __name__ == "__main__":
    run_tests()
