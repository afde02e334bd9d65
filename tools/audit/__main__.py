"""The strategy contract, stock vs built torch of one release, and the report over it.

Run from the repository root::

    python -m tools.audit                       # 2.13.0: .venv-stock against .venv
    python -m tools.audit --ops mm,t,"nn.functional.*" --strict
    python -m tools.audit --stock-python .venv-2.14.1-stock/bin/python --built-python .venv-2.14.1/bin/python

The contract is judged by the contract mode of ``strategy_validation`` (``python -m
torch.distributed.tensor._ops.strategy_validation --contract``), which the worker
(``tools/audit/worker.py``) runs under each python, both at once, writing one JSON each
to the build dir; options this command does not read (``--meshes``, ``--modes``,
``--calls-per-op``, ...) go to it as given. This command compares the two: the contract
table per mode and mesh, DTensor's runtime selections, the runtime refusals and, on the
built torch, the full-space comparison (``tools/audit/full_space.py``). The report is
printed and written to ``reports/<name>.md`` (whose tables ``make export`` puts in the
PR) and ``reports/<name>.json``. Standard library only, so any python runs it.

``--strict`` fails when the built torch breaks a clause, raises while asked for a
strategy, selects differently from stock at runtime (``changed``, or ``regressed``:
raises where stock selects), or lacks a strategy the full-space expansion finds. A
runtime query DTensor deliberately refuses (``contract_sweep.runtime_refusal``) is a
right answer: counted as ``refused``, never as an error.

No eager parity sweep here: DTensor eager against plain torch over the OpInfo db is
what PyTorch's own ``test_dtensor_ops`` checks, and the repository runs that suite on
the stock and the built torch of each release; per-op time is ``make bench``'s job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


REPO_ROOT = Path(__file__).resolve().parents[2]
ROLES = ("stock", "built")
CLAUSES = ("C1", "C2", "C3", "C4", "C5")
TOP = 10  # rows of the mismatch table and ops per cell
# How a runtime selection moved from stock to built. "changed" (both selected, differently)
# and "regressed" (stock selected, built raised) fail --strict; "newly_supported" (stock
# raised, built selected) and "error_changed" (both raised, differently) are reported only.
SELECTION_KINDS = ("changed", "regressed", "newly_supported", "error_changed")
STRICT_SELECTION_KINDS = ("changed", "regressed")


# --------------------------------------------------------------------------------------
# Running the workers
# --------------------------------------------------------------------------------------


def worker_command(python: str, role: str, out: Path, args: argparse.Namespace) -> list[str]:
    """The worker for one torch, with the contract mode's options this command did not read."""
    cmd = [python, "-m", "tools.audit.worker", "--role", role, "--out", str(out), *args.contract_options]
    for flag, value in (("--op", args.ops), ("--preload", args.preload), ("--full-space", args.full_space)):
        if value:
            cmd += [flag, value]
    return cmd


def run_workers(args: argparse.Namespace, roles: list[str], build_dir: Path) -> dict[str, dict]:
    """Each torch's worker, all at once, each writing ``<role>.json`` and ``<role>.log``.

    Returns their JSON. A failing worker ends the audit (exit 2) with its log's tail;
    the others are stopped, their results being of no use alone.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
           "PYTHONDONTWRITEBYTECODE": "1"}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    for role in roles:
        python = Path(getattr(args, f"{role}_python"))
        python = python if python.is_absolute() else REPO_ROOT / python
        if not python.exists():
            raise SystemExit(f"{role} python not found: {python} (run `make build`, or pass --{role}-python)")
        out = build_dir / f"{role}.json"
        out.unlink(missing_ok=True)  # a failed run must not leave the last one's results to read
        cmd = worker_command(str(python), role, out, args)
        with open(build_dir / f"{role}.log", "w") as logf:
            logf.write("$ " + " ".join(cmd) + "\n")
            logf.flush()
            procs[role] = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT)
    print(f"[audit] {' and '.join(roles)} running, logs in {build_dir}", file=sys.stderr, flush=True)
    started = time.monotonic()
    docs: dict[str, dict] = {}
    while len(docs) < len(procs):
        time.sleep(0.2)
        for role, proc in procs.items():
            if role in docs or proc.poll() is None:
                continue
            out, log = build_dir / f"{role}.json", build_dir / f"{role}.log"
            if proc.returncode != 0 or not out.exists():
                tail = "\n".join("    " + line for line in log.read_text().splitlines()[-25:])
                print(f"[audit {role}] worker failed (exit {proc.returncode}); end of {log}:\n{tail}", file=sys.stderr)
                for other in procs.values():
                    if other.poll() is None:
                        other.terminate()
                        other.wait()
                raise SystemExit(2)
            docs[role] = json.loads(out.read_text())
            docs[role]["timing"]["wall_s"] = round(time.monotonic() - started, 1)
            print(f"[audit {role}] done in {docs[role]['timing']['wall_s']}s", file=sys.stderr, flush=True)
    return docs


# --------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------


def compare_selections(docs: dict[str, dict]) -> dict[str, Any]:
    """Every runtime query both torches asked, where built's selection differs from stock's, and how."""
    if not all(r in docs for r in ROLES):
        return {"compared": 0, "mismatches": [], "by_kind": {}, "only_stock": 0, "only_built": 0, "errors": {}}
    s, b = docs["stock"]["selections"], docs["built"]["selections"]
    common = sorted(set(s) & set(b))
    mismatches = []
    for key in common:
        if s[key] != b[key]:
            _, mesh, inputs = key.split("|")
            stock_err, built_err = "error" in s[key], "error" in b[key]
            if stock_err:
                kind = "error_changed" if built_err else "newly_supported"
            else:
                kind = "regressed" if built_err else "changed"
            mismatches.append({"key": key, "op": s[key]["op"], "mesh": mesh, "config": inputs, "kind": kind,
                               "stock": s[key], "built": b[key]})
    mismatches.sort(key=lambda m: (SELECTION_KINDS.index(m["kind"]), m["op"], m["key"]))  # strict ones first
    return {
        "compared": len(common), "mismatches": mismatches,
        "by_kind": {k: sum(1 for m in mismatches if m["kind"] == k) for k in SELECTION_KINDS},
        "only_stock": len(set(s) - set(b)), "only_built": len(set(b) - set(s)),
        "errors": {role: sum(1 for v in docs[role]["selections"].values() if "error" in v) for role in ROLES},
    }


def merge(docs: dict[str, dict]) -> dict[str, Any]:
    """Both workers' JSON as one report document, stock's first."""
    docs = {role: docs[role] for role in ROLES if role in docs}
    return {
        "results": [{"torch": role, **rec} for role in ROLES if role in docs for rec in docs[role]["results"]],
        # what each refusal key means (contract_sweep.RUNTIME_REFUSALS / RUNTIME_REFUSAL_TYPES)
        "refusal_reasons": {k: v for d in docs.values() for k, v in d["refusal_reasons"].items()},
        "selections": compare_selections(docs),
        # the contract mode's per-op text of each side: its ops that break the contract or raise
        "reports": {role: d["report"] for role, d in docs.items()},
        "full_space": {role: d["full_space"] for role, d in docs.items() if "full_space" in d},
        "torches": {role: {k: d[k] for k in ("torch_version", "python", "capture")} for role, d in docs.items()},
        "config": next(iter(docs.values()))["config"] if docs else {},
        "timing": {role: d["timing"] for role, d in docs.items()},
    }


def strict_counts(rec: dict) -> tuple[int, int, int]:
    """(OpSpec violations, ops with violations, errors) of one result; refusals are no errors."""
    nviol = sum(sum(v["specs_by_clause"].values()) for v in rec.get("violating_ops", []))
    return nviol, len(rec.get("violating_ops", [])), sum(e["count"] for e in rec.get("error_details", []))


def strict_failures(merged: dict) -> list[str]:
    """Why the built torch fails ``--strict`` (empty: it passes)."""
    reasons = []
    for r in merged["results"]:
        if r["torch"] == "built":
            nviol, nops, nerr = strict_counts(r)
            if nviol:
                reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nviol} OpSpec violations in {nops} ops")
            if nerr:
                reasons.append(f"built {r['mode']} mesh {r['mesh']}: {nerr} errors")
    bad = [m["kind"] for m in merged["selections"]["mismatches"] if m["kind"] in STRICT_SELECTION_KINDS]
    if bad:
        kinds = ", ".join(f"{bad.count(k)} {k}" for k in STRICT_SELECTION_KINDS if k in bad)
        reasons.append(f"{len(bad)} runtime selections differ stock vs built ({kinds})")
    for mode, fs in merged.get("full_space", {}).get("built", {}).items():
        if isinstance(fs, dict) and (fs["missing"] or fs["errors"]):
            reasons.append(f"built full space ({mode} candidates): {fs['missing']} strategies missing in "
                           f"{len(fs['ops_missing'])} ops, {len(fs['errors'])} errors")
    return reasons


# --------------------------------------------------------------------------------------
# The report (markdown, also printed)
# --------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _ops_list(ops: list[str], n: int = 4) -> str:
    shown = ", ".join(o.replace("aten.", "") for o in ops[:n])
    return shown + (f" +{len(ops) - n}" if len(ops) > n else "")


def _code(text: str, width: int) -> str:
    return "`" + (text if len(text) <= width else text[: width - 3] + "...") + "`"


SUMMARY_HEADERS = ["mode", "mesh", "torch", "ops", "ops w/ viol", *CLAUSES, "errors", "refused", "no strategy"]


def summary_rows(merged: dict) -> list[list[Any]]:
    """The contract table: per mode and mesh, stock's row then built's."""
    keyed = {(r["mode"], r["mesh"], r["torch"]): r for r in merged["results"]}
    rows = []
    for mode, mesh in dict.fromkeys((r["mode"], r["mesh"]) for r in merged["results"]):
        for role in ROLES:
            r = keyed.get((mode, mesh, role))
            if r is not None:
                clauses = [f"{r['violations'][c]} ({r['ops_by_clause'][c]})" if r["violations"][c] else "0"
                           for c in CLAUSES]
                rows.append([mode, mesh, role, r["ops_sampled"], r["ops_with_violations"], *clauses, r["errors"],
                             r["refused"], r["no_strategy"]])
    return rows


def refusal_rows(merged: dict) -> list[list[Any]]:
    """Runtime refusals per refusal kind and torch: ops, queries, where, and why it is a refusal."""
    agg: dict[tuple[str, str], dict] = {}
    for r in merged["results"]:
        for d in r["refusal_details"]:
            e = agg.setdefault((d["refusal"], r["torch"]), {"ops": [], "count": 0, "where": set()})
            if d["op"] not in e["ops"]:
                e["ops"].append(d["op"])
            e["count"] += d["count"]
            e["where"].add(f"{r['mode']}/{r['mesh']}")
    reasons = merged["refusal_reasons"]
    order = {k: i for i, k in enumerate(reasons)}
    return [[f"`{key}`", role, len(e["ops"]), e["count"], ",".join(sorted(e["where"])), _ops_list(sorted(e["ops"])),
             reasons.get(key, "")]
            for (key, role), e in sorted(agg.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][0],
                                                                      ROLES.index(kv[0][1])))]


def full_space_rows(merged: dict) -> list[list[Any]]:
    """Per torch and candidate mode: what the full-space comparison found."""
    rows = []
    for role, modes in merged["full_space"].items():
        if "skipped" in modes:
            rows.append([role, "-", "-", "-", "-", "-", "-", f"skipped: {modes['skipped']}"])
            continue
        for mode, fs in modes.items():
            rows.append([role, mode, fs["ops_compared"], fs["schemas_compared"], fs["missing"],
                         _ops_list(fs["ops_missing"]), sum(fs["invalid_with_reason"].values()), len(fs["errors"])])
    return rows


def selection_lines(sel: dict) -> list[str]:
    """The runtime selections section: counts, ops per kind, and the mismatches that fail --strict."""
    kinds, errs = sel["by_kind"], sel["errors"]
    out = [
        f"{sel['compared']} runtime queries compared (output placements, needs_redistribute, redistribute "
        f"placements): {len(sel['mismatches'])} differ (" + ", ".join(f"{kinds.get(k, 0)} {k}" for k in SELECTION_KINDS)
        + f"); {sel['only_stock']} only in stock, {sel['only_built']} only in built; selection raised in "
        f"stock {errs.get('stock', 0)}, built {errs.get('built', 0)}. `changed` (both selected, differently) and "
        "`regressed` (built raises where stock selected) fail `--strict`; `newly_supported` (stock raised, built "
        "selects) and `error_changed` are reported only."
    ]
    for kind in SELECTION_KINDS:
        per_op: dict[str, int] = {}
        for m in sel["mismatches"]:
            if m["kind"] == kind:
                per_op[m["op"]] = per_op.get(m["op"], 0) + 1
        if per_op:
            out.append(f"- {kind}: " + ", ".join(f"{op.replace('aten.', '')} ({n})" for op, n in sorted(per_op.items())))
    strict = [m for m in sel["mismatches"] if m["kind"] in STRICT_SELECTION_KINDS]
    if strict:
        def placed(d: dict) -> str:
            return _code(json.dumps({k: v for k, v in d.items() if k != "op"}), 80)

        out += ["", table(["op", "mesh", "inputs", "kind", "stock", "built"],
                          [[m["op"], m["mesh"], m["config"], m["kind"], placed(m["stock"]), placed(m["built"])]
                           for m in strict[:TOP]])]
        if len(strict) > TOP:
            out.append(f"... {len(strict) - TOP} more in the JSON report (selections.mismatches)")
    return out


def render(merged: dict, strict_reasons: list[str] | None) -> str:
    cfg = merged["config"]
    out = [
        "## DTensor strategy contract audit (`python -m tools.audit`)",
        f"Meshes {cfg.get('meshes')}, modes {cfg.get('modes')}, dtypes {cfg.get('dtypes')}; "
        f"{cfg.get('max_samples')} samples per OpInfo/dtype, <= {cfg.get('max_calls_per_op')} distinct calls per "
        f"aten op, <= {cfg.get('max_candidates')} planner candidates per input, "
        f"{cfg.get('foreach_tensors') or 'default'} tensors per foreach list"
        + (f"; ops filter `{cfg['ops']}`" if cfg.get("ops") else "") + ".",
    ]
    for role, t in merged["torches"].items():
        cap = t["capture"]
        out.append(f"- {role}: torch {t['torch_version']} ({t['python']}): {cap.get('opinfos', 0)} OpInfos, "
                   f"{cap.get('samples', 0)} samples, {cap['calls_queried']} calls queried; "
                   f"worker {merged['timing'][role].get('wall_s')}s")
    out += [
        "", "### Contract violations, stock vs built",
        "Clause cells: OpSpecs violating the clause (ops). `errors`: strategy queries that raised. "
        "`refused`: runtime queries DTensor deliberately refuses (see 'Runtime refusals' below; a right "
        "answer, not an error). `no strategy`: queries answered with None (op unsupported for that input).",
        "", table(SUMMARY_HEADERS, summary_rows(merged)),
    ]
    built = [f"{r['mode']} {r['mesh']}: {n} violations, {e} errors"
             for r in merged["results"] if r["torch"] == "built" for n, _, e in [strict_counts(r)]]
    if built:
        out += ["", "Built (what `--strict` checks): " + "; ".join(built) + "."]
    for role, text in merged["reports"].items():
        out += ["", f"<details><summary><b>Ops that break the contract or raise ({role}), as `strategy_validation "
                "--contract` reports them</b></summary>\n", f"```{text.strip() or 'none'}\n```", "\n</details>"]
    rows = refusal_rows(merged)
    out += [
        "", "### Runtime refusals (contract_sweep.runtime_refusal)",
        "Runtime queries that raised one of the exceptions by which DTensor deliberately refuses an input "
        "placement, classified per query by message or exception type (stock refuses the same way). They are "
        "counted under `refused`, never as errors; the same calls are judged in planner mode.",
        table(["refusal", "torch", "ops", "queries", "where", "example ops", "why"], rows) if rows else "none",
        "", "### Runtime selections, stock vs built", *selection_lines(merged["selections"]),
    ]
    if merged["full_space"]:
        out += [
            "", "### Full space: planner answers vs a planner's own expansion of the single-dim rule",
            "Strategies a planner finds by expanding the registered rule itself over the same candidates "
            "(tools/audit/full_space.py) that get_op_strategy's answer lacks: `missing` fails --strict; those the "
            "expansion must drop are counted with their reason.",
            table(["torch", "candidates", "ops", "schemas", "missing", "ops missing", "not valid (with reason)",
                   "errors"], full_space_rows(merged)),
        ]
    if strict_reasons is not None:
        out += ["", "### Strict", "FAIL: " + "; ".join(strict_reasons) if strict_reasons else "PASS"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tools.audit", description=(__doc__ or "").splitlines()[0], allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(__doc__ or "").split("\n\n", 1)[1])
    ap.add_argument("--stock-python", default=".venv-stock/bin/python", help="python of the stock torch venv")
    ap.add_argument("--built-python", default=".venv/bin/python", help="python of the built torch venv")
    ap.add_argument("--only", choices=ROLES, help="run a single side")
    ap.add_argument("--ops", default=None,
                    help='comma-separated OpInfo names and/or aten op names, globs allowed (e.g. add,mm,"nn.functional.*")')
    ap.add_argument("--preload", default=None,
                    help="python file each worker runs after setup, before querying (tests plant strategies with it)")
    ap.add_argument("--out-dir", default="reports", help="where <report-name>.json and .md go")
    ap.add_argument("--report-name", default="audit", help="file name of the report, without suffix")
    ap.add_argument("--build-dir", default=".build/audit", help="worker JSON and logs")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 if the built torch breaks a clause, raises, selects differently from stock at "
                    "runtime (changed, regressed) or lacks a strategy of the full-space expansion")
    ap.add_argument("--full-space", default="audit,replicated",
                    help="candidate modes of the full-space comparison (tools/audit/full_space.py: audit, "
                    "replicated, partials; comma-separated; '' for none)")
    # the contract mode's own options (--meshes, --modes, --dtypes, --max-samples, --calls-per-op,
    # --candidates, --foreach-tensors, --query-timeout) go to the worker as given
    args, contract_options = ap.parse_known_args(argv)
    args.contract_options = contract_options
    unknown = {m for m in args.full_space.split(",") if m} - {"audit", "replicated", "partials"}
    if unknown:  # the worker would only find out after the whole sweep
        raise SystemExit(f"--full-space: unknown candidate modes {', '.join(sorted(unknown))}")

    roles = [args.only] if args.only else list(ROLES)
    build_dir = (REPO_ROOT / args.build_dir).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    merged = merge(run_workers(args, roles, build_dir))
    merged["timing"]["orchestrator_wall_s"] = round(time.monotonic() - t0, 1)
    reasons = None
    if args.strict:
        reasons = strict_failures(merged) + ([] if "built" in roles else ["--strict needs the built torch"])
    merged["strict"] = {"requested": args.strict, "failures": reasons or []}

    out_dir = (REPO_ROOT / args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{args.report_name}.json", out_dir / f"{args.report_name}.md"
    json_path.write_text(json.dumps(merged, indent=1) + "\n")
    text = render(merged, reasons)
    md_path.write_text(text)
    print(text)
    print(f"wrote {json_path} and {md_path} ({merged['timing']['orchestrator_wall_s']}s)")
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
