# Owner(s): ["oncall: distributed"]
"""``strategy_validation --contract`` asks DTensor for the strategies of the aten
calls an OpInfo's samples make and reports, per op, how the answers meet the
strategy contract."""

import contextlib
import io
from unittest import mock

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
from torch.distributed.tensor._ops import strategy_validation
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract


aten = torch.ops.aten


class TestStrategyValidationContract(strategy_contract.StrategyContractTestCase):
    def check(self) -> tuple[int, list[str]]:
        """``--contract --op mm --max-samples 1``: the failing count and the output."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            failed = strategy_validation.check_contract(
                ["mm"], "cpu", torch.float32, self.world_size, 1, ["runtime", "planner"]
            )
        return failed, out.getvalue().splitlines()

    def row(self, lines: list[str]) -> list[str]:
        """The summary's counts for mm: calls, queries, ok, violating, no strategy,
        refused, error."""
        return next(line for line in lines if line.startswith("aten.mm ")).split()[1:]

    def test_complete_answers_pass(self) -> None:
        failed, lines = self.check()
        self.assertEqual(failed, 0)
        self.assertEqual(self.row(lines), ["1", "2", "2", "0", "0", "0", "0"])
        self.assertNotIn("aten.mm", lines[:2])  # no block for an op without findings

    def test_a_call_without_a_rule_has_no_strategy(self) -> None:
        prop = DTensor._op_dispatcher.sharding_propagator
        with (
            mock.patch.dict(prop.op_single_dim_strategy_funcs),
            mock.patch.dict(prop.op_strategy_funcs),
        ):
            prop.op_single_dim_strategy_funcs.pop(aten.mm.default, None)
            prop.op_strategy_funcs.pop(aten.mm.default, None)
            failed, lines = self.check()
        self.assertEqual(failed, 0)
        self.assertEqual(self.row(lines), ["1", "2", "0", "0", "2", "0", "0"])
        reason = "no strategy: aten.mm.default: no sharding rule is registered"
        self.assertEqual(sum(reason in line for line in lines), 2)

    def test_a_violation_fails_the_check(self) -> None:
        query = strategy_contract.query_strategy

        def without_output_metas(schema, mesh, runtime):
            specs = query(schema, mesh, runtime).strategies
            return OpStrategy(
                [
                    OpSpec(
                        DTensorSpec(s.output_spec.mesh, s.output_spec.placements),
                        s.input_specs,
                        s.redistribute_cost,
                    )
                    for s in specs
                ]
            )

        with mock.patch.object(
            strategy_contract, "query_strategy", without_output_metas
        ):
            failed, lines = self.check()
        self.assertEqual(failed, 2)
        self.assertEqual(self.row(lines), ["1", "2", "0", "2", "0", "0", "0"])
        self.assertTrue(
            any(
                "violating: aten.mm.default" in line and " C1 " in line
                for line in lines
            )
        )


if __name__ == "__main__":
    run_tests()
