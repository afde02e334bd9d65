# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy-contract tests for the strategies of ``_ops/_view_ops.py`` this stack
changes: every view op's output carries the view's own strides, in every query
mode. See ``contract_common`` for the query modes and meshes.
"""

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    OP_MESHES,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    QUERY_MODES,
    StrategyOpsTestBase,
)


aten = torch.ops.aten


class TestViewOpsStrategyContract(StrategyOpsTestBase):
    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
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
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, avoid=avoid)
                    self.assert_output_metas(strategy, [expected])


instantiate_parametrized_tests(TestViewOpsStrategyContract)


if __name__ == "__main__":
    run_tests()
