# Owner(s): ["oncall: distributed"]
"""Redistribution costs: rows kept until the caches are cleared, never read under
another plan setting, plans of their own, no Partial("product") made."""

from unittest import mock

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._collective_utils import redistribute_cost
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._ops import utils
from torch.distributed.tensor._redistribute import (
    _gen_transform_infos,
    use_min_cost_redistribution_plan,
)
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import _StridedShard, Partial
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


PROP, MM = DTensor._op_dispatcher.sharding_propagator, torch.ops.aten.mm.default
BMM = torch.ops.aten.bmm.default
ARGS = (torch.randn(8, 4), torch.randn(4, 8))


class TestStrategyCostRows(LocalDTensorTestBase):
    def costs_computed(self, mesh: DeviceMesh) -> tuple[list, int]:
        """A planner's ``mm`` query: its cost rows, and how many costs it computed."""
        schema = sc.strategy_schema(MM, ARGS, {}, mesh, sc.planner_candidates)
        cost = utils.redistribute_cost  # what the strategy utilities call
        with mock.patch.object(utils, "redistribute_cost", wraps=cost) as m:
            answer = PROP.enumerate_strategies(schema)
        return [s.redistribute_cost for s in answer.strategies], m.call_count

    @with_comms
    def test_repeated_query_computes_no_cost_until_caches_are_cleared(self) -> None:
        """Same rows each time; computed once per plan setting."""
        for shape in [(4,), (2, 2)]:
            mesh = init_device_mesh("cpu", shape)
            _clear_sharding_prop_cache()
            rows, computed = self.costs_computed(mesh)
            self.assertGreater(computed, 0)
            self.assertEqual(self.costs_computed(mesh), (rows, 0))
            with use_min_cost_redistribution_plan():  # rows key on the plan setting
                self.assertGreater(self.costs_computed(mesh)[1], 0)
            _clear_sharding_prop_cache()
            self.assertEqual(self.costs_computed(mesh), (rows, computed))

    @with_comms
    def test_plan_setting_never_reads_stale_rows(self) -> None:
        """Rows asked under ``use_min_cost_redistribution_plan`` after rows asked
        without it, no cache cleared, were the default plan's."""
        mesh = init_device_mesh("cpu", (2, 2))
        args = (torch.randn(4, 8, 6), torch.randn(4, 6, 8))
        schema = sc.strategy_schema(BMM, args, {}, mesh, sc.planner_candidates)

        def rows() -> list:
            answer = PROP.enumerate_strategies(schema)
            return [s.redistribute_cost for s in answer.strategies]

        def clear() -> None:  # and the redistribution plans the costs come from
            _clear_sharding_prop_cache()
            _gen_transform_infos.cache_clear()

        for first, second in ((False, True), (True, False)):
            clear()
            with use_min_cost_redistribution_plan(first):
                rows()
            with use_min_cost_redistribution_plan(second):
                warm = rows()
            clear()
            with use_min_cost_redistribution_plan(second):
                self.assertEqual(warm, rows())

    @with_comms
    def test_strided_shard_to_itself_and_replicate_to_product(self) -> None:
        """The two readings of a ``_StridedShard`` cost nothing where one layout; no
        Replicate becomes Partial("product"); no redistribution reads a cost's plan."""
        mesh, x = init_device_mesh("cpu", (2, 2)), torch.randn(8, 4)
        mesh3 = DeviceMesh("cpu", torch.arange(8).view(2, 2, 2), _init_backend=False)
        strided = (_StridedShard(0, split_factor=4), _StridedShard(0, split_factor=2))
        for m, rows, free in ((mesh, 8, True), (mesh3, 8, True), (mesh3, 6, False)):
            meta = TensorMeta(torch.Size([rows, 4]), (4, 1), x.dtype)  # 6: they differ
            placements = strided[3 - m.ndim :] + (Shard(0),)
            order = DTensorSpec(m, placements, tensor_meta=meta)
            layout = DTensorSpec(m, placements, meta, None, False)  # not an order
            self.assertEqual(redistribute_cost(order, layout) == 0.0, free)
            self.assertEqual(redistribute_cost(layout, order) == 0.0, free)
        rep = DTensorSpec(mesh, (Replicate(),) * 2, meta)
        product = DTensorSpec(mesh, (Partial("product"),) * 2, meta)  # no partition
        self.assertEqual(redistribute_cost(rep, product), float("inf"))
        _gen_transform_infos.cache_clear()  # a cost's plan: rank 0's, its own entry
        redistribute_cost(DTensorSpec(mesh, (Shard(0),) * 2, meta), rep)
        _gen_transform_infos(DTensorSpec(mesh, (Shard(0),) * 2, meta), rep, None)
        self.assertEqual(_gen_transform_infos.cache_info().hits, 0)  # not read

    @with_comms
    def test_symbolic_shapes_keep_sharding(self) -> None:
        """Symbolic specs key no cache: an expansion shares rows by placements, and the
        decomposition path (hardswish) leaves its local-shape check out for them."""
        mesh = init_device_mesh("cpu", (2, 2))
        x = distribute_tensor(torch.randn(16, 8), mesh, [Shard(0), Replicate()])
        for fn in (torch.relu, torch.nn.functional.hardswish):
            out = torch.compile(fn, backend="aot_eager", dynamic=True)(x)
            self.assertEqual(out.placements, x.placements)
            self.assertEqual(out.full_tensor(), fn(x.full_tensor()))


if __name__ == "__main__":
    run_tests()
