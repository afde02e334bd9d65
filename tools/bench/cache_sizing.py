"""Size the redistribute-cost cache from measurement: hit rate against cache size.

Run from the repository root with a built venv's python (the cache is the change's)::

    .venv/bin/python -m tools.bench.cache_sizing                    # walk + registry sweep
    .venv/bin/python -m tools.bench.cache_sizing --phases walk --blocks 1
    .venv/bin/python -m tools.bench.cache_sizing --ops mm,add,"nn.functional.*"

The built torch caches cost rows across strategy queries in
``_ops/_redistribute_cost_cache.py``: ``_sources`` interns each tuple of source
specs as a number, and ``_costs`` keeps one row per (number, target mesh,
placements, shard order); both are ``BoundedCache``s of ``COST_CACHE_SIZE``
entries that drop their oldest entry first. Which size is enough depends on the
key sequence a workload produces, so this tool records it and replays it:

1. both caches are replaced, from outside (torch is not edited), by a recorder
   that answers every lookup from an unbounded dict (so each row is computed
   once, whatever the size) and logs each lookup: an interning of a source
   tuple, and a row lookup naming the interning it came from and its target;
2. the workload runs: the planner walk of ``make bench`` (every node of the
   traced Llama step, candidates capped, 2x4 mesh) and a registry sweep like
   the audit's (``contract_capture``'s OpInfo capture, then runtime, planner and
   utility queries and DTensor's runtime selections on meshes 4 and 2x2, the
   audit's capture and candidate settings); ``--ops`` restricts the sweep to
   some OpInfos;
3. the log is replayed through both FIFO caches at each size (both bounded
   alike, as in torch): an interning that misses hands out a new number, so
   rows cached under an evicted source's number are missed afterwards, as in
   the real cache.

Prints, per phase and size, the row hit rate, the interning hit rate and the
rows computed (misses); ``--out`` writes the same as JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from array import array
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

PHASES = ("walk", "sweep")
SOURCE, ROW = 0, 1


@dataclass
class KeyLog:
    """The lookups one workload made, in order, as small integers.

    Event ``i`` is ``kinds[i]``: a SOURCE interning of source tuple ``a[i]``
    (ids in first-seen order), or a ROW lookup whose source numbering came from
    the interning at event ``a[i]`` and whose target is ``b[i]`` (ids in
    first-seen order).
    """

    kinds: bytearray = field(default_factory=bytearray)
    a: array = field(default_factory=lambda: array("q"))
    b: array = field(default_factory=lambda: array("q"))

    def add_source(self, source_id: int) -> int:
        """Log an interning; its event index is the number the caller hands out."""
        self.kinds.append(SOURCE)
        self.a.append(source_id)
        self.b.append(-1)
        return len(self.kinds) - 1

    def add_row(self, source_event: int, target_id: int) -> None:
        if self.kinds[source_event] != SOURCE:
            raise ValueError(f"event {source_event} is not a source interning")
        self.kinds.append(ROW)
        self.a.append(source_event)
        self.b.append(target_id)

    def __len__(self) -> int:
        return len(self.kinds)

    def counts(self) -> dict[str, int]:
        """Lookups of each kind, and the distinct rows and source tuples among them
        (the rows an unbounded cache would hold)."""
        rows = sum(self.kinds)
        distinct_rows = {(self.a[self.a[i]], self.b[i]) for i in range(len(self)) if self.kinds[i] == ROW}
        distinct_sources = {self.a[i] for i in range(len(self)) if self.kinds[i] == SOURCE}
        return {"events": len(self), "row_lookups": rows, "source_internings": len(self) - rows,
                "distinct_rows": len(distinct_rows), "distinct_sources": len(distinct_sources)}


class _Fifo:
    """A FIFO set of at most ``size`` keys: hits do not refresh, the oldest goes first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.order: deque[object] = deque()
        self.values: dict[object, int] = {}

    def get(self, key: object) -> int | None:
        return self.values.get(key)

    def put(self, key: object, value: int) -> None:
        while len(self.values) >= self.size:
            del self.values[self.order.popleft()]
        self.order.append(key)
        self.values[key] = value


@dataclass(frozen=True)
class Replay:
    """What a key log gives at one cache size."""

    size: int
    row_hits: int
    row_lookups: int
    source_hits: int
    source_lookups: int

    @property
    def row_hit_rate(self) -> float:
        return self.row_hits / self.row_lookups if self.row_lookups else math.nan

    @property
    def source_hit_rate(self) -> float:
        return self.source_hits / self.source_lookups if self.source_lookups else math.nan

    @property
    def rows_computed(self) -> int:
        return self.row_lookups - self.row_hits

    def as_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "row_hit_rate": self.row_hit_rate,
            "row_hits": self.row_hits,
            "row_lookups": self.row_lookups,
            "rows_computed": self.rows_computed,
            "source_hit_rate": self.source_hit_rate,
            "source_hits": self.source_hits,
            "source_lookups": self.source_lookups,
        }


def replay(log: KeyLog, size: int) -> Replay:
    """Run ``log`` through a source cache and a row cache of ``size`` entries each."""
    if size < 1:
        raise ValueError(f"cache size must be positive, got {size}")
    sources, rows = _Fifo(size), _Fifo(size)
    numbers = itertools.count()
    # number handed out at each source event (only those entries are read)
    number_at = array("q", bytes(8 * len(log)))
    row_hits = row_lookups = source_hits = source_lookups = 0
    kinds, a, b = log.kinds, log.a, log.b
    for i in range(len(log)):
        if kinds[i] == SOURCE:
            source_lookups += 1
            number = sources.get(a[i])
            if number is None:
                number = next(numbers)
                sources.put(a[i], number)
            else:
                source_hits += 1
            number_at[i] = number
        else:
            row_lookups += 1
            key = (number_at[a[i]], b[i])
            if rows.get(key) is None:
                rows.put(key, 1)
            else:
                row_hits += 1
    return Replay(size, row_hits, row_lookups, source_hits, source_lookups)


class _RecordingSources:
    """Stands in for ``_sources``: interns every tuple, logs each lookup, never evicts.

    The number it hands out is the lookup's event index, unique per lookup, so
    the row lookups that follow name the interning they came from.
    """

    def __init__(self, log: KeyLog) -> None:
        self.log = log
        self.ids: dict[object, int] = {}

    def get_or_compute(self, key: object, compute: Callable[..., int], *args: Any,
                       keep: Callable[[int], bool] | None = None) -> int:
        source_id = self.ids.setdefault(key, len(self.ids))
        return self.log.add_source(source_id)

    def clear(self) -> None:
        """Forgetting the interned tuples would only renumber them; the log keeps going."""

    def __len__(self) -> int:
        return len(self.ids)


class _RecordingCosts:
    """Stands in for ``_costs``: one row per (source tuple, target), computed once; logs each lookup."""

    def __init__(self, log: KeyLog, sources: _RecordingSources) -> None:
        self.log = log
        self.sources = sources
        self.targets: dict[object, int] = {}
        self.rows: dict[tuple[int, int], Any] = {}

    def get_or_compute(self, key: object, compute: Callable[..., Any], *args: Any,
                       keep: Callable[[Any], bool] | None = None) -> Any:
        if not isinstance(key, tuple) or not key or not isinstance(key[0], int):
            raise TypeError(
                f"cost cache key {key!r}: expected (source number, target...); "
                "the cache's key layout changed, update tools/bench/cache_sizing.py"
            )
        event = key[0]
        target = self.targets.setdefault(key[1:], len(self.targets))
        self.log.add_row(event, target)
        canonical = (self.log.a[event], target)
        if canonical not in self.rows:
            self.rows[canonical] = compute(*args)
        return self.rows[canonical]

    def clear(self) -> None:
        """Kept: every row stays computed once, whatever the workload clears."""

    def __len__(self) -> int:
        return len(self.rows)


@contextmanager
def recording(log: KeyLog) -> Iterator[None]:
    """Replace the built torch's two cost caches by recorders for the duration."""
    try:
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache
    except ImportError:
        raise SystemExit(
            "this torch has no redistribute-cost cache (_ops/_redistribute_cost_cache.py): "
            "run the tool with a built venv's python, e.g. .venv/bin/python"
        ) from None
    for name in ("_costs", "_sources"):
        if not hasattr(getattr(cache, name, None), "get_or_compute"):
            raise SystemExit(f"_redistribute_cost_cache.{name} is not a BoundedCache any more; "
                             "update tools/bench/cache_sizing.py")
    saved = cache._costs, cache._sources
    sources = _RecordingSources(log)
    cache._sources = sources  # type: ignore[assignment]
    cache._costs = _RecordingCosts(log, sources)  # type: ignore[assignment]
    try:
        yield
    finally:
        cache._costs, cache._sources = saved
        cache.clear_cost_cache()


# --------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------


def run_walk(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark's planner walk (built side), once."""
    from tools.bench import common, model, planner

    common.init_fake_process_group(8)
    mesh = common.cpu_mesh((2, 4))
    gm = model.trace_llama(model.LlamaDims(blocks=args.blocks))
    common.clear_dtensor_caches()
    stats = planner.walk_once(mesh, gm.graph, "built", common.load_contract_candidates(), args.cap)
    planner.check_walk(stats, gm.graph)
    return {"blocks": args.blocks, "cap": args.cap, "mesh": [2, 4], "nodes": stats.nodes,
            "specs": stats.specs}


def run_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The audit's registry sweep: capture, then every mode's queries and the selections."""
    from tools.audit import worker as audit

    cv = audit.load_validation()
    sweep = cv.sweep
    audit_args = argparse.Namespace(dtypes="float32,bfloat16,int64,bool,complex64", max_samples=3,
                                    foreach_tensors=8)
    contract_mode = audit.load_mode()
    contract_mode.use_cli_sample_sizes()
    picked, aten = contract_mode.select_opinfos([p.strip() for p in (args.ops or "").split(",") if p.strip()])
    recorder, capture_counts = contract_mode.capture(picked, aten, audit_args)
    selected = contract_mode.select_calls(recorder, 4)
    meshes = cv.make_meshes("4,2x2")
    # the audit's queries without a checker: only the keys the caches see matter
    validation = cv.ContractValidation(selected, lambda *a: (), lambda schema: None, meshes,
                                       candidates=contract_mode.first_candidates(16))
    queries = errors = timeouts = 0
    for calls in selected.values():
        for call in calls:
            for mesh in meshes.values():
                for mode in sweep.MODES:
                    try:
                        built = validation.queries(call, mesh, mode)
                    except Exception:
                        errors += 1
                        continue
                    for query in built:
                        queries += 1
                        try:
                            with cv.time_limit(args.query_timeout):
                                answer = validation.ask(query, None)
                                if query.runtime is not None:
                                    sweep.runtime_selection(query.runtime)
                        except cv.QueryTimeout:
                            timeouts += 1
                            continue
                        except Exception:
                            errors += 1
                            continue
                        if isinstance(answer.error, cv.QueryTimeout):
                            timeouts += 1
                        elif answer.error is not None:
                            errors += 1
    return {"ops": args.ops, "aten_ops": len(selected),
            "calls": sum(len(c) for c in selected.values()), "queries": queries,
            "errors_and_refusals": errors, "timeouts": timeouts, "meshes": ["4", "2x2"],
            "capture": capture_counts}


def parse_sizes(text: str) -> list[int]:
    """``"8-17"`` -> 2**8 .. 2**17; ``"256,4096"`` -> those sizes."""
    text = text.strip()
    if "-" in text and "," not in text:
        lo_text, _, hi_text = text.partition("-")
        try:
            lo, hi = int(lo_text), int(hi_text)
        except ValueError:
            raise ValueError(f"sizes {text!r}: expected <log2 lo>-<log2 hi> or a list") from None
        if not 0 <= lo <= hi <= 30:
            raise ValueError(f"sizes {text!r}: need 0 <= lo <= hi <= 30")
        return [1 << k for k in range(lo, hi + 1)]
    try:
        sizes = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"sizes {text!r}: expected <log2 lo>-<log2 hi> or a list") from None
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes {text!r}: every size must be positive")
    return sizes


def format_table(phase: str, replays: list[Replay]) -> str:
    lines = [f"{phase}: cache size  row hit rate  rows computed  interning hit rate"]
    for r in replays:
        lines.append(f"{phase}: {r.size:>10}  {100 * r.row_hit_rate:>11.2f}%  "
                     f"{r.rows_computed:>13}  {100 * r.source_hit_rate:>17.2f}%")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench.cache_sizing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default=",".join(PHASES), help="walk, sweep or both (default both)")
    ap.add_argument("--sizes", default="8-17", help="log2 range (8-17: 256 .. 131072) or a list")
    ap.add_argument("--blocks", type=int, default=4, help="walk: Llama blocks (the benchmark's 4)")
    ap.add_argument("--cap", type=int, default=8, help="walk: candidates per tensor (the benchmark's 8)")
    ap.add_argument("--ops", default=None, help="sweep: OpInfo/aten names as the audit's --ops (default all)")
    ap.add_argument("--query-timeout", type=float, default=60.0, help="sweep: CPU seconds per query")
    ap.add_argument("--out", default=None, help="JSON file to write")
    args = ap.parse_args(argv)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        raise SystemExit(f"--phases: choose from {', '.join(PHASES)}, got {args.phases!r}")
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        raise SystemExit(str(e)) from None

    import warnings

    import torch

    from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    from tools.bench import common

    common.init_fake_process_group(8)
    doc: dict[str, Any] = {"torch": torch.__version__, "cache_size_now": cache.COST_CACHE_SIZE,
                           "sizes": sizes, "phases": {}}
    for phase in phases:
        log = KeyLog()
        t0 = time.monotonic()
        with recording(log):
            workload = run_walk(args) if phase == "walk" else run_sweep(args)
        run_s = time.monotonic() - t0
        replays = [replay(log, s) for s in sizes]
        doc["phases"][phase] = {"workload": workload, "run_s": round(run_s, 1), **log.counts(),
                                "replays": [r.as_dict() for r in replays]}
        print(f"{phase}: {workload}; {log.counts()}; {run_s:.0f} s", flush=True)
        print(format_table(phase, replays), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
