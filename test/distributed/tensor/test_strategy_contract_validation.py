# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the engine of ``strategy_validation --contract`` (``_ops/_contract_validation.py``):
what it counts for the answers it gets, and runtime refusals told apart from failures per
query. Nothing here depends on what DTensor's registries answer, so these hold on
stock torch with the contract's steps as with the whole change.
"""

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.distributed.tensor._ops._contract_validation import ContractValidation
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    ContractViolation,
    infer_output_metas,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_capture import CapturedCall
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    RUNTIME_REFUSAL_TYPES,
)


aten = torch.ops.aten


class TestContractValidation(StrategyContractTestBase):
    def test_counts_opspecs_per_clause(self) -> None:
        """A clause counts the OpSpecs breaking it, not its violations: two C1 positions
        of one spec are one; C5 is counted per child's spec, and by the child's clause."""
        x = torch.randn(8, 4)
        call = CapturedCall(aten.relu.default, (meta_of(x),), {}, "test forward")

        def check(op_schema, strategy, metas, **kwargs) -> list[ContractViolation]:
            def v(
                clause: str, index: int, position: str, child: str | None = None
            ) -> ContractViolation:
                return ContractViolation(
                    clause, str(op_schema.op), index, position, "x", "y", child
                )

            return [
                v("C1", 0, "output 0"),
                v("C1", 0, "output 1"),
                v("C3", 1, "input 0"),
                v("C5", 0, "child 0 output", "C1"),
                v("C5", 0, "child 1 output", "C1"),
            ]

        validation = ContractValidation(
            {call.op: [call]},
            check,
            infer_output_metas,
            {"4": self.mesh((4,))},
            ["runtime"],
        )
        validation.run()
        (counts,) = validation.results[("runtime", "4")].values()
        self.assertEqual(counts.queries, 2)  # all Replicate, and input 0 Shard(0)
        self.assertEqual(dict(counts.clauses), {"C1": 2, "C3": 2, "C5": 4})
        self.assertEqual(dict(counts.c5_children), {"C1": 4})
        self.assertTrue(counts.failed)
        self.assertIn(
            "C1 aten.relu.default strategy 0 output 0",
            counts.examples["C1"]["violation"],
        )

    def test_calls_it_cannot_judge_are_counted(self) -> None:
        """A call whose result size shape inference cannot give is not judged, but
        counted (the report says so instead of leaving it out)."""
        x = torch.randn(8, 4)
        call = CapturedCall(aten.relu.default, (meta_of(x),), {}, "test forward")

        def infer(op_schema, *args, **kwargs):
            raise DynamicOutputShapeException(op_schema.op)

        meshes = {"4": self.mesh((4,))}
        validation = ContractValidation(
            {call.op: [call]}, check_strategy_contract, infer, meshes, ["runtime"]
        )
        validation.run()
        (counts,) = validation.results[("runtime", "4")].values()
        self.assertEqual((counts.data_dependent, counts.queries), (1, 0))

    def test_runtime_refusal_is_per_query(self) -> None:
        """A boolean-mask index on a sharded input: eager DTensor needs the result's
        global size before it runs the op, so the runtime query is refused (on stock
        torch as with the change); the same call asked as a planner never is."""
        x = torch.randn(8, 4)
        call = CapturedCall(
            aten.index.Tensor, (meta_of(x), [meta_of(x[:, 0] > 0)]), {}, "test forward"
        )
        validation = ContractValidation(
            {call.op: [call]}, check_strategy_contract, infer_output_metas
        )
        mesh = self.mesh((4,))
        runtime = validation.queries(call, mesh, "runtime")
        self.assertEqual(
            [q.label for q in runtime], ["all Replicate", "input 0 Shard(0)"]
        )
        for query in runtime:
            answer = validation.ask(query, None)
            self.assertIsInstance(answer.error, DynamicOutputShapeException, str(query))
            self.assertEqual(
                answer.refusal, RUNTIME_REFUSAL_TYPES[DynamicOutputShapeException]
            )
        (planner,) = validation.queries(call, mesh, "planner")
        self.assertIsNone(validation.ask(planner, None).refusal)


if __name__ == "__main__":
    run_tests()
