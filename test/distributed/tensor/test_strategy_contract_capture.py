# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the call capture (``contract_capture``): the call recorder.
"""

import torch
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_capture import CallRecorder
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)


aten = torch.ops.aten


class TestCallCapture(StrategyContractTestBase):
    def test_call_recorder(self) -> None:
        """The recorder keeps distinct calls with tensor arguments, metas taken
        before the call (an in-place op may change its self), only the ops
        ``keep`` chooses; calls without tensors are counted, not kept."""
        x = torch.randn(4, 3)
        recorder = CallRecorder(pool_size=2)
        with recorder:
            recorder.source = "test forward"
            torch.empty(5)
            x.clone().t_()
            for rows in (x[:1], x[:2], x[:3]):
                torch.add(rows, rows)
        self.assertEqual(recorder.tensorless[aten.empty.memory_format], 1)
        (t_call,) = recorder.calls[aten.t_.default].values()
        self.assertEqual(t_call.tensor_metas, [meta_of(x)])
        self.assertEqual(t_call.source, "test forward")
        # three distinct calls, two kept (pool_size)
        self.assertEqual(len(recorder.calls[aten.add.Tensor]), 2)
        only_add = CallRecorder(keep=lambda op: op == aten.add.Tensor)
        with only_add:
            torch.add(x, 1).neg()
        self.assertEqual(list(only_add.calls), [aten.add.Tensor])
        self.assertEqual(only_add.seen, 1)


if __name__ == "__main__":
    run_tests()
