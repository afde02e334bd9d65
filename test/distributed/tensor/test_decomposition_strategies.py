# Owner(s): ["oncall: distributed"]
"""The decomposition path offers no sharding its trace, on one mesh dim of size 1,
cannot see is wrong: ``Partial("avg")`` over uneven shards, a ``_StridedShard``
another mesh dim changes, and local results of other shapes."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard
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
        """Each gave NaN or other values, or raised in the local kernel; composite
        ops reach dispatch as called in inference mode."""
        mesh, plane = self.build_device_mesh(), init_device_mesh("cpu", (2, 2))
        x, y, rows = torch.randn(6), torch.randn(6), torch.randn(6, 4)
        block = torch.randn(4, 8)
        cases = [  # (op, args, their placements, the mesh)
            (aten.mse_loss.default, (x, y), [Shard(0)], mesh),  # 6 rows, 4 ranks
            (aten.unflatten.int, (rows, 0, [2, -1]), [Shard(0)], mesh),
            (aten.flatten.using_ints, (block, 0, 1), [Shard(0), Shard(1)], plane),
            (aten.flatten.using_ints, (rows, 0, 1), [Shard(0), Shard(0)], plane),
        ]
        for op, args, ps, on in cases:
            with self.subTest(op), LocalTensorMode(frozenset(range(self.world_size))):
                with torch.inference_mode():
                    dargs = tree_map_only(
                        torch.Tensor, lambda t: distribute_tensor(t, on, ps), args
                    )
                    got = op(*dargs)
                self.assertEqual(got.full_tensor(), op(*args))


if __name__ == "__main__":
    run_tests()
