# Owner(s): ["oncall: distributed"]
"""View shardings that the local view cannot keep: a ``_StridedShard`` on a
flattened dim, and a dim several mesh dims shard split or flattened unevenly."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.distributed.tensor._ops._view_ops import (
    propagate_shape_and_sharding,
    view_groups,
)
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestViewShardingStrategies(LocalDTensorTestBase):
    def test_strided_shard_of_a_flattened_dim(self) -> None:
        """It stayed sharded on a flattened dim no output dim keeps (``KeyError``):
        ``view`` asks to redistribute it, ``reshape`` replicates it."""
        rule, r, strided = view_groups([8, 4, 6], [8, 24]), Replicate(), _StridedShard
        for placements, kept in [
            ((Shard(2), strided(1, split_factor=2)), [r, strided(1, split_factor=2)]),
            ((r, strided(2, split_factor=2)), [r, r]),
        ]:
            args = (placements, (8, 4, 6), rule, (2, 2))
            with self.assertRaisesRegex(RuntimeError, "redistribut"):
                propagate_shape_and_sharding(*args, strict_view=True)
            got, _ = propagate_shape_and_sharding(*args, strict_view=False)
            self.assertEqual(list(got), kept)

    @with_comms
    def test_dim_sharded_by_several_mesh_dims(self) -> None:
        """Each mesh dim divided the size alone: 8 rows on 2x2 ranks viewed as 2
        rows, 2 rows and 6 FSDP2+TP rows flattened stayed sharded; the view raised."""
        mesh, x = init_device_mesh("cpu", (2, 2)), torch.randn(8, 4)
        with LocalTensorMode(frozenset(range(self.world_size))):
            ss, ft = [Shard(0)] * 2, [_StridedShard(0, split_factor=2), Shard(0)]
            for t, shape, p in ((x, [2, 16], ss), (x[:2], [-1], ss), (x[:6], [-1], ft)):
                dt = distribute_tensor(t, mesh, ss).redistribute(mesh, p)
                with self.assertRaisesRegex(RuntimeError, "redistribut"):
                    dt.view(shape)
                with torch.inference_mode():
                    got = torch.ops.aten.reshape.default(dt, shape)
                self.assertEqual(got.full_tensor(), t.reshape(shape))
            # one mesh dim of four: analyzing the split's second dim reset the first's
            dt = distribute_tensor(x, self.build_device_mesh(), [Shard(0)])
            got = torch.ops.aten.view_copy.default(dt, [2, 16])
            self.assertEqual(got.full_tensor(), x.reshape(2, 16))

    @with_comms
    def test_uneven_shares_kept_whole(self) -> None:
        """Each rank's rows stay whole output rows: FSDP2+TP's TP shards of 4 rows
        viewed as 2, and 6 rows on 4 ranks as 3; both views raised. Its 3 rows of
        (12, 4), 1.5 of (6, 8), were kept on output dim 1: wrong values; reshape
        now replicates that mesh dim."""
        mesh, x = init_device_mesh("cpu", (2, 2)), torch.randn(12, 4)
        with LocalTensorMode(frozenset(range(self.world_size))):
            ft = [_StridedShard(0, split_factor=2), Shard(0)]
            dt = distribute_tensor(x[:4], mesh, [Shard(0)] * 2).redistribute(mesh, ft)
            self.assertEqual(dt.view(2, 8).full_tensor(), x[:4].view(2, 8))
            dt = distribute_tensor(x, mesh, [Shard(0)] * 2).redistribute(mesh, ft)
            with self.assertRaisesRegex(RuntimeError, "redistribute"):
                dt.view(6, 8)
            with torch.inference_mode():  # reshape itself, not its view
                got = torch.ops.aten.reshape.default(dt, [6, 8])
            self.assertEqual(got.full_tensor(), x.view(6, 8))
            dt = distribute_tensor(x[:6], self.build_device_mesh(), [Shard(0)])
            self.assertEqual(dt.view(3, 2, 4).full_tensor(), x[:6].view(3, 2, 4))


if __name__ == "__main__":
    run_tests()
