"""The eager benchmarks: a list of DTensor ops as a model's step calls them.

Tensors are tiny, so the local compute is negligible and the time is DTensor's
dispatch: sharding propagation (a cache hit when warm, the strategy machinery
when cold), redistribution decisions and wrapping. Inputs mix Shard and
Replicate on a 2x4 mesh so that every op runs without needing a placement its
strategy refuses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement

Shape = tuple[int, ...]


@dataclass
class EagerInputs:
    """DTensors the op list reads; global shapes in the comments."""

    x: DTensor  # [16, 32]  (Shard(0), Replicate())
    y: DTensor  # [16, 32]  (Shard(0), Replicate())
    w: DTensor  # [32, 64]  (Replicate(), Shard(1))
    x3: DTensor  # [4, 16, 32]  (Shard(0), Replicate())
    ln_x: DTensor  # [16, 32]  (Shard(0), Replicate()), requires grad
    ln_w: DTensor  # [32]  replicated, requires grad
    ln_b: DTensor  # [32]  replicated, requires grad
    ln_grad: DTensor  # [16, 32]  (Shard(0), Replicate())


def make_inputs(mesh: DeviceMesh) -> EagerInputs:
    torch.manual_seed(0)
    rows = (Shard(0), Replicate())
    cols = (Replicate(), Shard(1))
    rep = (Replicate(), Replicate())

    def dt(shape: Shape, placements: tuple[Placement, ...], grad: bool = False) -> DTensor:
        t = distribute_tensor(torch.randn(shape), mesh, placements)
        if grad:
            t.requires_grad_()  # in place: t stays the DTensor
        return t

    return EagerInputs(
        x=dt((16, 32), rows),
        y=dt((16, 32), rows),
        w=dt((32, 64), cols),
        x3=dt((4, 16, 32), rows),
        ln_x=dt((16, 32), rows, grad=True),
        ln_w=dt((32,), rep, grad=True),
        ln_b=dt((32,), rep, grad=True),
        ln_grad=dt((16, 32), rows),
    )


# name -> (op over the inputs, expected global shape of each of its results)
EagerOp = Callable[[EagerInputs], object]


def _layer_norm_fwd_bwd(i: EagerInputs) -> tuple[torch.Tensor, ...]:
    out = F.layer_norm(i.ln_x, (32,), i.ln_w, i.ln_b)
    grads = torch.autograd.grad(out, (i.ln_x, i.ln_w, i.ln_b), i.ln_grad)
    return (out.detach(), *grads)


OPS: dict[str, tuple[EagerOp, tuple[Shape, ...]]] = {
    "add": (lambda i: i.x + i.y, ((16, 32),)),
    "mul": (lambda i: i.x * i.y, ((16, 32),)),
    "gelu": (lambda i: F.gelu(i.x), ((16, 32),)),
    "mm": (lambda i: torch.mm(i.x, i.w), ((16, 64),)),
    "matmul": (lambda i: torch.matmul(i.x3, i.w), ((4, 16, 64),)),
    "sum_dim": (lambda i: i.x.sum(dim=1), ((16,),)),
    "view": (lambda i: i.x.view(16, 4, 8), ((16, 4, 8),)),
    "transpose": (lambda i: i.x.transpose(0, 1), ((32, 16),)),
    "softmax": (lambda i: torch.softmax(i.x, dim=-1), ((16, 32),)),
    "cat": (lambda i: torch.cat([i.x, i.y], dim=1), ((16, 64),)),
    "layer_norm_fwd_bwd": (_layer_norm_fwd_bwd, ((16, 32), (16, 32), (32,), (32,))),
}


def run_ops(inputs: EagerInputs) -> list[object]:
    """One call of the whole op list (what a measured value times)."""
    return [fn(inputs) for fn, _ in OPS.values()]


def check_results(results: list[object]) -> None:
    """Fail loudly unless every op returned DTensors of the expected global shape."""
    if len(results) != len(OPS):
        raise RuntimeError(f"eager op list returned {len(results)} results for {len(OPS)} ops")
    for (name, (_, want)), result in zip(OPS.items(), results):
        got = result if isinstance(result, tuple) else (result,)
        if len(got) != len(want):
            raise RuntimeError(f"eager op {name}: {len(got)} results, expected {len(want)}")
        for k, (g, w) in enumerate(zip(got, want)):
            if not isinstance(g, DTensor):
                raise RuntimeError(f"eager op {name} result {k}: {type(g).__name__}, not a DTensor")
            if tuple(g.shape) != w:
                raise RuntimeError(f"eager op {name} result {k}: shape {tuple(g.shape)}, expected {w}")
