# Owner(s): ["oncall: distributed"]
"""A planner's query: every strategy of an op whose inputs hold several candidates."""

from dataclasses import replace
from functools import partial
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import _StridedShard, Partial
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_map_only


aten, X, Y = torch.ops.aten, torch.randn(8, 4), torch.randn(4, 8)
R2 = (Replicate(),) * 2
PLANNER = DTensor._op_dispatcher.sharding_propagator.enumerate_strategies


def candidates(t: torch.Tensor, mesh: DeviceMesh, *placements: object) -> OpStrategy:
    """``t`` offered to the op in each of ``placements`` (a tuple: per mesh dim)."""
    meta = TensorMeta(t.shape, t.stride(), t.dtype)
    tuples = [p if isinstance(p, tuple) else (p,) for p in placements]
    return OpStrategy([OpSpec(DTensorSpec(mesh, p, tensor_meta=meta)) for p in tuples])


def ask(op: torch._ops.OpOverload, *args: object) -> OpStrategy:
    """The planner's query, through the public entry point."""
    return PLANNER(OpSchema(op, args, {}))


def offered(strategy: OpStrategy) -> set[tuple]:
    """What a planner reads from an answer: each ``OpSpec``'s placements."""
    read = partial(tree_map_only, DTensorSpec, lambda o: o.placements)
    return {(read(s.output_specs), *read(s.input_specs)) for s in strategy.strategies}


class TestPlannerQueries(LocalDTensorTestBase):
    @with_comms
    def test_the_answer_does_not_depend_on_repeated_candidates(self) -> None:
        """Single-dim expansion asserted on several candidates, offered no unheld Shard."""
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
            for n in (1, 2):
                self.assertEqual(offered(answers[0]), offered(answers[n]), str(op))
        mm = ask(aten.mm.default, candidates(X, mesh, Replicate()), y)
        self.assertIn((Shard(0),), {out for out, *_ in offered(mm)})
        x = candidates(torch.randn(3, 4), mesh, Replicate(), Shard(0))  # 3 rows: uneven
        flipped = OpStrategy(x.strategies[::-1])  # only the first was judged, before
        for op, arg in [(aten.sum.dim_IntList, [1]), (aten.add_.Tensor, x)]:
            answers = [offered(ask(op, c, arg)) for c in (x, flipped)]
            self.assertEqual(answers[0], answers[1], str(op))  # nor on their order

    @with_comms
    def test_view_redistributes_a_candidate_it_cannot_keep(self) -> None:
        """A placement the rule refuses is offered replicated, at a cost."""
        mesh = init_device_mesh("cpu", (4,))
        for placement in (Shard(0), Shard(1)):  # (8, 4) viewed as (2, 16)
            args = (candidates(X, mesh, placement), [2, 16])
            (strategy,) = ask(aten.view.default, *args).strategies
            self.assertEqual(strategy.input_specs[0].placements, (Replicate(),))
            self.assertGreater(strategy.redistribute_cost[0][0], 0)

    @with_comms
    def test_decomposition_answers_planners(self) -> None:
        """The decomposition path answered ``None`` to anything but runtime specs."""
        mesh = init_device_mesh("cpu", (2, 2))
        for op in (aten.hardswish, aten.glu, aten.mse_loss, aten.trace):
            args = (X, X) if op is aten.mse_loss else (X,)
            self.assertEqual(sc.registry(op.default), "decomposition")
            self.assertEqual(sc.check_call(op.default, args, {}, mesh, PLANNER), [], op)
        with FakeTensorMode():  # it raised: the path traces in a fake mode of its own
            ask(aten.hardswish.default, candidates(X, mesh, R2))

    @with_comms
    def test_refusals(self) -> None:
        """No strategy where dispatch has none; malformed candidates raised in rules."""
        mesh, x = init_device_mesh("cpu", (4,)), torch.randn(3, 8)
        for op, args in [
            (aten.reflection_pad1d.default, lambda t, _: (t, [1, 1])),
            (aten.block_diag.default, lambda t, tensors: (tensors([t, t]),)),
        ]:
            with self.assertRaisesRegex(NotImplementedError, f"{op} does not have"):
                ask(op, *args(candidates(x, mesh, Replicate()), TupleStrategy))
            with LocalTensorMode(frozenset(range(self.world_size))):
                dargs = args(distribute_tensor(x, mesh, [Replicate()]), list)
                self.assertRaisesRegex(NotImplementedError, "strategy", op, *dargs)
        with self.assertRaisesRegex(NotImplementedError, "data-dependent output"):
            ask(aten.argwhere.default, candidates(x, mesh, Replicate()))
        no_meta = OpStrategy([OpSpec(DTensorSpec(mesh, (Replicate(),)))])
        bad = [OpStrategy([]), no_meta, no_meta.strategies[0].output_spec]  # a spec
        for x in [*bad, X, candidates(X, mesh, Shard(2)), candidates(X, mesh, R2)]:
            with self.assertRaisesRegex(ValueError, "view.default.*tensor input 0"):
                ask(aten.view.default, x, [32])
        with self.assertRaisesRegex(ValueError, "stack.default.*TupleStrategy"):
            ask(aten.stack.default, [candidates(X, mesh, Replicate())] * 2)

    @with_comms
    def test_placements_fsdp_with_tp_gives(self) -> None:
        """``unbind`` raised on FSDP2+TP; ``view`` priced it to itself at ``inf``."""
        mesh = init_device_mesh("cpu", (2, 2))
        fsdp_tp = (_StridedShard(0, split_factor=2), Shard(0))
        x = candidates(torch.randn(8, 4), mesh, R2, fsdp_tp)
        (strategy,) = ask(aten.unbind.int, x, 0).strategies
        self.assertEqual(strategy.input_specs[0].placements, R2)
        kept = ask(aten.view.default, x, [8, 2, 2]).strategies
        self.assertIn([0.0, 0.0], [s.redistribute_cost[0] for s in kept])
        read = {"use_strided_shard_as_shard_order": False}  # as a layout
        layout = OpStrategy([OpSpec(replace(x.strategies[1].output_spec, **read))])
        for s in ask(aten.view.default, layout, [32]).strategies:
            self.assertIs(s.input_specs[0].use_strided_shard_as_shard_order, False)
        held = OpStrategy([x.strategies[0], *layout.strategies])  # a later candidate
        added = ask(aten.add.Tensor, candidates(X, mesh, R2), held).strategies
        specs = [t for s in added for t in (s.output_spec, *s.input_specs)]
        strided = [t for t in specs if t.placements == fsdp_tp]  # asked what x holds
        read_as_held = {t.use_strided_shard_as_shard_order for t in strided}
        self.assertEqual(read_as_held, {False})  # by every spec built from it
        for op, args, held in [  # no made-up layout; argmax keeps no _StridedShard
            (aten.gelu.default, (x,), fsdp_tp),
            (aten.view.default, (x, [2, 16]), fsdp_tp),
            (aten.argmax.default, (x, 1), None),
            (aten._foreach_add.List, (TupleStrategy([x]),) * 2, fsdp_tp),
        ]:
            answer = ask(op, *args)
            for s in getattr(answer, "children", [answer])[0].strategies:
                asked = s.input_specs[0].placements
                if any(isinstance(p, _StridedShard) for p in asked):
                    self.assertEqual(asked, held, msg=str(op))
        rules = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs
        for rule, error in [  # a bug in the rule; an answer with no strategy
            (mock.Mock(side_effect=RuntimeError("a bug")), "a bug"),
            (mock.Mock(return_value=OpStrategy([])), "no strategy for these"),
        ]:
            with mock.patch.dict(rules, {aten.unbind.int: rule}):
                self.assertRaisesRegex(RuntimeError, error, ask, aten.unbind.int, x, 0)
        one_row = candidates(torch.randn(1, 8), mesh, (Shard(0),) * 2)  # in place: kept
        with self.assertRaisesRegex(NotImplementedError, "no strategy for these"):
            ask(aten.squeeze_.dim, one_row, 0)
        s0_r = candidates(torch.randn(8, 6), mesh, (Shard(0), Replicate()))
        self.assertRaisesRegex(
            NotImplementedError, "in-place", ask, aten.t_.default, s0_r
        )

    @with_comms
    def test_no_sharding_eager_computes_wrongly(self) -> None:
        """Uneven mse_loss to Partial("avg"), flatten's split factor, view_copy's shards."""
        mesh, s00 = init_device_mesh("cpu", (2, 2)), (Shard(0), Shard(0))
        avg = (Partial("avg"),) * 2
        for op, t, args, wrong in [
            (aten.mse_loss.default, torch.randn(6), (), (avg, s00, s00)),
            (aten.view_copy.default, X, ([2, 16],), (s00, s00)),
        ]:
            x = candidates(t, mesh, s00)
            self.assertNotIn(wrong, offered(ask(op, x, *(args or (x,)))))
        x = candidates(torch.randn(4, 8), mesh, (Shard(0), Shard(1)))
        wrong = (Shard(0), _StridedShard(0, split_factor=4))  # 2 rows a rank: sf 2
        for s in ask(aten.flatten.using_ints, x, 0, 1).strategies:
            self.assertNotEqual(s.output_spec.placements, wrong)

    @with_comms
    def test_attention_offers_batch_and_heads(self) -> None:
        """Flash for CPU had no strategy; each result has its meta (rank-local too)."""
        mesh, q = init_device_mesh("cpu", (2, 2)), torch.empty(4, 4, 8, 16)
        cpu = aten._scaled_dot_product_flash_attention_for_cpu.default
        efficient = aten._scaled_dot_product_efficient_attention.default
        for op, args in [(cpu, (q, q, q)), (efficient, (q, q, q, None, True))]:
            self.assertEqual(sc.check_call(op, args, {}, mesh, PLANNER), [])
            schema = sc.strategy_schema(op, args, {}, mesh, sc.planner_candidates)
            outputs = {s.output_specs[0].placements for s in PLANNER(schema).strategies}
            self.assertIn((Shard(0), Shard(1)), outputs)
        kw = {"is_causal": True}  # by name, as an FX node may hold it: no query rows
        schema = sc.strategy_schema(cpu, (q, q, q), kw, mesh, sc.planner_candidates)
        rows = {s.input_specs[0].placements for s in PLANNER(schema).strategies}
        self.assertFalse(any(Shard(2) in ps for ps in rows), rows)


if __name__ == "__main__":
    run_tests()
