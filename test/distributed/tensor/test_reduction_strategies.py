# Owner(s): ["oncall: distributed"]
"""Reduction rules: the out overloads place ``out`` like the result; the
foreach norms, which share ``linalg_vector_norm``'s rule but hold ``dtype``
where it holds ``dim``, have their arguments read by name; an empty dim list
reduces every dim; ``histc`` with ``min == max`` bins over the global range."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten


class TestReductionStrategies(LocalDTensorTestBase):
    @with_comms
    def test_out_variants_match_plain_torch(self) -> None:
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        with LocalTensorMode(frozenset(range(self.world_size))):
            for fn, inp in [
                (torch.amax, x),
                (torch.amin, x),
                (torch.mean, x),
                (torch.prod, x),
                (torch.any, x > 0),
            ]:
                expected = fn(inp, 1)
                for placement in (Shard(0), Replicate()):
                    dt = distribute_tensor(inp, mesh, [placement])
                    out = distribute_tensor(
                        torch.empty_like(expected), mesh, [placement]
                    )
                    fn(dt, 1, out=out)
                    self.assertEqual(out.placements, (placement,))
                    self.assertEqual(out.full_tensor(), expected)

    @with_comms
    def test_foreach_norms_with_dtype(self) -> None:
        mesh = self.build_device_mesh()
        tensors = [torch.randn(8, 4), torch.randn(4, 8)]
        with LocalTensorMode(frozenset(range(self.world_size))):
            dts = [distribute_tensor(t, mesh, [Shard(0)]) for t in tensors]
            for op in (aten._foreach_norm.Scalar, aten._foreach_powsum.Scalar):
                expected = op(tensors, 3, torch.float64)
                results = op(dts, 3, torch.float64)
                for result, want in zip(results, expected):
                    self.assertEqual(result.full_tensor(), want)

    @with_comms
    def test_empty_dim_list_reduces_every_dim(self) -> None:
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        cases = {
            "sum": lambda t: torch.sum(t, dim=[]),
            "sum keepdim": lambda t: torch.sum(t, dim=[], keepdim=True),
            "std": lambda t: torch.std(t, dim=[]),
            "amin keepdim": lambda t: torch.amin(t, dim=(), keepdim=True),
            "logsumexp keepdim": lambda t: torch.logsumexp(t, dim=(), keepdim=True),
            "vector_norm": lambda t: torch.linalg.vector_norm(t, dim=()),
            "count_nonzero": lambda t: torch.count_nonzero(t, dim=()),
            "any (reduces nothing)": lambda t: torch.any(t > 0, dim=()),
        }
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for name, fn in cases.items():
                with self.subTest(name):
                    self.assertEqual(fn(dt).full_tensor(), fn(x))

    @with_comms
    def test_histc_with_equal_bounds(self) -> None:
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for lo, hi in ((1.0, 1.0), (0.0, 0.0), (-1.0, 1.0)):
                self.assertEqual(
                    torch.histc(dt, bins=4, min=lo, max=hi).full_tensor(),
                    torch.histc(x, bins=4, min=lo, max=hi),
                )


if __name__ == "__main__":
    run_tests()
