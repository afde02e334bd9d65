# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Single-dim expansion answers a caller that passes output metas in any shape.

``_expand_single_dim_strategy_to_mesh`` takes the caller's output metas (DTensor's
dispatch passes its own, downstream callers pass what they have): metas that fit
the op's returns are used as given, metas that do not (wrong structure, wrong
length, the self list of an in-place foreach op) give way to shape inference.
What the single-dim registry holds, called directly with only the required
arguments, is tested in test_strategy_contract_rule_calls.py.
"""

from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._op_schema import OpSchema, StrategyType
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    OP_MESHES,
    sharded_candidate,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    strategy_registry,
    strategy_schema,
)


aten = torch.ops.aten


class TestExpansionWithCallerMetas(StrategyContractTestBase):
    def expand_with_metas(
        self, mesh: DeviceMesh, op: torch._ops.OpOverload, args: Sequence[object], metas: object
    ) -> tuple[OpSchema, StrategyType]:
        """Expand ``op``'s single-dim strategy with caller-supplied ``metas``, as
        DTensor's own callers and tests call ``_expand_single_dim_strategy_to_mesh``."""
        from torch.distributed.tensor._ops.single_dim_strategy import (
            _expand_single_dim_strategy_to_mesh,
        )

        self.assertEqual(strategy_registry(op), "single_dim")
        schema = strategy_schema(mesh, op, args, None, sharded_candidate())
        info = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[op]
        expand = _expand_single_dim_strategy_to_mesh(mesh, schema, info, metas)
        return schema, expand(op, schema.args_meta, schema.kwargs_meta)

    @parametrize("shape", OP_MESHES, name_fn=mesh_name)
    def test_caller_metas_for_inplace_foreach(self, shape: tuple[int, ...]) -> None:
        """In-place foreach ops return nothing; metas of the self list (what a
        caller naturally passes) must not be indexed as per-return metas."""
        xs, ys = self.foreach_lists()
        zs = [torch.rand_like(t) + 1 for t in xs]
        self_metas = [meta_of(t) for t in xs]
        cases = [
            (aten._foreach_addcdiv_.Scalar, (xs, ys, zs, 0.5), 3),
            (aten._foreach_lerp_.Scalar, (xs, ys, 0.5), 2),
        ]
        for op, args, n_inputs in cases:
            for metas in (self_metas, tuple(self_metas), None):
                with self.subTest(op=str(op), metas=type(metas).__name__):
                    schema, strategy = self.expand_with_metas(self.mesh(shape), op, args, metas)
                    self.assert_contract(schema, strategy)
                    self.assert_children(strategy, [None] * len(xs), n_inputs)

    def test_caller_metas_in_every_shape(self) -> None:
        """Caller metas that fit the op's returns are used as given; metas that do
        not fit (wrong structure, wrong length) give way to shape inference."""
        mesh = self.mesh((2, 2))
        x, y = torch.randn(8, 12), torch.randn(12, 4)
        mm_meta = meta_of(torch.mm(x, y))
        xs, ys = self.foreach_lists()
        add_metas = [meta_of(t) for t in torch._foreach_add(xs, ys)]
        g = torch.randn(8, 12)
        w, b = torch.randn(12), torch.randn(12)
        mean, rstd = torch.randn(8, 1), torch.rand(8, 1) + 0.5
        ln_args = (g, x, [12], mean, rstd, w, b, [False, True, True])
        ln_metas = (None, meta_of(w), meta_of(b))
        cases = [
            ("one meta", aten.mm.default, (x, y), mm_meta, [mm_meta]),
            ("one-element list", aten.mm.default, (x, y), [mm_meta], [mm_meta]),
            ("list for one tensor", aten.mm.default, (x, y), [mm_meta, mm_meta], [mm_meta]),
            ("per element", aten._foreach_add.List, (xs, ys), add_metas, None),
            ("too few elements", aten._foreach_add.List, (xs, ys), add_metas[:1], None),
            ("one meta for a list", aten._foreach_add.List, (xs, ys), add_metas[0], None),
            ("None entries", aten.native_layer_norm_backward.default, ln_args, ln_metas, ln_metas),
            ("too few outputs", aten.native_layer_norm_backward.default, ln_args, ln_metas[1:], ln_metas),
        ]
        for label, op, args, metas, expected in cases:
            with self.subTest(case=label):
                schema, strategy = self.expand_with_metas(mesh, op, args, metas)
                self.assert_contract(schema, strategy)
                if expected is None:
                    self.assert_children(strategy, add_metas, 2)
                else:
                    self.assert_output_metas(strategy, expected)


instantiate_parametrized_tests(TestExpansionWithCallerMetas)


if __name__ == "__main__":
    run_tests()
