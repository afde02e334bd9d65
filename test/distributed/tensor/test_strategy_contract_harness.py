# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the contract tests' base (``contract_common``): cached CPU meshes on the
fake process group, and ``assert_contract`` naming each violation.
"""

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Replicate
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    MESH_SHAPES,
    StrategyContractTestBase,
)


aten = torch.ops.aten
R = Replicate()


class TestContractTestBase(StrategyContractTestBase):
    def test_assert_contract_reports_violations(self) -> None:
        mesh = self.mesh((2, 2))
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        inputs = [
            DTensorSpec(
                mesh, (R, R), tensor_meta=TensorMeta(t.shape, t.stride(), t.dtype)
            )
            for t in (a, b)
        ]
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


if __name__ == "__main__":
    run_tests()
