# Owner(s): ["oncall: distributed"]
"""The view, ``stack`` and ``unbind`` strategies build complete specs."""

import itertools
from unittest import mock

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._collective_utils import redistribute_cost
from torch.distributed.tensor._ops.utils import _first_candidate_schema
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten, X = torch.ops.aten, torch.randn(8, 4)
PROP = DTensor._op_dispatcher.sharding_propagator
INFER = "_propagate_tensor_meta_non_cached"  # the shape inference dispatch runs
CALLS = [(aten.view.default, (X, [32])), (aten.unbind.int, (X, 1))]
CALLS += [(aten.stack.default, ([X, X], 1))]


class TestRuleStrategyMetas(LocalDTensorTestBase):
    @with_comms
    def test_specs_carry_metas(self) -> None:
        """Metas on every spec, from dispatch's one shape inference."""
        for shape, (op, args) in itertools.product([(4,), (2, 2)], CALLS):
            mesh = init_device_mesh("cpu", shape)
            self.assertEqual(sc.check_call(op, args, {}, mesh), [], f"on {mesh}")
            schema = _first_candidate_schema(sc.strategy_schema(op, args, {}, mesh))
            with mock.patch.object(PROP, INFER, wraps=getattr(PROP, INFER)) as m:
                PROP.propagate_op_sharding_non_cached(schema)
            self.assertEqual(m.call_count, 1, op)

    @with_comms
    def test_unbind_costs(self) -> None:
        """Each candidate is priced, not costed zero."""
        mesh = init_device_mesh("cpu", (4,))
        args = (torch.randn(8, 3), 1)  # candidates: Replicate and Shard(0)
        schema = sc.strategy_schema(
            aten.unbind.int, args, {}, mesh, lambda t, m: [(Replicate(),), (Shard(0),)]
        )
        answer = PROP.op_strategy_funcs[aten.unbind.int](schema)
        candidates = [s.output_spec for s in schema.args_schema[0].strategies]
        for spec in answer.strategies:
            want = [redistribute_cost(c, spec.input_specs[0]) for c in candidates]
            self.assertEqual(spec.redistribute_cost, [want])
        costs = [c for s in answer.strategies for c in s.redistribute_cost[0]]
        self.assertGreater(max(costs), 0)


if __name__ == "__main__":
    run_tests()
