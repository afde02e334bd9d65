"""Set-up shared by the benchmarks: a fake process group, a CPU mesh, DTensor's caches.

The same file runs in the stock and the built venv, so it uses only torch
2.14.1 APIs and probes for what the change adds.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


MESH_SHAPE = (2, 4)


def mesh_world_size(shape: tuple[int, ...]) -> int:
    """Ranks a mesh of ``shape`` spans; ValueError for an empty or non-positive shape."""
    if not shape or any(n < 1 for n in shape):
        raise ValueError(f"a mesh shape needs positive dims, got {shape}")
    return int(torch.Size(shape).numel())


def init_fake_process_group(world_size: int) -> None:
    """An in-process world (this process is rank 0): meshes without real collectives.

    A world of another size is replaced, so that tests can build meshes of
    different sizes in one process.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if world_size < 1:
        raise ValueError(f"the fake process group needs at least 1 rank, got {world_size}")
    if dist.is_initialized():
        if dist.get_world_size() == world_size:
            return
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)


def cpu_mesh(shape: tuple[int, ...] = MESH_SHAPE) -> DeviceMesh:
    """A CPU mesh of ``shape`` over a fake world of exactly as many ranks."""
    init_fake_process_group(mesh_world_size(shape))
    return init_device_mesh("cpu", shape)


def clear_dtensor_caches() -> list[str]:
    """Empty the caches DTensor keeps across calls, on either torch; which were cleared.

    A cold measurement must start from nothing on both sides: the propagation
    caches (the Python LRU and the C++ fast path, through the debug helper)
    the shape-inference LRU, which the built runtime now fills on a miss
    and stock's runtime leaves alone, and the built torch's cost-row cache.
    """
    from torch.distributed.tensor._sharding_prop import ShardingPropagator
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    _clear_sharding_prop_cache()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    return ["sharding_prop", "tensor_meta"]


def has_contract_change() -> bool:
    """Whether the running torch carries the change (its shape-inference helper for strategies)."""
    from torch.distributed.tensor._ops import utils

    return hasattr(utils, "infer_output_tensor_meta")
