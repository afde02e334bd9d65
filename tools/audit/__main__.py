"""Audit DTensor's sharding strategies against the strategy contract, stock vs built.

Run from the repository root::

    python -m tools.audit                       # both torches, runtime+planner, meshes 4,2x2
    python -m tools.audit --ops mm,t,"nn.functional.*"
    python -m tools.audit --ops aten.convolution_backward.default --meshes 2x4
    python -m tools.audit --strict              # non-zero exit if the built torch breaks the contract
    python -m tools.audit --stock-python /tmp/probe/bin/python --built-python /tmp/probe/bin/python
    python -m tools.audit --parity              # also the runtime parity sweep (DTensor eager vs torch)
    python -m tools.audit --parity-only --ops add,mm,softmax

The worker (``tools/audit/worker.py``) runs the contract mode of
``strategy_validation`` (``python -m torch.distributed.tensor._ops.strategy_validation
--contract``, whose options and counts it shares: those not listed here, such as
``--meshes`` or ``--calls-per-op``, are passed on as given) once under each python,
in parallel, and writes one JSON each under ``.build/audit/``. This orchestrator is the
comparison of the two and the report over it, and only uses the standard library: it
merges both, prints the side-by-side tables and writes ``reports/audit.json`` and
``reports/audit.md``.

``--strict`` fails when the built torch has any contract violation, any exception
while a strategy is queried, or when a runtime selection (output placements,
redistribution) differs from stock. A runtime query DTensor deliberately refuses
(``contract_sweep.runtime_refusal``: an in-place op whose self would move, a
data-dependent result size, ...) is a right answer: counted as ``refused``, per
query, never as an error.

``--parity`` then runs ``tools/audit/parity.py`` under stock and under built, one
after the other (never in parallel, so their times compare): DTensor eager over the
OpInfo db against plain torch. Per OpInfo the outcome (same/wrong/raised/skipped)
and the DTensor wall time are compared; ``--strict`` also fails on any op whose
outcome got worse and on any op more than 3x slower than stock (built >= 0.5 s).
``--parity-only`` runs just that and keeps the contract sections of the last report.
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
from typing import Any, TextIO
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
    """Progress of the workers, a line per worker about every 10% of each phase."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self.stream = stream
        self.lock = threading.Lock()
        self.last: dict[str, tuple[str, int]] = {}

    def update(self, role: str, phase: str, done: int, total: int) -> None:
        with self.lock:
            step = (phase, (10 * done) // max(total, 1))
            if self.last.get(role) != step:
                self.last[role] = step
                print(f"[audit {role}] {phase} {done}/{total}", file=self.stream, flush=True)


def worker_command(python: str, role: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The contract worker for one torch, with the contract mode's options this command did not read."""
    cmd = [python, "-m", "tools.audit.worker", "--role", role, "--out", str(out), *args.contract_options]
    for flag, value in (("op", args.ops), ("foreach-tensors", args.foreach_tensors), ("preload", args.preload)):
        if value is not None:
            cmd += [f"--{flag}", str(value)]
    return cmd + (["--full-space", args.full_space] if args.full_space else [])


def parity_command(python: str, role: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The runtime parity worker (tools/audit/parity.py) for one torch."""
    cmd = [python, "-m", "tools.audit.parity", "--role", role, "--out", str(out),
           "--meshes", args.parity_meshes, "--op-timeout", str(args.op_timeout)]
    if args.ops is not None:
        cmd += ["--ops", args.ops]
    if args.parity_samples is not None:
        cmd += ["--max-samples", str(args.parity_samples)]
    if args.foreach_tensors is not None:
        cmd += ["--foreach-tensors", str(args.foreach_tensors)]
    return cmd


def _run(cmd: list[str], log: Path, env: dict[str, str], progress: Progress, run: dict[str, Any]) -> None:
    """Run one worker, its output into ``log``, passing its progress lines on; record exit and time."""
    started = time.monotonic()
    with open(log, "w") as logf:
        logf.write("$ " + " ".join(cmd) + "\n")
        logf.flush()
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=logf, stderr=subprocess.PIPE, text=True, bufsize=1)
        for line in proc.stderr or ():
            logf.write(line)
            m = PROGRESS_RE.match(line.strip())
            if m:
                progress.update(m.group(1), m.group(2), int(m.group(3)), int(m.group(4)))
        run.update(returncode=proc.wait(), seconds=time.monotonic() - started)


def run_workers(args: argparse.Namespace, roles: list[str], build_dir: Path, kind: str = "contract",
                prefix: str | None = None) -> dict[str, dict]:
    """One worker per torch, in parallel; parity workers one after the other, so that their times compare.

    Returns each worker's JSON, with its wall time added.
    """
    command = parity_command if kind == "parity" else worker_command
    prefix = ("parity-" if kind == "parity" else "") if prefix is None else prefix
    pythons = {role: Path(getattr(args, f"{role}_python")) for role in roles}
    pythons = {role: py if py.is_absolute() else REPO_ROOT / py for role, py in pythons.items()}
    for role, py in pythons.items():
        if not py.exists():
            raise SystemExit(f"{role} python not found: {py} (run `make build`, or pass --{role}-python)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONDONTWRITEBYTECODE": "1"}
    progress = Progress()
    runs: dict[str, dict[str, Any]] = {}
    threads = []
    for role in roles:
        # per-run names, renamed to <role>.json/.log once the worker succeeded: a
        # concurrent run sharing the build dir never sees (or removes) a partial file
        run = runs[role] = {ext: build_dir / f"{prefix}{role}.{os.getpid()}.{ext}" for ext in ("json", "log")}
        cmd = command(str(pythons[role]), role, run["json"], args)
        threads.append(threading.Thread(target=_run, args=(cmd, run["log"], env, progress, run), daemon=True))
        threads[-1].start()
        if kind == "parity":
            threads[-1].join()
    for th in threads:
        th.join()

    docs = {}
    for role, run in runs.items():
        if run.get("returncode") != 0 or not run["json"].exists():
            tail = run["log"].read_text().splitlines()[-25:]
            print(f"\n[audit {role}] worker failed (exit {run.get('returncode')}); log {run['log']}:", file=sys.stderr)
            print("\n".join("    " + t for t in tail), file=sys.stderr)
            continue
        docs[role] = json.loads(run["json"].read_text())
        docs[role].setdefault("timing", {})["wall_s"] = round(run["seconds"], 1)
        for ext in ("json", "log"):
            os.replace(run[ext], build_dir / f"{prefix}{role}.{ext}")
    if len(docs) < len(roles):
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


def merge(docs: dict[str, dict]) -> dict:
    results = []
    for role in ROLES:
        if role not in docs:
            continue
        for rec in docs[role]["results"]:
            results.append({"torch": role, **rec})
    sel = compare_selections(docs)
    merged = {
        "results": results,
        # what each refusal key means (contract_sweep.RUNTIME_REFUSALS / RUNTIME_REFUSAL_TYPES)
        "refusal_reasons": {k: v for d in docs.values() for k, v in d.get("refusal_reasons", {}).items()},
        "selections": sel,
        "coverage": {role: docs[role]["coverage"] for role in docs},
        "capture": {role: docs[role]["capture"] for role in docs},
        # the contract mode's per-op text of each side (its ops that break the contract or raise)
        "reports": {role: docs[role].get("report", "") for role in docs},
        "caches": {role: docs[role].get("caches", {}) for role in docs},
        "full_space": {role: docs[role]["full_space"] for role in docs if "full_space" in docs[role]},
        "infer_failed": {role: docs[role]["infer_failed"] for role in docs},
        "torches": {
            role: {k: docs[role].get(k) for k in ("torch_version", "torch_file", "python", "checker")}
            for role in docs
        },
        "config": next(iter(docs.values()))["config"] if docs else {},
        "timing": {role: docs[role]["timing"] for role in docs},
    }
    return merged


# --------------------------------------------------------------------------------------
# Runtime parity (tools/audit/parity.py), stock vs built
# --------------------------------------------------------------------------------------

# Worse is bigger; a skipped op (no float32, plain torch raised, nondeterministic) ranks
# with "same": only a DTensor run that fails where it did not is a regression.
PARITY_SEVERITY = {"same": 0, "skipped": 0, "wrong": 1, "raised": 2}
PARITY_REPORT_RATIO = 1.5   # listed as slower
PARITY_STRICT_RATIO = 3.0   # fails --strict
PARITY_FLOOR_S = 0.5        # below this, DTensor time is noise


def _parity_outcome(rec: dict) -> str:
    """``raised: Type``, ``wrong``, ``same`` or ``skipped``: what the report shows."""
    if rec["outcome"] == "raised":
        return f"raised: {rec.get('type', '?')}"
    return rec["outcome"]


def classify_parity(stock: dict, built: dict) -> str | None:
    """How one op moved from stock to built: worse, newly_works, better, notes, or None."""
    sev_s, sev_b = PARITY_SEVERITY[stock["outcome"]], PARITY_SEVERITY[built["outcome"]]
    if sev_b > sev_s:
        return "worse"
    if sev_b < sev_s:
        return "newly_works" if built["outcome"] == "same" else "better"
    if stock["outcome"] != built["outcome"] or (
        (stock.get("type"), stock.get("message")) != (built.get("type"), built.get("message"))
    ):
        return "notes"
    return None


def time_ratio(stock_s: float, built_s: float) -> float | None:
    """built/stock DTensor time; None when neither ran DTensor, inf when only built did."""
    if stock_s > 0:
        return built_s / stock_s
    return float("inf") if built_s > 0 else None


def compare_parity(pdocs: dict[str, dict]) -> dict:
    """Per op: outcome change and DTensor time ratio, stock vs built, with totals."""
    out: dict = {
        "torches": {r: {"counts": d["counts"], "ops": len(d["ops"]), "dtensor_s": d["timing"].get("dtensor_s"),
                        "wall_s": d["timing"].get("wall_s"), "total_s": d["timing"].get("total_s"),
                        "load": (d["timing"].get("loadavg_start") or [None])[0]}
                    for r, d in pdocs.items()},
        "config": {**(next(iter(pdocs.values()))["config"] if pdocs else {}),
                   "retime": max((len(r.get("timings_s", [0])) - 1 for d in pdocs.values() for r in d["ops"].values()),
                                 default=0)},
        "compared": 0, "worse": [], "newly_works": [], "better": [], "notes": [], "slower": [],
        "only_stock": [], "only_built": [],
        "thresholds": {"report_ratio": PARITY_REPORT_RATIO, "strict_ratio": PARITY_STRICT_RATIO,
                       "floor_s": PARITY_FLOOR_S},
    }
    if not all(r in pdocs for r in ROLES):
        return out
    s_ops, b_ops = pdocs["stock"]["ops"], pdocs["built"]["ops"]
    out["only_stock"] = sorted(set(s_ops) - set(b_ops))
    out["only_built"] = sorted(set(b_ops) - set(s_ops))
    for op in sorted(set(s_ops) & set(b_ops)):
        s, b = s_ops[op], b_ops[op]
        out["compared"] += 1
        entry = {"op": op, "stock": _parity_outcome(s), "built": _parity_outcome(b),
                 "stock_message": s.get("message", ""), "built_message": b.get("message", ""),
                 "stock_s": s.get("dtensor_s", 0.0), "built_s": b.get("dtensor_s", 0.0)}
        kind = classify_parity(s, b)
        if kind is not None:
            out[kind].append(entry)
        ratio = time_ratio(entry["stock_s"], entry["built_s"])
        if ratio is not None and ratio > PARITY_REPORT_RATIO and max(entry["stock_s"], entry["built_s"]) >= PARITY_FLOOR_S:
            out["slower"].append({**entry, "ratio": round(ratio, 2) if ratio != float("inf") else "inf"})
    out["slower"].sort(key=lambda e: -(float("inf") if e["ratio"] == "inf" else e["ratio"]))
    out["totals"] = {k: len(out[k]) for k in ("worse", "newly_works", "better", "notes", "slower")}
    out["totals"]["strict_slower"] = len(parity_strict_slower(out))
    return out


def retime_parity(args: argparse.Namespace, roles: list[str], build_dir: Path, pdocs: dict[str, dict]) -> dict:
    """Re-run the ops flagged slower, stock then built again, and keep each side's fastest time.

    On a shared 2-core machine one sweep's wall times carry other jobs' noise; a real
    slowdown survives a second measurement, a noisy one does not. Ops whose outcome got
    worse are not re-run (they fail --strict anyway, and may be hangs).
    """
    parity = compare_parity(pdocs)
    for attempt in range(1, args.parity_retime + 1):
        worse = {e["op"] for e in parity["worse"]}
        flagged = sorted({e["op"].split("#")[0] for e in parity["slower"] if e["op"] not in worse})
        if not flagged:
            break
        print(f"[audit] parity: re-timing {len(flagged)} ops flagged slower ({attempt}/{args.parity_retime}): "
              + ", ".join(flagged), file=sys.stderr, flush=True)
        sub = argparse.Namespace(**{**vars(args), "ops": ",".join(flagged)})
        again = run_workers(sub, roles, build_dir, kind="parity", prefix=f"parity-retime{attempt}-")
        for role in roles:
            for op, rec in again[role]["ops"].items():
                first = pdocs[role]["ops"].get(op)
                if first is None:
                    continue
                first.setdefault("timings_s", [first["dtensor_s"]]).append(rec["dtensor_s"])
                first["dtensor_s"] = min(first["timings_s"])
        parity = compare_parity(pdocs)
    for role in roles:
        # the worker JSON keeps the fastest times, so --from-json renders what was reported
        (build_dir / f"parity-{role}.json").write_text(json.dumps(pdocs[role], indent=1))
    return parity


def parity_strict_slower(parity: dict) -> list[dict]:
    """Ops slower than PARITY_STRICT_RATIO x stock whose built time is at least the floor."""
    def ratio(e: dict) -> float:
        return float("inf") if e["ratio"] == "inf" else e["ratio"]

    return [e for e in parity.get("slower", []) if ratio(e) > PARITY_STRICT_RATIO and e["built_s"] >= PARITY_FLOOR_S]


def parity_strict_failures(parity: dict | None) -> list[str]:
    """What fails --strict in the parity comparison: any worse outcome, any op > 3x slower."""
    if parity is None:
        return []
    reasons = []
    if parity.get("worse"):
        ops = ", ".join(e["op"] for e in parity["worse"][:10])
        more = f" +{len(parity['worse']) - 10}" if len(parity["worse"]) > 10 else ""
        reasons.append(f"runtime parity: {len(parity['worse'])} ops got worse than stock ({ops}{more})")
    slow = parity_strict_slower(parity)
    if slow:
        ops = ", ".join(f"{e['op']} {e['ratio']}x" for e in slow[:10])
        reasons.append(f"runtime parity: {len(slow)} ops slower than {PARITY_STRICT_RATIO:g}x stock "
                       f"(built >= {PARITY_FLOOR_S:g}s): {ops}")
    return reasons


def strict_counts(rec: dict) -> tuple[int, int, int]:
    """(OpSpec violations, ops with violations, errors) of one result; refusals are no errors."""
    nviol = sum(sum(v["specs_by_clause"].values()) for v in rec.get("violating_ops", []))
    nops = len(rec.get("violating_ops", []))
    nerr = sum(e["count"] for e in rec.get("error_details", []))
    return nviol, nops, nerr


def strict_failures(merged: dict) -> list[str]:
    reasons = []
    for r in merged["results"]:
        if r["torch"] != "built":
            continue
        nviol, nops, nerr = strict_counts(r)
        if nviol:
            reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nviol} OpSpec violations in {nops} ops")
        if nerr:
            reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nerr} errors")
    bad = [m for m in merged["selections"]["mismatches"] if m.get("kind", "changed") in STRICT_SELECTION_KINDS]
    if bad:
        kinds = ", ".join(f"{sum(1 for m in bad if m.get('kind', 'changed') == k)} {k}"
                          for k in STRICT_SELECTION_KINDS if any(m.get("kind", "changed") == k for m in bad))
        reasons.append(f"{len(bad)} runtime selections differ stock vs built ({kinds})")
    for mode, fs in merged.get("full_space", {}).get("built", {}).items():
        if isinstance(fs, dict) and (fs.get("missing") or fs.get("errors")):
            reasons.append(f"built full space ({mode} candidates): {fs.get('missing', 0)} strategies missing in "
                           f"{len(fs.get('ops_missing', []))} ops, {len(fs.get('errors', {}))} errors")
    reasons += parity_strict_failures(merged.get("parity"))
    return reasons


def full_space_rows(merged: dict) -> list[list]:
    """Per side and candidate mode: what the full-space comparison found."""
    rows = []
    for role, modes in merged.get("full_space", {}).items():
        if "skipped" in modes:
            rows.append([role, "-", "-", "-", "-", "-", "-", f"skipped: {modes['skipped']}"])
            continue
        for mode, fs in modes.items():
            rows.append([role, mode, fs["ops_compared"], fs["schemas_compared"], fs["missing"],
                         _ops_list(fs["ops_missing"], 4), sum(fs["invalid_with_reason"].values()),
                         len(fs["errors"])])
    return rows


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
                         *(_clause_cell(r, c) for c in CLAUSES), r["errors"], r.get("refused", 0),
                         r.get("no_strategy", 0)])
    return rows


SUMMARY_HEADERS = ["mode", "mesh", "torch", "ops", "ops w/ viol", *CLAUSES, "errors", "refused", "no strategy"]


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
        "`refused`: runtime queries DTensor deliberately refuses (see 'Runtime refusals' below; a right "
        "answer, not an error). `no strategy`: queries answered with None (op unsupported for that input)."
    )
    out.append("")
    out.append(table(SUMMARY_HEADERS, summary_rows(merged), md))
    parts = []
    for r in merged["results"]:
        if r["torch"] == "built":
            nviol, _, nerr = strict_counts(r)
            parts.append(f"{r['mode']} {r['mesh']}: {nviol} violations, {nerr} errors")
    if parts:
        out.append("")
        out.append("Built (what `--strict` checks): " + "; ".join(parts) + ".")
    for role in ROLES:
        if role in merged.get("reports", {}):
            text = merged["reports"][role].strip() or "none"
            out.append("")
            out.append(fold(f"Ops that break the contract or raise ({role}), as `strategy_validation --contract` "
                            "reports them"))
            out.append(f"```{text}\n```" if md else text)
            out.append(unfold)

    out.append("")
    out.append(h("Coverage (registered ops reached by OpInfo samples)"))
    out.append(table(["registry", "torch", "registered", "reached", "not reached"], coverage_rows(merged), md))
    for role in ROLES:
        rules = merged["coverage"].get(role, {}).get("rules", {})
        if rules.get("registered"):
            out.append(f"{'- ' if md else '  '}{role}: {rules['registered']} ops have only a propagation rule "
                       f"({rules['reached']} reached); the contract mode does not query rules")
        shadowed = rules.get("shadowed_by_strategies")
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
            f"unknown to DTensor and {st.get('aten_ops_without_tensor_calls', 0)} only called without tensors "
            f"(DTensor never sees those calls); {st.get('calls_queried', 0)} calls queried; "
            f"shape inference failed for {sum(d['calls'] for d in merged['infer_failed'].get(role, []))} calls "
            f"({len(merged['infer_failed'].get(role, []))} ops; skipped)"
        )

    out.append("")
    out.append(h("Runtime refusals (contract_sweep.runtime_refusal)"))
    out.append(
        "Runtime queries that raised one of the exceptions by which DTensor deliberately refuses an input "
        "placement, classified per query by message or exception type (stock refuses the same way). They are "
        "counted under `refused`, never as errors; the same calls are judged in planner mode."
    )
    rows = refusal_rows(merged)
    out.append(table(["refusal", "torch", "ops", "queries", "where", "example ops", "why"], rows, md)
               if rows else "none")

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

    caches = merged.get("caches", {})
    if any(caches.values()):
        out.append("")
        out.append(h("Cache sizes after the audit"))
        rows = [
            [role, name, str(c["entries"]), str(c["bound"])]
            for role, per_role in caches.items()
            for name, c in per_role.items()
        ]
        out.append(table(["torch", "cache", "entries", "bound"], rows, md))

    if merged.get("full_space"):
        out.append("")
        out.append(h("Full space: planner answers vs a planner's own expansion of the single-dim rule"))
        out.append("Strategies a planner finds by expanding the registered rule itself over the same "
                   "candidates (tools/audit/full_space.py) that get_op_strategy's answer lacks: `missing` "
                   "fails --strict; those the expansion must drop are counted with their reason.")
        out.append(table(["torch", "candidates", "ops", "schemas", "missing", "ops missing",
                          "not valid (with reason)", "errors"], full_space_rows(merged), md))

    if merged.get("parity") is not None:
        out.append("")
        out.append(render_parity(merged["parity"], md, top))

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


def render_parity(parity: dict, md: bool, top: int) -> str:
    """The "Runtime parity" section: outcome counts per torch, then what changed."""
    out: list[str] = []
    h = (lambda t: f"### {t}") if md else (lambda t: f"\n== {t} ==")
    fold = (lambda t: f"<details><summary><b>{t}</b></summary>\n") if md else h
    unfold = "\n</details>" if md else ""
    bullet = "- " if md else "  "
    cfg = parity.get("config", {})
    out.append(h("Runtime parity"))
    out.append(
        f"DTensor eager vs plain torch over the OpInfo db (float32, first {cfg.get('max_samples')} samples per "
        f"OpInfo, preferring samples that get sharded; mesh {cfg.get('meshes')} simulated with LocalTensorMode; "
        f"{cfg.get('op_timeout')}s per op)"
        + (f"; ops filter `{cfg.get('ops')}`" if cfg.get("ops") else "")
        + ". Per op the worst sample decides: `same`, `wrong` (differs from plain torch), `raised`, `skipped` "
        "(no float32, plain torch raised, or nondeterministic). Time: wall seconds of the op's DTensor runs, "
        "stock and built run one after the other; "
        + (f"ops flagged slower were re-run {cfg['retime']} more time(s) on both torches, each side keeping its "
           "fastest time." if cfg.get("retime") else "no op needed re-timing.")
    )
    out.append("")
    rows = []
    for role in ROLES:
        t = parity["torches"].get(role)
        if t is None:
            continue
        c = t["counts"]
        rows.append([role, t["ops"], c.get("same", 0), c.get("wrong", 0), c.get("raised", 0), c.get("skipped", 0),
                     t.get("dtensor_s"), t.get("wall_s"), "-" if t.get("load") is None else t["load"]])
    out.append(table(["torch", "ops", "same", "wrong", "raised", "skipped", "DTensor s", "wall s", "load avg"],
                     rows, md))
    if "totals" not in parity:
        return "\n".join(out)
    tot = parity["totals"]
    th = parity["thresholds"]
    out.append("")
    out.append(
        f"{parity['compared']} ops compared: {tot['worse']} worse, {tot['newly_works']} newly work, "
        f"{tot['better']} better (not yet same), {tot['notes']} same outcome with another message; "
        f"{tot['slower']} slower than {th['report_ratio']:g}x stock (either time >= {th['floor_s']:g}s), "
        f"{tot['strict_slower']} slower than {th['strict_ratio']:g}x (built >= {th['floor_s']:g}s). "
        "`--strict` fails on worse outcomes and on ops slower than "
        f"{th['strict_ratio']:g}x."
    )
    if parity["only_stock"] or parity["only_built"]:
        out.append(f"{bullet}only in stock: {', '.join(parity['only_stock']) or 'none'}; "
                   f"only in built: {', '.join(parity['only_built']) or 'none'}")

    def changes(title: str, entries: list[dict], limit: int | None) -> None:
        out.append("")
        out.append((fold if md and title.startswith(("Same outcome", "Improvements")) else h)(title))
        if not entries:
            out.append("none")
        else:
            shown = entries if limit is None else entries[:limit]
            out.append(table(["op", "stock", "built", "stock message", "built message", "stock s", "built s"],
                             [[e["op"], e["stock"], e["built"], _code(e["stock_message"] or "-", 120, md),
                               _code(e["built_message"] or "-", 120, md), e["stock_s"], e["built_s"]]
                              for e in shown], md))
            if limit is not None and len(entries) > limit:
                out.append(f"... {len(entries) - limit} more in reports/audit.json (parity)")
        if md and title.startswith(("Same outcome", "Improvements")):
            out.append(unfold)

    changes(f"Parity: outcome got worse ({tot['worse']})", parity["worse"], None)
    out.append("")
    out.append(h(f"Parity: slower than {th['report_ratio']:g}x stock ({tot['slower']})"))
    if parity["slower"]:
        out.append(table(["op", "stock s", "built s", "built/stock", "stock", "built"],
                         [[e["op"], e["stock_s"], e["built_s"], e["ratio"], e["stock"], e["built"]]
                          for e in parity["slower"]], md))
    else:
        out.append("none")
    changes(f"Improvements: newly work ({tot['newly_works']}) and better ({tot['better']})",
            parity["newly_works"] + parity["better"], None)
    changes(f"Same outcome, another message ({tot['notes']})", parity["notes"], top)
    return "\n".join(out)


def refusal_rows(merged: dict) -> list[list]:
    """Runtime refusals per refusal kind and torch: ops, queries, where, and why it is a refusal."""
    agg: dict[tuple[str, str], dict] = {}
    for r in merged["results"]:
        for d in r.get("refusal_details", []):
            e = agg.setdefault((d["refusal"], r["torch"]), {"ops": [], "count": 0, "where": set()})
            if d["op"] not in e["ops"]:
                e["ops"].append(d["op"])
            e["count"] += d["count"]
            e["where"].add(f"{r['mode']}/{r['mesh']}")
    reasons = merged.get("refusal_reasons", {})
    order = list(reasons)
    rows = []
    for (key, role), e in sorted(agg.items(), key=lambda kv: (
            order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0][0], ROLES.index(kv[0][1]))):
        rows.append([f"`{key}`", role, len(e["ops"]), e["count"], ",".join(sorted(e["where"])),
                     _ops_list(sorted(e["ops"]), 4), reasons.get(key, "")])
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.audit",
        description="Audit DTensor sharding strategies against the strategy contract (C1-C5), stock vs built.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument("--stock-python", default=".venv-stock/bin/python", help="python of the stock torch venv")
    ap.add_argument("--built-python", default=".venv/bin/python", help="python of the built torch venv")
    ap.add_argument("--only", choices=ROLES, help="run a single side")
    ap.add_argument("--ops", default=None,
                    help='comma-separated OpInfo names and/or aten op names, globs allowed (e.g. add,mm,"nn.functional.*")')
    ap.add_argument("--foreach-tensors", type=int, default=None,
                    help="tensors per list in foreach samples, contract and parity (default 8; 0: the OpInfo's)")
    ap.add_argument("--preload", default=None,
                    help="python file each worker runs after setup, before querying (tests, experiments)")
    ap.add_argument("--out-dir", default="reports", help="where audit.json and audit.md go")
    ap.add_argument("--report-name", default="audit",
                    help="file name of the report, without suffix (make audit: audit-<release> but for 2.13.0's)")
    ap.add_argument("--build-dir", default=".build/audit", help="worker JSON and logs")
    ap.add_argument("--from-json", action="store_true", help="re-render from the worker JSON of the last run")
    ap.add_argument("--top", type=int, default=15, help="rows in the offender/mismatch lists")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 if the built torch has violations or errors (refusals are neither), or selections "
                    "differ from stock; "
                    "with --parity also on any op whose eager outcome got worse or that is > 3x slower than stock")
    ap.add_argument("--full-space", default="audit,replicated",
                    help="candidate modes of the full-space comparison on the built torch (tools/audit/full_space.py: "
                    "audit, few, replicated, partials; comma-separated; '' for none)")
    ap.add_argument("--parity", action="store_true",
                    help="also run the runtime parity sweep (tools/audit/parity.py): DTensor eager vs plain torch, "
                    "stock then built")
    ap.add_argument("--parity-only", action="store_true", help="run only the runtime parity sweep")
    ap.add_argument("--parity-samples", type=int, default=None, help="parity: samples per OpInfo (default 3)")
    ap.add_argument("--parity-meshes", default="4", help="parity: mesh shapes, e.g. 4 or 4,2x2")
    ap.add_argument("--parity-retime", type=int, default=1,
                    help="parity: re-run ops flagged slower this many more times (stock then built), keeping each "
                    "side's fastest time (0: one measurement)")
    ap.add_argument("--op-timeout", type=float, default=120.0,
                    help="parity: wall seconds of DTensor runs per OpInfo before it counts as raised Timeout")
    # the contract mode's own options (--meshes, --modes, --dtypes, --max-samples,
    # --calls-per-op, --candidates, --query-timeout) go to the worker as given
    args, contract_options = ap.parse_known_args(argv)
    args.contract_options = contract_options

    roles = [args.only] if args.only else list(ROLES)
    build_dir = (REPO_ROOT / args.build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out_dir = (REPO_ROOT / args.out_dir).resolve()
    parity_wanted = args.parity or args.parity_only
    merged: dict[str, Any] = {}
    pdocs: dict[str, Any] = {}
    if args.parity_only:
        # keep the contract sections of the last full report; only the parity part is new
        previous = out_dir / f"{args.report_name}.json"
        merged = json.loads(previous.read_text()) if previous.exists() else {}
        if "results" not in merged:
            merged = {}
        docs: dict[str, dict] = {}
    elif args.from_json:
        docs = {r: json.loads((build_dir / f"{r}.json").read_text()) for r in roles}
    else:
        docs = run_workers(args, roles, build_dir)
    if parity_wanted:
        if args.from_json:
            pdocs = {r: json.loads((build_dir / f"parity-{r}.json").read_text()) for r in roles}
        else:
            pdocs = run_workers(args, roles, build_dir, kind="parity")
            if len(roles) == 2 and args.parity_retime:
                retime_parity(args, roles, build_dir, pdocs)
    if not args.parity_only:
        merged = merge(docs)
    merged.setdefault("timing", {})["orchestrator_wall_s"] = round(time.monotonic() - t0, 1)
    if parity_wanted:
        merged["parity"] = compare_parity(pdocs)
        # per op and torch, without the per-sample details (those stay in the build dir's parity-<torch>.json)
        merged["parity"]["ops"] = {r: {op: {k: v for k, v in rec.items() if k != "samples"}
                                       for op, rec in d["ops"].items()} for r, d in pdocs.items()}
    if args.parity_only:
        reasons = parity_strict_failures(merged["parity"]) if args.strict else None
    else:
        reasons = strict_failures(merged) if args.strict else None
    if args.strict and "built" not in roles:
        reasons = (reasons or []) + ["--strict needs the built torch"]
    merged["strict"] = {"requested": args.strict, "failures": reasons or []}

    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{args.report_name}.json", out_dir / f"{args.report_name}.md"
    json_path.write_text(json.dumps(merged, indent=1, sort_keys=False) + "\n")
    if "results" in merged:
        md_path.write_text(render(merged, md=True, top=min(args.top, 10), strict_reasons=None))
        text = render(merged, md=False, top=args.top, strict_reasons=reasons)
    else:
        # --parity-only with no earlier contract report: the parity section alone
        md_path.write_text("## DTensor audit (`python -m tools.audit --parity-only`)\n\n"
                           + render_parity(merged["parity"], True, min(args.top, 10)) + "\n")
        text = render_parity(merged["parity"], False, args.top) + "\n"
        if reasons is not None:
            text += "\n== Strict ==\n" + ("FAIL: " + "; ".join(reasons) if reasons else "PASS") + "\n"
    print(text)
    print(f"wrote {json_path} and {md_path} "
          f"({merged['timing']['orchestrator_wall_s']}s)")
    if args.strict and reasons:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
