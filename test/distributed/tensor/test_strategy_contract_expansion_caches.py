# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The caches ``expand_to_full_mesh_op_strategy`` works from, on their own.

The redistribute-cost rows and the shardability answers equal what the uncached
functions give and stay bounded; placement ids, which key a position's placements
across mesh dims, keep subclasses of a placement apart; the mixed-partial rule
combines only partial kinds that commute.
"""

from unittest import mock

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)


R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


class TestRedistributeCostCache(StrategyContractTestBase):
    def pairs(self) -> list[tuple[DTensorSpec, DTensorSpec]]:
        from torch.distributed.tensor.placement_types import _StridedShard

        mesh = self.mesh((2, 2))
        placements = [
            (R, R), (S0, R), (R, S1), (S0, S1), (S1, S0), (P, R), (R, P), (S0, S0),
            (_StridedShard(0, split_factor=2), S0),
        ]
        specs = []
        for shape in ((8, 6), (5, 7)):  # even and uneven shards
            meta = meta_of(torch.empty(shape))
            specs += [DTensorSpec(mesh, p, tensor_meta=meta) for p in placements]
        return [(a, b) for a in specs for b in specs if a.tensor_meta == b.tensor_meta]

    def test_cached_costs_equal_redistribute_cost(self) -> None:
        from torch.distributed.tensor._collective_utils import redistribute_cost
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

        cache.clear_cost_cache()
        for _ in range(2):  # computed, then served from the cache
            for src, dst in self.pairs():
                self.assertEqual(
                    cache.CostRows((src,)).row(dst)[0],
                    redistribute_cost(src, dst),
                    f"{src} -> {dst}",
                )
        self.assertGreater(cache.cost_cache_size(), 0)
        cache.clear_cost_cache()
        self.assertEqual(cache.cost_cache_size(), 0)

    def test_cache_stays_bounded(self) -> None:
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

        cache.clear_cost_cache()
        pairs = self.pairs()
        with mock.patch.object(cache._costs, "max_size", 5):
            for src, dst in pairs:
                cache.CostRows((src,)).row(dst)
                self.assertLessEqual(cache.cost_cache_size(), 5)
        cache.clear_cost_cache()

    def test_cost_rows(self) -> None:
        """A row prices every candidate; equal candidates of another tensor share it;
        the caller owns the list it gets."""
        from torch.distributed.tensor._collective_utils import redistribute_cost
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

        mesh = self.mesh((2, 2))
        meta = meta_of(torch.empty(8, 6))
        candidates = [(R, R), (S0, R), (R, S1), (P, R)]
        targets = [DTensorSpec(mesh, p, tensor_meta=meta) for p in ((S0, S1), (R, R), (P, P))]

        def sources() -> list[DTensorSpec]:  # new objects each time, as for another tensor
            return [DTensorSpec(mesh, p, tensor_meta=meta) for p in candidates]

        cache.clear_cost_cache()
        rows = cache.CostRows(sources())
        for dst in targets:
            self.assertEqual(rows.row(dst), [redistribute_cost(s, dst) for s in sources()])
        filled = cache.cost_cache_size()
        self.assertEqual(filled, len(targets))
        again = cache.CostRows(sources())
        first = again.row(targets[0])
        self.assertEqual(cache.cost_cache_size(), filled)  # served, not recomputed
        first[0] = -1.0
        self.assertNotEqual(again.row(targets[0])[0], -1.0)
        cache.clear_cost_cache()

    def test_cost_rows_without_metas_are_not_cached(self) -> None:
        """A source without a meta goes to redistribute_cost as is (which rejects it)."""
        from torch.distributed.tensor._collective_utils import redistribute_cost
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

        mesh = self.mesh((2,))
        cache.clear_cost_cache()
        src = DTensorSpec(mesh, (S0,))
        dst = DTensorSpec(mesh, (R,), tensor_meta=meta_of(torch.empty(4, 4)))
        with self.assertRaises(AssertionError) as stock:
            redistribute_cost(src, dst)
        with self.assertRaisesRegex(AssertionError, str(stock.exception)):
            cache.CostRows((src,)).row(dst)
        self.assertEqual(cache.cost_cache_size(), 0)



class TestShardableCache(StrategyContractTestBase):
    def test_answers_equal_is_tensor_shardable(self) -> None:
        from torch.distributed.tensor._ops import _shardable_cache as cache
        from torch.distributed.tensor._ops.utils import is_tensor_shardable

        mesh = self.mesh((2, 2))
        cache.clear_shardable_cache()
        for _ in range(2):  # answered, then served
            for shape in (torch.Size([8, 6]), torch.Size([1, 6]), torch.Size([3, 1])):
                for placements in ((S0, R), (S0, S0), (R, S1), (S1, S0), (P, R)):
                    spec = DTensorSpec(mesh, placements)
                    self.assertEqual(
                        cache.cached_is_shardable(is_tensor_shardable, shape, spec, None),
                        is_tensor_shardable(shape, spec),
                        f"{shape} {placements}",
                    )
        self.assertEqual(cache.shardable_cache_size(), 15)
        cache.clear_shardable_cache()
        self.assertEqual(cache.shardable_cache_size(), 0)


class TestExpansionPositions(StrategyContractTestBase):
    def test_subclass_placements_keep_their_own_id(self) -> None:
        from torch.distributed.tensor._ops._expansion_positions import placement_ids
        from torch.distributed.tensor.placement_types import _StridedShard

        strided = _StridedShard(0, split_factor=2)
        rule_ids, by_id = placement_ids([[S0, S0], [strided, S0], [Shard(0), R]])
        # equal Shard(0)s share an id; the strided shard of dim 0 does not
        self.assertEqual(rule_ids[0][0], rule_ids[2][0])
        self.assertNotEqual(rule_ids[0][0], rule_ids[1][0])
        self.assertIs(by_id[0][rule_ids[1][0]], strided)
        self.assertEqual(len(by_id[1]), 2)

    def test_mixed_partials(self) -> None:
        from torch.distributed.tensor._ops._expansion_positions import (
            mixes_partials,
            partial_kinds_by_id,
        )

        p_sum, p_avg, p_max = Partial("sum"), Partial("avg"), Partial("max")
        kinds = partial_kinds_by_id([[p_sum, R], [p_avg, R], [p_max, S0]])
        mesh = self.mesh((2, 2))
        self.assertFalse(mixes_partials(None, kinds))
        self.assertFalse(mixes_partials(DTensorSpec(mesh, (p_sum, p_avg)), kinds))
        self.assertFalse(mixes_partials(DTensorSpec(mesh, (p_max, p_max)), kinds))
        self.assertTrue(mixes_partials(DTensorSpec(mesh, (p_sum, p_max)), kinds))
        # a Partial the rules do not hold (not by identity) is not judged
        self.assertFalse(mixes_partials(DTensorSpec(mesh, (Partial("max"), p_sum)), kinds))


if __name__ == "__main__":
    run_tests()
