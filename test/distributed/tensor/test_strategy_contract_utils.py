# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
``expand_to_full_mesh_op_strategy`` and the caches behind it, called directly as a
downstream rule author calls them (no registry involved).

The expansion builds complete specs without being given output metas (shape
inference of the query), ``None`` where the op returns ``None``, inputs with their
metas when inference cannot run; it leaves out per placement, not per combination,
what cannot shard, and combinations that share a spec keep their own costs. (The
caches behind it are tested in ``test_strategy_contract_expansion_caches.py``.)
"""


import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    specs_per_candidate,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
    meta_of,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


def _layer_norm_backward_args() -> tuple:
    g, x, w, b = torch.randn(8, 6), torch.randn(8, 6), torch.randn(6), torch.randn(6)
    return (g, x, [6], torch.randn(8, 1), torch.rand(8, 1) + 0.5, w, b, [True, False, True])


# (op, args, rules with outputs first, input_index): rules as a downstream author writes them
EXPANSIONS = {
    "mm": (
        aten.mm.default,
        lambda: (torch.randn(8, 6), torch.randn(6, 4)),
        [[R, R, R], [S0, S0, R], [S1, R, S1], [P, S1, S0]],
        1,
    ),
    "max_dim": (
        aten.max.dim,
        lambda: (torch.randn(8, 6), 1),
        [[R, R, R], [S0, S0, S0]],
        2,
    ),
    # grad_weight masked off: its position is None whatever the rule says
    "layer_norm_backward_masked": (
        aten.native_layer_norm_backward.default,
        _layer_norm_backward_args,
        [[R] * 9, [S0, P, P, S0, S0, S0, S0, R, R]],
        3,
    ),
}


class TestExpandToFullMesh(StrategyContractTestBase):
    @parametrize("case", list(EXPANSIONS))
    def test_complete_without_output_metas(self, case: str) -> None:
        op, make_args, rules, input_index = EXPANSIONS[case]
        for mesh_shape in ((4,), (2, 2)):
            with self.subTest(mesh=mesh_shape):
                mesh = self.mesh(mesh_shape)
                schema = strategy_schema(mesh, op, make_args(), None, planner_candidates)
                strategy = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=input_index)
                self.assertGreater(len(strategy.strategies), 0)
                self.assert_contract(schema, strategy)

    def test_expand_when_shape_inference_cannot_run(self) -> None:
        """A schema that is no valid call of its op (tests build them around a
        stand-in op) still expands: inputs carry their metas, outputs none."""
        mesh = self.mesh((4,))
        a, b = meta_of(torch.randn(8, 6)), meta_of(torch.randn(8, 10))
        schema = OpSchema(
            aten.add.Tensor,  # (8, 6) + (8, 10) does not broadcast
            tuple(OpStrategy([OpSpec(DTensorSpec(mesh, (R,), tensor_meta=m))]) for m in (a, b)),
            {},
            RuntimeSchemaInfo(),
        )
        rules = [[S0, S0, S0], [R, R, R]]
        strategy = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)
        for spec in strategy.strategies:
            self.assertEqual([s.tensor_meta for s in spec.input_specs], [a, b])
            self.assertIsNone(spec.output_spec.tensor_meta)


class TestExpansionFilters(StrategyContractTestBase):
    """What the expansion leaves out is decided per placement, not per combination."""

    def expand(self, rules: list[list[Placement]], shape: tuple[int, ...]) -> set[tuple[Placement, ...]]:
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

        mesh = self.mesh((2, 2))
        schema = strategy_schema(
            mesh, aten.neg.default, (torch.empty(shape),), candidates=capped_candidates(4)
        )
        strategy = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)
        return {spec.output_spec.placements for spec in strategy.strategies}

    def test_partial_kinds_that_do_not_commute_are_not_combined(self) -> None:
        p_sum, p_avg, p_max = Partial("sum"), Partial("avg"), Partial("max")
        rules = [[p_sum, R], [p_avg, R], [p_max, R], [R, R]]
        outputs = self.expand(rules, (8, 4))
        self.assertIn((p_sum, p_avg), outputs)  # sum and avg commute
        self.assertIn((p_max, p_max), outputs)
        self.assertIn((p_max, R), outputs)
        self.assertNotIn((p_sum, p_max), outputs)
        self.assertNotIn((p_max, p_avg), outputs)

    def test_unshardable_inputs_are_left_out(self) -> None:
        rules = [[S0, S0], [Shard(1), Shard(1)], [R, R]]
        outputs = self.expand(rules, (8, 1))  # dim 1 cannot be split in two
        self.assertIn((S0, S0), outputs)
        self.assertIn((S0, R), outputs)
        self.assertFalse(any(Shard(1) in p for p in outputs), outputs)

    def test_specs_shared_by_combinations_keep_their_own_costs(self) -> None:
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

        mesh = self.mesh((2, 2))
        schema = strategy_schema(
            mesh,
            aten.add.Tensor,
            (torch.empty(8, 4), torch.empty(8, 4)),
            candidates=capped_candidates(4),
        )
        # every rule replicates the second input: all combinations share its spec
        rules = [[S0, S0, R], [Shard(1), Shard(1), R], [R, R, R]]
        strategy = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)
        specs = strategy.strategies
        self.assertEqual(len(specs), 9)
        rows = [spec.redistribute_cost[1] for spec in specs]
        self.assertEqual(len({id(row) for row in rows}), len(rows))
        before = list(rows[1])
        rows[0][0] = -1.0  # a planner editing one spec's costs
        self.assertEqual(rows[1], before)
        for spec in specs:
            self.assertEqual(spec.input_specs[1].placements, (R, R))
            self.assertEqual(
                spec.input_specs[1].tensor_meta, schema.args_schema[1].strategies[0].output_spec.tensor_meta
            )


class TestSpecsPerCandidate(StrategyContractTestBase):
    def test_refused_candidates_drop_out(self) -> None:
        mesh = self.mesh((2, 2))
        schema = strategy_schema(mesh, aten.relu.default, (torch.randn(8, 6),), candidates=planner_candidates)
        inp = schema.args_schema[0]

        def only_replicate(c: OpSpec) -> OpSpec:
            if any(p != R for p in c.output_spec.placements):
                raise RuntimeError(f"refused {c.output_spec.placements}")
            return OpSpec(DTensorSpec(mesh, c.output_spec.placements), [c.output_spec])

        specs = specs_per_candidate(inp, only_replicate)
        self.assertEqual([s.output_spec.placements for s in specs], [(R, R)])
        # with every candidate refused, the first refusal is the answer
        with self.assertRaisesRegex(RuntimeError, "refused"):
            specs_per_candidate(OpStrategy(inp.strategies[1:]), only_replicate)



instantiate_parametrized_tests(TestExpandToFullMesh)


if __name__ == "__main__":
    run_tests()
