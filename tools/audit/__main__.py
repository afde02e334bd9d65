"""Check DTensor sharding strategies against the strategy contract (C1-C5), stock torch vs built torch.

A worker under each interpreter captures the aten calls OpInfo samples make, asks DTensor's
registries for their strategies as dispatch (runtime), a planner and a rule author (utility)
ask, and judges every OpSpec with strategy_contract.py. The results go to
<out-dir>/audit.json and audit.md; worker logs and raw JSON to .build/audit/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools.audit.report import MESHES, MODES, ROLES, merge, refusal_candidates, render, summary_table

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_DIR = REPO_ROOT / ".build" / "audit"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tools.audit", description=__doc__,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--stock-python", default=".venv-stock/bin/python", help="python of the unmodified torch")
    ap.add_argument("--built-python", default=".venv/bin/python", help="python of the torch with the change")
    ap.add_argument("--ops", default=None, help="OpInfo (or run by hand) names, comma-separated (unset: every "
                    "OpInfo database); a name expands to the aten calls captured from its samples")
    ap.add_argument("--modes", default=",".join(MODES), help="query modes, comma-separated")
    ap.add_argument("--meshes", default=",".join(MESHES), help="meshes over a fake world of 4, comma-separated")
    ap.add_argument("--samples", type=int, default=6, help="samples per OpInfo whose aten calls are captured")
    ap.add_argument("--per-op", type=int, default=4, help="distinct calls asked per op at most (0: all)")
    ap.add_argument("--strict", action="store_true",
                    help="exit 1 when the built torch has any violation, error, planner query without a strategy "
                    "or refusal stock does not make, or (a full audit) asks under 95%% of the registered ops")
    ap.add_argument("--out-dir", default=None,
                    help="where audit.json and audit.md go (default: reports/; with --ops, .build/audit/, so a "
                    "partial audit never overwrites the tracked reports)")
    ap.add_argument("--jobs", type=int, default=2, choices=(1, 2), help="workers run at once (2: stock and built)")
    args = ap.parse_args(argv)
    for name, allowed in (("modes", MODES), ("meshes", MESHES)):
        given = [v for v in getattr(args, name).split(",") if v]
        unknown = sorted(set(given) - set(allowed))
        if unknown or not given:
            problem = f"--{name}: unknown or empty {unknown or given}; choose from {', '.join(allowed)}"
            ap.error(problem)
        setattr(args, name, [v for v in allowed if v in given])  # a fixed order keeps the report stable
    if args.samples < 1:
        ap.error("--samples must be at least 1")
    if args.per_op < 0:
        ap.error("--per-op must be 0 (all) or more")
    if args.out_dir is None:
        args.out_dir = str(BUILD_DIR) if args.ops else "reports"
    return args


def start_worker(role: str, python: str, args: argparse.Namespace,
                 task: list[str] | None = None) -> subprocess.Popen[bytes]:
    """One worker, its output to .build/audit/<role>.log and <role>.json: the audit, or ``task``'s arguments."""
    exe = Path(python).absolute()  # not resolved: a venv's python is a symlink that must stay one
    exe = exe if exe.exists() else REPO_ROOT / python
    if not exe.exists():
        raise SystemExit(f"{role} python not found: {exe} (pass --{role}-python)")
    out = BUILD_DIR / f"{role}.json"
    out.unlink(missing_ok=True)  # a failed run must not leave the previous results to read
    audit = ["--modes", ",".join(args.modes), "--samples", str(args.samples), "--per-op", str(args.per_op),
             *(["--ops", args.ops] if args.ops else [])]
    cmd = [str(exe), "-m", "tools.audit.worker", "--out", str(out), "--meshes", ",".join(args.meshes),
           *(audit if task is None else task)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONDONTWRITEBYTECODE": "1"}
    with open(BUILD_DIR / f"{role}.log", "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def finish_worker(role: str, proc: subprocess.Popen[bytes], started: float) -> dict:
    """The worker's JSON once it exits; its log's tail and exit 2 when it failed."""
    proc.wait()
    out, log = BUILD_DIR / f"{role}.json", BUILD_DIR / f"{role}.log"
    if proc.returncode != 0 or not out.exists():
        text = log.read_text() if log.exists() else f"{log} is gone (was {BUILD_DIR} removed during the run?)"
        tail = "\n".join("    " + line for line in text.splitlines()[-20:])
        print(f"[audit] {role} worker failed (exit {proc.returncode}); end of {log}:\n{tail}", file=sys.stderr)
        raise SystemExit(2)
    print(f"[audit] {role} worker done in {time.monotonic() - started:.0f}s", flush=True)
    return json.loads(out.read_text())


def run_workers(args: argparse.Namespace) -> dict[str, dict]:
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    docs: dict[str, dict] = {}
    started = time.monotonic()
    pending: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for role in ROLES:
            pending[role] = start_worker(role, getattr(args, f"{role}_python"), args)
            if args.jobs == 1:
                docs[role] = finish_worker(role, pending.pop(role), started)
        for role, proc in pending.items():
            docs[role] = finish_worker(role, proc, started)
    finally:
        for proc in pending.values():
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    return docs


def ask_stock_eager(args: argparse.Namespace, asks: list[dict[str, str]]) -> list[dict]:
    """Stock's eager DTensor on ``asks`` (``refusal_candidates``), by the stock python on the calls its
    worker saved."""
    path = BUILD_DIR / "stock-eager-asks.json"
    path.write_text(json.dumps(asks, indent=1) + "\n")
    task = ["--eager-asks", str(path), "--calls", str(BUILD_DIR / "stock.json.calls")]
    started = time.monotonic()
    proc = start_worker("stock-eager", args.stock_python, args, task)
    try:
        return list(finish_worker("stock-eager", proc, started))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    print(f"[audit] workers running, logs in {BUILD_DIR}/", flush=True)
    config = {"ops": args.ops, "modes": args.modes, "meshes": args.meshes, "samples": args.samples,
              "per_op": args.per_op}
    docs = run_workers(args)
    asks = refusal_candidates(docs)
    report = merge(docs, config, ask_stock_eager(args, asks) if asks else [])
    out_dir = Path(args.out_dir) if Path(args.out_dir).is_absolute() else REPO_ROOT / args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    # The tracked JSON holds the counts; the per-op examples are in audit.md and .build.
    listed = ("new_refusals", "stock_eager_raises")
    counts = {**report, "results": [
        {k: {"counts": v["counts"]} if k in ("stock", "built") else v for k, v in r.items() if k not in listed}
        | {k: len(r[k]) for k in listed}
        for r in report["results"]
    ]}
    (BUILD_DIR / "audit-full.json").write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    (out_dir / "audit.json").write_text(json.dumps(counts, indent=1, sort_keys=True) + "\n")
    (out_dir / "audit.md").write_text(render(report))
    print(summary_table(report))
    failures = report["strict_failures"]
    print("strict: " + ("FAIL: " + "; ".join(failures) if failures else "PASS"))
    print(f"[audit] wrote {out_dir / 'audit.json'} and audit.md in {time.monotonic() - started:.0f}s")
    return 1 if args.strict and failures else 0


if __name__ == "__main__":
    sys.exit(main())
