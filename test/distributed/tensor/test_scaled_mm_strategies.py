# Owner(s): ["oncall: distributed"]
"""``_scaled_mm``'s single-dim rule accepts calls that leave out the optional
``bias`` and ``scale_result``, as the dispatcher passes them."""

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.testing._internal.common_utils import run_tests, TestCase


aten = torch.ops.aten


class TestScaledMmStrategies(TestCase):
    def test_rule_without_optional_arguments(self) -> None:
        propagator = DTensor._op_dispatcher.sharding_propagator
        rule = propagator.op_single_dim_strategy_funcs[aten._scaled_mm.default]
        a, b = torch.empty(16, 32), torch.empty(32, 8)
        scale_a, scale_b = torch.empty(16, 1), torch.empty(1, 8)
        metas = tuple(
            TensorMeta(t.shape, t.stride(), torch.float8_e4m3fn)
            for t in (a, b, scale_a, scale_b)
        )
        full = rule(aten._scaled_mm.default, (*metas, None, None), {})
        self.assertNotEqual(full, [])
        # Placeholders compare by identity; their reprs name the sharded dims.
        self.assertEqual(repr(rule(aten._scaled_mm.default, metas, {})), repr(full))


if __name__ == "__main__":
    run_tests()
