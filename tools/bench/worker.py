"""One side of one benchmark repeat: runs inside one venv, writes pyperf JSON + info JSON.

Run from the repository root (the orchestrator, ``python -m tools.bench``, does)::

    .venv/bin/python -m tools.bench.worker --bench planner_enumeration \\
        --out /tmp/built.json --info /tmp/built.info.json [--quick] [--memory] \\
        [--profile /tmp/built.prof]

The timing is pyperf's: a ``pyperf.Runner`` in ``--worker`` mode with fixed
warmups, values and loops, so this process is the one pyperf worker and the
orchestrator decides how processes alternate. ``--out`` receives the pyperf
benchmark JSON; ``--info`` what the benchmark computed (counts, checks, caches
cleared, peak memory), which pyperf's metadata cannot hold.

The planner benchmarks' built worker also times the floor (see
``planner.FloorWalk``): after pyperf's values, one recording walk keeps the
built answers, and the floor walk over them is timed with as many values (of
as many loops) as the benchmark; its median goes into the info as ``floor_s``.
``--profile`` runs one more measured call under cProfile and writes its stats
(``python -m pstats``), to see where a side spends its time.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@dataclass(frozen=True)
class Plan:
    """pyperf's fixed loop structure for one benchmark (no calibration)."""

    warmups: int
    values: int
    loops: int


@dataclass(frozen=True)
class BenchSpec:
    """A benchmark: its target ratio (built/stock), full and quick plans, and why."""

    target: float
    full: Plan
    quick: Plan
    what: str


BENCHES: dict[str, BenchSpec] = {
    "eager_dispatch_warm": BenchSpec(
        1.02,
        Plan(warmups=3, values=10, loops=200),
        Plan(warmups=1, values=2, loops=2),
        "DTensor eager op list (pointwise, mm/matmul, sum, view/transpose, softmax, cat, "
        "layer_norm fwd+bwd) on a 2x4 mesh, sharding cache warm; seconds per op list",
    ),
    "eager_dispatch_cold": BenchSpec(
        1.00,
        Plan(warmups=1, values=8, loops=3),
        Plan(warmups=0, values=2, loops=1),
        "the same op list with DTensor's caches (sharding propagation and shape inference) "
        "cleared before each call",
    ),
    "planner_enumeration": BenchSpec(
        0.50,
        Plan(warmups=1, values=2, loops=1),
        Plan(warmups=0, values=1, loops=1),
        "every node of a traced 4-block Llama step (fwd+bwd) queried with planner "
        "candidates on a 2x4 mesh; built: the registries' answers as returned; stock: "
        "its registries + the planner's repair pass (planner-side expansion, shape "
        "inference, metas and costs filled); seconds per walk",
    ),
    "planner_enumeration_bare": BenchSpec(
        1.00,
        Plan(warmups=1, values=2, loops=1),
        Plan(warmups=0, values=1, loops=1),
        "the same walk; built's complete answers vs stock bare: stock's registries with no "
        "repair (single-dim rules expanded planner-side without metas, no shape inference, "
        "specs read as they come, gaps counted, all-Replicate where stock cannot answer); "
        "seconds per walk",
    ),
}
PLANNER_BENCHES = ("planner_enumeration", "planner_enumeration_bare")

# Planner walk sizes: (blocks, candidates per tensor).
PLANNER_FULL = (4, 8)
PLANNER_QUICK = (1, 4)

# The clocks a measured call is timed with. Both are read for every value; the
# benchmark's ``clock`` is the one pyperf records and the targets are checked on.
# "cpu" (this process's CPU time) is the default: on a shared machine, time the
# process spends waiting for a core counts in wall time but is not DTensor's work.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
DEFAULT_CLOCK = "cpu"


class Stopwatch:
    """Wall and CPU seconds of the calls timed inside ``with`` blocks, summed."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(CLOCKS, 0.0)
        self._start: dict[str, float] = {}

    def __enter__(self) -> Self:
        self._start = {name: clock() for name, clock in CLOCKS.items()}
        return self

    def __exit__(self, *exc: object) -> None:
        for name, clock in CLOCKS.items():
            self.seconds[name] += clock() - self._start[name]


def _max_rss_mib() -> float:
    """Peak resident set size of this process so far (getrusage; KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _tracemalloc_peak(action: Callable[[], object]) -> float:
    """Peak Python-heap growth (MiB, tracemalloc) while ``action`` runs."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        action()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return (peak - base) / (1024.0 * 1024.0)


class Benchmark:
    """Set-up, the measured function (pyperf ``time_func``), and the checks."""

    name: str

    def __init__(self) -> None:
        self.clock = DEFAULT_CLOCK
        # Both clocks' seconds of every time_func call, warm-ups included.
        self.clock_values: list[dict[str, float]] = []

    def time_func(self, loops: int) -> float:
        """Seconds of ``loops`` measured calls on the benchmark's clock (pyperf's callback)."""
        raise NotImplementedError

    def timed(self, watch: Stopwatch) -> float:
        """Keep both clocks' seconds of one pyperf value; return the benchmark's clock."""
        self.clock_values.append(dict(watch.seconds))
        return watch.seconds[self.clock]

    def check(self) -> None:
        """Raise unless the last measured call computed what it should: a fast wrong run is no result."""
        raise NotImplementedError

    def info(self) -> dict[str, Any]:
        """What the run computed, for the info JSON."""
        return {}

    def memory(self) -> dict[str, Any]:
        """Peak memory of one extra call (``--memory``); nothing where not measured."""
        return {}

    def floor(self, plan: Plan) -> dict[str, Any]:
        """The floor's timing (planner benchmarks, built torch); nothing elsewhere."""
        return {}


class EagerBench(Benchmark):
    """The eager op list; ``cold`` clears DTensor's caches before every call."""

    def __init__(self, cold: bool) -> None:
        from tools.bench import common, eager

        super().__init__()
        self.common = common
        self.eager = eager
        self.cold = cold
        self.inputs = eager.make_inputs(common.cpu_mesh())
        self.cleared = common.clear_dtensor_caches()
        self.results = eager.run_ops(self.inputs)  # the warm-up call; also checked
        self.check()

    def time_func(self, loops: int) -> float:
        watch = Stopwatch()
        run_ops, clear = self.eager.run_ops, self.common.clear_dtensor_caches
        for _ in range(loops):
            if self.cold:
                clear()
            with watch:
                self.results = run_ops(self.inputs)
        return self.timed(watch)

    def check(self) -> None:
        self.eager.check_results(self.results)

    def info(self) -> dict[str, Any]:
        return {"ops": list(self.eager.OPS), "caches_cleared": self.cleared if self.cold else []}


class PlannerBench(Benchmark):
    """The planner walk over a traced Llama step; caches cleared before each walk.

    The built torch walks as the change answers; the stock torch walks with
    the repair pass (``bare=False``) or without any (``bare=True``).
    """

    def __init__(self, quick: bool, bare: bool = False) -> None:
        from tools.bench import common, model, planner

        super().__init__()
        self.common = common
        self.planner = planner
        self.blocks, self.cap = PLANNER_QUICK if quick else PLANNER_FULL
        self.mesh = common.cpu_mesh()
        if common.has_contract_change():
            self.side = "built"
        else:
            self.side = "bare" if bare else "stock"
        t0 = time.perf_counter()
        self.gm = model.trace_llama(model.LlamaDims(blocks=self.blocks))
        self.trace_s = time.perf_counter() - t0
        self.cleared: list[str] = []
        self.stats = None

    def walk(self) -> Any:
        """One complete walk of this side (the caller clears the caches)."""
        return self.planner.walk_once(self.mesh, self.gm.graph, self.side, self.cap)

    def time_func(self, loops: int) -> float:
        watch = Stopwatch()
        for _ in range(loops):
            self.cleared = self.common.clear_dtensor_caches()
            with watch:
                stats = self.walk()
            self.stats = stats
        return self.timed(watch)

    def check(self) -> None:
        if self.stats is None:
            raise RuntimeError("planner_enumeration: no walk was measured")
        self.planner.check_walk(self.stats, self.gm.graph)

    def info(self) -> dict[str, Any]:
        nodes = self.gm.graph.nodes
        self.common.clear_dtensor_caches()
        costs = self.planner.count_costs(self.mesh, self.gm.graph, self.side, self.cap)
        return {
            "walk": self.side,
            "cost_computations": costs,
            "blocks": self.blocks,
            "candidate_cap": self.cap,
            "mesh": list(self.mesh.shape),
            "graph_nodes": len(nodes),
            "trace_s": round(self.trace_s, 3),
            "caches_cleared": self.cleared,
            **(self.stats.as_dict() if self.stats is not None else {}),
        }

    def memory(self) -> dict[str, Any]:
        walked: list[Any] = []

        def cold_walk() -> None:
            self.common.clear_dtensor_caches()
            walked.append(self.walk())

        peak = _tracemalloc_peak(cold_walk)
        specs = walked[0].specs
        return {
            **self.cost_cache(),
            "peak_tracemalloc_mib": round(peak, 2),
            # per OpSpec the walk received: a side returning more specs may peak higher
            "peak_per_spec_kib": round(peak * 1024.0 / specs, 3) if specs else None,
            "peak_memory_kind": "tracemalloc peak of Python allocations during one cold walk "
            "(above the heap at its start; the graph and torch are already loaded); "
            "per spec: that peak over the OpSpecs the walk received",
        }

    def cost_cache(self) -> dict[str, Any]:
        """The cost-row cache after one cold walk: its entries, bound and the memory it alone holds
        (what clearing it frees, the walk's answers kept); nothing on a torch without it."""
        from torch.distributed.tensor._ops import utils

        rows = getattr(utils, "_cost_row", None)
        if rows is None:
            return {}
        self.common.clear_dtensor_caches()
        tracemalloc.start()
        try:
            answers = self.walk()  # kept alive, so clearing frees only what the cache holds
            gc.collect()
            held, _ = tracemalloc.get_traced_memory()
            info = rows.cache_info()
            rows.cache_clear()
            gc.collect()
            freed = held - tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        del answers
        return {"cost_cache": {"entries": info.currsize, "maxsize": info.maxsize,
                               "mib": round(freed / (1024.0 * 1024.0), 3)}}

    def floor(self, plan: Plan) -> dict[str, Any]:
        """Record the built answers once, then time the floor walk over them.

        As many values of as many loops as the benchmark's plan, after a
        verifying run and the plan's warm-ups; the floor uses none of DTensor's
        caches, so none are cleared.
        """
        if self.side != "built":
            return {}
        planner, mesh, graph = self.planner, self.mesh, self.gm.graph
        self.common.clear_dtensor_caches()
        stats, recorded = planner.record_walk(mesh, graph, self.cap)
        planner.floor_once(mesh, graph, self.cap, recorded, verify=True)
        for _ in range(plan.warmups):
            planner.floor_once(mesh, graph, self.cap, recorded)
        values = []
        floor_stats = None
        for _ in range(plan.values):
            watch = Stopwatch()
            with watch:
                for _ in range(plan.loops):
                    floor_stats = planner.floor_once(mesh, graph, self.cap, recorded)
            values.append(watch.seconds[self.clock] / plan.loops)
        if floor_stats is None or floor_stats.specs != stats.specs:
            raise RuntimeError(
                f"floor walk built {None if floor_stats is None else floor_stats.specs} specs, "
                f"the built walk received {stats.specs}"
            )
        planner.check_walk(floor_stats, graph)
        return {
            "floor_s": statistics.median(values),
            "floor_values": values,
            "floor_specs": floor_stats.specs,
            "floor_kind": "one fake shape inference per node + the built answers' OpSpecs "
            "rebuilt from recorded placements, metas and cost rows, consumed as built's "
            "(planner.FloorWalk)",
        }


def make_bench(name: str, quick: bool) -> Benchmark:
    """The benchmark ``name``, set up (inputs made, graph traced); ValueError if unknown."""
    if name in PLANNER_BENCHES:
        return PlannerBench(quick, bare=name == "planner_enumeration_bare")
    if name == "eager_dispatch_warm":
        return EagerBench(cold=False)
    if name == "eager_dispatch_cold":
        return EagerBench(cold=True)
    raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHES)}")


def profile_once(bench: Benchmark, path: Path) -> None:
    """cProfile stats of one measured call (cache clearing included, as the timed loop does)."""
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        bench.time_func(1)
    finally:
        profiler.disable()
    profiler.dump_stats(str(path))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Set up, let pyperf time, check, then the extras (floor, memory, profile); the info."""
    import pyperf
    import torch

    from tools.bench import common

    spec = BENCHES[args.bench]
    plan = spec.quick if args.quick else spec.full
    out = Path(args.out)
    if out.exists():
        out.unlink()  # pyperf refuses to overwrite a result file
    t0 = time.perf_counter()
    bench = make_bench(args.bench, args.quick)
    bench.clock = args.clock
    setup_s = time.perf_counter() - t0

    runner = pyperf.Runner(processes=1, values=plan.values, warmups=plan.warmups, loops=plan.loops)
    runner.parse_args(
        [
            "--worker",
            "--quiet",
            "--values", str(plan.values),
            "--warmups", str(plan.warmups),
            "--loops", str(plan.loops),
            "--output", str(out),
        ]
    )
    runner.metadata["bench_role"] = args.role
    result = runner.bench_time_func(args.bench, bench.time_func)
    if result is None or not out.exists():
        raise RuntimeError(f"{args.bench}: pyperf wrote no result to {out}")
    bench.check()  # what the last measured call computed
    # pyperf's values are the last ``values`` calls (after its warm-ups), per loop.
    measured = bench.clock_values[-plan.values:]
    values_by_clock = {c: [v[c] / plan.loops for v in measured] for c in CLOCKS}
    floor = bench.floor(plan)
    info: dict[str, Any] = {
        "bench": args.bench,
        "role": args.role,
        "torch": torch.__version__,
        "has_change": common.has_contract_change(),
        "quick": args.quick,
        "plan": vars(plan),
        "setup_s": round(setup_s, 3),
        "checks": "passed",
        "clock": args.clock,
        "values_by_clock": values_by_clock,
        **bench.info(),
        **floor,
    }
    if args.memory:
        info.update(bench.memory())
    if args.profile:
        profile_once(bench, Path(args.profile))
        bench.check()
    info["max_rss_mib"] = round(_max_rss_mib(), 1)
    return info


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run, write the info JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", required=True, choices=sorted(BENCHES))
    ap.add_argument("--role", default="torch", help="label recorded in the results (stock/built)")
    ap.add_argument("--out", required=True, help="pyperf benchmark JSON to write")
    ap.add_argument("--info", required=True, help="JSON of counts, checks and memory to write")
    ap.add_argument("--quick", action="store_true", help="tiny plan and model: a smoke run")
    ap.add_argument("--memory", action="store_true", help="also measure peak memory (one extra run)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default=DEFAULT_CLOCK,
                    help="the clock pyperf records (both are kept in the info; default cpu)")
    ap.add_argument("--profile", help="also write cProfile stats of one measured call here")
    args = ap.parse_args(argv)
    info = run(args)
    Path(args.info).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
