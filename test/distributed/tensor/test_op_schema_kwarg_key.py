# Owner(s): ["oncall: distributed"]
"""The sharding caches tell bucketize's ``right=True`` from ``out_int32=True``."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor._op_schema import OpSchema
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten


class TestOpSchemaKwargKey(LocalDTensorTestBase):
    @with_comms
    def test_bucketize_kwargs_with_a_warm_cache(self) -> None:
        mesh = self.build_device_mesh()
        x, boundaries = torch.randn(8, 3), torch.linspace(-1, 1, 5)
        with LocalTensorMode(frozenset(range(self.world_size))):
            dx = distribute_tensor(x, mesh, [Shard(0)])
            db = distribute_tensor(boundaries, mesh, [Replicate()])
        propagator = DTensor._op_dispatcher.sharding_propagator
        right, out_int32 = {"right": True}, {"out_int32": True}
        for calls in ([right, out_int32], [out_int32, right]):
            _clear_sharding_prop_cache()
            for kwargs in calls:
                want = torch.bucketize(x, boundaries, **kwargs)
                schema = OpSchema(aten.bucketize.Tensor, (dx._spec, db._spec), kwargs)
                meta = propagator.propagate_op_sharding(schema).output_spec.tensor_meta
                got = (meta.shape, meta.stride, meta.dtype)
                self.assertEqual(got, (want.shape, want.stride(), want.dtype))
                with LocalTensorMode(frozenset(range(self.world_size))):
                    out = torch.bucketize(dx, db, **kwargs)  # eager: its spec too
                self.assertEqual(out._spec.tensor_meta.dtype, want.dtype)


if __name__ == "__main__":
    run_tests()
