# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the contract tests' base (``contract_common``): cached CPU meshes on the
fake process group, ``assert_contract`` naming each violation, and the planner
candidates the tests offer.
"""

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    MESH_SHAPES,
    planner_candidates,
    StrategyContractTestBase,
)


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


class TestContractTestBase(StrategyContractTestBase):
    def test_assert_contract_reports_violations(self) -> None:
        mesh = self.mesh((2, 2))
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        inputs = [DTensorSpec(mesh, (R, R), tensor_meta=_meta(t)) for t in (a, b)]
        schema = OpSchema(
            aten.mm.default, tuple(OpStrategy([OpSpec(s)]) for s in inputs), {}
        )
        bad = OpSpec(DTensorSpec(mesh, (R, R)), inputs, [[0.0], [0.0]])
        with self.assertRaisesRegex(
            AssertionError, "C1 aten.mm.default strategy 0 output"
        ):
            self.assert_contract(schema, OpStrategy([bad]))

    def test_meshes(self) -> None:
        for shape in MESH_SHAPES:
            mesh = self.mesh(shape)
            self.assertEqual(tuple(mesh.shape), shape)
            self.assertEqual(mesh.device_type, "cpu")
            self.assertIs(self.mesh(list(shape)), mesh)

    def test_planner_candidates(self) -> None:
        mesh = self.mesh((2, 4))
        floats = planner_candidates(mesh, _meta(torch.randn(2, 8)))
        # Tensor dim 0 has 2 elements: it can only be split over mesh dim 0.
        self.assertEqual(
            floats,
            [
                (R, R),
                (R, S1),
                (R, P),
                (S0, R),
                (S0, S1),
                (S0, P),
                (S1, R),
                (S1, S1),
                (S1, P),
                (P, R),
                (P, S1),
                (P, P),
            ],
        )
        ints = planner_candidates(mesh, _meta(torch.ones(2, 8, dtype=torch.long)))
        self.assertFalse(any(isinstance(p, Partial) for c in ints for p in c))
        scalar = planner_candidates(self.mesh((4,)), _meta(torch.tensor(1.0)))
        self.assertEqual(scalar, [(R,), (P,)])


if __name__ == "__main__":
    run_tests()
