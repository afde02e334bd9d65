# Owner(s): ["oncall: distributed"]
"""DTensor's strategy functions hand out complete specs: every tensor output
carries its meta, ``None`` stands exactly where the op returns ``None``, and
inputs and redistribute costs are present (C1-C5 of
``torch.testing._internal.distributed._tensor.strategy_contract``)."""

from unittest import mock

import torch
import torch.distributed as dist
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor._op_schema import TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    infer_output_tensor_meta,
)
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import Shard
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed._tensor.strategy_contract import (
    _spec_schema,
    contract_violations,
    dtensor_calls,
    expected_output_metas,
    query_strategy,
    strategy_schema,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten
WORLD_SIZE = 4


class FakeWorldTestCase(TestCase):
    """A fake process group of four ranks and the meshes the contract is
    checked on, a 1-D and a 2-D one."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )
        ranks = torch.arange(WORLD_SIZE)
        cls.meshes = {
            "4": DeviceMesh("cpu", ranks),
            "2x2": DeviceMesh("cpu", ranks.reshape(2, 2)),
        }

    @classmethod
    def tearDownClass(cls) -> None:
        dist.destroy_process_group()
        super().tearDownClass()

    @property
    def propagator(self) -> ShardingPropagator:
        return DTensor._op_dispatcher.sharding_propagator


def author_rules(op_schema, rule, expected) -> tuple[list[list], int]:
    """A single-dim rule resolved as a downstream author does before calling
    ``expand_to_full_mesh_op_strategy``: placeholders become ``Shard`` and the
    all-``Replicate`` rule is added. Returns the rules and the output count."""
    rules = rule.func(op_schema.op, op_schema.args_meta, op_schema.kwargs_meta)
    n_inputs = len(op_schema.args_strategy) + len(op_schema.kwargs_strategy)
    returned = (expected,) if isinstance(expected, TensorMeta) else expected or ()
    n_outputs = len(rules[0]) - n_inputs if rules else len(returned)
    resolved = [
        [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in r]
        for r in rules
    ]
    outputs = [None if m is None else Replicate() for m in returned[:n_outputs]]
    resolved.append(outputs + [Replicate()] * n_inputs)
    return resolved, n_outputs


def opinfo_calls() -> list[tuple[str, OpOverload, tuple, dict]]:
    """Every distinct aten call with a DTensor strategy that the first sample
    of each OpInfo in ``op_db`` makes, with the OpInfo's name."""
    seen: set[str] = set()
    return [
        (opinfo.name, *call)
        for opinfo in op_db
        for call in dtensor_calls(opinfo, seen=seen)
    ]


@instantiate_parametrized_tests
class TestStrategyContractOpInfo(FakeWorldTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.calls = opinfo_calls()

    def checked_calls(self, mesh: DeviceMesh):
        """Each call's OpInfo name, strategy schema and expected metas."""
        for name, op, args, kwargs in self.calls:
            schema = strategy_schema(op, args, kwargs, mesh)
            try:
                expected = expected_output_metas(schema)
            except (DynamicOutputShapeException, DataDependentOutputException):
                continue  # data-dependent sizes: DTensor does not serve these
            yield name, schema, expected

    @parametrize("mesh_name", ["4", "2x2"])
    def test_runtime_strategies(self, mesh_name: str) -> None:
        mesh = self.meshes[mesh_name]
        violations = []
        for name, schema, expected in self.checked_calls(mesh):
            try:
                strategy = query_strategy(schema, mesh, runtime=True)
            except (RuntimeError, NotImplementedError):
                continue  # DTensor refuses this placement, as it does eagerly
            if strategy is not None:
                found = contract_violations(schema, strategy, expected)
                violations += [f"{name}: {v}" for v in found[:1]]
        self.assertEqual(violations, [])

    @parametrize("mesh_name", ["4", "2x2"])
    def test_utility_strategies(self, mesh_name: str) -> None:
        """Single-dim rules expanded by ``expand_to_full_mesh_op_strategy``
        without output metas, as downstream authors call it."""
        mesh = self.meshes[mesh_name]
        violations = []
        for name, schema, expected in self.checked_calls(mesh):
            rule = self.propagator.op_single_dim_strategy_funcs.get(schema.op)
            if rule is None or any(
                isinstance(a, TupleStrategy)
                for a in (*schema.args_schema, *schema.kwargs_schema.values())
            ):
                continue  # tensor lists expand per element, through dispatch
            rules, n_outputs = author_rules(schema, rule, expected)
            try:
                expanded = expand_to_full_mesh_op_strategy(
                    mesh, schema, rules, input_index=n_outputs
                )
            except (RuntimeError, NotImplementedError):
                continue  # no rule serves these inputs on this mesh
            found = contract_violations(schema, expanded, expected)
            violations += [f"{name}: {v}" for v in found[:1]]
        self.assertEqual(violations, [])


class TestStrategyContract(FakeWorldTestCase):
    def test_shape_inference_runs_once_per_runtime_query(self) -> None:
        mesh = self.meshes["2x2"]
        x = torch.randn(8, 4)
        # view's strategy function builds its own output spec from the metas.
        for op, args in [(aten.view.default, (x, [32])), (aten.mm.default, (x, x.t()))]:
            schema = _spec_schema(strategy_schema(op, args, {}, mesh))
            self.propagator._propagate_tensor_meta_cached.cache_clear()
            with mock.patch.object(
                ShardingPropagator,
                "_propagate_tensor_meta_non_cached",
                autospec=True,
                side_effect=ShardingPropagator._propagate_tensor_meta_non_cached,
            ) as infer:
                self.propagator.propagate_op_sharding_non_cached(schema)
            self.assertEqual(infer.call_count, 1, op)

    def test_metas_follow_every_non_tensor_argument(self) -> None:
        mesh = self.meshes["4"]
        x = torch.randn(8, 4)
        for dim in (0, 1):
            schema = strategy_schema(aten.aminmax.default, (x,), {"dim": dim}, mesh)
            metas = infer_output_tensor_meta(schema)
            self.assertEqual(metas[0].shape, x.amax(dim).shape)

    def test_masked_off_outputs_are_none(self) -> None:
        grad, inp, weight = torch.randn(4, 4, 6, 6), torch.randn(4, 3, 8, 8), torch.randn(4, 3, 3, 3)
        args = (grad, inp, weight, [4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        for mesh in self.meshes.values():
            schema = strategy_schema(
                aten.convolution_backward.default, (*args, [False, True, True]), {}, mesh
            )
            strategy = query_strategy(schema, mesh, runtime=True)
            self.assertEqual(
                contract_violations(schema, strategy, expected_output_metas(schema)), []
            )
            self.assertTrue(all(s.output_specs[0] is None for s in strategy.strategies))

    def test_eye_out_eager(self) -> None:
        with LocalTensorMode(frozenset(range(WORLD_SIZE))):
            out = distribute_tensor(torch.zeros(4, 4), self.meshes["4"], [Replicate()])
            torch.eye(4, 4, out=out)
            self.assertEqual(out.full_tensor(), torch.eye(4, 4))


if __name__ == "__main__":
    run_tests()
