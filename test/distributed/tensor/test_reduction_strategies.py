# Owner(s): ["oncall: distributed"]
"""Reduction rules read their calls as torch reads them: the foreach norms with a
``dtype``, an empty dim list per op (refused where the prims kernels disagree),
``histc`` with ``min == max``."""

import itertools
import re

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten, prims = torch.ops.aten, torch.ops.prims
# Where plain torch raises (logsumexp on CPU), DTensor must raise the same error.
EMPTY_DIM_LISTS = {
    "sum": lambda t, k: torch.sum(t, dim=[], keepdim=k),
    "nansum": lambda t, k: torch.nansum(t, dim=[], keepdim=k),
    "mean": lambda t, k: torch.mean(t, dim=[], keepdim=k),
    "amax": lambda t, k: torch.amax(t, dim=(), keepdim=k),
    "amin": lambda t, k: torch.amin(t, dim=(), keepdim=k),
    "std": lambda t, k: torch.std(t, dim=[], keepdim=k),
    "var": lambda t, k: torch.var(t, dim=[], correction=0, keepdim=k),
    "var_mean": lambda t, k: torch.var_mean(t, dim=[], keepdim=k)[int(k)],
    "logsumexp": lambda t, k: torch.logsumexp(t, dim=(), keepdim=k),
    "vector_norm": lambda t, k: torch.linalg.vector_norm(t, 3, dim=(), keepdim=k),
    "powsum": lambda t, k: aten.linalg__powsum(t, 2, [], k),
    "count_nonzero": lambda t, k: torch.count_nonzero(t, dim=()),
    # These reduce no dim, so a Shard(0) input keeps its placement.
    "any": lambda t, k: torch.any(t > 0, dim=(), keepdim=k),
    "all": lambda t, k: torch.all(t > 0, dim=(), keepdim=k),
    "prims.prod": lambda t, k: prims.prod(t, []),
}


class TestReductionStrategies(LocalDTensorTestBase):
    @with_comms
    def test_foreach_norms_with_dtype(self) -> None:
        """The rule read ``dtype`` as ``dim`` and raised a TypeError."""
        mesh, tensors = self.build_device_mesh(), [torch.randn(8, 4), torch.randn(4, 8)]
        with LocalTensorMode(frozenset(range(self.world_size))):
            dts = [distribute_tensor(t, mesh, [Shard(0)]) for t in tensors]
            for op in (aten._foreach_norm.Scalar, aten._foreach_powsum.Scalar):
                got = [r.full_tensor() for r in op(dts, 3, torch.float64)]
                self.assertEqual(got, op(tensors, 3, torch.float64))

    @with_comms
    def test_empty_dim_list_read_per_op(self) -> None:
        """Read as no dim, it raised or, with keepdim, gave one shard's value."""
        x, mesh = torch.randn(8, 6), self.build_device_mesh()
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for name, keepdim in itertools.product(EMPTY_DIM_LISTS, (False, True)):
                fn = EMPTY_DIM_LISTS[name]
                with self.subTest(name, keepdim=keepdim):
                    try:
                        expected = fn(x, keepdim)
                    except RuntimeError as e:
                        with self.assertRaisesRegex(RuntimeError, re.escape(str(e))):
                            fn(dt, keepdim)
                        continue
                    result = fn(dt, keepdim)
                    self.assertEqual(result.full_tensor(), expected)
                    if name in ("any", "all", "prims.prod"):
                        self.assertEqual(result.placements, (Shard(0),))

    @with_comms
    def test_prims_empty_dims_refused(self) -> None:
        """No result fits both kernels; the dims listed or a 0-d input still run."""
        x, s, mesh = torch.randn(8, 6), torch.tensor(2.5), self.build_device_mesh()
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            scalar = distribute_tensor(s, mesh, [Replicate()])
            for op in (prims.sum, prims.amax, prims.amin, prims.var):
                extra = (1.0,) if op is prims.var else ()
                pattern = rf"{re.escape(str(op.default))}: empty dims .* list them"
                with self.assertRaisesRegex(RuntimeError, pattern):
                    op(dt, [], *extra)
                for inp, plain, dims in ((dt, x, [0, 1]), (scalar, s, [])):
                    got = op(inp, dims, *extra).full_tensor()
                    self.assertEqual(got, op(plain, dims, *extra))

    @with_comms
    def test_histc_with_equal_bounds(self) -> None:
        """With ``min == max`` each shard binned over its own range."""
        x, mesh = torch.randn(8, 6), self.build_device_mesh()
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for lo, hi in ((1.0, 1.0), (0.0, 0.0), (-1.0, 1.0)):
                got = torch.histc(dt, bins=4, min=lo, max=hi).full_tensor()
                self.assertEqual(got, torch.histc(x, bins=4, min=lo, max=hi))

    @with_comms
    def test_keepdim_by_position_and_empty_shards(self) -> None:
        """logsumexp read ``keepdim`` passed by position (as dispatch passes it) as
        False; amax, amin and _foreach_max raised where a rank's shard was empty."""
        x, mesh = torch.randn(4, 8, 6), self.build_device_mesh()
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(1)])
            got = torch.logsumexp(dt, 0, keepdim=True)
            self.assertEqual(got.placements, (Shard(1),))
            self.assertEqual(got.full_tensor(), torch.logsumexp(x, 0, keepdim=True))
            x = torch.randn(2, 3)  # 2 rows on 4 ranks
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for op in (torch.amax, torch.amin):
                self.assertEqual(op(dt, 0).full_tensor(), op(x, 0))
            self.assertEqual(torch._foreach_max([dt])[0].full_tensor(), x.max())


if __name__ == "__main__":
    run_tests()
