"""Running one benchmark worker process, as the orchestrator does.

``python -m tools.bench`` starts each measured side in its own interpreter,
with a quiet environment (one intra-op thread, no warnings, no bytecode
writes), so that both sides run alike, and a failure report naming the worker.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]


def run_worker_process(cmd: list[str], what: str, timeout: float, outputs: list[Path]) -> None:
    """Run ``cmd`` from the repository root; SystemExit naming ``what`` unless it exits 0
    and leaves every file of ``outputs``."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONDONTWRITEBYTECODE="1")
    try:
        proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{what}: worker timed out after {timeout} s\n"
                         f"  command: {shlex.join(cmd)}") from None
    if proc.returncode != 0 or not all(f.exists() for f in outputs):
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise SystemExit(f"{what}: worker failed (exit {proc.returncode})\n"
                         f"  command: {shlex.join(cmd)}\n{tail}")


def resolve_python(path: str, role: str) -> str:
    """``path`` (relative to the repository root) if that interpreter exists, else
    SystemExit saying how to get it."""
    py = Path(path)
    if not py.is_absolute():
        py = REPO_ROOT / py
    if not py.exists():
        raise SystemExit(f"{role} python not found: {py} (run `make build`, or pass --{role}-python)")
    return str(py)
