# Owner(s): ["oncall: distributed"]
"""``view_as_real`` of a 0-d complex DTensor: one new dim of size 2 holds the
real and imaginary parts."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestViewAsRealStrategies(LocalDTensorTestBase):
    @with_comms
    def test_zero_dim_view_as_real(self) -> None:
        mesh = self.build_device_mesh()
        z = torch.tensor(1.5 - 2.0j)
        with LocalTensorMode(frozenset(range(self.world_size))):
            real = torch.view_as_real(distribute_tensor(z, mesh, [Replicate()]))
            self.assertEqual(real.placements, (Replicate(),))
            self.assertEqual(real.full_tensor(), torch.view_as_real(z))


if __name__ == "__main__":
    run_tests()
