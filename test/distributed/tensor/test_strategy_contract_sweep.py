# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the strategy queries (``contract_sweep``): runtime refusals told apart
from failures.
"""

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    runtime_refusal,
    runtime_refusal_key,
    RUNTIME_REFUSAL_TYPES,
    RUNTIME_REFUSALS,
)


aten = torch.ops.aten


class TestStrategyQueries(StrategyContractTestBase):
    def test_runtime_refusal_classification(self) -> None:
        """DTensor deliberately refusing a runtime input is told from a failure per
        query: by message for the placement refusals, by exception type (also when
        DTensor's dispatch wraps it) for data-dependent result sizes."""
        pattern = "in-place operations that require placement changes are not supported"
        inplace = RuntimeError(f"aten.scatter_.src: {pattern}, got Shard(0)")
        self.assertEqual(runtime_refusal_key(inplace), pattern)
        self.assertEqual(runtime_refusal(inplace), RUNTIME_REFUSALS[pattern])

        dynamic = DynamicOutputShapeException(aten.nonzero.default)
        self.assertEqual(runtime_refusal_key(dynamic), "DynamicOutputShapeException")
        self.assertEqual(
            runtime_refusal(dynamic), RUNTIME_REFUSAL_TYPES[DynamicOutputShapeException]
        )
        scalar = DataDependentOutputException(aten._local_scalar_dense.default)
        self.assertEqual(
            runtime_refusal(scalar), RUNTIME_REFUSAL_TYPES[DataDependentOutputException]
        )
        # DTensor's dispatch re-raises strategy failures inside a RuntimeError
        try:
            try:
                raise dynamic
            except DynamicOutputShapeException as e:
                raise RuntimeError(
                    "Sharding propagation failed for aten.index.Tensor"
                ) from e
        except RuntimeError as wrapped:
            self.assertEqual(
                runtime_refusal_key(wrapped), "DynamicOutputShapeException"
            )
        # an unrelated error raised while a refusal was handled is no refusal
        try:
            try:
                raise dynamic
            except DynamicOutputShapeException:
                raise KeyError("a bug in the handler")  # noqa: B904
        except KeyError as unrelated:
            self.assertIsNone(runtime_refusal(unrelated))
        self.assertIsNone(runtime_refusal(ValueError("Shard(0) is not supported")))
        self.assertIsNone(runtime_refusal_key(RuntimeError("")))


if __name__ == "__main__":
    run_tests()
