"""Benchmark DTensor on stock torch 2.14.1 and on the same release with the change, side by side.

Run from the repository root (``make bench`` does, after ``make build``)::

    python -m tools.bench --stock-python .venv-stock/bin/python \\
        --built-python .venv/bin/python --out .build/bench/bench.json --work-dir .build/bench
    python -m tools.bench --bench planner_enumeration --repeats 3
    python -m tools.bench --quick --repeats 1               # smoke run
    python -m tools.bench --strict                          # exit 1 if a target is missed

The benchmarks and their targets (built/stock, checked with ``--strict``):

* ``eager_dispatch_warm`` (<= 1.02) and ``eager_dispatch_cold`` (<= 1.00): a
  DTensor op list, caches warm, or cleared before every call (propagation and
  shape inference caches, on both sides);
* ``planner_enumeration`` (<= 0.50): a planner's walk over a traced Llama step,
  the built registries' complete answers against stock plus the repair pass a
  planner needs to use stock's answers;
* ``planner_enumeration_bare`` (<= 1.00): the same built walk against stock's
  plain answers, where stock can answer.

For every benchmark and repeat the worker (``tools/bench/worker.py``) runs once
under the stock python and once under the built python, as separate processes,
alternating stock, built, stock, built, ... so that drift on a shared machine
hits both sides alike. Each worker times with pyperf (worker mode, fixed
warmups/values/loops) and writes pyperf JSON, read back here with
``pyperf.Benchmark``. The values are on ``--clock``: ``cpu``, each worker's
CPU time (the default: on a shared machine, time spent waiting for a core is in
wall time but is no side's work), or ``wall``; every worker reads both clocks,
and the other clock's ratio is reported beside the checked one. Per side, the
median is taken over every value of every repeat; the spread is that of the
per-repeat medians (relative stdev and min-max); the ratio is the median of
the per-repeat built/stock ratios and is checked against the target. The
planner benchmarks' built workers also time the floor (``planner.FloorWalk``):
built/floor is, per repeat, the built median over that worker's floor median,
and its median over the repeats is reported next to built/stock (no target).

Writes ``--out`` (one entry per benchmark, medians, ratios and walk counts; no
paths, no timestamps; ``make bench RECORD=1`` writes it to the tracked
``reports/bench.json``, otherwise it goes to ``.build/bench/``) and the merged pyperf suites
``<work-dir>/stock.pyperf.json`` and ``built.pyperf.json`` (for
``python -m pyperf compare_to``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyperf

from tools.bench._process import resolve_python, run_worker_process
from tools.bench.worker import BENCHES, CLOCKS, DEFAULT_CLOCK, PLANNER_BENCHES


REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES = ("stock", "built")


@dataclass
class SideResult:
    """One side of one benchmark: a pyperf Benchmark per repeat, and worker infos."""

    benches: list[pyperf.Benchmark] = field(default_factory=list)
    infos: list[dict[str, Any]] = field(default_factory=list)

    @property
    def repeat_medians(self) -> list[float]:
        """Each repeat's median (the unit the ratios pair)."""
        return [b.median() for b in self.benches]

    @property
    def values(self) -> list[float]:
        """Every value of every repeat."""
        return [v for b in self.benches for v in b.get_values()]

    def median(self) -> float:
        """The side's headline time: the median over all its values."""
        return statistics.median(self.values)

    def clock_repeat_medians(self, clock: str) -> list[float]:
        """Per repeat, the median of that clock's values (the workers keep both)."""
        return [statistics.median(i["values_by_clock"][clock]) for i in self.infos]

    def spread(self) -> dict[str, float]:
        """How much the repeats disagree: relative stdev and range of their medians."""
        meds = self.repeat_medians
        mean = statistics.fmean(meds)
        rel = statistics.stdev(meds) / mean if len(meds) > 1 and mean > 0 else 0.0
        return {"rel_stdev": rel, "min_s": min(meds), "max_s": max(meds)}

    def merged(self) -> pyperf.Benchmark:
        """Every repeat's runs in one pyperf Benchmark (for the side's suite file)."""
        return pyperf.Benchmark([run for b in self.benches for run in b.get_runs()])


def run_worker(
    python: str, role: str, bench: str, repeat: int, args: argparse.Namespace, work: Path
) -> tuple[pyperf.Benchmark, dict[str, Any]]:
    """One worker process; its pyperf Benchmark and info, or SystemExit naming what failed."""
    stem = f"{bench}-r{repeat}-{role}"
    out, info = work / f"{stem}.run.json", work / f"{stem}.info.json"
    for f in (out, info):
        f.unlink(missing_ok=True)
    cmd = [python, "-m", "tools.bench.worker", "--bench", bench, "--role", role,
           "--out", str(out), "--info", str(info), "--clock", args.clock]
    if args.quick:
        cmd.append("--quick")
    if repeat == 0:
        cmd.append("--memory")  # one extra measured run, first repeat only
    run_worker_process(cmd, f"bench {bench} repeat {repeat + 1} {role}", args.timeout, [out, info])
    return pyperf.Benchmark.load(str(out)), json.loads(info.read_text())


def fmt_s(seconds: float) -> str:
    """Seconds in the unit that keeps 3-4 significant digits readable."""
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"


def fmt_spread(s: dict[str, float]) -> str:
    """A spread as the table prints it."""
    return f"±{100 * s['rel_stdev']:.1f}% ({fmt_s(s['min_s'])}–{fmt_s(s['max_s'])})"


def summarize(
    name: str, sides: dict[str, SideResult], repeats: int, command: str, clock: str
) -> dict[str, Any]:
    """The reports/bench.json entry of one benchmark; its times are ``clock``'s."""
    stock, built = sides["stock"], sides["built"]
    stock_s, built_s = stock.median(), built.median()
    # The headline ratio pairs each repeat's stock and built workers (run back to
    # back), so drift in the machine's load between repeats cancels out.
    paired = [b / s for s, b in zip(stock.repeat_medians, built.repeat_medians)]
    ratio = statistics.median(paired)
    target = BENCHES[name].target
    entry: dict[str, Any] = {
        "name": name,
        "stock_s": stock_s,
        "built_s": built_s,
        "ratio": ratio,
        "spread": {
            "stock": stock.spread(),
            "built": built.spread(),
            "ratio_per_repeat": {"min": min(paired), "max": max(paired)},
            "what": "relative stdev and min–max of the per-repeat medians; "
            "ratio_per_repeat pairs each repeat's stock and built workers; "
            "ratio is the median of those paired ratios",
        },
        "target": target,
        "pass": ratio <= target,
        "clock": clock,
        # The same workers' ratio on every clock (the checked one included), paired
        # per repeat as above: what the other clock says about the same runs.
        "ratio_by_clock": {
            c: statistics.median(
                b / s
                for s, b in zip(stock.clock_repeat_medians(c), built.clock_repeat_medians(c))
            )
            for c in CLOCKS
        },
        "repeats": repeats,
        "values_per_repeat": len(stock.benches[0].get_values()),
        "loops_per_value": stock.infos[0]["plan"]["loops"],
        "what": BENCHES[name].what,
        "torch": {r: sides[r].infos[0]["torch"] + (" + change" if sides[r].infos[0]["has_change"] else "")
                  for r in ROLES},
        "command": command,
    }
    if name in PLANNER_BENCHES:
        keys = ("walk", "blocks", "candidate_cap", "mesh", "nodes", "queries", "specs",
                "candidates", "registries", "fallback_nodes", "fallbacks", "fallback_reasons",
                "repairs", "expanded", "missing", "cost_computations")
        entry["walk"] = {r: {k: sides[r].infos[0].get(k) for k in keys} for r in ROLES}
        for r in ROLES:
            entry[f"{r}_peak_mib"] = sides[r].infos[0].get("peak_tracemalloc_mib")
            entry[f"{r}_peak_per_spec_kib"] = sides[r].infos[0].get("peak_per_spec_kib")
            entry[f"{r}_cost_cache"] = sides[r].infos[0].get("cost_cache")
        entry["peak_memory_kind"] = stock.infos[0].get("peak_memory_kind")
        entry.update(floor_summary(built))
    entry["max_rss_mib"] = {r: max(i["max_rss_mib"] for i in sides[r].infos) for r in ROLES}
    return entry


def floor_summary(built: SideResult) -> dict[str, Any]:
    """built/floor per repeat (each built worker against its own floor) and their median.

    Empty when the built workers timed no floor (a stock torch on both sides).
    """
    raw = [i.get("floor_s") for i in built.infos]
    floors = [float(f) for f in raw if isinstance(f, (int, float)) and f > 0]
    if not floors or len(floors) != len(raw):
        return {}
    paired = [b / f for b, f in zip(built.repeat_medians, floors)]
    return {
        "floor_s": statistics.median(floors),
        "built_over_floor": statistics.median(paired),
        "built_over_floor_per_repeat": {"min": min(paired), "max": max(paired)},
        "floor_kind": built.infos[0].get("floor_kind"),
    }


def table(entries: list[dict[str, Any]]) -> str:
    """The printed results: one aligned row per benchmark."""
    headers = ["benchmark", "stock median", "stock spread", "built median", "built spread",
               "built/stock", "per-repeat", "target", "result", "other clock", "built/floor", "floor"]
    rows = [headers]
    for e in entries:
        pr = e["spread"]["ratio_per_repeat"]
        floor = ["", ""]
        if "built_over_floor" in e:
            fr = e["built_over_floor_per_repeat"]
            floor = [f"{e['built_over_floor']:.2f} ({fr['min']:.2f}–{fr['max']:.2f})",
                     fmt_s(e["floor_s"])]
        rows.append([
            e["name"], fmt_s(e["stock_s"]), fmt_spread(e["spread"]["stock"]),
            fmt_s(e["built_s"]), fmt_spread(e["spread"]["built"]), f"{e['ratio']:.3f}",
            f"{pr['min']:.3f}–{pr['max']:.3f}", f"<= {e['target']:.2f}",
            "PASS" if e["pass"] else "FAIL",
            ", ".join(f"{c} {r:.3f}" for c, r in e["ratio_by_clock"].items() if c != e["clock"]),
            *floor,
        ])
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def planner_lines(entries: list[dict[str, Any]]) -> list[str]:
    """Per planner benchmark and side, what the walk did (so a fast side that skipped work shows)."""
    lines = []
    for e in entries:
        if "walk" not in e:
            continue
        for r in ROLES:
            w = e["walk"][r]
            lines.append(
                f"{e['name']} {r} ({w['walk']}): {w['nodes']} nodes, {w['queries']} queries, "
                f"{w['specs']} specs, {w['fallback_nodes']} all-Replicate fallbacks "
                f"{w['fallbacks']}; peak {e[f'{r}_peak_mib']} MiB (tracemalloc), "
                f"{e[f'{r}_peak_per_spec_kib']} KiB per spec"
                + (f"; missing in specs: {w['missing']}" if w.get("missing") else "")
            )
            if e.get(f"{r}_cost_cache"):
                c = e[f"{r}_cost_cache"]
                lines.append(f"{e['name']} {r}: cost-row cache after a cold walk: {c['entries']} rows "
                             f"(at most {c['maxsize']}), {c['mib']} MiB held (what clearing it frees)")
            if w.get("cost_computations"):
                c = w["cost_computations"]
                lines.append(
                    f"{e['name']} {r}: {c['computed']} redistribution costs computed, "
                    f"{c['per_query']} per query; each distinct cost computed "
                    f"{c['times_each_per_query']} times per query, "
                    f"{c['times_each_per_walk']} times per walk"
                )
    return lines


def parse_benches(text: str | None) -> list[str]:
    """``--bench``'s names (all when empty); SystemExit naming any unknown one."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()] or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHES)}")
    return names


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark's worker pairs, write the report, print the table; 1 on a miss with --strict."""
    ap = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", help=f"comma-separated names (default all: {','.join(BENCHES)})")
    ap.add_argument("--repeats", type=int, default=5, help="worker pairs per benchmark (default 5)")
    ap.add_argument("--stock-python", default=".venv-stock/bin/python")
    ap.add_argument("--built-python", default=".venv/bin/python")
    ap.add_argument("--out", default=".build/bench/bench.json", help="the results JSON (default .build/bench/bench.json)")
    ap.add_argument("--work-dir", default=".build/bench", help="per-worker pyperf and info files")
    ap.add_argument("--quick", action="store_true", help="tiny plans and model: a smoke run")
    ap.add_argument("--strict", action="store_true", help="exit 1 if a ratio misses its target")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default=DEFAULT_CLOCK,
                    help="the clock times and targets are on: cpu (each worker's CPU time, "
                    "default) or wall; the other clock's ratio is printed beside it")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")

    names = parse_benches(args.bench)
    pythons = {"stock": resolve_python(args.stock_python, "stock"),
               "built": resolve_python(args.built_python, "built")}
    work = Path(args.work_dir)
    work = work if work.is_absolute() else REPO_ROOT / work
    work.mkdir(parents=True, exist_ok=True)
    command = "python -m tools.bench " + shlex.join(
        (["--bench", ",".join(names)] if args.bench else [])
        + ["--repeats", str(args.repeats), "--clock", args.clock]
        + (["--quick"] if args.quick else []))
    print(f"[bench] {', '.join(names)}; {args.repeats} repeats, {args.clock} clock; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
          file=sys.stderr, flush=True)

    t_start = time.monotonic()
    entries = []
    merged: dict[str, dict[str, pyperf.Benchmark]] = {}
    for name in names:
        sides = {r: SideResult() for r in ROLES}
        for repeat in range(args.repeats):
            for role in ROLES:  # stock, built, stock, built, ...
                t0 = time.monotonic()
                bench, info = run_worker(pythons[role], role, name, repeat, args, work)
                sides[role].benches.append(bench)
                sides[role].infos.append(info)
                print(f"[bench] {name} {repeat + 1}/{args.repeats} {role}: median "
                      f"{fmt_s(bench.median())} ({time.monotonic() - t0:.0f} s wall)",
                      file=sys.stderr, flush=True)
        if sides["stock"].infos[0]["has_change"] == sides["built"].infos[0]["has_change"]:
            print(f"[bench] warning: stock and built workers report the same torch "
                  f"(has_change={sides['stock'].infos[0]['has_change']}); the ratio compares "
                  f"a torch with itself", file=sys.stderr)
        entries.append(summarize(name, sides, args.repeats, command, args.clock))
        merged[name] = {r: sides[r].merged() for r in ROLES}

    for role in ROLES:  # this invocation's benchmarks, for `python -m pyperf compare_to`
        suite = pyperf.BenchmarkSuite([m[role] for m in merged.values()])
        suite.dump(str(work / f"{role}.pyperf.json"), replace=True)

    out = Path(args.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entries, indent=1) + "\n")

    print(table(entries))
    for line in planner_lines(entries):
        print(line)
    shown = {p: p.relative_to(REPO_ROOT) if p.is_relative_to(REPO_ROOT) else p for p in (out, work)}
    print(f"wrote {shown[out]} ({time.monotonic() - t_start:.0f} s); pyperf suites in {shown[work]}")
    failed = [e["name"] for e in entries if not e["pass"]]
    if failed:
        print(f"targets missed: {', '.join(failed)}" + ("" if args.strict else " (not --strict)"))
    return 1 if failed and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
