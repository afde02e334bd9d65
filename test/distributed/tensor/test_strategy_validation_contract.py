# Owner(s): ["oncall: distributed"]
"""``strategy_validation --contract``: the aten calls of OpInfo samples, asked as
dispatch and as a planner asks with candidates real programs hold, checked against
the contract, with refusals counted only where eager DTensor refuses alike."""

import contextlib
import io

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.placement_types import _StridedShard, Partial, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
import torch.testing._internal.distributed._tensor.strategy_contract_opinfo as checks
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestStrategyValidationContract(LocalDTensorTestBase):
    @with_comms
    def test_contract_report(self) -> None:
        """It counts what it asked and names ``nonzero``, which read as a pass."""
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            found = checks.check_opinfo_calls(["mm", "unbind", "nonzero"], 4)
        report = printed.getvalue()
        self.assertEqual(found, 1, report)  # nonzero's
        self.assertRegex(report, r"(\d+) queries of \d+ aten calls .*: \1 answered")
        self.assertIn("no strategy at all: aten.nonzero.default", report)

    @with_comms
    def test_planner_candidates_hold_what_programs_hold(self) -> None:
        """``Partial``, uneven shards and FSDP2 with TP's ``_StridedShard``."""
        mesh = init_device_mesh("cpu", (2, 2))
        found = sc.planner_candidates(torch.randn(5, 4), mesh)
        self.assertIn((Partial(), Partial()), found)
        self.assertIn((Shard(0), Shard(0)), found)  # 5 rows on 4 ranks
        self.assertIn((_StridedShard(0, split_factor=2), Shard(0)), found)

    @with_comms
    def test_refusals_agree_only_with_their_reason(self) -> None:
        """The same type and message, or shape inference's, never an internal error."""
        missing, other = (NotImplementedError(f"aten.{x} has none") for x in "xy")
        self.assertTrue(
            checks.refused_alike(missing, NotImplementedError(missing), True)
        )
        self.assertFalse(checks.refused_alike(missing, other, True))
        self.assertFalse(checks.refused_alike(KeyError(1), KeyError(1), False))
        refused = RuntimeError("Attempted to unbind along the sharded dimension 0.")
        self.assertTrue(checks.refused_alike(refused, RuntimeError(refused), False))
        self.assertFalse(checks.refused_alike(refused, RuntimeError(refused), True))
        shape = DataDependentOutputException(torch.ops.aten.item.default)
        self.assertTrue(checks.refused_alike(shape, RuntimeError(f"{shape}\n"), False))


if __name__ == "__main__":
    run_tests()
