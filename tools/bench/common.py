"""Set-up shared by the benchmarks: fake process group, meshes, DTensor's caches.

Everything here uses only torch 2.13.0 APIs (or probes for the built change's
additions), because the same file runs in the stock and the built venv.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tools._modules import load_by_path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType


REPO_ROOT = Path(__file__).resolve().parents[2]
WORLD_SIZE = 8
CONTRACT_CANDIDATES = "torch/testing/_internal/distributed/_tensor/contract_candidates.py"


def init_fake_process_group(world_size: int = WORLD_SIZE) -> None:
    """An in-process world of ``world_size`` ranks (this process is rank 0); no real collectives.

    A world of another size is torn down and replaced, so that one process can
    walk meshes of 8 and of 16 ranks one after the other (the scaling run does).
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1:
        raise ValueError(f"the fake process group needs at least 1 rank, got {world_size}")
    if dist.is_initialized():
        if dist.get_world_size() == world_size:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def mesh_world_size(shape: tuple[int, ...]) -> int:
    """Ranks a mesh of ``shape`` spans (every dim at least 1)."""
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"a mesh shape needs positive dims, got {shape}")
    return int(torch.Size(shape).numel())


def parse_mesh(text: str) -> tuple[int, ...]:
    """``"2x4"`` -> ``(2, 4)``; ``"8"`` -> ``(8,)``. Raises ValueError naming the text."""
    try:
        shape = tuple(int(part) for part in text.strip().lower().split("x"))
    except ValueError:
        raise ValueError(f"mesh shape {text!r}: expected sizes joined by 'x', e.g. 2x4") from None
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"mesh shape {text!r}: every dim must be a positive size")
    return shape


def cpu_mesh(shape: tuple[int, ...]) -> DeviceMesh:
    """A CPU DeviceMesh over the whole fake world, which must be as large as the mesh."""
    world = dist.get_world_size() if dist.is_initialized() else WORLD_SIZE
    if mesh_world_size(shape) != world:
        raise ValueError(
            f"mesh {shape} spans {mesh_world_size(shape)} ranks but the fake world has {world}; "
            f"call init_fake_process_group({mesh_world_size(shape)}) first"
        )
    return init_device_mesh("cpu", shape)


def clear_dtensor_caches() -> list[str]:
    """Empty every sharding cache DTensor keeps across calls; return which were cleared.

    Stock and built both have the propagation caches (Python lru_cache and the
    C++ fast path, via the debug helper) and the tensor-meta lru_cache on the
    propagator; only the built change has the finalizer's output-meta cache and
    the redistribute-cost cache.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    cleared = ["sharding_prop"]
    _clear_sharding_prop_cache()
    propagator = DTensor._op_dispatcher.sharding_propagator
    meta_cached = getattr(propagator, "_propagate_tensor_meta_cached", None)
    if meta_cached is not None and hasattr(meta_cached, "cache_clear"):
        meta_cached.cache_clear()
        cleared.append("tensor_meta")
    try:
        from torch.distributed.tensor._ops import _output_metas
    except ImportError:  # stock torch: no output-meta cache
        return cleared
    cache = getattr(_output_metas, "_meta_cache", None)
    if cache is not None:
        cache.clear()
        cleared.append("finalize_meta")
    try:
        from torch.distributed.tensor._ops import _redistribute_cost_cache
    except ImportError:  # built before the cost cache
        return cleared
    _redistribute_cost_cache.clear_cost_cache()
    cleared.append("redistribute_cost")
    return cleared


def load_contract_candidates() -> ModuleType:
    """contract_candidates as installed (built venv), else loaded from the repo by path (stock)."""
    try:
        from torch.testing._internal.distributed._tensor import contract_candidates

        return contract_candidates
    except ImportError:
        pass
    return load_by_path("_bench_contract_candidates", REPO_ROOT / CONTRACT_CANDIDATES)


def has_contract_change() -> bool:
    """Whether the running torch carries the strategy-contract change."""
    return importlib.util.find_spec("torch.distributed.tensor._ops._finalize_strategy") is not None
