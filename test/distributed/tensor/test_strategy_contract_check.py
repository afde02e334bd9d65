# Owner(s): ["oncall: distributed"]
"""The contract check finds each clause broken in a strategy, accepts a complete one."""

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.strategy_contract import (
    contract_violations,
    expected_output_metas,
    StrategyContractTestCase,
)


aten = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
    return TensorMeta(torch.Size(shape), torch.empty(shape).stride(), dtype)


class TestStrategyContractCheck(StrategyContractTestCase):
    def spec(self, placement, tensor_meta) -> DTensorSpec:
        return DTensorSpec(self.meshes["4"], (placement,), tensor_meta=tensor_meta)

    def strategy(self, *candidates, tensor_meta) -> OpStrategy:
        return OpStrategy([OpSpec(self.spec(p, tensor_meta)) for p in candidates])

    def mm(self) -> tuple[OpSchema, OpSpec]:
        """``mm`` of (8, 4) and (4, 8) inputs, with 2 and 1 candidates; a complete spec."""
        a, b = meta(8, 4), meta(4, 8)
        schema = OpSchema(
            aten.mm.default,
            (
                self.strategy(Replicate(), Shard(0), tensor_meta=a),
                self.strategy(Replicate(), tensor_meta=b),
            ),
            {},
        )
        spec = OpSpec(
            self.spec(Shard(0), meta(8, 8)),
            [self.spec(Shard(0), a), self.spec(Replicate(), b)],
            [[1.0, 0.0], [0.0]],
        )
        return schema, spec

    def violations(self, schema: OpSchema, spec: OpSpec) -> list[str]:
        return contract_violations(
            schema, OpStrategy([spec]), expected_output_metas(schema)
        )

    def test_each_clause(self) -> None:
        schema, good = self.mm()
        self.assertEqual(self.violations(schema, good), [])
        a, b = good.input_specs
        broken = {
            "C1": OpSpec(
                self.spec(Shard(0), None), good.input_specs, good.redistribute_cost
            ),
            "C1 dtype": OpSpec(
                self.spec(Shard(0), meta(8, 8, dtype=torch.float64)),
                [a, b],
                good.redistribute_cost,
            ),
            "C2": OpSpec((good.output_specs,), [a, b], good.redistribute_cost),
            "C3": OpSpec(good.output_specs, None, good.redistribute_cost),
            "C3 meta": OpSpec(
                good.output_specs,
                [self.spec(Shard(0), None), b],
                good.redistribute_cost,
            ),
            "C4": OpSpec(good.output_specs, [a, b], [[0.0], [0.0]]),
            "C4 negative": OpSpec(good.output_specs, [a, b], [[-1.0, 0.0], [0.0]]),
        }
        for name, spec in broken.items():
            with self.subTest(name):
                found = self.violations(schema, spec)
                self.assertEqual(len(found), 1, found)
                self.assertIn(f"{name.split()[0]} ", found[0])
                self.assertIn("aten.mm.default OpSpec 0", found[0])

    def test_none_where_the_op_returns_none(self) -> None:
        grad, inp, weight = meta(4, 4, 6, 6), meta(4, 3, 8, 8), meta(4, 3, 3, 3)
        schema = OpSchema(
            aten.convolution_backward.default,
            (
                *(
                    self.strategy(Replicate(), tensor_meta=m)
                    for m in (grad, inp, weight)
                ),
                [4],
                [1, 1],
                [0, 0],
                [1, 1],
                False,
                [0, 0],
                1,
                [False, True, True],
            ),
            {},
        )
        inputs, costs = (
            [self.spec(Replicate(), m) for m in (grad, inp, weight)],
            [[0.0]] * 3,
        )
        outputs = [self.spec(Replicate(), m) for m in (inp, weight, meta(4))]
        self.assertEqual(
            self.violations(schema, OpSpec((None, *outputs[1:]), inputs, costs)), []
        )
        found = self.violations(schema, OpSpec(tuple(outputs), inputs, costs))
        self.assertEqual(len(found), 1, found)
        self.assertIn("output 0: C2", found[0])

    def test_tuple_strategy_children(self) -> None:
        x, y = meta(8, 4), meta(4, 8)
        schema = OpSchema(
            aten._foreach_abs.default,
            (TupleStrategy([self.strategy(Shard(0), tensor_meta=m) for m in (x, y)]),),
            {},
        )
        # The second child's output lacks its meta.
        children = [
            OpStrategy(
                [OpSpec(self.spec(Shard(0), out), [self.spec(Shard(0), m)], [[0.0]])]
            )
            for m, out in ((x, x), (y, None))
        ]
        found = contract_violations(
            schema, TupleStrategy(children), expected_output_metas(schema)
        )
        self.assertEqual(len(found), 1, found)
        self.assertTrue(found[0].startswith("child 1: "), found)


if __name__ == "__main__":
    run_tests()
