# Owner(s): ["oncall: distributed"]
"""The contract check names each clause a strategy breaks and accepts a complete one."""

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
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.testing._internal.distributed._tensor.strategy_contract import (
    contract_violations,
    expected_output_metas,
)


aten = torch.ops.aten
R, S0 = Replicate(), Shard(0)


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
    return TensorMeta(torch.Size(shape), torch.empty(shape).stride(), dtype)


class TestStrategyContractCheck(LocalDTensorTestBase):
    def check(self, op, args: tuple, *specs: OpSpec) -> list[str]:
        """The findings for an answer of ``specs`` (of one ``OpStrategy``, or the
        children of a ``TupleStrategy`` when ``args`` holds one)."""
        schema = OpSchema(op, args, {})
        strategies = [OpStrategy([s]) for s in specs]
        answer = strategies[0] if len(specs) == 1 else TupleStrategy(strategies)
        return contract_violations(schema, answer, expected_output_metas(schema))

    def spec(self, placement, tensor_meta) -> DTensorSpec:
        return DTensorSpec(self.mesh, (placement,), tensor_meta=tensor_meta)

    def inputs(self, *metas: TensorMeta, candidates=(R,)) -> list[OpStrategy]:
        return [
            OpStrategy([OpSpec(self.spec(p, m)) for p in candidates]) for m in metas
        ]

    @with_comms
    def test_each_clause(self) -> None:
        self.mesh = self.build_device_mesh()
        a, b, out = meta(8, 4), meta(4, 8), meta(8, 8)
        args = (*self.inputs(a, candidates=(R, S0)), *self.inputs(b))
        ins, costs = [self.spec(S0, a), self.spec(R, b)], [[1.0, 0.0], [0.0]]
        good = OpSpec(self.spec(S0, out), ins, costs)
        self.assertEqual(self.check(aten.mm.default, args, good), [])
        broken = {
            "C1": OpSpec(self.spec(S0, None), ins, costs),
            "C1 dtype": OpSpec(
                self.spec(S0, meta(8, 8, dtype=torch.int64)), ins, costs
            ),
            "C2": OpSpec((good.output_specs,), ins, costs),
            "C3": OpSpec(good.output_specs, None, costs),
            "C3 meta": OpSpec(good.output_specs, [self.spec(S0, None), ins[1]], costs),
            "C4": OpSpec(good.output_specs, ins, [[0.0], [0.0]]),
            "C4 negative": OpSpec(good.output_specs, ins, [[-1.0, 0.0], [0.0]]),
        }
        for name, spec in broken.items():
            with self.subTest(name):
                found = self.check(aten.mm.default, args, spec)
                self.assertEqual(len(found), 1, found)
                self.assertIn(f"{name.split()[0]} ", found[0])
                self.assertIn("aten.mm.default OpSpec 0", found[0])

    @with_comms
    def test_none_exactly_where_the_op_returns_none(self) -> None:
        self.mesh = self.build_device_mesh()
        metas = (meta(4, 4, 6, 6), meta(4, 3, 8, 8), meta(4, 3, 3, 3))
        flags = [False, True, True]  # no grad_input
        args = (*self.inputs(*metas), [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        ins, costs = [self.spec(R, m) for m in metas], [[0.0]] * 3
        outs = [self.spec(R, m) for m in (metas[1], metas[2], meta(4))]
        op = aten.convolution_backward.default
        self.assertEqual(
            self.check(op, (*args, flags), OpSpec((None, *outs[1:]), ins, costs)), []
        )
        found = self.check(op, (*args, flags), OpSpec(tuple(outs), ins, costs))
        self.assertEqual(len(found), 1, found)
        self.assertIn("output 0: C2", found[0])

    @with_comms
    def test_tuple_strategy_children(self) -> None:
        self.mesh = self.build_device_mesh()
        x, y = meta(8, 4), meta(4, 8)
        args = (TupleStrategy(self.inputs(x, y, candidates=(S0,))),)
        # the second child's output has no meta
        children = [
            OpSpec(self.spec(S0, out), [self.spec(S0, m)], [[0.0]])
            for m, out in ((x, x), (y, None))
        ]
        found = self.check(aten._foreach_abs.default, args, *children)
        self.assertEqual(len(found), 1, found)
        self.assertTrue(found[0].startswith("child 1: "), found)


if __name__ == "__main__":
    run_tests()
