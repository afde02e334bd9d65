# Owner(s): ["oncall: distributed"]
"""DTensor's strategy functions build complete specs: every tensor output has
its meta, ``None`` stands exactly where the op returns ``None``, and inputs and
costs are present (C1-C5 of ``strategy_contract``)."""

import collections
import contextlib
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    infer_output_tensor_meta,
)
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.strategy_contract import (
    without_known_gaps,
    contract_violations,
    eager_error,
    expected_output_metas,
    opinfo_calls,
    query_strategy,
    registered_ops,
    strategy_schema,
    StrategyContractTestCase,
    unreached,
)
from torch.utils._pytree import tree_map


aten = torch.ops.aten
propagator = DTensor._op_dispatcher.sharding_propagator


def author_rules(op_schema: OpSchema, rule, expected) -> tuple[list[list], int]:
    """A single-dim rule resolved as a downstream author resolves it for
    ``expand_to_full_mesh_op_strategy``: placeholders become ``Shard`` and the
    all-``Replicate`` rule is added. Returns the rules and the output count."""
    rules = rule.func(op_schema.op, op_schema.args_meta, op_schema.kwargs_meta)
    n_inputs = len(op_schema.args_strategy) + len(op_schema.kwargs_strategy)
    returned = (expected,) if isinstance(expected, TensorMeta) else expected or ()
    n_outputs = len(rules[0]) - n_inputs if rules else len(returned)
    outputs = [None if m is None else Replicate() for m in returned[:n_outputs]]
    resolved = [
        [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in r]
        for r in rules
    ]
    return [*resolved, outputs + [Replicate()] * n_inputs], n_outputs


@instantiate_parametrized_tests
class TestStrategyContract(StrategyContractTestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.capture = opinfo_calls()
        cls.eager: dict[tuple[int, str], str | None] = {}  # eager DTensor's refusal

    def checked_calls(self, mesh: str):
        for i, (name, op, args, kwargs) in enumerate(self.capture.calls):
            schema = strategy_schema(op, args, kwargs, self.meshes[mesh])
            metas = self.capture.result_metas(i, schema)
            if isinstance(metas, Exception):
                yield i, f"{name}: {op}", schema, None, metas
            else:
                yield i, f"{name}: {op}", schema, metas, None

    def refusal(self, i: int, mesh: str, error: Exception) -> str | None:
        """Why a refused query fails the test, or None when dispatch refuses the
        call too (or decomposes it, as it does a composite op it has no strategy
        for)."""
        if (i, mesh) not in self.eager:
            _, op, args, kwargs = self.capture.calls[i]
            self.eager[(i, mesh)] = eager_error(op, args, kwargs, self.meshes[mesh])
        if self.eager[(i, mesh)] is not None:
            return None
        op = self.capture.calls[i][1]
        composite = torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), torch._C.DispatchKey.CompositeImplicitAutograd
        )
        if composite and isinstance(error, NotImplementedError):
            return None
        return f"refused ({type(error).__name__}: {error}), eager DTensor runs it"

    def judge(self, label, schema, strategy, expected, why, counts, failures) -> None:
        if strategy is None:
            counts["no strategy"] += 1
        elif why is not None:
            # fake tensors give no result: its size depends on the data, or
            # torch has no meta kernel that runs the call
            counts["unjudged"] += 1
        else:
            found = contract_violations(schema, strategy, expected)
            counts["violating" if found else "ok"] += 1
            failures += [f"{label}: {v}" for v in found[:1]]

    @parametrize("mesh", ["4", "2x2"])
    def test_runtime_strategies(self, mesh: str) -> None:
        """Every captured call, as dispatch asks for its strategy: the answer
        meets the contract, and a refusal is one eager DTensor makes too."""
        counts, failures = collections.Counter(), []
        for i, label, schema, expected, why in self.checked_calls(mesh):
            try:
                strategy = query_strategy(schema, self.meshes[mesh], runtime=True)
            except Exception as e:
                counts["refused"] += 1
                problem = self.refusal(i, mesh, e)
                failures += [f"{label}: {problem}"] if problem else []
                continue
            self.judge(label, schema, strategy, expected, why, counts, failures)
        failures = without_known_gaps(failures)
        self.assertFalse(failures, "\n".join([str(dict(counts)), *failures]))
        self.assertGreater(counts["ok"], counts["refused"], dict(counts))

    @parametrize("mesh", ["4", "2x2"])
    def test_utility_strategies(self, mesh: str) -> None:
        """Single-dim rules expanded by ``expand_to_full_mesh_op_strategy``
        without output metas, as downstream authors call it; it refuses only
        calls eager DTensor refuses."""
        counts, failures = collections.Counter(), []
        for i, label, schema, expected, why in self.checked_calls(mesh):
            rule = propagator.op_single_dim_strategy_funcs.get(schema.op)
            args = (*schema.args_schema, *schema.kwargs_schema.values())
            if rule is None or any(isinstance(a, TupleStrategy) for a in args):
                continue  # tensor lists expand per element, through dispatch
            try:
                rules, n_outputs = author_rules(schema, rule, expected)
                strategy = expand_to_full_mesh_op_strategy(
                    self.meshes[mesh], schema, rules, input_index=n_outputs
                )
            except Exception as e:
                counts["refused"] += 1
                problem = self.refusal(i, mesh, e)
                failures += [f"{label}: {problem}"] if problem else []
                continue
            self.judge(label, schema, strategy, expected, why, counts, failures)
        failures = without_known_gaps(failures)
        self.assertFalse(failures, "\n".join([str(dict(counts)), *failures]))
        self.assertGreater(counts["ok"], counts["refused"], dict(counts))

    def test_capture(self) -> None:
        """The capture asks most registered ops, and every run it could not
        finish fails the same way without its recorder: it loses no call."""
        missing = unreached(self.capture)
        self.assertLessEqual(len(missing), 0.05 * len(registered_ops()), missing)
        self.assertTrue(all(missing.values()), missing)
        self.assertLess(len(self.capture.failures), self.capture.runs / 10)
        for run, failure in self.capture.failures.items():
            with self.subTest(run=run):
                rerun = self.capture.reruns.get(run)
                if rerun is None:  # the OpInfo has no dtype to run in
                    self.assertIn("samples", run)
                    continue
                with self.assertRaises(Exception) as caught:
                    rerun()
                self.assertTrue(failure.startswith(type(caught.exception).__name__))

    @parametrize("tracing", [False, True])
    def test_shape_inference_runs_once_per_runtime_query(self, tracing: bool) -> None:
        """Strategy functions receive the metas dispatch inferred, also under
        an active fake mode, where shape inference is not cached."""
        x = torch.randn(8, 4)
        calls = [
            (aten.view.default, (x, [32])),
            (aten.unbind.int, (x, 1)),
            (aten.stack.default, ([x, x], 1)),
            (aten.mm.default, (x, x.t())),
        ]
        for op, args in calls:
            schema = strategy_schema(op, args, {}, self.meshes["2x2"])
            specs = OpSchema(
                op,
                *tree_map(
                    lambda a: a.strategies[0].output_spec
                    if isinstance(a, OpStrategy)
                    else [c.strategies[0].output_spec for c in a.children]
                    if isinstance(a, TupleStrategy)
                    else a,
                    (schema.args_schema, schema.kwargs_schema),
                    is_leaf=lambda a: isinstance(a, (OpStrategy, TupleStrategy)),
                ),
                schema_info=schema.schema_info,
            )
            with (
                mock.patch.object(
                    ShardingPropagator,
                    "_propagate_tensor_meta_non_cached",
                    autospec=True,
                    side_effect=ShardingPropagator._propagate_tensor_meta_non_cached,
                ) as infer,
                FakeTensorMode() if tracing else contextlib.nullcontext(),
            ):
                output = propagator.propagate_op_sharding_non_cached(specs)
            self.assertEqual(infer.call_count, 1, op)
            self.assertIsNotNone(output.output_spec, op)

    def test_a_call_the_op_rejects_raises(self) -> None:
        """Shape inference that fails is reported, never turned into specs
        without metas."""
        schema = strategy_schema(
            aten.mm.default,
            (torch.randn(8, 4), torch.randn(5, 8)),
            {},
            self.meshes["4"],
        )
        rules = [[Replicate(), Replicate(), Replicate()]]
        with self.assertRaisesRegex(RuntimeError, "aten.mm.default: cannot build"):
            expand_to_full_mesh_op_strategy(
                self.meshes["4"], schema, rules, input_index=1
            )

    def test_metas_follow_every_non_tensor_argument(self) -> None:
        x, boundaries = torch.randn(8, 4), torch.arange(5.0)
        for op, args, kwargs in [
            (aten.aminmax.default, (x,), {"dim": 0}),
            (aten.aminmax.default, (x,), {"dim": 1}),
            # Keyword arguments with equal values but different names.
            (aten.bucketize.Tensor, (x, boundaries), {"right": True}),
            (aten.bucketize.Tensor, (x, boundaries), {"out_int32": True}),
        ]:
            schema = strategy_schema(op, args, kwargs, self.meshes["4"])
            self.assertEqual(
                infer_output_tensor_meta(schema), expected_output_metas(schema)
            )

    def test_masked_off_outputs_are_none(self) -> None:
        grad, inp, weight = (
            torch.randn(4, 4, 6, 6),
            torch.randn(4, 3, 8, 8),
            torch.randn(4, 3, 3, 3),
        )
        args = (
            grad,
            inp,
            weight,
            [4],
            [1, 1],
            [0, 0],
            [1, 1],
            False,
            [0, 0],
            1,
            [False, True, True],
        )
        for mesh in self.meshes.values():
            schema = strategy_schema(aten.convolution_backward.default, args, {}, mesh)
            strategy = query_strategy(schema, mesh, runtime=True)
            self.assertEqual(
                contract_violations(schema, strategy, expected_output_metas(schema)), []
            )
            self.assertTrue(all(s.output_specs[0] is None for s in strategy.strategies))

    def test_eye_out(self) -> None:
        with LocalTensorMode(frozenset(range(self.world_size))):
            out = distribute_tensor(torch.zeros(4, 4), self.meshes["4"], [Replicate()])
            torch.eye(4, 4, out=out)
            self.assertEqual(out.full_tensor(), torch.eye(4, 4))

    def test_inplace_foreach_with_a_scalar_list(self) -> None:
        """Each element's metas are inferred with its own scalar."""
        plain = [torch.randn(8, 4), torch.randn(8, 4)]
        with LocalTensorMode(frozenset(range(self.world_size))):
            xs = [distribute_tensor(t, self.meshes["4"], [Shard(0)]) for t in plain]
            torch._foreach_add_(xs, [10.0, 2.0])
            torch._foreach_addcmul_(xs, xs, xs, [1.0, 3.0])
            got = [x.full_tensor() for x in xs]
        want = [plain[0] + 10.0, plain[1] + 2.0]
        self.assertEqual(got, [want[0] + want[0] ** 2, want[1] + 3.0 * want[1] ** 2])


if __name__ == "__main__":
    run_tests()
