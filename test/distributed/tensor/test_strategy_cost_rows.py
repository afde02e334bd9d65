# Owner(s): ["oncall: distributed"]
"""Cost rows are kept across strategy queries, until the sharding caches are
cleared."""

from unittest import mock

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops import utils
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.strategy_contract import (
    StrategyContractTestCase,
)


aten = torch.ops.aten


class TestStrategyCostRows(StrategyContractTestCase):
    def mm_query(self, mesh: DeviceMesh) -> OpStrategy:
        def candidates(t: torch.Tensor) -> OpStrategy:
            meta = TensorMeta(t.shape, t.stride(), t.dtype)
            return OpStrategy(
                [
                    OpSpec(DTensorSpec(mesh, (p,) * mesh.ndim, tensor_meta=meta))
                    for p in (Replicate(), Shard(0), Shard(1))
                ]
            )

        schema = OpSchema(
            aten.mm.default,
            (candidates(torch.randn(8, 4)), candidates(torch.randn(4, 8))),
            {},
        )
        propagator = DTensor._op_dispatcher.sharding_propagator
        return propagator.enumerate_strategies(schema)

    def priced_query(self, mesh: DeviceMesh) -> tuple[OpStrategy, int]:
        """The answer, and how many redistribution costs it computed."""
        with mock.patch.object(
            utils, "redistribute_cost", wraps=utils.redistribute_cost
        ) as priced:
            answer = self.mm_query(mesh)
        return answer, priced.call_count

    def test_a_repeated_query_computes_no_cost(self) -> None:
        for mesh in self.meshes.values():
            _clear_sharding_prop_cache()
            first, computed = self.priced_query(mesh)
            second, recomputed = self.priced_query(mesh)
            self.assertGreater(computed, 0)
            self.assertEqual(recomputed, 0)
            self.assertEqual(
                [s.redistribute_cost for s in second.strategies],
                [s.redistribute_cost for s in first.strategies],
            )

    def test_clearing_the_sharding_caches_clears_cost_rows(self) -> None:
        self.mm_query(self.meshes["4"])
        _clear_sharding_prop_cache()
        _, computed = self.priced_query(self.meshes["4"])
        self.assertGreater(computed, 0)


if __name__ == "__main__":
    run_tests()
