# Owner(s): ["oncall: distributed"]
"""The sharding caches key on the values of an op's kwarg-only arguments."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._ops.utils import (
    register_op_strategy,
    replicate_op_strategy,
)
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_leaves


aten = torch.ops.aten


class TestKwargOnlyCacheKey(LocalDTensorTestBase):
    @with_comms
    def test_kwarg_values_with_a_warm_cache(self) -> None:
        mesh = self.build_device_mesh()
        local_mode = LocalTensorMode(frozenset(range(self.world_size)))
        x, boundaries = torch.randn(8, 3), torch.linspace(-1, 1, 5)
        x4d = torch.randn(4, 4, 4, 4)
        with local_mode:
            dx = distribute_tensor(x, mesh, [Shard(0)])
            db = distribute_tensor(boundaries, mesh, [Replicate()])
            dx4d = distribute_tensor(x4d, mesh, [Replicate()])
        # (op, args, DTensor args, two calls that differ in a kwarg-only value)
        cases = [
            (aten.bucketize.Tensor, (x, boundaries), (dx, db))
            + ({"right": True}, {"out_int32": True}),
            (aten.sum.dim_IntList, (x, [1]), (dx, [1]))
            + ({"dtype": torch.float64}, {"dtype": torch.float16}),
            # registered by a loop over foreach variants, not a decorator
            (aten._foreach_clone.default, ([x4d],), ([dx4d],))
            + ({}, {"memory_format": torch.channels_last}),
        ]
        propagator = DTensor._op_dispatcher.sharding_propagator
        unwrap = DTensor._op_dispatcher.unwrap_to_op_info
        for op, args, dargs, *calls in cases:
            for ordered in (calls, calls[::-1]):
                _clear_sharding_prop_cache()  # the first call warms it
                for kwargs in ordered:
                    want = op(*args, **kwargs)
                    with local_mode:
                        out = op(*dargs, **kwargs)  # eager: the C++ fast path's cache
                    # Python's cache, on the schema eager dispatch builds
                    schema = unwrap(op, dargs, kwargs).schema
                    output_spec = propagator.propagate_op_sharding(schema).output_spec
                    specs = zip(*map(tree_leaves, (out, output_spec, want)))
                    for dtensor, spec, plain in specs:
                        for meta in (dtensor._spec.tensor_meta, spec.tensor_meta):
                            got = (meta.shape, meta.stride, meta.dtype)
                            expected = (plain.shape, plain.stride(), plain.dtype)
                            self.assertEqual(got, expected, msg=str(op))

    @with_comms
    def test_float_kwargs_share_an_entry(self) -> None:
        """A scheduled learning rate changes on every step without changing any
        result's metadata, so the step after the first hits the cache."""
        mesh = self.build_device_mesh()
        with LocalTensorMode(frozenset(range(self.world_size))):
            x = distribute_tensor(torch.randn(8), mesh, [Shard(0)])
        states = [[x] for _ in "pgmvs"]  # params, grads, moments, max_exp_avg_sqs
        kwargs = dict(beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8)
        kwargs.update(amsgrad=False, maximize=False)
        propagator = DTensor._op_dispatcher.sharding_propagator
        _clear_sharding_prop_cache()
        for lr in (1e-3, 9e-4, 8e-4):
            schema = DTensor._op_dispatcher.unwrap_to_op_info(
                aten._fused_adam_.default, (*states, states[0]), {"lr": lr, **kwargs}
            ).schema
            propagator.propagate_op_sharding(schema)
        self.assertEqual(propagator.propagate_op_sharding.cache_info().hits, 2)

    @with_comms
    def test_registration_flattens_tensor_lists(self) -> None:
        """A rule registered without ``needs_pytree`` for a tensor-list op, and a
        decomposed op's first call, saw none of the list's DTensors."""
        op = torch.ops.dtensor_kwarg_test.add_all.default
        propagator = DTensor._op_dispatcher.sharding_propagator
        register_op_strategy(op)(replicate_op_strategy)
        try:
            self.assertTrue(propagator.op_to_schema_info[op].needs_pytree)
            x, mesh = torch.randn(4, 4), self.build_device_mesh()
            with LocalTensorMode(frozenset(range(self.world_size))):
                dxs = [distribute_tensor(x, mesh, [Shard(0)]) for _ in range(2)]
                self.assertEqual(op(dxs).full_tensor(), x + x)
        finally:
            del propagator.op_strategy_funcs[op], propagator.op_to_schema_info[op]
        propagator.op_to_schema_info.pop(umi := aten._unsafe_masked_index.default, None)
        with LocalTensorMode(frozenset(range(self.world_size))):  # a first call
            d = [distribute_tensor(t, mesh) for t in (x < 9, torch.arange(4))]
            self.assertEqual(umi(dxs[0], d[0], [d[1]], 0.0).full_tensor(), x)


@torch.library.custom_op("dtensor_kwarg_test::add_all", mutates_args=())
def add_all(xs: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack(xs).sum(0)


add_all.register_fake(lambda xs: torch.empty_like(xs[0]))


if __name__ == "__main__":
    run_tests()
