# Owner(s): ["oncall: distributed"]
"""A planner asks ``ShardingPropagator.enumerate_strategies`` for every strategy of
an op whose inputs each hold several candidate placements, without output metas."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Placement
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_map_only


aten, X, Y = torch.ops.aten, torch.randn(8, 4), torch.randn(4, 8)


def candidates(t: torch.Tensor, mesh: DeviceMesh, *placements: Placement) -> OpStrategy:
    """``t`` offered to the op in each of ``placements`` (one mesh dim)."""
    meta = TensorMeta(t.shape, t.stride(), t.dtype)
    return OpStrategy(
        [OpSpec(DTensorSpec(mesh, (p,), tensor_meta=meta)) for p in placements]
    )


PLANNER = DTensor._op_dispatcher.sharding_propagator.enumerate_strategies


def ask(op: torch._ops.OpOverload, *args: object) -> OpStrategy:
    """The planner's query, through the public entry point."""
    return PLANNER(OpSchema(op, args, {}))


def offered(strategy: OpStrategy) -> set[tuple]:
    """What a planner reads from an answer: each ``OpSpec``'s placements."""
    return {
        (
            tree_map_only(DTensorSpec, lambda o: o.placements, s.output_specs),
            tuple(spec.placements for spec in s.input_specs),
        )
        for s in strategy.strategies
    }


class TestPlannerQueries(LocalDTensorTestBase):
    @with_comms
    def test_the_answer_does_not_depend_on_repeated_candidates(self) -> None:
        """Single-dim expansion asserted on more than one candidate per input."""
        mesh = init_device_mesh("cpu", (4,))
        y = candidates(Y, mesh, Replicate())
        for op, first, rest in [
            (aten.mm.default, Replicate(), (y,)),
            (aten.view.default, Shard(1), ([2, 16],)),
            (aten.unbind.int, Shard(1), (0,)),
        ]:
            answers = [
                ask(op, candidates(X, mesh, *[first] * n), *rest) for n in (1, 2, 3)
            ]
            self.assertEqual(len(answers[0].strategies), len(answers[2].strategies))
            self.assertEqual(offered(answers[0]), offered(answers[1]), op)
            self.assertEqual(offered(answers[0]), offered(answers[2]), op)

    @with_comms
    def test_replicated_candidates_are_offered_sharded_strategies(self) -> None:
        """Placeholders expand to ``Shard`` though no candidate is sharded."""
        mesh = init_device_mesh("cpu", (4,))
        x, y = (candidates(t, mesh, Replicate()) for t in (X, Y))
        outputs = {out for out, _ in offered(ask(aten.mm.default, x, y))}
        self.assertIn((Shard(0),), outputs)

    @with_comms
    def test_view_redistributes_a_candidate_it_cannot_keep(self) -> None:
        """Dispatch refuses it; a planner is offered it replicated, at its cost."""
        mesh = init_device_mesh("cpu", (4,))
        for placement in (Shard(0), Shard(1)):  # (8, 4) viewed as (2, 16)
            args = (candidates(X, mesh, placement), [2, 16])
            with self.assertRaisesRegex(RuntimeError, "redistribute"):
                sc.query_strategy(OpSchema(aten.view.default, args, {}), mesh)
            (strategy,) = ask(aten.view.default, *args).strategies
            self.assertEqual(strategy.input_specs[0].placements, (Replicate(),))
            self.assertGreater(strategy.redistribute_cost[0][0], 0)

    @with_comms
    def test_unbind_offers_the_input_unsharded_on_the_unbind_dim(self) -> None:
        """Offered unsharded there, at the all-gather's cost; the answer was empty."""
        mesh = init_device_mesh("cpu", (4,))
        for placements in [(Shard(0),), (Shard(0), Replicate(), Shard(1))]:
            strategy = ask(aten.unbind.int, candidates(X, mesh, *placements), 0)
            inputs = sorted(
                str(s.input_specs[0].placements) for s in strategy.strategies
            )
            expected = ["(Replicate(),)"] + (
                ["(Shard(dim=1),)"] if len(placements) > 1 else []
            )
            self.assertEqual(inputs, expected)
            self.assertGreater(strategy.strategies[0].redistribute_cost[0][0], 0)

    @with_comms
    def test_decomposition_answers_planners(self) -> None:
        """The decomposition path answered ``None`` to anything but runtime specs."""
        mesh, x = init_device_mesh("cpu", (2, 2)), X
        for op, args in [
            (aten.hardswish.default, (x,)),
            (aten.glu.default, (x,)),
            (aten.mse_loss.default, (x, x)),
            (aten.trace.default, (x,)),
        ]:
            self.assertEqual(sc.registry(op), "decomposition")
            self.assertEqual(sc.check_call(op, args, {}, mesh, PLANNER), [], op)

    @with_comms
    def test_decomposition_refuses_what_dispatch_refuses(self) -> None:
        """An op whose decomposition does not trace, or takes a list of DTensors,
        has no strategy for a planner, as dispatch has none on replicated inputs."""
        mesh, x = init_device_mesh("cpu", (4,)), torch.randn(3, 8)
        for op, args, reason in [
            (aten.reflection_pad1d.default, lambda t: (t, [1, 1]), "does not trace"),
            (aten.block_diag.default, lambda t: ([t, t],), "takes no DTensor lists"),
        ]:
            with self.assertRaisesRegex(NotImplementedError, f"{op}: its .*{reason}"):
                ask(op, *args(candidates(x, mesh, Replicate())))
            with LocalTensorMode(frozenset(range(self.world_size))):
                dx = distribute_tensor(x, mesh, [Replicate()])
                with self.assertRaisesRegex(NotImplementedError, "sharding strategy"):
                    op(*args(dx))


if __name__ == "__main__":
    run_tests()
