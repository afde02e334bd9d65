# Owner(s): ["oncall: distributed"]
"""Scaled dot product attention on CPU DTensors: its flash kernel for CPU, forward
and backward, sharded on batch and on heads, gives plain torch's values."""

import torch
import torch.nn.functional as F
from torch.distributed._local_tensor import LocalTensorMode
from torch.distributed.tensor import distribute_tensor, Replicate, Shard
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


class TestAttentionCpuStrategies(LocalDTensorTestBase):
    @with_comms
    def test_flash_attention_for_cpu_forward_and_backward(self) -> None:
        """Before, both ops had no strategy: dispatch raised NotImplementedError."""
        mesh = self.build_device_mesh()
        q, k, v = (torch.randn(4, 4, 8, 16, requires_grad=True) for _ in range(3))
        mask = torch.randn(8, 8)
        for causal, attn_mask in ((True, None), (False, mask)):
            expected = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=causal
            )
            grads = torch.autograd.grad(expected.sum(), (q, k, v))
            for placement in (Shard(0), Shard(1), Replicate()):
                with LocalTensorMode(frozenset(range(self.world_size))):
                    dq, dk, dv = (
                        distribute_tensor(
                            t.detach(), mesh, [placement]
                        ).requires_grad_()
                        for t in (q, k, v)
                    )
                    dmask = attn_mask
                    if attn_mask is not None:
                        dmask = distribute_tensor(attn_mask, mesh, [Replicate()])
                    out = F.scaled_dot_product_attention(
                        dq, dk, dv, attn_mask=dmask, is_causal=causal
                    )
                    self.assertEqual(out.placements, (placement,))
                    self.assertEqual(out.full_tensor(), expected)
                    got = torch.autograd.grad(out.sum(), (dq, dk, dv))
                    for dgrad, grad in zip(got, grads):
                        self.assertEqual(dgrad.placements, (placement,))
                        self.assertEqual(dgrad.full_tensor(), grad)
        q6 = torch.randn(4, 6, 8, 16)  # a rank without heads: the kernel divided by 0
        with LocalTensorMode(frozenset(range(self.world_size))):
            d6 = distribute_tensor(q6, mesh, [Shard(1)])
            out = F.scaled_dot_product_attention(d6, d6, d6).full_tensor()
        self.assertEqual(out, F.scaled_dot_product_attention(q6, q6, q6))

    @with_comms
    def test_mask_is_used_as_held(self) -> None:
        """Dispatch does not redistribute a keyword argument: q sharded on heads with
        a key-padding mask held sharded on batch ran on each rank's piece, wrongly;
        with a mask held sharded on query rows it had no strategy (q's rows have)."""
        mesh, q = self.build_device_mesh(), torch.randn(4, 4, 8, 16, requires_grad=True)
        for mask in (torch.randn(4, 1, 1, 8), torch.randn(8, 8)):
            expected = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
            (grad,) = torch.autograd.grad(expected.sum(), q)
            with LocalTensorMode(frozenset(range(self.world_size))):
                dq = distribute_tensor(q.detach(), mesh, [Shard(1)]).requires_grad_()
                dmask = distribute_tensor(mask, mesh, [Shard(0)])
                out = F.scaled_dot_product_attention(dq, dq, dq, attn_mask=dmask)
                self.assertEqual(out.full_tensor(), expected)
                (dgrad,) = torch.autograd.grad(out.sum(), dq)
                self.assertEqual(dgrad.full_tensor(), grad)


if __name__ == "__main__":
    run_tests()
