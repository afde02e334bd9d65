# Owner(s): ["oncall: distributed"]
"""View ops on shapes their dim maps missed: 0-d ``view_as_real`` and
``transpose``, and ``expand`` of a sharded size-1 dim."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestViewOpStrategies(LocalDTensorTestBase):
    @with_comms
    def test_shapes_the_dim_maps_missed(self) -> None:
        mesh = self.build_device_mesh()
        z, x = torch.tensor(1.5 - 2.0j), torch.tensor(3.0)
        with LocalTensorMode(frozenset(range(self.world_size))):
            real = torch.view_as_real(distribute_tensor(z, mesh, [Replicate()]))
            self.assertEqual(real.full_tensor(), torch.view_as_real(z))
            same = distribute_tensor(x, mesh, [Replicate()]).transpose(0, -1)
            self.assertEqual(same.full_tensor(), x)
            x = torch.randn(1, 3)  # expand of a sharded size-1 dim
            expanded = distribute_tensor(x, mesh, [Shard(0)]).expand(4, 3)
            self.assertEqual(expanded.placements, (Replicate(),))
            self.assertEqual(expanded.full_tensor(), x.expand(4, 3))


if __name__ == "__main__":
    run_tests()
