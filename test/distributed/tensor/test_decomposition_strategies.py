# Owner(s): ["oncall: distributed"]
"""The decomposition path offers no sharding its trace on one mesh dim cannot vouch
for: uneven ``Partial("avg")``, nested shards, local results of other shapes."""

from unittest import mock

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)
from torch.utils._pytree import tree_map_only


aten = torch.ops.aten


class TestDecompositionStrategies(LocalDTensorTestBase):
    @with_comms
    def test_eager_results(self) -> None:
        """Each gave NaN or wrong values, raised or held pieces its placements don't."""
        mesh, plane = self.build_device_mesh(), init_device_mesh("cpu", (2, 2))
        x, rows, block = torch.randn(6), torch.randn(6, 4), torch.randn(4, 8)
        cases = [  # (op, args, their placements, the mesh)
            (aten.mse_loss.default, (x, rows[:, 1]), [Shard(0)], mesh),  # 6 on 4
            (aten.unflatten.int, (rows, 0, [2, -1]), [Shard(0)], mesh),
            (aten.unflatten.int, (torch.randn(16, 4), 0, [4, -1]), [Shard(0)], mesh),
            (aten.flatten.using_ints, (block, 0, 1), [Shard(0), Shard(1)], plane),
            (aten.flatten.using_ints, (rows, 0, 1), [Shard(0), Shard(0)], plane),
            (aten.addmv_.default, (x, rows, block[:, 0]), [Shard(0), Shard(0)], plane),
            (aten.hardswish.default, (torch.randn(1, 8),), [Shard(1)], mesh),
        ]
        trace, traced = DecompShardingStrategy._propagate_through_decomp, []
        spy = mock.patch.object(  # its arguments: the path, query, placements, mesh
            DecompShardingStrategy, "_propagate_through_decomp", autospec=True
        )
        for op, args, ps, on in cases:
            with self.subTest(op), LocalTensorMode(frozenset(range(self.world_size))):
                with torch.inference_mode(), spy as m:
                    m.side_effect = lambda *a: traced.append(a[1:3]) or trace(*a)
                    dargs = tree_map_only(
                        torch.Tensor, lambda t: distribute_tensor(t, on, ps), args
                    )
                    got = op(*dargs)
                want = op(*args)  # once: an in-place op writes into its first argument
                self.assertEqual(got.full_tensor(), want)
                if all(isinstance(p, Shard | Replicate) for p in got.placements):
                    want = distribute_tensor(want, on, got.placements).to_local()
                    self.assertTrue(torch.equal(got.to_local(), want))
        hardswish = {ps for q, ps in traced if q.op == aten.hardswish.default}
        self.assertEqual(hardswish, {(Replicate(),), (Shard(1),)})  # not of size 1


if __name__ == "__main__":
    run_tests()
