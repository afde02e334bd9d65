# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of ``python -m torch.distributed.tensor._ops.strategy_validation --contract``
(``_ops/_contract_mode.py``): its per-op report and the command line end to end.
"""

import subprocess
import sys

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.distributed.tensor._ops._contract_mode import format_ops
from torch.distributed.tensor._ops._contract_validation import ContractValidation
from torch.distributed.tensor._ops.strategy_contract import check_strategy_contract
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_capture import CapturedCall
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)


aten = torch.ops.aten


class TestContractMode(StrategyContractTestBase):
    def test_report_names_calls_not_judged(self) -> None:
        """The per-op report says how many calls shape inference could not size."""
        x = torch.randn(8, 4)
        call = CapturedCall(aten.relu.default, (meta_of(x),), {}, "test forward")

        def infer(op_schema, *args, **kwargs):
            raise DynamicOutputShapeException(op_schema.op)

        meshes = {"4": self.mesh((4,))}
        validation = ContractValidation(
            {call.op: [call]}, check_strategy_contract, infer, meshes, ["runtime"]
        )
        validation.run()
        self.assertIn(
            "runtime mesh 4: 1 calls not judged (data-dependent size)",
            format_ops(validation),
        )

    def test_command_line(self) -> None:
        """``strategy_validation --contract`` captures the filter's OpInfo samples, asks
        every registry they reach and prints the per-clause summary for each op."""
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.tensor._ops.strategy_validation",
            "--contract",
            "--op",
            "t",
            "--device",
            "cpu",
            "--meshes",
            "4",
            "--modes",
            "runtime,planner",
            "--dtypes",
            "float32",
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        self.assertIn(out.returncode, (0, 1), out.stderr[-2000:])
        self.assertIn(
            "Mode: contract (C1-C5), meshes 4, modes runtime,planner", out.stdout
        )
        self.assertIn("aten.t.default", out.stdout)
        self.assertIn("Summary (OpSpecs breaking each clause)", out.stdout)
        header = next(
            line for line in out.stdout.splitlines() if line.lstrip().startswith("mode")
        )
        for column in (
            "C1",
            "C2",
            "C3",
            "C4",
            "C5",
            "errors",
            "refused",
            "no strategy",
        ):
            self.assertIn(column, header)


if __name__ == "__main__":
    run_tests()
