# Owner(s): ["oncall: distributed"]
"""A planner asks DTensor's registries for strategies with several candidate
placements per input, without output metas; every registry answers, and its
answer meets the same contract as a runtime answer."""

import gc
import weakref
from unittest import mock

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._collective_utils import MeshTopoInfo
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops import utils
from torch.distributed.tensor._redistribute import (
    _gen_transform_infos,
    clear_redistribute_planner_cache,
)
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.strategy_contract import (
    contract_violations,
    expected_output_metas,
    opinfo_calls,
    planner_candidates,
    query_strategy,
    registry,
    strategy_schema,
    StrategyContractTestCase,
)


aten = torch.ops.aten


@instantiate_parametrized_tests
class TestPlannerQueries(StrategyContractTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.capture = opinfo_calls()
        cls.calls = cls.capture.calls

    @parametrize("mesh_name", ["4", "2x2"])
    def test_every_registry_answers_planners(self, mesh_name: str) -> None:
        """Every captured call, each input with several candidates: the registry
        answers, and its answer meets the contract."""
        mesh = self.meshes[mesh_name]
        failures, judged = [], 0
        for i, (name, op, args, kwargs) in enumerate(self.calls):
            schema = strategy_schema(op, args, kwargs, mesh, planner_candidates)
            expected = self.capture.result_metas(i, schema)
            try:
                strategy = query_strategy(schema, mesh, runtime=False)
            except Exception as e:
                strategy, error = None, f"{type(e).__name__}: {e}"
            else:
                error = f"{registry(op)} gave no strategy"
            if isinstance(expected, Exception):
                # fake tensors give no result: its size depends on the data, or
                # torch has no meta kernel that runs the call; nothing to judge
                continue
            if strategy is None:
                failures.append(f"{name} {op}: {error}")
            else:
                judged += 1
                found = contract_violations(schema, strategy, expected)
                failures += [f"{name}: {v}" for v in found[:1]]
        self.assertFalse(failures, "\n".join(failures))
        self.assertGreater(judged, 0.9 * len(self.calls))

    def candidates(self, t: torch.Tensor, *placements, mesh=None) -> OpStrategy:
        mesh = mesh or self.meshes["4"]
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        return OpStrategy(
            [OpSpec(DTensorSpec(mesh, (p,), tensor_meta=meta)) for p in placements]
        )

    def test_single_dim_rules_offer_sharding_of_replicated_candidates(self) -> None:
        x, y = torch.randn(8, 4), torch.randn(4, 8)
        schema = OpSchema(
            aten.mm.default,
            (self.candidates(x, Replicate(), Replicate()), self.candidates(y, Replicate())),
            {},
        )
        strategy = query_strategy(schema, self.meshes["4"], runtime=False)
        outputs = {s.output_spec.placements for s in strategy.strategies}
        self.assertIn((Shard(0),), outputs)
        self.assertTrue(all(len(s.redistribute_cost[0]) == 2 for s in strategy.strategies))

    def test_view_redistributes_a_candidate_it_cannot_keep(self) -> None:
        x = torch.randn(8, 4)
        runtime = OpSchema(
            aten.view.default, (self.candidates(x, Shard(1)), [2, 16]), {}
        )
        with self.assertRaisesRegex(RuntimeError, "redistribute"):
            query_strategy(runtime, self.meshes["4"], runtime=False)
        planner = OpSchema(
            aten.view.default,
            (self.candidates(x, Replicate(), Shard(1)), [2, 16]),
            {},
        )
        strategy = query_strategy(planner, self.meshes["4"], runtime=False)
        costs = [s.redistribute_cost[0][1] for s in strategy.strategies]
        self.assertTrue(any(c > 0 for c in costs))

    def test_unbind_leaves_out_candidates_sharded_on_the_unbind_dim(self) -> None:
        x = torch.randn(8, 4)
        schema = OpSchema(
            aten.unbind.int, (self.candidates(x, Replicate(), Shard(0), Shard(1)), 0), {}
        )
        strategy = query_strategy(schema, self.meshes["4"], runtime=False)
        inputs = [s.input_specs[0].placements for s in strategy.strategies]
        self.assertEqual(inputs, [(Replicate(),), (Shard(1),)])

    def mm_query(self, mesh: DeviceMesh):
        x, y = torch.randn(8, 4), torch.randn(4, 8)
        schema = OpSchema(
            aten.mm.default,
            (
                self.candidates(x, Replicate(), Shard(0), Shard(1), mesh=mesh),
                self.candidates(y, Replicate(), Shard(0), Shard(1), mesh=mesh),
            ),
            {},
        )
        return query_strategy(schema, mesh, runtime=False)

    def test_cost_rows_are_shared_across_queries(self) -> None:
        utils._cost_rows.clear()
        first = self.mm_query(self.meshes["4"])
        with mock.patch.object(
            utils, "redistribute_cost", wraps=utils.redistribute_cost
        ) as priced:
            second = self.mm_query(self.meshes["4"])
        self.assertEqual(priced.call_count, 0)
        self.assertEqual(
            [s.redistribute_cost for s in second.strategies],
            [s.redistribute_cost for s in first.strategies],
        )
        with mock.patch.object(utils, "_COST_ROWS_MAXSIZE", 2):
            self.mm_query(self.meshes["2x2"])
            self.assertEqual(len(utils._cost_rows), 2)

    def test_cost_rows_keep_no_mesh_alive(self) -> None:
        mesh = DeviceMesh("cpu", torch.arange(self.world_size))
        self.mm_query(mesh)
        self.assertTrue(any(key[0]() is mesh for key in utils._cost_rows))
        mesh_ref = weakref.ref(mesh)
        del mesh
        # DTensor's own caches of meshes and specs
        clear_redistribute_planner_cache()
        _gen_transform_infos.cache_clear()
        MeshTopoInfo.build_from_mesh.cache_clear()
        DTensor._op_dispatcher.sharding_propagator._propagate_tensor_meta_cached.cache_clear()
        gc.collect()
        self.assertIsNone(mesh_ref())

    def test_decomposition_answers_planners(self) -> None:
        calls = [c for c in self.calls if registry(c[1]) == "decomposition"]
        if not calls:
            self.skipTest("no OpInfo call is answered by the decomposition path")
        _, op, args, kwargs = calls[0]
        mesh = self.meshes["2x2"]
        schema = strategy_schema(op, args, kwargs, mesh, planner_candidates)
        strategy = query_strategy(schema, mesh, runtime=False)
        self.assertIsNotNone(strategy, op)
        self.assertEqual(
            contract_violations(schema, strategy, expected_output_metas(schema)), []
        )


if __name__ == "__main__":
    run_tests()
