# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy-contract tests for the strategies of ``_ops/_tensor_ops.py`` this stack
changes: dtype conversions and factory-like ops carry the op's own output dtype
(not the input's), and list results (split, chunk, unbind) get one spec per
element. See ``contract_common`` for the query modes and meshes.
"""

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    OP_MESHES,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    QUERY_MODES,
    StrategyOpsTestBase,
)


aten = torch.ops.aten
prims = torch.ops.prims


class TestTensorOpsStrategyContract(StrategyOpsTestBase):
    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_dtype_conversion_output_dtype(self, shape: tuple[int, ...]) -> None:
        x = torch.randn(8, 12).bfloat16()
        cases = [
            (prims.convert_element_type.default, (x, torch.float32), {}),
            (aten._to_copy.default, (x,), {"dtype": torch.float32}),
        ]
        expected = meta_of(x.float())
        for op, args, kwargs in cases:
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, kwargs)
                    self.assert_output_metas(strategy, [expected])
                    for spec in self.specs_of(strategy):
                        self.assertEqual(spec.input_specs[0].tensor_meta.dtype, torch.bfloat16)

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_factory_like_dtype_from_kwarg(self, shape: tuple[int, ...]) -> None:
        x = torch.randn(8, 12)
        cases = [
            (aten.zeros_like.default, (x,), {"dtype": torch.bfloat16}),
            (aten.empty_like.default, (x,), {"dtype": torch.float16}),
            (aten.new_zeros.default, (x, [4, 6]), {"dtype": torch.int32}),
            (aten.full_like.default, (x, 2), {"dtype": torch.int64}),
        ]
        for op, args, kwargs in cases:
            expected = meta_of(op(*args, **kwargs))
            self.assertEqual(expected.dtype, kwargs["dtype"])
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, kwargs)
                    self.assert_output_metas(strategy, [expected])

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_list_results_one_spec_per_element(self, shape: tuple[int, ...]) -> None:
        x, y = torch.randn(10, 8), torch.randn(4, 6, 8)
        cases = [
            (aten.split.Tensor, (x, 4), (0,), torch.split(x, 4)),  # 4, 4, 2
            (aten.chunk.default, (x, 3), (0,), torch.chunk(x, 3)),  # 4, 4, 2
            (aten.unbind.int, (y, 1), (1,), torch.unbind(y, 1)),
        ]
        for op, args, avoid, result in cases:
            expected = [meta_of(r) for r in result]
            for mode in QUERY_MODES:
                with self.subTest(op=str(op), mode=mode):
                    _, strategy = self.query(shape, mode, op, args, avoid=avoid)
                    self.assert_output_metas(strategy, expected)


instantiate_parametrized_tests(TestTensorOpsStrategyContract)


if __name__ == "__main__":
    run_tests()
