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

import threading

from torch.distributed.tensor._collective_utils import redistribute_cost
from torch.distributed.tensor._dtensor_spec import DTensorSpec


__all__ = ["cached_redistribute_cost", "clear_cost_cache", "cost_cache_size"]

# Entries kept at most; the oldest are dropped first. A full `make audit` fills
# it to this bound (reports/audit.md, "Cache sizes after the audit").
COST_CACHE_SIZE = 1 << 16
_costs: dict[object, float] = {}
_lock = threading.Lock()


def cached_redistribute_cost(src: DTensorSpec, dst: DTensorSpec) -> float:
    """``redistribute_cost(src, dst)``, computed once per distinct key."""
    meta = src.tensor_meta
    if meta is None:
        return redistribute_cost(src, dst)
    key = (src, dst.mesh, dst.placements, dst.shard_order)
    try:
        cost = _costs.get(key)
    except TypeError:  # symbolic shapes are not hashable: nothing to share
        return redistribute_cost(src, dst)
    if cost is None:
        cost = redistribute_cost(src, dst)
        with _lock:
            if len(_costs) >= COST_CACHE_SIZE:
                _costs.pop(next(iter(_costs)))
            _costs[key] = cost
    return cost


def clear_cost_cache() -> None:
    """Forget every cached cost (e.g. between benchmark runs)."""
    with _lock:
        _costs.clear()


def cost_cache_size() -> int:
    return len(_costs)
