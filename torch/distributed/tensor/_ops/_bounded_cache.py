# Copyright (c) Meta Platforms, Inc. and affiliates
"""
The bounded, thread-safe cache behind the strategy machinery's cross-query caches.

Shape inference (``_finalize_strategy``) and redistribution costs
(``_redistribute_cost_cache``) are each worth computing once and sharing across
strategy queries. Both caches need the same three properties: a bound, so that a
long-running planner cannot grow them without limit; safety under queries from
several threads; and a size that tools can report. Their keys can hold symbolic
sizes, which cannot be hashed: such a value is computed every time and never
stored, so nothing symbolic outlives the trace that produced it.
"""

import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar


__all__ = ["BoundedCache"]

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class BoundedCache(Generic[K, V]):
    """A mapping of at most ``max_size`` entries; the oldest entry is dropped first.

    Reads take no lock (a dict lookup is atomic); inserts and evictions do, so
    concurrent fills never push the cache past its bound. Two threads missing on
    the same key may both compute it: values must be deterministic in the key.
    """

    def __init__(self, max_size: int) -> None:
        if max_size <= 0:
            raise ValueError(f"BoundedCache: max_size must be positive, got {max_size}")
        self.max_size = max_size
        self._entries: dict[K, V] = {}
        self._lock = threading.Lock()

    def get_or_compute(
        self,
        key: K,
        compute: Callable[..., V],
        *args: Any,
        keep: Callable[[V], bool] | None = None,
    ) -> V:
        """The value cached for ``key``, else ``compute(*args)``, stored under
        ``key`` unless ``keep`` says otherwise. (The arguments are passed, not
        closed over, so that a hit allocates nothing.)

        An unhashable key (e.g. one holding a ``SymInt``) is computed and not stored.
        """
        try:
            value = self._entries.get(key, _MISSING)
        except TypeError:
            return compute(*args)
        if value is not _MISSING:
            return value  # type: ignore[return-value]
        value = compute(*args)
        if keep is not None and not keep(value):
            return value
        with self._lock:
            if key not in self._entries:  # another thread may have stored it meanwhile
                while self._entries and len(self._entries) >= self.max_size:
                    del self._entries[next(iter(self._entries))]
            self._entries[key] = value
        return value

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def items(self) -> list[tuple[K, V]]:
        """A snapshot of the entries, oldest first (for tests and reports)."""
        with self._lock:
            return list(self._entries.items())

    def __len__(self) -> int:
        return len(self._entries)
