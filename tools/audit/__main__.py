"""Audit DTensor's sharding strategies against the strategy contract, stock vs built.

Run from the repository root::

    python -m tools.audit                       # both torches, runtime+planner, meshes 4,2x2
    python -m tools.audit --ops mm,t,"nn.functional.*"
    python -m tools.audit --ops aten.convolution_backward.default --meshes 2x4
    python -m tools.audit --strict              # non-zero exit if the built torch breaks the contract
    python -m tools.audit --stock-python /tmp/probe/bin/python --built-python /tmp/probe/bin/python

The worker (``tools/audit/worker.py``) runs once under each python, in parallel,
and writes one JSON each under ``.build/audit/``. This orchestrator only uses the
standard library: it merges both, prints the side-by-side tables and writes
``reports/audit.json`` and ``reports/audit.md``.

``--strict`` fails when the built torch has any contract violation, any exception
while a strategy is queried (ops in ``tools/audit/skips.py`` are not queried), or
when a runtime selection (output placements, redistribution) differs from stock.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES = ("stock", "built")
CLAUSES = ("C1", "C2", "C3", "C4", "C5")
REGISTRIES = ("single_dim", "op_strategy", "decomposition", "rules")
PROGRESS_RE = re.compile(r"^\[audit (\w+)\] (.+?) (\d+)/(\d+)$")
NUMERIC_RE = re.compile(r"^[-\d\s().]*$")


# --------------------------------------------------------------------------------------
# Running the workers
# --------------------------------------------------------------------------------------


class Progress:
    """One status line for both workers (a bar on a TTY, sparse lines otherwise)."""

    def __init__(self, roles: list[str], stream=sys.stderr) -> None:
        self.state = {r: ("starting", 0, 0) for r in roles}
        self.stream = stream
        self.tty = stream.isatty()
        self.lock = threading.Lock()
        self.last_line: dict[str, tuple] = {}
        self.t0 = time.monotonic()
        self.width = 0

    def start(self) -> None:
        if self.tty:
            with self.lock:
                self._draw()

    def update(self, role: str, phase: str, done: int, total: int) -> None:
        with self.lock:
            self.state[role] = (phase, done, total)
            if self.tty:
                self._draw()
            else:
                # about every 10%, and at the end of each phase
                bucket = (phase, (10 * done) // max(total, 1))
                if self.last_line.get(role) != bucket:
                    self.last_line[role] = bucket
                    print(f"[audit {role}] {phase} {done}/{total}", file=self.stream, flush=True)

    def _draw(self) -> None:
        parts = []
        for role, (phase, done, total) in self.state.items():
            frac = done / total if total else 0.0
            bar = "#" * int(frac * 20)
            parts.append(f"[{role}] {phase:<9} [{bar:<20}] {done}/{total}")
        elapsed = time.monotonic() - self.t0
        line = ("  ".join(parts) + f"  {elapsed:5.0f}s")[:200]
        self.stream.write("\r" + line.ljust(self.width))
        self.width = len(line)
        self.stream.flush()

    def finish(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def worker_command(python: str, role: str, out: Path, args: argparse.Namespace) -> list[str]:
    cmd = [python, "-m", "tools.audit.worker", "--role", role, "--out", str(out)]
    for flag in ("ops", "meshes", "modes", "dtypes", "max_samples", "max_calls_per_op", "max_candidates",
                 "foreach_tensors", "query_timeout", "checker", "preload"):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    if args.tracebacks:
        cmd.append("--tracebacks")
    return cmd


def run_workers(args: argparse.Namespace, roles: list[str], build_dir: Path) -> dict[str, dict]:
    pythons = {"stock": args.stock_python, "built": args.built_python}
    for role in roles:
        py = Path(pythons[role])
        if not py.is_absolute():
            py = REPO_ROOT / py
        if not py.exists():
            raise SystemExit(
                f"{role} python not found: {py} (run `make build`, or pass --{role}-python)"
            )
        pythons[role] = str(py)

    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONDONTWRITEBYTECODE="1")
    progress = Progress(roles)
    progress.start()
    procs: dict[str, subprocess.Popen] = {}
    threads = []
    logs = {}
    outs = {}
    t0 = time.monotonic()
    durations: dict[str, float] = {}
    for role in roles:
        # per-run names, renamed to <role>.json/.log once the worker succeeded: a
        # concurrent run sharing the build dir never sees (or removes) a partial file
        out = build_dir / f"{role}.{os.getpid()}.json"
        outs[role] = out
        logs[role] = build_dir / f"{role}.{os.getpid()}.log"
        cmd = worker_command(pythons[role], role, out, args)
        logf = open(logs[role], "w")
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=logf, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        procs[role] = proc

        def pump(role=role, proc=proc, logf=logf):
            assert proc.stderr is not None
            for line in proc.stderr:
                logf.write(line)
                m = PROGRESS_RE.match(line.strip())
                if m:
                    progress.update(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))
            proc.wait()
            durations[role] = time.monotonic() - t0
            logf.close()

        th = threading.Thread(target=pump, daemon=True)
        th.start()
        threads.append(th)
        if args.sequential:
            th.join()
    for th in threads:
        th.join()
    progress.finish()

    docs = {}
    failed = []
    for role in roles:
        if procs[role].returncode != 0 or not outs[role].exists():
            failed.append(role)
            tail = logs[role].read_text().splitlines()[-25:]
            print(f"\n[audit {role}] worker failed (exit {procs[role].returncode}); log {logs[role]}:", file=sys.stderr)
            print("\n".join("    " + t for t in tail), file=sys.stderr)
            continue
        docs[role] = json.loads(outs[role].read_text())
        docs[role].setdefault("timing", {})["wall_s"] = round(durations.get(role, 0.0), 1)
        os.replace(outs[role], build_dir / f"{role}.json")
        os.replace(logs[role], build_dir / f"{role}.log")
    if failed:
        raise SystemExit(2)
    return docs


# --------------------------------------------------------------------------------------
# Merging
# --------------------------------------------------------------------------------------


# How a runtime selection moved from stock to built. "changed" (both selected, differently)
# and "regressed" (stock selected, built raised) fail --strict; "newly_supported" (stock
# raised, built selected) and "error_changed" (both raised, differently) are reported only.
SELECTION_KINDS = ("changed", "regressed", "newly_supported", "error_changed")
STRICT_SELECTION_KINDS = ("changed", "regressed")


def compare_selections(docs: dict[str, dict]) -> dict:
    if not all(r in docs for r in ROLES):
        return {"compared": 0, "mismatches": [], "by_kind": {}, "only_stock": 0, "only_built": 0}
    s, b = docs["stock"]["selections"], docs["built"]["selections"]
    common = sorted(set(s) & set(b))
    mismatches = []
    for key in common:
        if s[key] != b[key]:
            _, mesh, cfg = key.split("|")
            stock_err, built_err = "error" in s[key], "error" in b[key]
            kind = ("error_changed" if built_err else "newly_supported") if stock_err else (
                "regressed" if built_err else "changed")
            mismatches.append({"key": key, "op": s[key]["op"], "mesh": mesh, "config": cfg, "kind": kind,
                               "stock": s[key], "built": b[key]})
    # the ones that fail --strict first
    mismatches.sort(key=lambda m: (SELECTION_KINDS.index(m["kind"]), m["op"], m["key"]))
    return {
        "compared": len(common),
        "mismatches": mismatches,
        "by_kind": {k: sum(1 for m in mismatches if m["kind"] == k) for k in SELECTION_KINDS},
        "only_stock": len(set(s) - set(b)),
        "only_built": len(set(b) - set(s)),
        "errors": {role: sum(1 for v in docs[role]["selections"].values() if "error" in v) for role in ROLES},
    }


def merge(docs: dict[str, dict], skips: dict[str, str]) -> dict:
    results = []
    for role in ROLES:
        if role not in docs:
            continue
        for rec in docs[role]["results"]:
            results.append({"torch": role, **rec})
    sel = compare_selections(docs)
    merged = {
        "results": results,
        "skips": [{"op": op, "reason": reason} for op, reason in sorted(skips.items())],
        "selections": sel,
        "coverage": {role: docs[role]["coverage"] for role in docs},
        "capture": {role: docs[role]["capture"] for role in docs},
        "infer_failed": {role: docs[role]["infer_failed"] for role in docs},
        "torches": {
            role: {k: docs[role].get(k) for k in ("torch_version", "torch_file", "python", "checker")}
            for role in docs
        },
        "config": next(iter(docs.values()))["config"] if docs else {},
        "timing": {role: docs[role]["timing"] for role in docs},
        "slowest_queries": {role: docs[role].get("slowest_queries", []) for role in docs},
        "planner_candidates": "per tensor input: every combination over mesh dims of Replicate, each "
        "Shard(d) with size(d) >= mesh dim size and Partial() for float/complex dtypes; ordered by "
        "number of non-Replicate mesh dims (all-Replicate first); capped",
    }
    return merged


def outside_skips(rec: dict, skips: set[str]) -> tuple[int, int, int]:
    """(OpSpec violations, ops with violations, errors) of one result, skip-listed ops left out."""
    nviol = sum(sum(v["specs_by_clause"].values()) for v in rec.get("violating_ops", []) if v["op"] not in skips)
    nops = sum(1 for v in rec.get("violating_ops", []) if v["op"] not in skips)
    nerr = sum(e["count"] for e in rec.get("error_details", []) if e["op"] not in skips)
    return nviol, nops, nerr


def strict_failures(merged: dict) -> list[str]:
    skips = {s["op"] for s in merged["skips"]}
    reasons = []
    for r in merged["results"]:
        if r["torch"] != "built":
            continue
        nviol, nops, nerr = outside_skips(r, skips)
        if nviol:
            reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nviol} OpSpec violations in {nops} ops")
        if nerr:
            reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nerr} errors")
    bad = [m for m in merged["selections"]["mismatches"] if m.get("kind", "changed") in STRICT_SELECTION_KINDS]
    if bad:
        kinds = ", ".join(f"{sum(1 for m in bad if m.get('kind', 'changed') == k)} {k}"
                          for k in STRICT_SELECTION_KINDS if any(m.get("kind", "changed") == k for m in bad))
        reasons.append(f"{len(bad)} runtime selections differ stock vs built ({kinds})")
    return reasons


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], md: bool) -> str:
    cells = [[str(c) for c in row] for row in rows]
    if md:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(NUMERIC_RE.match(r[i]) for r in cells) for i in range(len(headers))]

    def fmt(row: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)
        ).rstrip()

    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in cells]
    return "\n".join(lines)


def _clause_cell(rec: dict, clause: str) -> str:
    n = rec["violations"].get(clause, 0)
    ops = rec.get("ops_by_clause", {}).get(clause, 0)
    return f"{n} ({ops})" if n else "0"


def summary_rows(merged: dict) -> list[list]:
    rows = []
    keyed = {(r["mode"], r["mesh"], r["torch"]): r for r in merged["results"]}
    seen = []
    for r in merged["results"]:
        if (r["mode"], r["mesh"]) not in seen:
            seen.append((r["mode"], r["mesh"]))
    for mode, mesh in seen:
        for role in ROLES:
            r = keyed.get((mode, mesh, role))
            if r is None:
                continue
            rows.append([mode, mesh, role, r["ops_sampled"], r["ops_with_violations"],
                         *(_clause_cell(r, c) for c in CLAUSES), r["errors"], r.get("no_strategy", 0)])
    return rows


SUMMARY_HEADERS = ["mode", "mesh", "torch", "ops", "ops w/ viol", *CLAUSES, "errors", "no strategy"]


def registry_rows(merged: dict) -> list[list]:
    rows = []
    order = []
    for r in merged["results"]:
        if f"{r['mode']} {r['mesh']}" not in order:
            order.append(f"{r['mode']} {r['mesh']}")
    for r in merged["results"]:
        for reg in REGISTRIES:
            b = r.get("by_registry", {}).get(reg)
            if b is None:
                continue
            rows.append([f"{r['mode']} {r['mesh']}", reg, r["torch"], b["ops_sampled"], b["ops_with_violations"],
                         *(_clause_cell(b, c) for c in CLAUSES), b["errors"], b.get("no_strategy", 0)])
    rows.sort(key=lambda x: (order.index(x[0]), REGISTRIES.index(x[1]), ROLES.index(x[2])))
    return rows


def offenders(merged: dict, role: str, limit: int) -> list[dict]:
    """Ops ranked by OpSpecs violating the contract, summed over modes and meshes."""
    agg: dict[str, dict] = {}
    for r in merged["results"]:
        if r["torch"] != role:
            continue
        for v in r.get("violating_ops", []):
            e = agg.setdefault(v["op"], {"op": v["op"], "registry": v["registry"], "total": 0,
                                         "clauses": {}, "where": [], "example": v["example"]})
            for c, n in v["specs_by_clause"].items():
                e["clauses"][c] = e["clauses"].get(c, 0) + n
                e["total"] += n
            e["where"].append(f"{r['mode']}/{r['mesh']}")
    return sorted(agg.values(), key=lambda e: (-e["total"], e["op"]))[:limit]


def error_summary(merged: dict, role: str) -> list[dict]:
    """Errors grouped by cause (registry, exception, message, raising frame), most ops first."""
    agg: dict[tuple, dict] = {}
    for r in merged["results"]:
        if r["torch"] != role:
            continue
        for e in r.get("error_details", []):
            # messages often embed the op or a size; the raising frame groups them anyway
            key = (e["registry"], e["type"], _normalize(e["message"]), e.get("raised_at", ""))
            d = agg.setdefault(key, {"registry": e["registry"], "type": e["type"], "message": e["message"],
                                     "raised_at": e.get("raised_at", ""), "ops": [], "where": set(), "count": 0})
            if e["op"] not in d["ops"]:
                d["ops"].append(e["op"])
            d["where"].add(f"{r['mode']}/{r['mesh']}")
            d["count"] += e["count"]
    return sorted(agg.values(), key=lambda d: (-len(d["ops"]), -d["count"], d["registry"], d["message"]))


PLACEMENTS_RE = re.compile(r"\((?:(?:Replicate|Shard|Partial|_StridedShard)\([^()]*\)(?:, )?)+,?\)")


def _normalize(text: str) -> str:
    text = re.sub(r"TensorMeta\(.*?dtype=torch\.\w+\)", "TensorMeta(...)", text)
    text = PLACEMENTS_RE.sub("<placements>", text)
    text = re.sub(r"\b(aten|prims)\.[\w.]+", "<op>", text)
    text = re.sub(r"\d+", "N", text)
    return text


def violation_categories(merged: dict, role: str) -> list[dict]:
    """Violations grouped by (registry, clause, shape of the message), with example ops."""
    agg: dict[tuple, dict] = {}
    for r in merged["results"]:
        if r["torch"] != role:
            continue
        for v in r.get("violating_ops", []):
            for clause, ex in v.get("examples", {}).items():
                text = ex["violation"]
                # drop "C1 <op> strategy N" so the key is what is wrong, not where
                what = re.sub(r"^\S+ \S+ strategy -?\d+ ", "", text)
                key = (v["registry"], text.split(" ", 1)[0], _normalize(what))
                d = agg.setdefault(key, {"registry": v["registry"], "clause": key[1], "pattern": key[2],
                                         "ops": [], "specs": 0, "where": set(), "example": text,
                                         "call": ex.get("call", ""), "query": ex.get("query", "")})
                if v["op"] not in d["ops"]:
                    d["ops"].append(v["op"])
                d["specs"] += v["specs_by_clause"].get(clause, 0)
                d["where"].add(f"{r['mode']}/{r['mesh']}")
    return sorted(agg.values(), key=lambda d: (-len(d["ops"]), -d["specs"]))


def _ops_list(ops: list[str], n: int) -> str:
    shown = ", ".join(o.replace("aten.", "") for o in ops[:n])
    return shown + (f" +{len(ops) - n}" if len(ops) > n else "")


def _code(text: str, width: int, md: bool) -> str:
    text = text if len(text) <= width else text[: width - 3] + "..."
    return f"`{text}`" if md else text


def coverage_rows(merged: dict) -> list[list]:
    rows = []
    for reg in REGISTRIES:
        for role in ROLES:
            cov = merged["coverage"].get(role, {}).get(reg)
            if cov is None:
                continue
            registered = cov["registered"]
            if registered is None:
                rows.append([reg, role, f"({cov['decomposition_table_entries']} decomp-table entries)",
                             cov["reached"], "-"])
            else:
                rows.append([reg, role, registered, cov["reached"], len(cov["not_reached"])])
    return rows


def render(merged: dict, md: bool, top: int, strict_reasons: list[str] | None) -> str:
    out: list[str] = []
    h = (lambda t: f"### {t}") if md else (lambda t: f"\n== {t} ==")
    # long sections fold away in markdown (the README shows the summary first)
    fold = (lambda t: f"<details><summary><b>{t}</b></summary>\n") if md else h
    unfold = "\n</details>" if md else ""
    cfg = merged["config"]
    torches = merged["torches"]
    if md:
        out.append("## DTensor strategy contract audit (`python -m tools.audit`)")
    out.append(
        f"Meshes {cfg.get('meshes')}, modes {cfg.get('modes')}, dtypes {cfg.get('dtypes')}; "
        f"{cfg.get('max_samples')} samples per OpInfo/dtype, <= {cfg.get('max_calls_per_op')} distinct calls per aten op, "
        f"<= {cfg.get('max_candidates')} planner candidates per input, "
        f"{cfg.get('foreach_tensors') or 'default'} tensors per foreach list"
        + (f"; ops filter `{cfg.get('ops')}`" if cfg.get("ops") else "")
        + "."
    )
    for role in ROLES:
        if role in torches:
            t = torches[role]
            out.append(f"{'- ' if md else '  '}{role}: torch {t['torch_version']} ({t['python']})")
    out.append("")
    out.append(h("Contract violations, stock vs built"))
    out.append(
        "Clause cells: OpSpecs violating the clause (ops). `errors`: strategy queries that raised. "
        "`no strategy`: queries answered with None (op unsupported for that input). "
        "Rules (propagation rules) are held to C1/C2 only, in runtime mode."
    )
    out.append("")
    out.append(table(SUMMARY_HEADERS, summary_rows(merged), md))
    skips = {s["op"] for s in merged["skips"]}
    if skips:
        parts = []
        for r in merged["results"]:
            if r["torch"] == "built":
                nviol, _, nerr = outside_skips(r, skips)
                parts.append(f"{r['mode']} {r['mesh']}: {nviol} violations, {nerr} errors")
        if parts:
            out.append("")
            out.append("Built, outside the skip list (what `--strict` checks): " + "; ".join(parts) + ".")
    out.append("")
    out.append(fold("Per registry"))
    out.append(table(["mode mesh", "registry", "torch", "ops", "ops w/ viol", *CLAUSES, "errors", "no strategy"],
                     registry_rows(merged), md))
    out.append(unfold)

    focus = "built" if "built" in merged["coverage"] else next(iter(merged["coverage"]), None)
    if focus is not None:
        worst = offenders(merged, focus, top)
        out.append("")
        out.append(fold(f"Top offending ops ({focus}), {len(worst)} shown"))
        if worst:
            rows = [[e["op"], e["registry"], e["total"],
                     " ".join(f"{c}:{n}" for c, n in sorted(e["clauses"].items())),
                     _code(e["example"], 150, md)] for e in worst]
            out.append(table(["op", "registry", "OpSpecs", "clauses", "example"], rows, md))
        else:
            out.append("none")
        out.append(unfold)
        cats = violation_categories(merged, focus)
        out.append("")
        out.append(fold(f"Violation categories ({focus}): {len(cats)}"))
        if cats:
            n = top if not md else min(top, 10)
            rows = [[c["registry"], c["clause"], len(c["ops"]), c["specs"], _ops_list(c["ops"], 3),
                     _code(c["example"], 170, md)] for c in cats[:n]]
            out.append(table(["registry", "clause", "ops", "OpSpecs", "example ops", "example"], rows, md))
            if len(cats) > n:
                out.append(f"... {len(cats) - n} more categories in reports/audit.json (violating_ops)")
        else:
            out.append("none")
        out.append(unfold)
        errs = error_summary(merged, focus)
        out.append("")
        out.append(fold(f"Errors ({focus}), by cause: {len(errs)}"))
        if errs:
            n = top if not md else min(top, 10)
            rows = [[e["registry"], len(e["ops"]), e["count"], ",".join(sorted(e["where"])),
                     _code(f"{e['type']}: {e['message'] or '(no message)'}", 100, md), e["raised_at"],
                     _ops_list(e["ops"], 3)] for e in errs[:n]]
            out.append(table(["registry", "ops", "queries", "where", "error", "raised at", "example ops"], rows, md))
            if len(errs) > n:
                out.append(f"... {len(errs) - n} more causes in reports/audit.json (error_details)")
        else:
            out.append("none")
        out.append(unfold)

    out.append("")
    out.append(h("Coverage (registered ops reached by OpInfo samples)"))
    out.append(table(["registry", "torch", "registered", "reached", "not reached"], coverage_rows(merged), md))
    for role in ROLES:
        shadowed = merged["coverage"].get(role, {}).get("rules", {}).get("shadowed_by_strategies")
        if shadowed:
            out.append(f"{'- ' if md else '  '}{role}: op_to_rules entries also registered as strategies "
                       f"(their rule is never used): {', '.join(shadowed)}")
    for role in ROLES:
        cov = merged["coverage"].get(role)
        cap = merged["capture"].get(role)
        if cov is None or cap is None:
            continue
        st = cap["stats"]
        out.append(
            f"{'- ' if md else '  '}{role}: {st.get('opinfos', 0)} OpInfos, {st.get('samples', 0)} samples "
            f"({st.get('sample_failures', 0)} sample failures, not DTensor errors), "
            f"{st.get('aten_ops_captured', 0)} aten ops captured, {len(cov['unregistered_captured'])} of them "
            f"unknown to DTensor; {st.get('calls_queried', 0)} calls queried; "
            f"shape inference failed for {sum(d['calls'] for d in merged['infer_failed'].get(role, []))} calls "
            f"({len(merged['infer_failed'].get(role, []))} ops; skipped)"
        )

    out.append("")
    out.append(h("Skip list (tools/audit/skips.py)"))
    out.append("Skipped ops are queried and counted like any other; only `--strict` ignores their findings.")
    if merged["skips"]:
        out.append(table(["op", "reason"], [[s["op"], s["reason"]] for s in merged["skips"]], md))
    else:
        out.append("empty")

    sel = merged["selections"]
    out.append("")
    out.append(h("Runtime selections, stock vs built"))
    errs = sel.get("errors", {})
    kinds = sel.get("by_kind", {})
    out.append(
        f"{sel['compared']} runtime queries compared (output placements, needs_redistribute, redistribute "
        f"placements): {len(sel['mismatches'])} differ ("
        + ", ".join(f"{kinds.get(k, 0)} {k}" for k in SELECTION_KINDS)
        + f"); {sel['only_stock']} only in stock, {sel['only_built']} only in built; selection raised in "
        f"stock {errs.get('stock', 0)}, built {errs.get('built', 0)}. "
        "`changed` (both selected, differently) and `regressed` (built raises where stock selected) fail "
        "`--strict`; `newly_supported` (stock raised, built selects) and `error_changed` are reported only."
    )
    for kind in SELECTION_KINDS:
        per_op: dict[str, int] = {}
        for m in sel["mismatches"]:
            if m.get("kind") == kind:
                per_op[m["op"]] = per_op.get(m["op"], 0) + 1
        if per_op:
            out.append(f"{'- ' if md else '  '}{kind}: " + ", ".join(
                f"{op.replace('aten.', '')} ({n})" for op, n in sorted(per_op.items())))
    shown = sel["mismatches"]
    if md:
        # the README only needs the rows that fail --strict
        shown = [m for m in shown if m.get("kind", "changed") in STRICT_SELECTION_KINDS]
    if shown:
        out.append("")
        rows = [[m["op"], m["mesh"], m["config"], m.get("kind", ""),
                 _code(json.dumps({k: v for k, v in m["stock"].items() if k != "op"}), 80, md),
                 _code(json.dumps({k: v for k, v in m["built"].items() if k != "op"}), 80, md)]
                for m in shown[:top]]
        out.append(table(["op", "mesh", "inputs", "kind", "stock", "built"], rows, md))
        if len(shown) > top:
            out.append(f"... {len(shown) - top} more in reports/audit.json (selections.mismatches)")

    if not md:
        out.append("")
        out.append(h("Timing"))
        for role, t in merged["timing"].items():
            if isinstance(t, dict):
                out.append(f"  {role} worker: " + ", ".join(f"{k} {v}" for k, v in t.items()))
            else:
                out.append(f"  {role}: {t}")
    if strict_reasons is not None:
        out.append("")
        out.append(h("Strict"))
        out.append("FAIL: " + "; ".join(strict_reasons) if strict_reasons else "PASS")
    return "\n".join(out) + "\n"


def load_skips() -> dict[str, str]:
    sys.path.insert(0, str(REPO_ROOT))
    try:
        from tools.audit.skips import SKIPS
    finally:
        sys.path.pop(0)
    return dict(SKIPS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.audit",
        description="Audit DTensor sharding strategies against the strategy contract (C1-C5), stock vs built.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--stock-python", default=".venv-stock/bin/python", help="python of the stock torch venv")
    ap.add_argument("--built-python", default=".venv/bin/python", help="python of the built torch venv")
    ap.add_argument("--only", choices=ROLES, help="run a single side")
    ap.add_argument("--ops", default=None,
                    help='comma-separated OpInfo names and/or aten op names, globs allowed (e.g. add,mm,"nn.functional.*")')
    ap.add_argument("--meshes", default="4,2x2", help="comma-separated mesh shapes among 4, 2x2, 2x4, 2x2x2")
    ap.add_argument("--modes", default="runtime,planner")
    ap.add_argument("--dtypes", default=None, help="default float32,bfloat16,int64,bool,complex64")
    ap.add_argument("--max-samples", type=int, default=None, help="samples per OpInfo and dtype (default 3)")
    ap.add_argument("--max-calls-per-op", type=int, default=None, help="distinct calls per aten op (default 4)")
    ap.add_argument("--max-candidates", type=int, default=None, help="planner candidates per input (default 16)")
    ap.add_argument("--foreach-tensors", type=int, default=None,
                    help="tensors per list in foreach samples (default 8; 0: the OpInfo default, 20)")
    ap.add_argument("--query-timeout", type=float, default=None,
                    help="CPU seconds per query before it counts as a QueryTimeout error (default 60; 0: none)")
    ap.add_argument("--checker", default=None, help="strategy_contract.py to judge with (default: the repo's)")
    ap.add_argument("--tracebacks", action="store_true", help="keep short tracebacks in error details")
    ap.add_argument("--preload", default=None,
                    help="python file each worker runs after setup, before querying (tests, experiments)")
    ap.add_argument("--sequential", action="store_true", help="run the workers one after the other")
    ap.add_argument("--out-dir", default="reports", help="where audit.json and audit.md go")
    ap.add_argument("--build-dir", default=".build/audit", help="worker JSON and logs")
    ap.add_argument("--from-json", action="store_true", help="re-render from the worker JSON of the last run")
    ap.add_argument("--top", type=int, default=15, help="rows in the offender/mismatch lists")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 if the built torch has violations or errors, or selections differ from stock")
    args = ap.parse_args(argv)

    roles = [args.only] if args.only else list(ROLES)
    build_dir = (REPO_ROOT / args.build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.from_json:
        docs = {r: json.loads((build_dir / f"{r}.json").read_text()) for r in roles}
    else:
        docs = run_workers(args, roles, build_dir)
    skips = load_skips()
    merged = merge(docs, skips)
    merged["timing"]["orchestrator_wall_s"] = round(time.monotonic() - t0, 1)
    reasons = strict_failures(merged) if args.strict else None
    if args.strict and "built" not in docs:
        reasons = (reasons or []) + ["--strict needs the built torch"]
    merged["strict"] = {"requested": args.strict, "failures": reasons or []}

    out_dir = (REPO_ROOT / args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "audit.json").write_text(json.dumps(merged, indent=1, sort_keys=False) + "\n")
    (out_dir / "audit.md").write_text(render(merged, md=True, top=min(args.top, 10), strict_reasons=None))
    print(render(merged, md=False, top=args.top, strict_reasons=reasons))
    print(f"wrote {out_dir / 'audit.json'} and {out_dir / 'audit.md'} "
          f"({merged['timing']['orchestrator_wall_s']}s)")
    if args.strict and reasons:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
