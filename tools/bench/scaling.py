"""How the planner walk's cost grows with the mesh and the model, on every side.

Run from the repository root (``make bench-scaling`` does, per release)::

    python -m tools.bench.scaling                          # default configurations, 3 repeats
    python -m tools.bench.scaling --configs 2x4@1,2x2x2@1 --repeats 3 --cap 4
    python -m tools.bench.scaling --quick --repeats 3      # smoke run

A configuration is a mesh and a model size, written ``<mesh>@<blocks>[:<nodes>]``:
``2x4@2`` is the 2-block Llama step (forward and backward) walked on a 2x4 mesh, and
``2x2x2@1:40`` the first 40 aten nodes of the 1-block step on a 2x2x2 mesh (a
prefix of the step, ``model.graph_prefix``: a 4-D mesh multiplies each node's
combinations, so the mesh series uses a fixed model small enough to walk there).
The fake world has as many ranks as the mesh: 8 for ``8``, ``2x4`` and ``2x2x2``,
16 for ``2x2x2x2``. Each is
walked by three sides (see ``planner.py``): ``stock`` (stock's registries plus
the repair pass), ``bare`` (stock's registries, no repair) and ``built`` (the
change's ``get_op_strategy``, specs as returned).

Why it exists: single-dim rules expand to ``rules ** mesh.ndim`` combinations,
so the cost of an answer explodes with the mesh's dims; the built/stock ratio
must not grow with the mesh or the model while the absolute cost does.

One worker process per side and repeat walks every configuration (processes
alternate stock, bare, built, stock, ... so that drift in the machine's load
hits every side alike; a process per configuration would spend most of the run
importing torch). In each worker, DTensor's caches are cleared before every
walk, a walk of the 1-block step's first 40 nodes on the 8-rank 1-D mesh warms
the process up first, a configuration is walked until at least MIN_SECONDS
went into it (its repeat's time is the median of those walks), and the first
repeat also runs one extra walk per configuration under tracemalloc for the
peak. Per configuration and side the report gives time per walk and per node
(median over repeats of each repeat's walk time, relative stdev and min-max
over repeats), specs per node, fallbacks, the tracemalloc peak and
peak per returned spec, and the built/stock and built/bare ratios (median of
the per-repeat ratios, and their range).

Times are each worker's CPU time (the benchmarks' default clock, see
``tools.bench.worker.CLOCKS``), so that other processes on a shared machine do
not count as any side's work.

Writes ``--out`` (JSON, default ``reports/scaling.json``) and the same table
as markdown next to it (``.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.bench._process import resolve_python, run_worker_process
from tools.bench.worker import DEFAULT_CLOCK

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# side -> which venv's python walks it
SIDES = {"stock": "stock", "bare": "stock", "built": "built"}
# The mesh series at a fixed model size (the first 40 aten nodes of the 1-block step:
# its attention half, every op kind the step has but the MLP's), then the model series
# on 2x4 (whole steps of 2 and 8 blocks). Cap 2 and 40 nodes keep one release's run
# near 10 minutes on this machine; see the README.
DEFAULT_CONFIGS = "8@1:40,2x4@1:40,2x2x2@1:40,2x2x2x2@1:40,2x4@2,2x4@8"
DEFAULT_CAP = 2
QUICK_CONFIGS = "8@1:12,2x4@1:12"
QUICK_CAP = 2


@dataclass(frozen=True)
class ScalingConfig:
    """One configuration: a mesh shape and a model size (Llama blocks, optionally a prefix)."""

    mesh: tuple[int, ...]
    blocks: int
    nodes: int | None = None  # walk only the first ``nodes`` aten nodes of the step

    @property
    def world_size(self) -> int:
        """Ranks of the fake world this configuration needs: the mesh's size."""
        return math.prod(self.mesh)

    @property
    def label(self) -> str:
        size = f"{self.blocks}" if self.nodes is None else f"{self.blocks}:{self.nodes}"
        return f"{'x'.join(map(str, self.mesh))}@{size}"

    @classmethod
    def parse(cls, text: str) -> ScalingConfig:
        """``"2x4@2"`` -> mesh (2, 4), 2 blocks; ``"2x2x2@1:40"`` adds a 40-node prefix.

        Raises ValueError naming the text.
        """
        mesh_text, sep, size_text = text.strip().partition("@")
        if not sep:
            raise ValueError(f"configuration {text!r}: expected <mesh>@<blocks>[:<nodes>], e.g. 2x4@2")
        blocks_text, colon, nodes_text = size_text.partition(":")
        nodes = None
        if colon:
            if not nodes_text.strip().isdigit() or int(nodes_text) < 1:
                raise ValueError(f"configuration {text!r}: nodes must be a positive integer")
            nodes = int(nodes_text)
        mesh: list[int] = []
        for part in mesh_text.lower().split("x"):
            if not part.strip().isdigit() or int(part) < 1:
                raise ValueError(f"configuration {text!r}: mesh dims must be positive integers")
            mesh.append(int(part))
        if not blocks_text.strip().isdigit() or int(blocks_text) < 1:
            raise ValueError(f"configuration {text!r}: blocks must be a positive integer")
        return cls(tuple(mesh), int(blocks_text), nodes)


def parse_configs(text: str) -> list[ScalingConfig]:
    """Comma-separated configurations, in order; duplicates are an error."""
    configs = [ScalingConfig.parse(t) for t in text.split(",") if t.strip()]
    if not configs:
        raise ValueError("no configuration given")
    labels = [c.label for c in configs]
    dupes = sorted({label for label in labels if labels.count(label) > 1})
    if dupes:
        raise ValueError(f"configuration(s) given twice: {', '.join(dupes)}")
    return configs


# --------------------------------------------------------------------------------------
# The worker: one side, every configuration, in one process
# --------------------------------------------------------------------------------------


def config_graph(config: ScalingConfig, traced: dict[int, Any]) -> Any:
    """The GraphModule ``config`` walks; whole steps are traced once per block count."""
    import torch.fx

    from tools.bench import model

    if config.blocks not in traced:
        traced[config.blocks] = model.trace_llama(model.LlamaDims(blocks=config.blocks))
    gm = traced[config.blocks]
    if config.nodes is None:
        return gm
    return torch.fx.GraphModule(gm, model.graph_prefix(gm.graph, config.nodes))


# A configuration is walked again until this much time went into it (at most MAX_VALUES
# walks): a 40-node walk on a small mesh takes tens of milliseconds, and one such value
# per repeat is mostly noise.
MIN_SECONDS = 1.0
MAX_VALUES = 25


def walk_config(
    config: ScalingConfig, walk: str, cap: int, values: int, memory: bool, traced: dict[int, Any]
) -> dict[str, Any]:
    """Walk ``config`` at least ``values`` times and for MIN_SECONDS (caches cleared each
    time); counts, times, peak. The repeat's figure is the median of the walks."""
    from tools.bench import common
    from tools.bench.worker import PlannerBench

    common.init_fake_process_group(config.world_size)
    bench = PlannerBench(
        quick=False, bare=walk == "bare", mesh_shape=config.mesh, blocks=config.blocks,
        cap=cap, gm=config_graph(config, traced),
    )
    if bench.side != walk:
        raise RuntimeError(
            f"scaling worker asked for the {walk} walk, but this torch walks {bench.side} "
            f"(stock and bare need the stock python, built the built one)"
        )
    times = [bench.time_func(1) for _ in range(values)]
    while sum(times) < MIN_SECONDS and len(times) < MAX_VALUES:
        times.append(bench.time_func(1))
    bench.check()
    if bench.stats is None:
        raise RuntimeError(f"{config.label}: no walk was measured")
    stats = bench.stats.as_dict()
    out: dict[str, Any] = {
        "config": config.label,
        "times_s": times,
        "nodes": stats["nodes"],
        "specs": stats["specs"],
        "fallback_nodes": stats["fallback_nodes"],
        "fallbacks": stats["fallbacks"],
        "fallback_reasons": stats["fallback_reasons"],
        "missing": stats["missing"],
    }
    if memory:
        mem = bench.memory()
        out["peak_mib"] = mem["peak_tracemalloc_mib"]
        out["peak_per_spec_kib"] = mem["peak_per_spec_kib"]
    return out


def worker_main(args: argparse.Namespace) -> int:
    """Walk every configuration as ``args.walk``; write one JSON document."""
    import torch

    from tools.bench import common, model, planner

    configs = parse_configs(args.configs)
    # Fewest ranks first, so the fake world is rebuilt at most once per size.
    order = sorted(configs, key=lambda c: c.world_size)
    common.init_fake_process_group(8)
    warm = model.trace_llama(model.LlamaDims(blocks=1))
    common.clear_dtensor_caches()
    side = "built" if common.has_contract_change() else args.walk
    warm_graph = model.graph_prefix(warm.graph, 40)
    planner.walk_once(common.cpu_mesh((8,)), warm_graph, side, common.load_contract_candidates(), args.cap)
    traced: dict[int, Any] = {1: warm}
    results = {}
    for config in order:
        t0 = time.monotonic()
        results[config.label] = walk_config(config, args.walk, args.cap, args.values, args.memory, traced)
        print(f"[scaling {args.walk}] {config.label}: {time.monotonic() - t0:.1f} s",
              file=sys.stderr, flush=True)
    doc = {
        "walk": args.walk,
        "torch": torch.__version__,
        "has_change": common.has_contract_change(),
        "cap": args.cap,
        "values": args.values,
        "results": [results[c.label] for c in configs],
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


# --------------------------------------------------------------------------------------
# The orchestrator
# --------------------------------------------------------------------------------------


def run_worker(python: str, walk: str, repeat: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One worker process for ``walk``; its JSON, or SystemExit naming what failed."""
    out = work / f"r{repeat}-{walk}.json"
    out.unlink(missing_ok=True)
    cmd = [python, "-m", "tools.bench.scaling", "worker", "--walk", walk, "--configs", args.configs,
           "--cap", str(args.cap), "--values", "1", "--out", str(out)]
    if repeat == 0:
        cmd.append("--memory")
    run_worker_process(cmd, f"scaling repeat {repeat + 1} {walk}", args.timeout, [out])
    return json.loads(out.read_text())


def spread(values: list[float]) -> dict[str, float]:
    """Relative stdev and min-max of per-repeat values."""
    mean = statistics.fmean(values)
    rel = statistics.stdev(values) / mean if len(values) > 1 and mean > 0 else 0.0
    return {"rel_stdev": rel, "min": min(values), "max": max(values)}


def summarize(configs: list[ScalingConfig], docs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per configuration: every side's figures and the paired ratios."""
    entries = []
    for config in configs:
        per_side: dict[str, list[dict[str, Any]]] = {
            walk: [next(r for r in d["results"] if r["config"] == config.label) for d in repeats]
            for walk, repeats in docs.items()
        }
        entry: dict[str, Any] = {"config": config.label, "mesh": list(config.mesh),
                                 "mesh_dims": len(config.mesh), "blocks": config.blocks,
                                 "world_size": config.world_size, "sides": {}}
        walk_s: dict[str, list[float]] = {}
        for walk, results in per_side.items():
            walk_s[walk] = [statistics.median(r["times_s"]) for r in results]
            first = results[0]
            median = statistics.median(walk_s[walk])
            entry["sides"][walk] = {
                "walk_s": median,
                "walk_spread": spread(walk_s[walk]),
                "per_node_ms": 1e3 * median / first["nodes"],
                "nodes": first["nodes"],
                "specs": first["specs"],
                "specs_per_node": first["specs"] / first["nodes"],
                "fallback_nodes": first["fallback_nodes"],
                "fallbacks": first["fallbacks"],
                "fallback_reasons": first["fallback_reasons"],
                "missing": first["missing"],
                "peak_mib": first.get("peak_mib"),
                "peak_per_spec_kib": first.get("peak_per_spec_kib"),
            }
        for base in ("stock", "bare"):
            if "built" in walk_s and base in walk_s:
                paired = [b / s for s, b in zip(walk_s[base], walk_s["built"])]
                entry[f"built_over_{base}"] = {"median": statistics.median(paired),
                                               "min": min(paired), "max": max(paired)}
        entries.append(entry)
    return entries


def fmt_ratio(r: dict[str, float] | None) -> str:
    return "" if r is None else f"**{r['median']:.3f}** ({r['min']:.3f}-{r['max']:.3f})"


def fmt_peak(side: dict[str, Any]) -> str:
    if side.get("peak_mib") is None:
        return ""
    return f"{side['peak_mib']:.2f} MiB / {side['peak_per_spec_kib']:.2f} KiB"


def markdown(entries: list[dict[str, Any]], walks: list[str]) -> str:
    """The scaling table: one row per configuration, every side's figures side by side."""
    headers = ["config", "mesh dims", "nodes"]
    for w in walks:
        headers += [f"{w} ms/node (spread)", f"{w} specs/node", f"{w} peak / per spec"]
    headers += ["built/stock", "built/bare"]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for e in entries:
        row = [f"`{e['config']}`", str(e["mesh_dims"]), str(next(iter(e["sides"].values()))["nodes"])]
        for w in walks:
            s = e["sides"][w]
            row += [f"{s['per_node_ms']:.2f} ±{100 * s['walk_spread']['rel_stdev']:.1f}%",
                    f"{s['specs_per_node']:.1f}", fmt_peak(s)]
        row += [fmt_ratio(e.get("built_over_stock")), fmt_ratio(e.get("built_over_bare"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        wp = argparse.ArgumentParser(prog="python -m tools.bench.scaling worker")
        wp.add_argument("--walk", required=True, choices=sorted(SIDES))
        wp.add_argument("--configs", required=True)
        wp.add_argument("--cap", type=int, required=True)
        wp.add_argument("--values", type=int, default=1, help="timed walks per configuration")
        wp.add_argument("--memory", action="store_true", help="one extra walk under tracemalloc")
        wp.add_argument("--out", required=True)
        return worker_main(wp.parse_args(argv[1:]))

    ap = argparse.ArgumentParser(prog="python -m tools.bench.scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", help=f"<mesh>@<blocks>, comma-separated (default {DEFAULT_CONFIGS})")
    ap.add_argument("--cap", type=int, help=f"candidates per tensor (default {DEFAULT_CAP})")
    ap.add_argument("--repeats", type=int, default=3, help="worker rounds, each side once per round")
    ap.add_argument("--sides", default=",".join(SIDES), help="walks to run (default stock,bare,built)")
    ap.add_argument("--stock-python", default=".venv-stock/bin/python")
    ap.add_argument("--built-python", default=".venv/bin/python")
    ap.add_argument("--out", default="reports/scaling.json")
    ap.add_argument("--work-dir", default=".build/scaling")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_CONFIGS}, cap {QUICK_CAP}: a smoke run")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    args = ap.parse_args(argv)
    args.configs = args.configs or (QUICK_CONFIGS if args.quick else DEFAULT_CONFIGS)
    args.cap = args.cap or (QUICK_CAP if args.quick else DEFAULT_CAP)
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    if args.cap < 1:
        raise SystemExit("--cap must be at least 1")
    try:
        configs = parse_configs(args.configs)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    walks = [w.strip() for w in args.sides.split(",") if w.strip()]
    unknown = [w for w in walks if w not in SIDES]
    if unknown or not walks:
        raise SystemExit(f"unknown side(s) {', '.join(unknown) or '(none)'}; known: {', '.join(SIDES)}")
    pythons = {"stock": resolve_python(args.stock_python, "stock"),
               "built": resolve_python(args.built_python, "built")}
    work = Path(args.work_dir)
    work = work if work.is_absolute() else REPO_ROOT / work
    work.mkdir(parents=True, exist_ok=True)
    print(f"[scaling] {args.configs}; cap {args.cap}; {args.repeats} repeats of {', '.join(walks)}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores",
          file=sys.stderr, flush=True)

    t_start = time.monotonic()
    docs: dict[str, list[dict[str, Any]]] = {w: [] for w in walks}
    for repeat in range(args.repeats):
        for walk in walks:  # stock, bare, built, stock, ...
            t0 = time.monotonic()
            docs[walk].append(run_worker(pythons[SIDES[walk]], walk, repeat, args, work))
            print(f"[scaling] repeat {repeat + 1}/{args.repeats} {walk}: "
                  f"{time.monotonic() - t0:.0f} s wall", file=sys.stderr, flush=True)
    entries = summarize(configs, docs)
    table = markdown(entries, walks)
    report = {
        "command": "python -m tools.bench.scaling " + shlex.join(
            ["--configs", args.configs, "--cap", str(args.cap), "--repeats", str(args.repeats),
             "--sides", ",".join(walks)]),
        "cap": args.cap,
        "repeats": args.repeats,
        "clock": DEFAULT_CLOCK,
        "torch": {w: docs[w][0]["torch"] + (" + change" if docs[w][0]["has_change"] else "")
                  for w in walks},
        "wall_s": round(time.monotonic() - t_start, 1),
        "what": f"per configuration and side: walk time ({DEFAULT_CLOCK} clock; median over repeats; spread: relative "
        "stdev and min-max over repeats), per node, specs per node, tracemalloc peak of one "
        "cold walk and that peak per returned spec; built/stock and built/bare: median and "
        "range of the per-repeat ratios",
        "entries": entries,
    }
    out = Path(args.out)
    out = out if out.is_absolute() else REPO_ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    out.with_suffix(".md").write_text(table + "\n")
    print(table)
    print(f"wrote {out} and {out.with_suffix('.md').name} ({report['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
