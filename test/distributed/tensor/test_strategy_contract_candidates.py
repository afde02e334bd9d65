# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the input strategies and candidate builders (``contract_candidates``).
"""

import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import (
    first_candidates,
    meta_of,
    op_strategy,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


class TestCandidates(StrategyContractTestBase):
    def test_op_strategy(self) -> None:
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(4, 6))
        default = op_strategy(mesh, meta)
        self.assertEqual(len(default.strategies), 1)
        self.assertEqual(default.strategies[0].output_spec.placements, (R, R))
        self.assertEqual(default.tensor_meta, meta)
        several = op_strategy(mesh, meta, (S0, R), [R, P])
        self.assertEqual(
            [s.output_spec.placements for s in several.strategies], [(S0, R), (R, P)]
        )
        with self.assertRaises(ValueError):
            op_strategy(mesh, meta, (S0,))

    def test_first_candidates(self) -> None:
        """Fewest non-Replicate mesh dims first, in option order, capped; uneven
        and empty shards stay in (the audit's planner candidates)."""
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(2, 3))
        every = first_candidates(100)(mesh, meta)
        # per mesh dim: R, S(0), S(1), P -> 16 tuples
        self.assertEqual(len(every), 16)
        self.assertEqual(every[:4], [(R, R), (R, S0), (R, S1), (R, P)])
        self.assertEqual(every[4:7], [(S0, R), (S1, R), (P, R)])
        # S(0) twice splits 2 rows over 4 ranks: offered all the same
        self.assertIn((S0, S0), every)
        self.assertEqual(first_candidates(5)(mesh, meta), every[:5])
        ints = first_candidates(100)(
            self.mesh((4,)), meta_of(torch.ones(4, 2, dtype=torch.long))
        )
        # no Partial for integers; dim 1 (2) is shorter than the mesh (4)
        self.assertEqual(ints, [(R,), (S0,)])
        with self.assertRaisesRegex(ValueError, "at least 1"):
            first_candidates(0)


if __name__ == "__main__":
    run_tests()
