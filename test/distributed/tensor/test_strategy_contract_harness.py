# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the contract test harness (``contract_common``, ``contract_sweep``): meshes,
input strategies, candidate builders, the call recorder, runtime refusals told apart
from failures, and ``assert_contract``.
"""

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    MESH_SHAPES,
    meta_of,
    op_strategy,
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    CallRecorder,
    first_candidates,
    RUNTIME_REFUSAL_TYPES,
    RUNTIME_REFUSALS,
    runtime_refusal,
    runtime_refusal_key,
)


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


class TestContractHarness(StrategyContractTestBase):
    def test_assert_contract_reports_violations(self) -> None:
        mesh = self.mesh((2, 2))
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        schema = OpSchema(
            aten.mm.default,
            (op_strategy(mesh, meta_of(a)), op_strategy(mesh, meta_of(b))),
            {},
        )
        inputs = [DTensorSpec(mesh, (R, R), tensor_meta=meta_of(t)) for t in (a, b)]
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

    def test_op_strategy(self) -> None:
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(4, 6))
        default = op_strategy(mesh, meta)
        self.assertEqual(len(default.strategies), 1)
        self.assertEqual(default.strategies[0].output_spec.placements, (R, R))
        self.assertEqual(default.tensor_meta, meta)
        several = op_strategy(mesh, meta, (S0, R), [R, P])
        self.assertEqual(
            [s.output_spec.placements for s in several.strategies], [(S0, R), (R, P)]
        )
        with self.assertRaises(ValueError):
            op_strategy(mesh, meta, (S0,))

    def test_planner_candidates(self) -> None:
        mesh = self.mesh((2, 4))
        floats = planner_candidates(mesh, meta_of(torch.randn(2, 8)))
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
        ints = planner_candidates(mesh, meta_of(torch.ones(2, 8, dtype=torch.long)))
        self.assertFalse(any(isinstance(p, Partial) for c in ints for p in c))
        scalar = planner_candidates(self.mesh((4,)), meta_of(torch.tensor(1.0)))
        self.assertEqual(scalar, [(R,), (P,)])

    def test_first_candidates(self) -> None:
        """Fewest non-Replicate mesh dims first, in option order, capped; uneven
        and empty shards stay in (the audit's planner candidates)."""
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(2, 3))
        every = first_candidates(100)(mesh, meta)
        # per mesh dim: R, S(0), S(1), P -> 16 tuples
        self.assertEqual(len(every), 16)
        self.assertEqual(every[:4], [(R, R), (R, S0), (R, S1), (R, P)])
        self.assertEqual(every[4:7], [(S0, R), (S1, R), (P, R)])
        # S(0) twice splits 2 rows over 4 ranks: offered all the same
        self.assertIn((S0, S0), every)
        self.assertEqual(first_candidates(5)(mesh, meta), every[:5])
        ints = first_candidates(100)(
            self.mesh((4,)), meta_of(torch.ones(4, 2, dtype=torch.long))
        )
        # no Partial for integers; dim 1 (2) is shorter than the mesh (4)
        self.assertEqual(ints, [(R,), (S0,)])
        with self.assertRaisesRegex(ValueError, "at least 1"):
            first_candidates(0)

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

    def test_call_recorder(self) -> None:
        """The recorder keeps distinct calls with tensor arguments, metas taken
        before the call (an in-place op may change its self), only the ops
        ``keep`` chooses; calls without tensors are counted, not kept."""
        x = torch.randn(4, 3)
        recorder = CallRecorder(pool_size=2)
        with recorder:
            recorder.source = "test forward"
            torch.empty(5)
            x.clone().t_()
            for rows in (x[:1], x[:2], x[:3]):
                torch.add(rows, rows)
        self.assertEqual(recorder.tensorless[aten.empty.memory_format], 1)
        (t_call,) = recorder.calls[aten.t_.default].values()
        self.assertEqual(t_call.tensor_metas, [meta_of(x)])
        self.assertEqual(t_call.source, "test forward")
        # three distinct calls, two kept (pool_size)
        self.assertEqual(len(recorder.calls[aten.add.Tensor]), 2)
        only_add = CallRecorder(keep=lambda op: op == aten.add.Tensor)
        with only_add:
            torch.add(x, 1).neg()
        self.assertEqual(list(only_add.calls), [aten.add.Tensor])
        self.assertEqual(only_add.seen, 1)


if __name__ == "__main__":
    run_tests()
