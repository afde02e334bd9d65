# Owner(s): ["oncall: distributed"]
"""A planner asks DTensor's registries for strategies with several candidate
placements per input, without output metas; every registry answers, and its
answer meets the same contract as a runtime answer."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor, DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.strategy_contract import (
    without_known_gaps,
    contract_violations,
    expected_output_metas,
    opinfo_calls,
    planner_candidates,
    query_strategy,
    registry,
    strategy_schema,
    StrategyContractTestCase,
)
from torch.utils._pytree import tree_map_only


aten = torch.ops.aten


def replicated_candidate(t: torch.Tensor, mesh: DeviceMesh) -> list[tuple]:
    return [(Replicate(),) * mesh.ndim]


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
            except NotImplementedError as e:
                # Refused: dispatch must refuse the call on replicated inputs too.
                replicated = strategy_schema(
                    op, args, kwargs, mesh, replicated_candidate
                )
                try:
                    answer = query_strategy(replicated, mesh, runtime=True)
                except NotImplementedError:
                    answer = None
                if answer is not None:
                    failures.append(f"{name} {op}: refused, dispatch is not: {e}")
                continue
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
        failures = without_known_gaps(failures)
        self.assertFalse(failures, "\n".join(failures))
        self.assertGreater(judged, 0.9 * len(self.calls))

    def candidates(self, t: torch.Tensor, *placements, mesh=None) -> OpStrategy:
        mesh = mesh or self.meshes["4"]
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        return OpStrategy(
            [OpSpec(DTensorSpec(mesh, (p,), tensor_meta=meta)) for p in placements]
        )

    def offered(self, strategy: OpStrategy) -> set[tuple]:
        """What a planner reads from an answer: each ``OpSpec``'s placements."""
        return {
            (
                tree_map_only(DTensorSpec, lambda o: o.placements, s.output_specs),
                tuple(spec.placements for spec in s.input_specs),
            )
            for s in strategy.strategies
        }

    def test_the_answer_does_not_depend_on_repeated_candidates(self) -> None:
        x, y = torch.randn(8, 4), torch.randn(4, 8)
        prop = DTensor._op_dispatcher.sharding_propagator
        for op, first, rest in [
            (aten.mm.default, (x, Replicate()), (self.candidates(y, Replicate()),)),
            (aten.view.default, (x, Shard(1)), ([2, 16],)),
            (aten.unbind.int, (x, Shard(1)), (0,)),
        ]:
            t, placement = first
            answers = [
                prop.enumerate_strategies(
                    OpSchema(op, (self.candidates(t, *[placement] * n), *rest), {})
                )
                for n in (1, 2, 3)
            ]
            self.assertEqual(len(answers[0].strategies), len(answers[2].strategies))
            self.assertEqual(self.offered(answers[0]), self.offered(answers[1]), op)
            self.assertEqual(self.offered(answers[0]), self.offered(answers[2]), op)

    def test_replicated_candidates_are_offered_sharded_strategies(self) -> None:
        x, y = torch.randn(8, 4), torch.randn(4, 8)
        schema = OpSchema(
            aten.mm.default,
            (self.candidates(x, Replicate()), self.candidates(y, Replicate())),
            {},
        )
        strategy = DTensor._op_dispatcher.sharding_propagator.enumerate_strategies(
            schema
        )
        self.assertIn((Shard(0),), {out for out, _ in self.offered(strategy)})

    def test_view_redistributes_a_candidate_it_cannot_keep(self) -> None:
        x = torch.randn(8, 4)
        runtime = OpSchema(
            aten.view.default, (self.candidates(x, Shard(1)), [2, 16]), {}
        )
        with self.assertRaisesRegex(RuntimeError, "redistribute"):
            query_strategy(runtime, self.meshes["4"], runtime=True)
        strategy = query_strategy(runtime, self.meshes["4"], runtime=False)
        self.assertEqual(len(strategy.strategies), 1)
        self.assertGreater(strategy.strategies[0].redistribute_cost[0][0], 0)

    def test_unbind_offers_the_input_unsharded_on_the_unbind_dim(self) -> None:
        x = torch.randn(8, 4)
        for placements in [(Shard(0),), (Shard(0), Replicate(), Shard(1))]:
            schema = OpSchema(aten.unbind.int, (self.candidates(x, *placements), 0), {})
            strategy = query_strategy(schema, self.meshes["4"], runtime=False)
            inputs = sorted(
                str(s.input_specs[0].placements) for s in strategy.strategies
            )
            expected = ["(Replicate(),)"] + (
                ["(Shard(dim=1),)"] if len(placements) > 1 else []
            )
            self.assertEqual(inputs, expected)
            # the Shard(0) candidate pays for its all-gather
            self.assertGreater(strategy.strategies[0].redistribute_cost[0][0], 0)

    def test_decomposition_answers_planners(self) -> None:
        mesh, answered = self.meshes["2x2"], 0
        for _, op, args, kwargs in self.calls:
            if registry(op) != "decomposition" or op._schema.is_mutable:
                continue  # out= and in-place calls are judged above
            schema = strategy_schema(op, args, kwargs, mesh, planner_candidates)
            try:
                strategy = query_strategy(schema, mesh, runtime=False)
            except NotImplementedError:
                continue  # refused as dispatch refuses it (checked above)
            self.assertEqual(
                contract_violations(schema, strategy, expected_output_metas(schema)),
                [],
            )
            answered += 1
        self.assertGreater(answered, 0)

    def test_decomposition_refuses_what_dispatch_refuses(self) -> None:
        """An op whose decomposition does not trace has no strategy for a
        planner, as dispatch has none even for replicated inputs."""
        x = torch.randn(2, 3, 8)
        schema = OpSchema(
            aten.reflection_pad1d.default, (self.candidates(x, Replicate()), [1, 1]), {}
        )
        with self.assertRaisesRegex(
            NotImplementedError, "reflection_pad1d.default does not have a sharding"
        ):
            DTensor._op_dispatcher.sharding_propagator.enumerate_strategies(schema)
        with LocalTensorMode(frozenset(range(self.world_size))):
            dx = distribute_tensor(x, self.meshes["4"], [Replicate()])
            with self.assertRaisesRegex(NotImplementedError, "sharding strategy"):
                torch.ops.aten.reflection_pad1d(dx, [1, 1])


if __name__ == "__main__":
    run_tests()
