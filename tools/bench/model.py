"""A tiny Llama-style training step, traced forward+backward to an aten graph.

The planner benchmark needs a graph with the ops a real planner meets (norms,
linears, head reshapes, SDPA, SwiGLU, residuals and their backward ops) yet
small enough to walk in seconds; dims are tiny, only the op mix matters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.fx
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True)
class LlamaDims:
    """Model sizes; ``blocks`` identical transformer blocks."""

    blocks: int = 4
    hidden: int = 64
    heads: int = 4
    ffn: int = 128
    seq: int = 16
    batch: int = 2
    eps: float = 1e-6


# Parameter shapes of one block, in the order ``llama_step`` consumes them.
def block_param_shapes(d: LlamaDims) -> list[tuple[int, ...]]:
    """attn norm, wq, wk, wv, wo, mlp norm, gate, up, down."""
    h, f = d.hidden, d.ffn
    return [(h,), (h, h), (h, h), (h, h), (h, h), (h,), (f, h), (f, h), (h, f)]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm written out, as Llama code does (no fused op to hide the reduction)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def llama_block(x: torch.Tensor, params: list[torch.Tensor], d: LlamaDims) -> torch.Tensor:
    """Pre-norm attention and SwiGLU MLP, each with a residual."""
    attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down = params
    b, s, hd = d.batch, d.seq, d.hidden // d.heads

    h = rms_norm(x, attn_norm, d.eps)

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, d.heads, hd).transpose(1, 2)

    q, k, v = heads(F.linear(h, wq)), heads(F.linear(h, wk)), heads(F.linear(h, wv))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(o.transpose(1, 2).reshape(b, s, d.hidden), wo)

    h = rms_norm(x, mlp_norm, d.eps)
    return x + F.linear(F.silu(F.linear(h, w_gate)) * F.linear(h, w_up), w_down)


def llama_step(d: LlamaDims) -> Callable[..., tuple[torch.Tensor, ...]]:
    """``step(x, *params) -> (loss, *grads)``: forward, a scalar loss, backward."""
    per_block = len(block_param_shapes(d))

    def step(x: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x
        for i in range(d.blocks):
            h = llama_block(h, list(params[i * per_block : (i + 1) * per_block]), d)
        loss = h.pow(2).mean()
        return (loss, *torch.autograd.grad(loss, params))

    return step


def trace_llama(d: LlamaDims) -> torch.fx.GraphModule:
    """make_fx on fake tensors: the aten graph of one training step."""
    torch.manual_seed(0)
    x = torch.randn(d.batch, d.seq, d.hidden)
    params = [
        torch.randn(shape).requires_grad_()
        for _ in range(d.blocks)
        for shape in block_param_shapes(d)
    ]
    gm = make_fx(llama_step(d), tracing_mode="fake")(x, *params)
    n_placeholders = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
    if n_placeholders != 1 + len(params):
        raise RuntimeError(
            f"traced llama graph has {n_placeholders} placeholders, expected {1 + len(params)}"
        )
    return gm
