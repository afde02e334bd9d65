# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategy queries from many threads at once.

The change adds process-wide state to sharding propagation: a shape-inference cache
(``_output_metas._meta_cache``), a redistribute-cost cache shared across
queries (``_redistribute_cost_cache``), and context variables that tell spec
builders which query they answer (``_output_metas.answering``) and tell the
decomposition path it traces for a planner (``_decompositions._in_planner_query``).
A planner may query from a thread pool, and eager DTensor runs in several threads
(threaded process groups in PyTorch's own tests), so:

* ``TestConcurrentQueries``: 8 threads released together by a barrier ask for the
  same strategies (runtime queries through the propagator, planner queries through
  ``get_op_strategy``; single-dim, registered and decomposition-derived ops, a
  foreach op) and get exactly what one thread gets alone (placements, metas,
  costs), without an exception and without hanging; eager DTensor ops from 8
  threads on the fake process group give the serial results too.
* ``TestCachesStayBounded``: each cache the change adds holds at most its bound
  even when 8 threads fill it at once with more distinct keys than it may hold.

Each thread is joined with a timeout; a thread still running is reported with the
query it was in.
"""

import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from unittest import mock

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSpec,
    OpStrategy,
    OutputSharding,
    TupleStrategy,
)
from torch.distributed.tensor._ops import (
    _output_metas,
    _redistribute_cost_cache,
    _shardable_cache,
)
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
    meta_of,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    ops_by_registry,
    REGISTRIES,
    runtime_schema,
    strategy_schema,
)


# One intra-op thread per Python thread: the machine has few cores and the point
# is interleaving in Python, not parallel kernels.
torch.set_num_threads(1)

aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()

THREADS = 8
ROUNDS = 3
# GIL switch interval while threads run (the default is 5 ms).
SWITCH_INTERVAL_S = 1e-5
# Rounds of the cache-bound tests: each starts with an empty cache.
FILL_ROUNDS = 6
# Per thread, for the barrier and for the join; a query takes milliseconds, a round
# of all of them well under a second even cold, so this only trips on a hang.
TIMEOUT_S = 120.0


# ---------------------------------------------------------------------------
# Shared queries
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """An op call and the placements a runtime query gives its tensor inputs."""

    name: str
    op: torch._ops.OpOverload
    args: tuple[object, ...]
    kwargs: dict[str, object]
    placements: tuple[tuple[Placement, ...], ...]


def _cases() -> list[Case]:
    x = torch.empty(8, 6)
    y = torch.empty(6, 4)
    v6 = torch.empty(6)
    v4 = torch.empty(4)
    return [
        Case("mm", aten.mm.default, (x, y), {}, ((S0, R), (R, S1))),
        Case("add", aten.add.Tensor, (x, x), {}, ((S0, R), (R, S1))),
        Case(
            "to_copy", aten._to_copy.default, (x,), {"dtype": torch.float64},
            ((S0, P),),
        ),
        Case("max_dim", aten.max.dim, (x, 1), {}, ((S0, S1),)),
        Case(
            "foreach_add", aten._foreach_add.List, ([x, v4], [x, v4]), {},
            ((S0, R), (R, R), (R, S1), (S0, R)),
        ),
        Case("t", aten.t.default, (x,), {}, ((S0, R),)),
        Case("sum_dim", aten.sum.dim_IntList, (x, [1]), {}, ((S0, S1),)),
        Case("softmax", aten._softmax.default, (x, 1, False), {}, ((S0, S1),)),
        Case(
            "layer_norm", aten.native_layer_norm.default, (x, [6], v6, v6, 1e-5), {},
            ((S0, R), (R, R), (R, R)),
        ),
        Case("view", aten.view.default, (x, [4, 12]), {}, ((S0, R),)),
        Case("hardswish", aten.hardswish.default, (x,), {}, ((S0, S1),)),
        Case("mv", aten.mv.default, (x, v6), {}, ((S0, S1), (S0, R))),
    ]


@dataclass(frozen=True)
class Query:
    """One strategy query, run by every thread on the very same schema objects."""

    name: str
    run: Callable[[], object]


def _propagator() -> ShardingPropagator:
    return DTensor._op_dispatcher.sharding_propagator


def clear_caches() -> None:
    """Forget every sharding decision, output meta and cost cached in the process."""
    _clear_sharding_prop_cache()
    _propagator().propagate_op_sharding.cache_clear()
    # dict.clear() is atomic; not taking the cache's lock keeps a test that found a
    # deadlock (a thread holding that lock forever) from hanging in its tear-down.
    _output_metas._meta_cache.clear()
    _redistribute_cost_cache.clear_cost_cache()


# ---------------------------------------------------------------------------
# Structural summaries: what must be equal between threads and a serial run
# ---------------------------------------------------------------------------


def summarize(x: object) -> Hashable:
    """A hashable, comparable digest of a strategy or sharding decision.

    Placements (with shard order), output and input metas, and every redistribute
    cost, exactly; exceptions by type and message.
    """
    if x is None:
        return None
    if isinstance(x, BaseException):
        return ("raised", type(x).__name__, str(x)[:300])
    if isinstance(x, TensorMeta):
        return (tuple(x.shape), tuple(x.stride), str(x.dtype))
    if isinstance(x, DTensorSpec):
        return (
            tuple(x.mesh.shape),
            tuple(repr(p) for p in x.placements),
            repr(x.shard_order),
            summarize(x.tensor_meta),
        )
    if isinstance(x, OpSpec):
        costs = None
        if x.redistribute_cost is not None:
            costs = tuple(tuple(float(c) for c in row) for row in x.redistribute_cost)
        return (
            "OpSpec",
            summarize(x.output_specs),
            summarize(x.input_specs),
            costs,
        )
    if isinstance(x, OpStrategy):
        return ("OpStrategy", tuple(summarize(s) for s in x.strategies))
    if isinstance(x, TupleStrategy):
        return ("TupleStrategy", tuple(summarize(c) for c in x.children))
    if isinstance(x, OutputSharding):
        redistribute = None
        if x.redistribute_schema is not None:
            redistribute = summarize(x.redistribute_schema.args_spec)
        return (
            "OutputSharding",
            summarize(x.output_spec),
            redistribute,
            x.needs_redistribute,
            x.use_val_from_redistribute_schema,
        )
    if isinstance(x, DTensor):
        return (
            "DTensor",
            tuple(x.shape),
            str(x.dtype),
            tuple(repr(p) for p in x.placements),
            tuple(x.to_local().shape),
        )
    if isinstance(x, (list, tuple)):
        return tuple(summarize(e) for e in x)
    if isinstance(x, (int, float, bool, str)):
        return x
    raise TypeError(f"cannot summarize {type(x).__name__}")


def _outcome(run: Callable[[], object]) -> Hashable:
    try:
        return summarize(run())
    except Exception as e:  # compared with the serial outcome, never swallowed
        return summarize(e)


# ---------------------------------------------------------------------------
# Running the same work from many threads
# ---------------------------------------------------------------------------


@dataclass
class ThreadedRun:
    """Per thread: the outcome of each (round, query), and where it is now."""

    outcomes: list[dict[tuple[int, str], Hashable]]
    errors: list[str]
    hung: list[str]


def run_in_threads(
    queries: Sequence[Query],
    threads: int = THREADS,
    rounds: int = ROUNDS,
    between_rounds: Callable[[int], None] | None = None,
    timeout: float | None = None,
) -> ThreadedRun:
    """Run every query ``rounds`` times in each of ``threads`` threads.

    A barrier releases all threads together; thread ``i`` starts each round at
    query ``i`` (so that at any moment different threads are in different queries,
    and every query is being answered by several threads at once over a round).
    ``between_rounds(thread)`` runs before each round (e.g. one thread clearing
    caches while the others read them). ``timeout`` defaults to ``TIMEOUT_S``.
    """
    timeout = TIMEOUT_S if timeout is None else timeout
    barrier = threading.Barrier(threads, timeout=timeout)
    where = ["not started"] * threads
    outcomes: list[dict[tuple[int, str], Hashable]] = [{} for _ in range(threads)]
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            where[i] = "barrier"
            barrier.wait()
            for r in range(rounds):
                if between_rounds is not None:
                    where[i] = f"round {r} set-up"
                    between_rounds(i)
                for k in range(len(queries)):
                    query = queries[(i + k) % len(queries)]
                    where[i] = f"round {r} {query.name}"
                    outcomes[i][(r, query.name)] = _outcome(query.run)
            where[i] = "done"
        except Exception as e:  # the barrier broke, or set-up failed
            errors.append(f"thread {i} at {where[i]}: {type(e).__name__}: {e}")
            where[i] = "failed"

    workers = [
        threading.Thread(target=work, args=(i,), name=f"strategy-query-{i}", daemon=True)
        for i in range(threads)
    ]
    # Hand the GIL over far more often than the default 5 ms, so that threads
    # interleave inside a cache's read-check-write rather than between calls.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        for w in workers:
            w.start()
        deadline = time.monotonic() + timeout
        for w in workers:
            w.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(switch_interval)
    hung = [
        f"{w.name} still in {where[i]} after {timeout:.0f} s"
        for i, w in enumerate(workers)
        if w.is_alive()
    ]
    return ThreadedRun(outcomes, errors, hung)


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


class ThreadsTestBase(StrategyContractTestBase):
    def setUp(self) -> None:
        super().setUp()
        self._hung = False
        clear_caches()

    def tearDown(self) -> None:
        # After a hang, stuck threads may hold a cache's lock that clearing would
        # wait on forever: leave the caches, the failure is already reported.
        if not self._hung:
            clear_caches()
        super().tearDown()

    def assert_run_finished(self, run: ThreadedRun) -> None:
        """No thread hung (each named with where it is stuck), none failed outside a query."""
        if run.hung:
            self._hung = True
            self.fail("threads hung (deadlock?):\n" + "\n".join(run.hung))
        self.assertEqual(run.errors, [], "\n".join(run.errors))

    def assert_threads_match_serial(
        self,
        queries: Sequence[Query],
        between_rounds: Callable[[int], None] | None = None,
    ) -> None:
        """Every thread's outcome of every query equals the serial, cold-cache one."""
        clear_caches()
        serial = {q.name: _outcome(q.run) for q in queries}
        for name, outcome in serial.items():
            if isinstance(outcome, tuple) and outcome[:1] == ("raised",):
                self.fail(f"{name}: the serial query raised {outcome[1]}: {outcome[2]}")
        clear_caches()
        run = run_in_threads(queries, between_rounds=between_rounds)
        self.assert_run_finished(run)
        mismatches = [
            f"thread {i} round {r} {name}: {got!r:.300} != serial {serial[name]!r:.300}"
            for i, outcomes in enumerate(run.outcomes)
            for (r, name), got in sorted(outcomes.items())
            if got != serial[name]
        ]
        self.assertEqual(mismatches, [], "\n".join(mismatches[:10]))
        expected = THREADS * ROUNDS * len(queries)
        done = sum(len(o) for o in run.outcomes)
        self.assertEqual(done, expected, "not every thread answered every query")


class TestConcurrentQueries(ThreadsTestBase):
    """The same queries from 8 threads at once give the serial answers."""

    def mesh_2d(self) -> DeviceMesh:
        return self.mesh((2, 2))

    def planner_queries(self) -> list[Query]:
        propagator = _propagator()
        mesh = self.mesh_2d()
        queries = []
        for case in _cases():
            schema = strategy_schema(mesh, case.op, case.args, case.kwargs, capped_candidates(4))
            queries.append(
                Query(f"planner {case.name}", lambda s=schema: propagator.get_op_strategy(s))
            )
        return queries

    def runtime_queries(self) -> list[Query]:
        """DTensor's runtime query: the runtime schema through the propagator's
        uncached sharding propagation (shape inference, routing, selection)."""
        propagator = _propagator()
        mesh = self.mesh_2d()
        queries = []
        for case in _cases():
            schema = runtime_schema(mesh, case.op, case.args, case.kwargs, case.placements)
            queries.append(
                Query(
                    f"runtime {case.name}",
                    lambda s=schema: propagator.propagate_op_sharding_non_cached(s),
                )
            )
        return queries

    def test_cases_cover_every_registry(self) -> None:
        """The shared queries reach single-dim rules, registered strategies and
        decompositions (once ops move registry, the cases could test less)."""
        reached = ops_by_registry(case.op for case in _cases())
        self.assertEqual(set(reached), set(REGISTRIES), f"the cases by registry: {reached}")

    def test_planner_queries(self) -> None:
        """``get_op_strategy`` from 8 threads, every op in flight at once."""
        self.assert_threads_match_serial(self.planner_queries())

    def test_runtime_queries(self) -> None:
        """DTensor's runtime sharding propagation from 8 threads."""
        self.assert_threads_match_serial(self.runtime_queries())

    def test_mixed_queries_with_cache_clearing(self) -> None:
        """Runtime and planner queries interleaved (the decomposition path's
        planner/runtime context must not leak between threads), while thread 0
        clears every cache before each of its rounds."""

        def clear_from_thread_0(thread: int) -> None:
            if thread == 0:
                clear_caches()

        queries = [q for pair in zip(self.runtime_queries(), self.planner_queries()) for q in pair]
        self.assert_threads_match_serial(queries, between_rounds=clear_from_thread_0)

    def test_eager_dtensor_ops(self) -> None:
        """Eager DTensor ops on the fake process group from 8 threads: same output
        placements and shapes as one thread (values are not compared: fake
        collectives leave them undefined)."""
        mesh = self.mesh_2d()
        gen = torch.Generator().manual_seed(0)
        x = distribute_tensor(torch.randn(8, 6, generator=gen), mesh, [S0, R])
        w = distribute_tensor(torch.randn(6, 4, generator=gen), mesh, [R, S1])
        v = distribute_tensor(torch.randn(6, generator=gen), mesh, [R, R])

        def program(x: DTensor, w: DTensor, v: DTensor) -> tuple[DTensor, ...]:
            h = torch.mm(x, w)
            s = torch.softmax(h, dim=-1)
            n = torch.nn.functional.layer_norm(x, (6,), v, v)
            return (
                h,
                s.sum(dim=1),
                x.t(),
                x.view(4, 12),
                torch.nn.functional.hardswish(n),
                torch.mv(x, v),
                x.to(torch.float64),
                torch.cat([x, x], dim=1),
                h.redistribute(mesh, [R, R]),
            )

        queries = [
            Query("eager program", lambda: program(x, w, v)),
            Query("eager add", lambda: x + x),
            Query("eager max", lambda: x.max(dim=1)),
        ]
        self.assert_threads_match_serial(queries)


class TestCachesStayBounded(ThreadsTestBase):
    """Every cache the change adds holds at most its bound under concurrent fills.

    Both caches are ``BoundedCache`` objects whose ``max_size`` is read on every
    insert, so the tests lower it to a few entries and offer many more distinct
    keys. The other state the change adds is bounded by construction: the
    per-query cost rows of ``expand_to_full_mesh_op_strategy`` live in a local of
    one call, ``answering``/``_in_planner_query`` are context variables (one value
    per thread and query), and ``_positional_defaults`` is keyed on the op.
    """

    BOUND = 4

    def fill(
        self,
        name: str,
        size: Callable[[], int],
        clear: Callable[[], None],
        calls: list[Callable[[], object]],
        rounds: int = FILL_ROUNDS,
    ) -> None:
        """Run ``calls`` in each of 8 threads; the cache never exceeds ``BOUND``."""
        self.assertGreater(len(calls), 2 * self.BOUND, f"{name}: too few keys to evict")
        peak = [0]
        lock = threading.Lock()

        def observe() -> None:
            n = size()
            with lock:
                peak[0] = max(peak[0], n)

        def restart_fill(thread: int) -> None:
            # Every thread empties the cache before each of its rounds, so that it
            # fills up again (where a racy bound check lets it overshoot) many times,
            # while other threads are mid-round.
            clear()

        queries = [
            Query(f"{name} {i}", lambda c=c: (c(), observe())[1]) for i, c in enumerate(calls)
        ]
        run = run_in_threads(queries, rounds=rounds, between_rounds=restart_fill)
        self.assert_run_finished(run)
        raised = [
            f"{key}: {o}"
            for outcomes in run.outcomes
            for key, o in outcomes.items()
            if isinstance(o, tuple) and o[:1] == ("raised",)
        ]
        self.assertEqual(raised, [], "\n".join(raised[:5]))
        self.assertLessEqual(peak[0], self.BOUND, f"{name} grew to {peak[0]} entries")
        self.assertLessEqual(size(), self.BOUND, f"{name} holds {size()} entries")
        # (Not ``== BOUND``: two threads missing on the same key both insert it, and
        # the second insert still evicts an entry, so the cache may end one short.)
        self.assertGreater(size(), 0, f"{name} is empty after the fill")

    def fill_meta_cache(
        self, calls: list[Callable[[], object]], rounds: int = FILL_ROUNDS
    ) -> None:
        """``fill`` the shape-inference cache with its bound lowered to ``BOUND``."""
        cache = _output_metas._meta_cache
        with mock.patch.object(cache, "max_size", self.BOUND):
            self.fill("_meta_cache", lambda: len(cache), cache.clear, calls, rounds=rounds)

    def test_meta_cache_bounded(self) -> None:
        """Shape inference for 64 distinct planner schemas (``output_metas_for``, the
        planner path's cached inference) from 8 threads with a bound of 4."""
        mesh = self.mesh((4,))
        schemas = [
            strategy_schema(mesh, aten.add.Tensor, (torch.empty(k, 6), torch.empty(k, 6)))
            for k in range(1, 65)
        ]
        self.fill_meta_cache([lambda s=s: _output_metas.output_metas_for(s) for s in schemas])

    def test_meta_cache_bounded_through_get_op_strategy(self) -> None:
        """The same bound holds when the cache is filled by whole planner queries."""
        mesh = self.mesh((2, 2))
        propagator = _propagator()
        schemas = [
            strategy_schema(
                mesh, aten.mm.default, (torch.empty(4 * k, 6), torch.empty(6, 4)),
                candidates=capped_candidates(3),
            )
            for k in range(1, 25)
        ]
        calls = [lambda s=s: propagator.get_op_strategy(s) for s in schemas]
        self.fill_meta_cache(calls, rounds=2)  # whole planner queries: slower

    def test_cost_cache_bounded(self) -> None:
        """Redistribute costs of 128 distinct (source, target) pairs from 8 threads
        with a bound of 4."""
        mesh = self.mesh((2, 2))
        placements = [(R, R), (S0, R), (R, S1), (S0, S1), (P, R), (R, P), (S1, S0), (P, P)]
        pairs = []
        for k in (4, 8):
            meta = meta_of(torch.empty(k, 6))
            specs = [DTensorSpec(mesh, p, tensor_meta=meta) for p in placements]
            pairs += [(a, b) for a in specs for b in specs]
        self.assertGreater(len(pairs), 8 * self.BOUND)
        calls = [
            lambda a=a, b=b: _redistribute_cost_cache.CostRows((a,)).row(b)
            for a, b in pairs
        ]
        with mock.patch.object(_redistribute_cost_cache._costs, "max_size", self.BOUND):
            self.fill(
                "cost cache",
                _redistribute_cost_cache.cost_cache_size,
                _redistribute_cost_cache.clear_cost_cache,
                calls,
                rounds=4 * FILL_ROUNDS,  # cheap, and the more fills the likelier a race
            )

    def test_default_bounds(self) -> None:
        """The shipped bounds are finite, positive integers, and the caches use them."""
        for name, bound, cache in (
            ("_META_CACHE_SIZE", _output_metas._META_CACHE_SIZE, _output_metas._meta_cache),
            ("COST_CACHE_SIZE", _redistribute_cost_cache.COST_CACHE_SIZE, _redistribute_cost_cache._costs),
            ("COST_CACHE_SIZE (sources)", _redistribute_cost_cache.COST_CACHE_SIZE, _redistribute_cost_cache._sources),
            ("SHARDABLE_CACHE_SIZE", _shardable_cache.SHARDABLE_CACHE_SIZE, _shardable_cache._answers),
        ):
            self.assertEqual(cache.max_size, bound, name)
            self.assertIsInstance(bound, int, name)
            self.assertGreater(bound, 0, name)


if __name__ == "__main__":
    run_tests()
