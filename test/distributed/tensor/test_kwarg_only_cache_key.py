# Owner(s): ["oncall: distributed"]
"""The sharding caches key on the values of an op's kwarg-only arguments."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten


class TestKwargOnlyCacheKey(LocalDTensorTestBase):
    @with_comms
    def test_kwarg_values_with_a_warm_cache(self) -> None:
        mesh = self.build_device_mesh()
        local_mode = LocalTensorMode(frozenset(range(self.world_size)))
        x, boundaries = torch.randn(8, 3), torch.linspace(-1, 1, 5)
        with local_mode:
            dx = distribute_tensor(x, mesh, [Shard(0)])
            db = distribute_tensor(boundaries, mesh, [Replicate()])
        # (op, args, DTensor args, two calls that differ in a kwarg-only value)
        cases = [
            (aten.bucketize.Tensor, (x, boundaries), (dx, db))
            + ({"right": True}, {"out_int32": True}),
            (aten.sum.dim_IntList, (x, [1]), (dx, [1]))
            + ({"dtype": torch.float64}, {"dtype": torch.float16}),
        ]
        propagator = DTensor._op_dispatcher.sharding_propagator
        for op, args, dargs, *calls in cases:
            for ordered in (calls, calls[::-1]):
                _clear_sharding_prop_cache()  # the first call warms it
                for kwargs in ordered:
                    want = op(*args, **kwargs)
                    with local_mode:
                        out = op(*dargs, **kwargs)  # eager: the C++ fast path's cache
                    # Python's cache, on the schema eager dispatch builds
                    schema = DTensor._op_dispatcher.unwrap_to_op_info(
                        op, dargs, kwargs
                    ).schema
                    output_spec = propagator.propagate_op_sharding(schema).output_spec
                    for meta in (out._spec.tensor_meta, output_spec.tensor_meta):
                        got = (meta.shape, meta.stride, meta.dtype)
                        self.assertEqual(got, (want.shape, want.stride(), want.dtype))

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


if __name__ == "__main__":
    run_tests()
