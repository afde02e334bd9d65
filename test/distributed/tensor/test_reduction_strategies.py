# Owner(s): ["oncall: distributed"]
"""Reduction rules: the out overloads place ``out`` like the result; the
foreach norms, which share ``linalg_vector_norm``'s rule but hold ``dtype``
where it holds ``dim``, have their arguments read by name; an empty dim list
is read per op as torch reads it, and refused for the prims reductions whose meta
and CPU kernels read it differently; ``histc`` with ``min == max`` bins over the
global range."""

import re

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten
prims = torch.ops.prims


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
    def test_empty_dim_list_read_per_op(self) -> None:
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        # Most reductions reduce every dim for an empty dim list; these reduce none,
        # so a Shard(0) input keeps its placement.
        reduces_none = {"any", "any keepdim", "all", "all keepdim", "prims.prod"}
        cases = {
            "sum": lambda t: torch.sum(t, dim=[]),
            "sum keepdim": lambda t: torch.sum(t, dim=[], keepdim=True),
            "nansum": lambda t: torch.nansum(t, dim=[]),
            "nansum keepdim": lambda t: torch.nansum(t, dim=[], keepdim=True),
            "mean": lambda t: torch.mean(t, dim=[]),
            "mean keepdim": lambda t: torch.mean(t, dim=[], keepdim=True),
            "amax": lambda t: torch.amax(t, dim=()),
            "amax keepdim": lambda t: torch.amax(t, dim=(), keepdim=True),
            "amin": lambda t: torch.amin(t, dim=()),
            "amin keepdim": lambda t: torch.amin(t, dim=(), keepdim=True),
            "std": lambda t: torch.std(t, dim=[]),
            "std keepdim": lambda t: torch.std(t, dim=[], keepdim=True),
            "var": lambda t: torch.var(t, dim=[], correction=0),
            "var keepdim": lambda t: torch.var(t, dim=[], keepdim=True),
            "var_mean var": lambda t: torch.var_mean(t, dim=[])[0],
            "var_mean mean": lambda t: torch.var_mean(t, dim=[], keepdim=True)[1],
            # Plain torch raises for this one on CPU; DTensor must raise too.
            "logsumexp": lambda t: torch.logsumexp(t, dim=()),
            "logsumexp keepdim": lambda t: torch.logsumexp(t, dim=(), keepdim=True),
            "vector_norm": lambda t: torch.linalg.vector_norm(t, dim=()),
            "vector_norm keepdim": lambda t: torch.linalg.vector_norm(
                t, 3, dim=(), keepdim=True
            ),
            "powsum": lambda t: aten.linalg__powsum(t, 2, []),
            "powsum keepdim": lambda t: aten.linalg__powsum(t, 2, [], True),
            "count_nonzero": lambda t: torch.count_nonzero(t, dim=()),
            "any": lambda t: torch.any(t > 0, dim=()),
            "any keepdim": lambda t: torch.any(t > 0, dim=(), keepdim=True),
            "all": lambda t: torch.all(t > 0, dim=()),
            "all keepdim": lambda t: torch.all(t > 0, dim=(), keepdim=True),
            "prims.prod": lambda t: prims.prod(t, []),
        }
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            for name, fn in cases.items():
                with self.subTest(name):
                    try:
                        expected = fn(x)
                    except RuntimeError as e:
                        with self.assertRaisesRegex(RuntimeError, re.escape(str(e))):
                            fn(dt)
                        continue
                    result = fn(dt)
                    self.assertEqual(result.shape, expected.shape)
                    self.assertEqual(result.full_tensor(), expected)
                    if name in reduces_none:
                        self.assertEqual(result.placements, (Shard(0),))

    @with_comms
    def test_prims_empty_dims_refused(self) -> None:
        """prims.sum, amax, amin and var read an empty ``dims`` as no dim in their
        meta kernel and as every dim on CPU, so no result can match both."""
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        with LocalTensorMode(frozenset(range(self.world_size))):
            dt = distribute_tensor(x, mesh, [Shard(0)])
            scalar = distribute_tensor(torch.tensor(2.5), mesh, [Replicate()])
            for op, extra in [
                (prims.sum.default, ()),
                (prims.amax.default, ()),
                (prims.amin.default, ()),
                (prims.var.default, (1.0,)),
            ]:
                with self.subTest(str(op)):
                    with self.assertRaisesRegex(
                        RuntimeError, rf"{re.escape(str(op))}: .*empty `dims`"
                    ):
                        op(dt, [], *extra)
                    # The dims listed, or a 0-d input, leave no doubt.
                    self.assertEqual(
                        op(dt, [0, 1], *extra).full_tensor(), op(x, [0, 1], *extra)
                    )
                    self.assertEqual(
                        op(scalar, [], *extra).full_tensor(),
                        op(torch.tensor(2.5), [], *extra),
                    )

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
