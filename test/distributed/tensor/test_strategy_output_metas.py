# Owner(s): ["oncall: distributed"]
"""The strategy utilities build complete specs, with dispatch's one shape inference."""

import itertools
from contextlib import nullcontext
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema
from torch.distributed.tensor._ops.utils import (
    _first_candidate_schema,
    expand_to_full_mesh_op_strategy,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten, X = torch.ops.aten, torch.randn(8, 4)
PROP, MESHES = DTensor._op_dispatcher.sharding_propagator, [(4,), (2, 2)]
INFER = "_propagate_tensor_meta_non_cached"  # the shape inference dispatch runs
# Single-dim expansions: an op, an in-place list op (elements: their self's meta)
CALLS = [(aten.mm.default, (X, X.t())), (aten._foreach_add_.List, ([X, X], [X, X]))]
CONV = (torch.randn(4, 4, 6, 6), torch.randn(4, 3, 8, 8), torch.randn(4, 3, 3, 3))
CONV += ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True])
Q = torch.empty(8, 8, 16, 16, device="meta", dtype=torch.float16)
ATTENTION = {  # the forward's arguments
    "efficient": (Q, Q, Q, Q, True, 0.1),
    "flash": (Q, Q, Q, 0.1, True, True),
    "cudnn": (Q, Q, Q, Q, True, 0.1, False, True),
}
# The backward's arguments after (grad, q, k, v), from the forward's args and outs.
BACKWARD = {
    "efficient": lambda a, o: (a[3], *o[:4], a[5], [True] * 4),
    "flash": lambda a, o: (*o[:2], None, None, 16, 16, a[3], False, *o[6:8]),
    "cudnn": lambda a, o: (*o[:2], *o[6:8], a[3], None, None, 16, 16, a[5], False),
}


class TestStrategyOutputMetas(LocalDTensorTestBase):
    @with_comms
    def test_shape_inference_runs_once_per_runtime_query(self) -> None:
        """Strategies reuse dispatch's metas, also under a fake mode (no cache),
        handed to the schemas they build, never written into a built one."""
        mesh, setattr_ = init_device_mesh("cpu", (2, 2)), OpSchema.__setattr__

        def no_rewrite(schema: OpSchema, name: str, value: object) -> None:
            if name == "output_tensor_meta" and name in vars(schema):
                raise AssertionError("an OpSchema written after construction")
            setattr_(schema, name, value)

        for (op, args), ctx in itertools.product(CALLS, (nullcontext, FakeTensorMode)):
            schema = _first_candidate_schema(sc.strategy_schema(op, args, {}, mesh))
            with mock.patch.object(PROP, INFER, wraps=getattr(PROP, INFER)) as m, ctx():
                with mock.patch.object(OpSchema, "__setattr__", no_rewrite):
                    PROP.propagate_op_sharding_non_cached(schema)
            self.assertEqual(m.call_count, 1, f"{op} in {ctx.__name__}")

    @with_comms
    def test_specs_carry_metas(self) -> None:
        """Also a masked-off result, and a call the op rejects raises."""
        calls = [*CALLS, (aten.convolution_backward.default, CONV)]
        for shape, (op, args) in itertools.product(MESHES, calls):
            mesh = init_device_mesh("cpu", shape)
            self.assertEqual(sc.check_call(op, args, {}, mesh), [], f"on {mesh}")
        schema = sc.strategy_schema(aten.mm.default, (X, torch.randn(5, 8)), {}, mesh)
        rules = [[Replicate()] * 3]
        with self.assertWarnsRegex(FutureWarning, "aten.mm.default: shape inference"):
            answer = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)
        self.assertIsNone(answer.strategies[0].output_spec.tensor_meta)  # as before
        with self.assertRaisesRegex(ValueError, "mm.default: output_tensor_meta needs"):
            expand_to_full_mesh_op_strategy(mesh, schema, rules, output_tensor_meta=())
        e, i = torch.empty(0), torch.empty(0, dtype=torch.int32)  # outs to resize
        out = dict(result=e, LU=e, pivots=i, info=i)
        solve = (aten._linalg_solve_ex.result, (torch.eye(5), torch.ones(5)), out)
        self.assertEqual(sc.check_call(*solve, mesh), [])  # fills the fake cache
        schema, rules = sc.strategy_schema(*solve, mesh), [[Replicate()] * 10]
        answer = expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=4)
        want = sc.expected_output_metas(schema)
        self.assertEqual(sc.contract_violations(schema, answer, want), [])

    @with_comms
    def test_attention(self) -> None:
        """Forward and backward meet the contract; rank-local results (RNG seeds and
        offsets, flash's ``unused``) are ``None`` with metas in local_output_metas."""
        for shape, (name, args) in itertools.product(MESHES, ATTENTION.items()):
            mesh = init_device_mesh("cpu", shape)
            prefix = f"_scaled_dot_product_{name}_attention"
            op, bwd = (getattr(aten, prefix + s).default for s in ("", "_backward"))
            self.assertEqual(sc.check_call(op, args, {}, mesh), [])
            b_args = (Q, Q, Q, Q, *BACKWARD[name](args, op(*args)))
            self.assertEqual(sc.check_call(bwd, b_args, {}, mesh), [])
            dq = DTensor.from_local(Q, mesh, [Replicate()] * mesh.ndim, run_check=False)
            results = op(*(dq if a is Q else a for a in args))
            plain = {i for i, r in enumerate(results) if type(r) is torch.Tensor}
            schema = sc.strategy_schema(op, args, {}, mesh)
            for spec in sc.query_strategy(schema, mesh).strategies:
                local = enumerate(spec.local_output_metas or ())
                self.assertEqual({i for i, m in local if m is not None}, plain)

    @with_comms
    def test_eager_masked_off_result(self) -> None:
        """A masked-off result over a 2-d mesh: stock's expansion raised on it."""
        mesh, want = init_device_mesh("cpu", (2, 2)), aten.convolution_backward(*CONV)
        with LocalTensorMode(frozenset(range(self.world_size))):
            d = [distribute_tensor(t, mesh, [Shard(0), Replicate()]) for t in CONV[:2]]
            dw = distribute_tensor(CONV[2], mesh, [Replicate()] * 2)
            got = aten.convolution_backward(*d, dw, *CONV[3:])
            self.assertEqual([r if r is None else r.full_tensor() for r in got], want)


if __name__ == "__main__":
    run_tests()
