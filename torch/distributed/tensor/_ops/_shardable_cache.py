# Copyright (c) Meta Platforms, Inc. and affiliates
"""
A bounded cache of shardability answers across strategy queries.

Expanding single-dim rules asks, for every combination it keeps, whether each
input's shape can be split as the combination places it. A planner walking a
model asks again at every consumer of the same tensor, and the blocks of a
model repeat the same shapes, so on a planner walk the distinct questions are a
few percent of those asked. The answer depends only on the shape, the mesh,
the placements and how unbacked sizes are treated. A shape holding symbolic
sizes is not hashable and is answered afresh (checks such as ``torch._check``
that the answer records then run as they always do).
"""

from collections.abc import Callable, Sequence

from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._ops._bounded_cache import BoundedCache


__all__ = ["cached_is_shardable", "clear_shardable_cache", "shardable_cache_size"]

# Answers kept at most; the oldest are dropped first. A planner walk of a
# 4-block model asks about 2k distinct questions.
SHARDABLE_CACHE_SIZE = 1 << 14
_answers: BoundedCache[object, bool] = BoundedCache(SHARDABLE_CACHE_SIZE)


def cached_is_shardable(
    is_shardable: Callable[[Sequence[int], DTensorSpec, bool | None], bool],
    shape: Sequence[int],
    spec: DTensorSpec,
    allow_unbacked_sharding: bool | None,
) -> bool:
    """``is_shardable(shape, spec, allow_unbacked_sharding)``, answered once per key.

    (``is_shardable`` is ``_ops.utils.is_tensor_shardable``, passed in because
    ``_ops.utils`` imports this module.)
    """
    key = (shape, spec.mesh, spec.placements, allow_unbacked_sharding)
    return _answers.get_or_compute(
        key, is_shardable, shape, spec, allow_unbacked_sharding
    )


def clear_shardable_cache() -> None:
    """Forget every cached answer (e.g. between benchmark runs)."""
    _answers.clear()


def shardable_cache_size() -> int:
    return len(_answers)
