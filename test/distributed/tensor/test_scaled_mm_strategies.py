# Owner(s): ["oncall: distributed"]
"""``_scaled_mm`` on DTensors without the optional ``bias`` and
``scale_result``, which the dispatcher then leaves out of the call."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestScaledMmStrategies(LocalDTensorTestBase):
    @with_comms
    def test_without_optional_arguments(self) -> None:
        mesh = self.build_device_mesh()
        a = torch.randn(16, 32).to(torch.float8_e4m3fn)
        b = torch.randn(8, 32).to(torch.float8_e4m3fn).t()  # column-major
        scale_a, scale_b = torch.tensor(1.0), torch.tensor(1.0)
        expected = torch._scaled_mm(a, b, scale_a, scale_b)
        with LocalTensorMode(frozenset(range(self.world_size))):
            for placement in (Shard(0), Replicate()):
                dist_a = distribute_tensor(a, mesh, [placement])
                dist_b, dist_sa, dist_sb = (
                    distribute_tensor(t, mesh, [Replicate()])
                    for t in (b, scale_a, scale_b)
                )
                result = torch._scaled_mm(dist_a, dist_b, dist_sa, dist_sb)
                self.assertEqual(result.full_tensor().float(), expected.float())


if __name__ == "__main__":
    run_tests()
