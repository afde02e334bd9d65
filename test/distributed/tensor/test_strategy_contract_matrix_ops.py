# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy-contract tests for the shared strategy helpers this stack completes when
they are called directly, outside any registry (``_ops/_matrix_ops.py``'s mm-like
helpers, and the ``utils``/``_tensor_ops`` helpers of earlier steps). See
``contract_common`` for the query modes and meshes.
"""

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    OP_MESHES,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    mode_candidates,
    QUERY_MODES,
    StrategyOpsTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten


class TestMatrixOpsStrategyContract(StrategyOpsTestBase):
    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_shared_helpers_called_directly(self, shape: tuple[int, ...]) -> None:
        """The helpers a downstream rule author calls with an op schema hand out
        complete specs without any registry around them."""
        from torch.distributed.tensor._ops import _matrix_ops, _tensor_ops, utils

        mesh = self.mesh(shape)
        a, b, c = torch.randn(8, 12), torch.randn(12, 4), torch.randn(8, 4)
        # (module, helper, op, args, how a rule author calls it)
        cases = [
            (utils, "replicate_op_strategy", aten.mm.default, (a, b), lambda f: f),
            (_tensor_ops, "propagate_single_input_strategy", aten.clone.default, (a,), lambda f: f),
            (_tensor_ops, "replica_only_strategy", aten.clone.default, (a,), lambda f: f),
            (_matrix_ops, "_mm_like_strategy", aten.mm.default, (a, b),
             lambda f: lambda s: f("mk,kn->mn", mesh, s)),
            (_matrix_ops, "_addmm_like_strategy", aten.addmm.default, (c, a, b),
             lambda f: lambda s: f("mk,kn->mn", mesh, s)),
        ]
        missing = []
        for module, name, op, args, call in cases:
            helper = getattr(module, name, None)
            if helper is None:
                # later releases rewrote some of these as single-dim rules
                missing.append(name)
                continue
            for mode in QUERY_MODES:
                with self.subTest(helper=name, mode=mode):
                    schema = strategy_schema(mesh, op, args, None, mode_candidates(mode))
                    self.assert_contract(schema, call(helper)(schema))
        if missing:
            self.skipTest(f"not in this torch: {', '.join(missing)} (the rest checked)")


instantiate_parametrized_tests(TestMatrixOpsStrategyContract)


if __name__ == "__main__":
    run_tests()
