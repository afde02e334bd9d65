# Owner(s): ["oncall: distributed"]
"""The out overloads of the reductions: registered like the result, ``out`` is
placed as the result is, so the call runs and gives plain torch's values."""

import torch
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import Partial
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestReductionOutOverloads(LocalDTensorTestBase):
    @with_comms
    def test_out_placed_like_the_result(self) -> None:
        """The functional rule did not place ``out``: the expansion failed."""
        mesh = self.build_device_mesh()
        x = torch.randn(8, 6)
        with LocalTensorMode(frozenset(range(self.world_size))):
            fns = (torch.amax, torch.amin, torch.mean, torch.prod, torch.argmax)
            for fn in (*fns, torch.any):
                inp = x > 0 if fn is torch.any else x
                expected = fn(inp, 1)
                dt = distribute_tensor(inp, mesh, [Shard(1)])  # out's placement keyed
                for placement in (Shard(0), Replicate()):
                    with self.subTest(fn=fn.__name__, placement=placement):
                        empty = torch.empty_like(expected)
                        out = distribute_tensor(empty, mesh, [placement])
                        fn(dt, 1, out=out)
                        self.assertEqual(out.placements, (placement,))
                        self.assertEqual(out.full_tensor(), expected)
            dx = distribute_tensor(x, mesh, [Shard(0)])
            dy = distribute_tensor(x.T, mesh, [Replicate()])
            for placement in (Shard(0), Replicate()):  # mm.out's out is keyed too
                out = distribute_tensor(torch.empty(8, 8), mesh, [placement])
                torch.mm(dx, dy, out=out)
                self.assertEqual(out.placements, (placement,))
                self.assertEqual(out.full_tensor(), x @ x.T)
            for fn in (torch.max, torch.min):  # the elementwise out overloads
                ts = (x, x.cos(), torch.empty(8, 6))
                dx, dy, out = (distribute_tensor(t, mesh, [Shard(0)]) for t in ts)
                fn(dx, dy, out=out)
                self.assertEqual(out.full_tensor(), fn(x, x.cos()))
            # mean's filter refuses Partial("avg") of uneven shards, for out= too
            dx = distribute_tensor(torch.randn(6, 4), mesh, [Shard(0)])
            out = DTensor.from_local(torch.zeros(4), mesh, [Partial("avg")])
            with self.assertRaisesRegex(RuntimeError, "S\\(0\\) to P\\(avg\\)"):
                torch.mean(dx, 0, out=out)

    @with_comms
    def test_copied_filter_serves_out_overloads(self) -> None:
        """``convolution.out`` inherits convolution's filter, which accepts it."""
        mesh = self.build_device_mesh()
        x, w, b = torch.randn(4, 3, 8), torch.randn(5, 3, 3), torch.randn(5)
        args = ([1], [0], [1], False, [0], 1)
        expected = torch.ops.aten.convolution.default(x, w, b, *args)
        with LocalTensorMode(frozenset(range(self.world_size))):
            dw, db = (distribute_tensor(t, mesh, [Replicate()]) for t in (w, b))
            for placement in (Shard(0), Replicate()):
                dx = distribute_tensor(x, mesh, [placement])
                out = distribute_tensor(torch.empty_like(expected), mesh, [placement])
                torch.ops.aten.convolution.out(dx, dw, db, *args, out=out)
                self.assertEqual(out.full_tensor(), expected)


if __name__ == "__main__":
    run_tests()
