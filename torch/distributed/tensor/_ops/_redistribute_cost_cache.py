# Copyright (c) Meta Platforms, Inc. and affiliates
"""
A bounded cache of redistribution costs across strategy queries.

Strategies price every candidate placement of every input against every
placement the op could take it in (``generate_redistribute_costs``: one row of
costs, one entry per candidate). A planner walking a model asks about the same
tensors, with the same candidates, at every consumer, and a cold eager call asks
about the same few pairs again and again, so most rows are computed many times.
A cost depends only on the source spec (mesh, placements, shard order, tensor
metadata) and the target's placements and shard order on its mesh, so whole rows
are cached on those.

Comparing sources is what a lookup spends its time on (a ``DTensorSpec``
compares field by field, and equal candidates of different tensors are different
objects), so each distinct tuple of sources is interned once as a number:
:class:`CostRows` does that once per input of a query, and each of its rows is
then looked up on that number and the target alone.
"""

import itertools
from collections.abc import Sequence

from torch.distributed.tensor._collective_utils import redistribute_cost
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpStrategy
from torch.distributed.tensor._ops._bounded_cache import BoundedCache


__all__ = [
    "CostRows",
    "clear_cost_cache",
    "cost_cache_size",
]

# Rows kept at most; the oldest are dropped first. A sweep of every registered
# op's OpInfo samples on two meshes fills it.
COST_CACHE_SIZE = 1 << 16
_costs: BoundedCache[object, tuple[float, ...]] = BoundedCache(COST_CACHE_SIZE)
# Source tuples -> their number. A number is never reused, so a row cached under an
# evicted source's number is only unreachable, never wrong.
_sources: BoundedCache[tuple[DTensorSpec, ...], int] = BoundedCache(COST_CACHE_SIZE)
_numbers = itertools.count()


def _row(sources: tuple[DTensorSpec, ...], dst: DTensorSpec) -> tuple[float, ...]:
    return tuple(redistribute_cost(src, dst) for src in sources)


def _next_number() -> int:
    return next(_numbers)


class CostRows:
    """Rows of redistribution costs from one input's candidates, one per target.

    Built once per input of a query; :meth:`row` is then cheap for every target
    the query's strategies take that input in, and equal targets share a row.
    """

    __slots__ = ("_sources", "_number")

    def __init__(self, sources: OpStrategy | Sequence[DTensorSpec]) -> None:
        if isinstance(sources, OpStrategy):
            sources = [s.output_spec for s in sources.strategies]
        self._sources = tuple(sources)
        # None: not cacheable (a source without metadata, or with a symbolic shape,
        # which cannot be hashed); its rows are computed each time.
        self._number: int | None = None
        if all(src.tensor_meta is not None for src in self._sources):
            try:
                hash(self._sources)
            except TypeError:
                return
            self._number = _sources.get_or_compute(self._sources, _next_number)

    def row(self, dst: DTensorSpec) -> list[float]:
        """The cost of moving each candidate to ``dst``, as a list the caller owns."""
        if self._number is None:
            return list(_row(self._sources, dst))
        key = (self._number, dst.mesh, dst.placements, dst.shard_order)
        # A planner may edit the costs it is handed; a row is shared by many specs.
        return list(_costs.get_or_compute(key, _row, self._sources, dst))


def clear_cost_cache() -> None:
    """Forget every cached cost (e.g. between benchmark runs)."""
    _costs.clear()
    _sources.clear()


def cost_cache_size() -> int:
    """Rows currently cached."""
    return len(_costs)
