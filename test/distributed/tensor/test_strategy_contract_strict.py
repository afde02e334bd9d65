# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strict mode for strategy authors (``torch.distributed.tensor.debug.strict_strategy_contract``).

Each test registers a deliberately broken strategy for a test-only op, one per
contract clause, and runs the op on DTensors. Without strict mode DTensor's
registry exit quietly repairs what the strategy got wrong; in strict mode the call
fails with a :class:`StrictContractError` naming the op, the strategy and the
clause. Registrations and DTensor's caches are restored after every test. The
switch and the check on their own: test_strategy_contract_strict_check.py.
"""

from collections.abc import Callable

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._strict_contract import (
    strict_enabled,
    StrictContractError,
)
from torch.distributed.tensor.debug import (
    _clear_sharding_prop_cache,
    strict_strategy_contract,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)


StrategyFunc = Callable[[OpSchema], StrategyType]

# The test-only ops (one_out, two_out, list_out) are defined while TestStrictMode
# runs (see its setUpClass).
ops = torch.ops.strategy_contract_strict_test


def follow_input(op_schema: OpSchema) -> list[DTensorSpec]:
    """The first tensor input's candidate specs (placements and metas)."""
    return [c.output_spec for c in op_schema.args_schema[0].strategies]


def wrong_dtype(spec: DTensorSpec) -> DTensorSpec:
    meta = spec.tensor_meta
    return spec.shallow_copy_with_tensor_meta(
        TensorMeta(meta.shape, meta.stride, torch.float64)
    )


# ---- one broken strategy per clause ----


def c1_wrong_output_meta(op_schema: OpSchema) -> OpStrategy:
    return OpStrategy(
        [OpSpec(wrong_dtype(s), input_specs=[s]) for s in follow_input(op_schema)]
    )


def c2_spec_for_none_result(op_schema: OpSchema) -> OpStrategy:
    # the op's second result is always None, but the strategy gives it a spec
    return OpStrategy(
        [OpSpec((s, s), input_specs=[s]) for s in follow_input(op_schema)]
    )


def c3_wrong_input_meta(op_schema: OpSchema) -> OpStrategy:
    return OpStrategy(
        [OpSpec(s, input_specs=[wrong_dtype(s)]) for s in follow_input(op_schema)]
    )


def c4_short_cost_row(op_schema: OpSchema) -> OpStrategy:
    return OpStrategy(
        [OpSpec(s, input_specs=[s], redistribute_cost=[[]]) for s in follow_input(op_schema)]
    )


def c5_child_wrong_meta(op_schema: OpSchema) -> TupleStrategy:
    children = []
    for i, child in enumerate(op_schema.args_schema[0].children):
        specs = [c.output_spec for c in child.strategies]
        out = (lambda s: wrong_dtype(s)) if i == 1 else (lambda s: s)
        children.append(OpStrategy([OpSpec(out(s), input_specs=[s]) for s in specs]))
    return TupleStrategy(children)


# clause -> (test-only op, broken strategy, clause named in the error)
CASES: dict[str, tuple[str, StrategyFunc, str]] = {
    "C1": ("one_out", c1_wrong_output_meta, "C1"),
    "C2": ("two_out", c2_spec_for_none_result, "C2"),
    "C3": ("one_out", c3_wrong_input_meta, "C3"),
    "C4": ("one_out", c4_short_cost_row, "C4"),
    "C5": ("list_out", c5_child_wrong_meta, "C5/C1"),
}


def case(name: str) -> tuple[torch._ops.OpOverload, StrategyFunc, str]:
    """``CASES[name]`` with its op resolved (the ops exist while the tests run)."""
    op_name, func, clause = CASES[name]
    return getattr(ops, op_name).default, func, clause


class TestStrictMode(StrategyContractTestBase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        lib = cls.enterClassContext(
            torch.library._scoped_library("strategy_contract_strict_test", "DEF")
        )
        lib.define("one_out(Tensor x) -> Tensor")
        lib.define("two_out(Tensor x) -> (Tensor, Tensor?)")
        lib.define("list_out(Tensor[] xs) -> Tensor[]")
        lib.impl("one_out", lambda x: x.clone(), "CompositeExplicitAutograd")
        lib.impl("two_out", lambda x: (x.clone(), None), "CompositeExplicitAutograd")
        lib.impl("list_out", lambda xs: [x.clone() for x in xs], "CompositeExplicitAutograd")

    def setUp(self) -> None:
        super().setUp()
        self.propagator = DTensor._op_dispatcher.sharding_propagator
        self.addCleanup(_clear_sharding_prop_cache)

    def register_temporarily(self, op: torch._ops.OpOverload, func: StrategyFunc) -> None:
        """Register ``func`` for ``op``; the test's cleanup restores the registry."""
        registries = (self.propagator.op_strategy_funcs, self.propagator.op_to_schema_info)
        saved = [r.get(op) for r in registries]

        def restore() -> None:
            for registry, value in zip(registries, saved):
                if value is None:
                    registry.pop(op, None)
                else:
                    registry[op] = value

        self.addCleanup(restore)
        self.propagator.register_op_strategy(op, func)

    def run_op(self, op: torch._ops.OpOverload) -> object:
        """Call ``op`` on DTensors sharded on dim 0 of a 1-D mesh."""
        mesh = self.mesh((4,))
        x = DTensor.from_local(torch.randn(2, 3), mesh, [Shard(0)], run_check=False)
        if op == ops.list_out.default:
            y = DTensor.from_local(torch.randn(5), mesh, [Replicate()], run_check=False)
            return op([x, y])
        return op(x)

    def test_each_clause(self) -> None:
        for name in CASES:
            op, func, clause = case(name)
            with self.subTest(clause=name):
                self.register_temporarily(op, func)
                _clear_sharding_prop_cache()
                # off: the registry exit repairs the strategy and the call runs
                self.assertFalse(strict_enabled())
                self.run_op(op)
                # on: the same call names the op, the strategy and the clause
                with strict_strategy_contract():
                    self.assertTrue(strict_enabled())
                    with self.assertRaises(Exception) as ctx:
                        self.run_op(op)
                err = ctx.exception
                while err is not None and not isinstance(err, StrictContractError):
                    err = err.__cause__ or err.__context__
                self.assertIsInstance(err, StrictContractError, str(ctx.exception))
                message = str(err)
                self.assertIn(str(op), message)
                self.assertIn(f"'{func.__name__}'", message)
                self.assertIn(f"violates {clause} ", message)
                self.assertEqual(err.clause, clause)
                self.assertFalse(strict_enabled())

    def test_registry_and_caches_restored(self) -> None:
        op, func, _ = case("C1")
        before = self.propagator.op_strategy_funcs.get(op)
        with self.subTest("registered"):
            self.register_temporarily(op, func)
            self.assertIn(op, self.propagator.op_strategy_funcs)
        self.doCleanups()
        self.assertIs(self.propagator.op_strategy_funcs.get(op), before)
        self.assertEqual(self.propagator.propagate_op_sharding.cache_info().currsize, 0)

    def test_dtensor_own_strategies_pass(self) -> None:
        """DTensor's own strategies for everyday ops are clean in strict mode."""
        mesh = self.mesh((2, 2))
        a = DTensor.from_local(torch.randn(4, 6), mesh, [Shard(0), Replicate()], run_check=False)
        b = DTensor.from_local(torch.randn(6, 8), mesh, [Replicate(), Shard(1)], run_check=False)
        with strict_strategy_contract():
            out = torch.mm(a, b).relu().sum(dim=0)
            torch.nn.functional.layer_norm(a, (6,)).t().contiguous()
        self.assertEqual(out.shape, torch.Size([16]))


if __name__ == "__main__":
    run_tests()
