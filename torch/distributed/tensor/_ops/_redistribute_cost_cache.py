# Copyright (c) Meta Platforms, Inc. and affiliates
"""
A bounded cache of redistribution costs across strategy queries.

Strategies price every candidate placement of every input against every
placement the op could take it in (``generate_redistribute_costs``). A planner
walking a model asks about the same tensors, with the same candidates, at every
consumer, and a cold eager call asks about the same few pairs again and again, so
most costs are computed many times. A cost depends only on the source spec
(mesh, placements, shard order, tensor metadata) and the target's placements and
shard order on its mesh, so it is cached on those.
"""

from torch.distributed.tensor._collective_utils import redistribute_cost
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._ops._bounded_cache import BoundedCache


__all__ = ["cached_redistribute_cost", "clear_cost_cache", "cost_cache_size"]

# Entries kept at most; the oldest are dropped first. A sweep of every registered
# op's OpInfo samples on two meshes fills it.
COST_CACHE_SIZE = 1 << 16
_costs: BoundedCache[object, float] = BoundedCache(COST_CACHE_SIZE)


def cached_redistribute_cost(src: DTensorSpec, dst: DTensorSpec) -> float:
    """``redistribute_cost(src, dst)``, computed once per distinct key."""
    if src.tensor_meta is None:
        return redistribute_cost(src, dst)
    # A key holding symbolic shapes is unhashable: the cache computes it unshared.
    key = (src, dst.mesh, dst.placements, dst.shard_order)
    return _costs.get_or_compute(key, redistribute_cost, src, dst)


def clear_cost_cache() -> None:
    """Forget every cached cost (e.g. between benchmark runs)."""
    _costs.clear()


def cost_cache_size() -> int:
    return len(_costs)
