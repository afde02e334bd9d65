# Owner(s): ["oncall: distributed"]
"""Strategies the decomposition path derives keep a ``None`` result in its
position, so the output placements line up with the op's returns."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten


class TestDecompositionNoneResults(LocalDTensorTestBase):
    @with_comms
    def test_group_norm_backward_with_a_masked_result(self) -> None:
        op, mesh = aten.native_group_norm_backward.default, self.build_device_mesh()
        grad, x, weight = torch.randn(4, 6, 8), torch.randn(4, 6, 8), torch.randn(6)
        _, mean, rstd = aten.native_group_norm(x, weight, None, 4, 6, 8, 2, 1e-5)
        for mask in ([True, False, True], [False, True, True], [True, True, False]):
            expected = op(grad, x, mean, rstd, weight, 4, 6, 8, 2, mask)
            with LocalTensorMode(frozenset(range(self.world_size))):
                # Replicated, as the op's N, C and HxW arguments are global sizes.
                dist_args = [
                    distribute_tensor(t, mesh, [Replicate()])
                    for t in (grad, x, mean, rstd, weight)
                ]
                results = op(*dist_args, 4, 6, 8, 2, mask)
                got = [r if r is None else r.full_tensor() for r in results]
                self.assertEqual(got, list(expected))


if __name__ == "__main__":
    run_tests()
