# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The finalizer on its own: ``finalize_strategy`` called directly on hand-built
strategies, before any registry calls it.

What it completes (output metas, ``None`` results, input specs, cost rows), what
it passes through untouched, what it rejects naming op, strategy, OpSpec and
position, and what eager dispatch keeps using as stock does.
"""

from collections.abc import Callable

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops import _finalize_strategy as fin
from torch.distributed.tensor._ops._output_metas import eager_dispatch
from torch.distributed.tensor._ops.strategy_contract import (
    infer_output_metas,
    tensor_inputs,
)
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten
R, S0, S1 = Replicate(), Shard(0), Shard(1)


def bare(spec: DTensorSpec) -> DTensorSpec:
    """``spec``'s placements without a meta, as hand-written strategies build them."""
    return DTensorSpec(spec.mesh, spec.placements)


def follow_input(
    schema: OpSchema, outputs: Callable[[DTensorSpec], object], derive: bool = False
) -> OpStrategy:
    """One OpSpec per candidate of input 0: ``outputs(candidate)`` as output, that
    candidate as input spec (none with ``derive``: DTensor's "inputs follow the
    output" convention), no costs."""
    first = tensor_inputs(schema)[0]
    return OpStrategy([
        OpSpec(outputs(bare(c.output_spec)), None if derive else [bare(c.output_spec)])
        for c in first.strategies
    ])


# Strategies a hand-written rule gives and the finalizer completes:
# (case, op, args, strategy builder).
COMPLETED = {
    # metas, input specs and costs all left out
    "bare_output": (aten.relu.default, lambda s: follow_input(s, lambda o: o, derive=True)),
    # one spec for a two-result op: both results take its placements
    "one_spec_for_two_results": (aten.max.dim, lambda s: follow_input(s, lambda o: o)),
    # a spec where the op returns None (output_mask False): None
    "spec_for_none_result": (
        aten.native_layer_norm_backward.default,
        lambda s: OpStrategy(
            [OpSpec((bare(c.output_spec),) * 3, [bare(c.output_spec)] * 6)
             for c in tensor_inputs(s)[0].strategies[:1]]
        ),
    ),
    # a cost row shorter than the input's candidates
    "short_cost_row": (
        aten.relu.default,
        lambda s: OpStrategy(
            [OpSpec(bare(c.output_spec), [bare(c.output_spec)], [[0.0]])
             for c in tensor_inputs(s)[0].strategies]
        ),
    ),
}


def case_args(op: torch._ops.OpOverload) -> tuple[tuple, dict]:
    x = torch.randn(8, 6)
    if op is aten.max.dim:
        return (x, 1), {}
    if op is aten.native_layer_norm_backward.default:
        mean, rstd = torch.randn(8, 1), torch.randn(8, 1)
        return (x, x, [6], mean, rstd, torch.randn(6), torch.randn(6), [True, False, False]), {}
    return (x,), {}


class TestFinalizeStrategy(StrategyContractTestBase):
    def schema(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict | None = None) -> OpSchema:
        return strategy_schema(self.mesh((2, 2)), op, args, kwargs, planner_candidates)

    def finalize(self, schema: OpSchema, strategy: StrategyType) -> StrategyType:
        return fin.finalize_strategy(schema, strategy, infer_output_metas(schema), "hand_made")

    @parametrize("case", list(COMPLETED))
    def test_completes(self, case: str) -> None:
        op, build = COMPLETED[case]
        schema = self.schema(op, *case_args(op))
        self.assert_contract(schema, self.finalize(schema, build(schema)))

    def test_complete_specs_pass_through(self) -> None:
        """A spec built with the very metas the finalizer is given is kept as is."""
        schema = self.schema(aten.relu.default, (torch.randn(8, 6),))
        done = self.finalize(schema, follow_input(schema, lambda o: o))
        metas = infer_output_metas(schema)
        rebuilt = OpStrategy([
            OpSpec(DTensorSpec(s.output_spec.mesh, s.output_spec.placements, tensor_meta=metas),
                   s.input_specs, s.redistribute_cost)
            for s in done.strategies
        ])
        again = fin.finalize_strategy(schema, rebuilt, metas, "complete")
        self.assertEqual(len(again.strategies), len(rebuilt.strategies))
        for kept, given in zip(again.strategies, rebuilt.strategies):
            self.assertIs(kept, given)

    def test_tuple_strategy_children(self) -> None:
        schema = self.schema(
            aten._foreach_add.List, ([torch.randn(8, 6), torch.randn(4)], [torch.randn(8, 6), torch.randn(4)])
        )
        children = [
            OpStrategy([OpSpec(bare(c.output_spec)) for c in child.strategies])
            for child in schema.args_schema[0].children
        ]
        self.assert_contract(schema, self.finalize(schema, TupleStrategy(children)))

    # (case, op, strategy builder, position named, message part)
    REJECTED = {
        "three_specs_for_two_results": (
            aten.max.dim, lambda s: follow_input(s, lambda o: (o, o, o)), "output", "the op has 2 results"
        ),
        "none_for_tensor_result": (
            aten.relu.default, lambda s: follow_input(s, lambda o: None), "output",
            "the op returns a tensor but the spec is None",
        ),
        "tuple_child_none_for_tensor_result": (
            aten._foreach_neg.default,
            lambda s: TupleStrategy([
                follow_input(OpSchema(s.op, (child,), {}), lambda o, i=i: None if i == 1 else o)
                for i, child in enumerate(s.args_schema[0].children)
            ]),
            "output", "(child 1)",
        ),
        "input_spec_not_a_dtensor_spec": (
            aten.relu.default,
            lambda s: OpStrategy([OpSpec(bare(c.output_spec), [None]) for c in tensor_inputs(s)[0].strategies]),
            "input 0", "expected a DTensorSpec, got None",
        ),
        "fewer_input_specs_than_positional_inputs": (
            aten.add.Tensor,
            lambda s: OpStrategy([OpSpec(bare(c.output_spec), [c.output_spec]) for c in tensor_inputs(s)[0].strategies]),
            "input_specs", "the op has 2 tensor inputs but the spec lists 1",
        ),
    }

    @parametrize("case", list(REJECTED))
    def test_rejects_naming_op_strategy_and_position(self, case: str) -> None:
        op, build, position, problem = self.REJECTED[case]
        x = torch.randn(8, 6)
        args = {aten.max.dim: (x, 1), aten._foreach_neg.default: ([x, x],), aten.add.Tensor: (x, x)}.get(op, (x,))
        schema = self.schema(op, args)
        with self.assertRaises(fin.StrategyContractError) as ctx:
            self.finalize(schema, build(schema))
        message = str(ctx.exception)
        for part in (str(op), "strategy 'hand_made", f"at {position}:", problem):
            self.assertIn(part, message)

    def test_eager_dispatch_uses_what_stock_runs(self) -> None:
        """``None`` for a tensor result: stock's eager dispatch runs with it, so
        eager dispatch keeps it (strict mode off); any other caller gets the error."""
        schema = self.schema(aten.relu.default, (torch.randn(8, 6),))
        strategy = follow_input(schema, lambda o: None)
        with eager_dispatch():
            kept = self.finalize(schema, strategy)
        self.assertTrue(all(s.output_specs is None for s in kept.strategies))
        with self.assertRaises(fin.StrategyContractError):
            self.finalize(schema, strategy)

    def test_finalized_strategy_func(self) -> None:
        """The registry wrapper: defaults filled, metas inferred, result finalized."""
        seen: list[OpSchema] = []

        def rule(op_schema: OpSchema) -> OpStrategy:
            seen.append(op_schema)
            return follow_input(op_schema, lambda o: o)

        func = fin.FinalizedStrategyFunc(rule)
        self.assertEqual(func.__name__, "rule")
        x = torch.randn(8, 6)
        schema = strategy_schema(self.mesh((2, 2)), aten.sum.dim_IntList, (x, [1]), None, planner_candidates)
        self.assert_contract(schema, func(schema))
        # keepdim and dtype, left out of the call, are filled with their defaults
        self.assertEqual(seen[0].args_schema[2:], (False,))


instantiate_parametrized_tests(TestFinalizeStrategy)


if __name__ == "__main__":
    run_tests()
