# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strict mode's check on its own (``_ops/_strict_contract.py``), before any registry
calls it: the switch (context manager, environment variable) and ``check_strict``,
which names the op, the strategy and the clause of the first violation, judging
what a strategy gave only on what it filled in. Strict mode through DTensor's
registries: test_strategy_contract_strict.py.
"""

import os
import subprocess
import sys

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops._strict_contract import (
    check_strict,
    ENV_VAR,
    strict_enabled,
    strict_strategy_contract,
    StrictContractError,
)
from torch.distributed.tensor._ops.strategy_contract import infer_output_metas
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


def in_float64(spec: DTensorSpec) -> DTensorSpec:
    meta = spec.tensor_meta
    return spec.shallow_copy_with_tensor_meta(TensorMeta(meta.shape, meta.stride, torch.float64))


def candidates(schema: OpSchema) -> list[DTensorSpec]:
    return [c.output_spec for c in schema.args_schema[0].strategies]


# clause -> (op, strategy as its function gives it)
BROKEN = {
    "C1": (aten.relu.default, lambda s: OpStrategy([OpSpec(in_float64(c), [c]) for c in candidates(s)])),
    "C3": (aten.relu.default, lambda s: OpStrategy([OpSpec(c, [in_float64(c)]) for c in candidates(s)])),
    "C4": (aten.relu.default, lambda s: OpStrategy([OpSpec(c, [c], [[]]) for c in candidates(s)])),
}


class TestStrictCheck(StrategyContractTestBase):
    def schema(self, op: torch._ops.OpOverload) -> OpSchema:
        return strategy_schema(self.mesh((2, 2)), op, (torch.randn(8, 6),), None, planner_candidates)

    @parametrize("clause", list(BROKEN))
    def test_names_op_strategy_and_clause(self, clause: str) -> None:
        op, build = BROKEN[clause]
        schema = self.schema(op)
        broken = build(schema)
        with self.assertRaises(StrictContractError) as ctx:
            check_strict(schema, broken, broken, infer_output_metas(schema), "broken_rule")
        self.assertEqual((ctx.exception.op, ctx.exception.source, ctx.exception.clause), (op, "broken_rule", clause))
        self.assertIn(f"violates {clause} in OpSpec 0", str(ctx.exception))

    def test_left_out_fields_are_not_violations(self) -> None:
        """A strategy may leave out what the registry exit completes: only a finalized
        strategy is held to every clause."""
        schema = self.schema(aten.relu.default)
        bare = OpStrategy([OpSpec(DTensorSpec(c.mesh, c.placements)) for c in candidates(schema)])
        complete = OpStrategy([
            OpSpec(c, [c], [[0.0] * len(candidates(schema))]) for c in candidates(schema)
        ])
        metas = infer_output_metas(schema)
        check_strict(schema, bare, complete, metas, "bare_rule")
        with self.assertRaisesRegex(StrictContractError, "'bare_rule' violates C1"):
            check_strict(schema, bare, bare, metas, "bare_rule")

    def test_switch(self) -> None:
        self.assertFalse(strict_enabled())
        with strict_strategy_contract():
            self.assertTrue(strict_enabled())
            with strict_strategy_contract(False):
                self.assertFalse(strict_enabled())
        self.assertFalse(strict_enabled())
        code = (
            "from torch.distributed.tensor._ops._strict_contract import strict_enabled; "
            "print(strict_enabled())"
        )
        for value, expected in (("1", "True"), ("0", "False")):
            env = {**os.environ, ENV_VAR: value}
            out = subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            )
            self.assertEqual(out.stdout.strip(), expected, out.stderr)


instantiate_parametrized_tests(TestStrictCheck)


if __name__ == "__main__":
    run_tests()
