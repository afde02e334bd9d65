# Owner(s): ["oncall: distributed"]
"""The contract check names each clause a strategy breaks and accepts a complete one."""

import math

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
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten, R, S = torch.ops.aten, Replicate(), Shard(0)


def meta(*shape: int) -> TensorMeta:
    return TensorMeta(torch.Size(shape), torch.empty(shape).stride(), torch.float32)


class TestStrategyContractCheck(LocalDTensorTestBase):
    def check(self, op, args: tuple, *specs: OpSpec, finding: str = "") -> None:
        """No finding for ``specs`` (children if ``args`` holds a tuple), or one."""
        schema = OpSchema(op, args, {})
        answer = [OpStrategy([s]) for s in specs]
        answer = answer[0] if len(specs) == 1 else TupleStrategy(answer)
        found = sc.contract_violations(schema, answer, sc.expected_output_metas(schema))
        self.assertEqual(len(found), 1 if finding else 0, found)
        self.assertRegex(found[0] if found else "", finding or "^$")

    def spec(self, p, m: TensorMeta | None) -> DTensorSpec:
        return DTensorSpec(self.build_device_mesh(), (p,), tensor_meta=m)

    def inputs(self, *metas: TensorMeta, candidates=(R,)) -> list[OpStrategy]:
        specs = [[OpSpec(self.spec(p, m)) for p in candidates] for m in metas]
        return list(map(OpStrategy, specs))

    @with_comms
    def test_each_clause(self) -> None:
        a, b, out = meta(8, 4), meta(4, 8), self.spec(S, meta(8, 8))
        args = (aten.mm.default, (*self.inputs(a, candidates=(R, S)), *self.inputs(b)))
        ins, costs = [self.spec(S, a), self.spec(R, b)], [[1.0, 0.0], [0.0]]
        self.check(*args, OpSpec(out, ins, costs))
        for clause, spec in [
            ("C1", OpSpec(self.spec(S, None), ins, costs)),
            ("C2", OpSpec((out,), ins, costs)),
            ("C3", OpSpec(out, None, costs)),
            ("C3", OpSpec(out, [self.spec(S, None), ins[1]], costs)),
            ("C4", OpSpec(out, ins, [[0.0], [0.0]])),
            ("C4", OpSpec(out, ins, [[-1.0, 0.0], [0.0]])),
            ("C4", OpSpec(out, ins, [[0.0, math.inf], [0.0]])),  # S to S
        ]:
            self.check(*args, spec, finding=f"^aten.mm.default OpSpec 0 .*{clause} ")
        mm = (aten.mm.default, (torch.randn(8, 4), torch.randn(4, 8)), {}, out.mesh)
        self.assertEqual(sc.check_call(*mm), [])  # asked as dispatch asks
        found = sc.check_call(*mm, planner=lambda schema: OpStrategy([]))
        self.assertEqual(found, ["aten.mm.default: C5 OpStrategy with no OpSpec"])

    @with_comms
    def test_none_results_and_tuple_children(self) -> None:
        metas = (meta(4, 4, 6, 6), meta(4, 3, 8, 8), meta(4, 3, 3, 3))
        args = (*self.inputs(*metas), [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        conv = (aten.convolution_backward.default, (*args, [False, True, True]))
        ins, costs = [self.spec(R, m) for m in metas], [[0.0]] * 3
        outs = [self.spec(R, m) for m in (metas[1], metas[2], meta(4))]
        self.check(*conv, OpSpec((None, *outs[1:]), ins, costs))  # no grad_input
        self.check(*conv, OpSpec(tuple(outs), ins, costs), finding="output 0: C2")
        grads = (aten.convolution_backward.default, (*args, [True] * 3))
        local = OpSpec((None, *outs[1:]), ins, costs)  # grad_input's meta missing
        self.check(*grads, local, finding="output 0: C2 None without local_output")
        local.local_output_metas = (metas[1], None, None)  # rank-local, with it
        self.check(*grads, local)
        x, y = meta(8, 4), meta(4, 8)
        args = (TupleStrategy(self.inputs(x, y, candidates=(S,))),)
        ok = OpSpec(self.spec(S, x), [self.spec(S, x)], [[0.0]])
        no_meta = OpSpec(self.spec(S, None), [self.spec(S, y)], [[0.0]])  # output's
        self.check(aten._foreach_abs.default, args, ok, no_meta, finding="^child 1: ")


if __name__ == "__main__":
    run_tests()
