# Owner(s): ["oncall: distributed"]
"""Strategies build complete specs (the contract on ``OpSpec``): output metas, from
the one shape inference dispatch runs, and ``None`` where the op returns ``None``."""

import contextlib
import itertools
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_map_only


aten, X = torch.ops.aten, torch.randn(8, 4)
PROP, MESHES = DTensor._op_dispatcher.sharding_propagator, [(4,), (2, 2)]
INFER = "_propagate_tensor_meta_non_cached"  # the shape inference dispatch runs
# Strategies that built specs without metas; convolution_backward masking one off.
CALLS = [(aten.view.default, (X, [32])), (aten.unbind.int, (X, 1))]
CALLS += [(aten.stack.default, ([X, X], 1)), (aten.mm.default, (X, X.t()))]
CONV = (torch.randn(4, 4, 6, 6), torch.randn(4, 3, 8, 8), torch.randn(4, 3, 3, 3))
CONV += ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, True])
Q = torch.empty(8, 8, 16, 16, device="meta", dtype=torch.float16)
# Attention: arguments, RNG-state results, those eager DTensor returns rank-local.
ATTENTION = [
    ("efficient", (Q, Q, Q, Q, True, 0.1), frozenset({2, 3}), {2, 3}),
    ("flash", (Q, Q, Q, 0.1, True, True), frozenset({6, 7}), {7}),
    ("cudnn", (Q, Q, Q, Q, True, 0.1, False, True), frozenset({6, 7}), {6, 7}),
]
# The backward's arguments after (grad, q, k, v), from the forward's args and outs.
BACKWARD = {
    "efficient": lambda a, o: (a[3], *o[:4], a[5], [True] * 4),
    "flash": lambda a, o: (*o[:2], None, None, 16, 16, a[3], False, *o[6:8]),
    "cudnn": lambda a, o: (*o[:2], *o[6:8], a[3], None, None, 16, 16, a[5], False),
}


class TestStrategyOutputMetas(LocalDTensorTestBase):
    @with_comms
    def test_a_call_the_op_rejects_raises(self) -> None:
        """The expansion gave specs with ``tensor_meta=None`` for it before."""
        mesh, rules = init_device_mesh("cpu", (4,)), [[Replicate()] * 3]
        schema = sc.strategy_schema(aten.mm.default, (X, torch.randn(5, 8)), {}, mesh)
        with self.assertRaisesRegex(RuntimeError, "aten.mm.default: cannot build"):
            expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=1)

    @with_comms
    def test_shape_inference_runs_once_per_runtime_query(self) -> None:
        """Strategies reuse dispatch's metas, also under a fake mode (no cache)."""
        mesh = init_device_mesh("cpu", (2, 2))

        def spec(t: torch.Tensor) -> DTensorSpec:
            meta = TensorMeta(t.shape, t.stride(), t.dtype)
            return DTensorSpec(mesh, sc.runtime_candidate(t, mesh)[0], tensor_meta=meta)

        for (op, args), tracing in itertools.product(CALLS, (False, True)):
            info = sc.strategy_schema(op, args, {}, mesh).schema_info
            schema = OpSchema(op, tree_map_only(torch.Tensor, spec, args), {}, info)
            infer = mock.patch.object(PROP, INFER, wraps=getattr(PROP, INFER))
            with infer as m, FakeTensorMode() if tracing else contextlib.nullcontext():
                PROP.propagate_op_sharding_non_cached(schema)
            self.assertEqual((m.call_count, tracing), (1, tracing), op)

    @with_comms
    def test_view_stack_unbind_and_masked_outputs(self) -> None:
        """Specs without metas; a masked-off result made a 2-D expansion raise."""
        calls = [*CALLS, (aten.convolution_backward.default, CONV)]
        for shape, (op, args) in itertools.product(MESHES, calls):
            mesh = init_device_mesh("cpu", shape)
            self.assertEqual(sc.check_call(op, args, {}, mesh), [], f"on {mesh}")

    @with_comms
    def test_attention_rng_state(self) -> None:
        """RNG state: ``Replicate`` with metas, not ``None``; eager keeps it local."""
        for shape, (name, args, rng, local) in itertools.product(MESHES, ATTENTION):
            mesh = init_device_mesh("cpu", shape)
            prefix = f"_scaled_dot_product_{name}_attention"
            op, bwd = (getattr(aten, prefix + s).default for s in ("", "_backward"))
            schema = sc.strategy_schema(op, args, {}, mesh)
            answer = sc.query_strategy(schema, mesh, runtime=True)
            want = sc.expected_output_metas(schema)
            self.assertEqual(sc.contract_violations(schema, answer, want, rng), [])
            b_args = (Q, Q, Q, Q, *BACKWARD[name](args, op(*args)))
            self.assertEqual(sc.check_call(bwd, b_args, {}, mesh), [])
            lq = Q.new_empty(8, 8 // mesh.size(), 16, 16)
            dq = DTensor.from_local(lq, mesh, [Shard(1)] * mesh.ndim, run_check=False)
            d_args = tuple(dq if a is Q else a for a in args)
            results = op(*d_args)
            plain = {i for i, r in enumerate(results) if type(r) is torch.Tensor}
            self.assertEqual(plain, local)
            b_args = (dq, dq, dq, dq, *BACKWARD[name](d_args, results))
            self.assertTrue(all(isinstance(g, DTensor) for g in bwd(*b_args)[:3]))

    @with_comms
    def test_inplace_foreach_with_a_scalar_list(self) -> None:
        """Each element's metas are inferred with its own scalar."""
        mesh = init_device_mesh("cpu", (4,))
        plain = [torch.rand(8, 4), torch.rand(8, 4)]
        with LocalTensorMode(frozenset(range(self.world_size))):
            xs = [distribute_tensor(t.clone(), mesh, [Shard(0)]) for t in plain]
            for ts in (xs, plain):
                torch._foreach_add_(ts, [10.0, 2.0])
                torch._foreach_addcmul_(ts, ts, ts, [1.0, 3.0])
                torch._foreach_addcdiv_(ts, ts, ts, [0.5, 4.0])
            self.assertEqual([x.full_tensor() for x in xs], plain)


if __name__ == "__main__":
    run_tests()
