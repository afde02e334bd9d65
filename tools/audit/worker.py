"""One side of the audit: runs inside one venv, writes one JSON.

Run from the repository root (the orchestrator does this for you)::

    .venv/bin/python -m tools.audit.worker --role built --out /tmp/built.json --op mm,t

The judging is the contract mode of ``strategy_validation``, with its options and
defaults, loaded by path where a torch lacks it (stock), so both torches are judged by
the same code. This adds what comparing two torches needs: DTensor's runtime selection
per runtime query and, on the built torch, the full-space comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import runpy
import sys
import time
import warnings
from pathlib import Path
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

from tools._modules import load_by_path, write_json_atomically


REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKER = REPO_ROOT / "torch/distributed/tensor/_ops/strategy_contract.py"
# The repository's modules the audit runs, by the name torch would import them as.
MODULES = {
    "torch.distributed.tensor._ops._op_returns": "torch/distributed/tensor/_ops/_op_returns.py",
    **{f"torch.testing._internal.distributed._tensor.{m}": f"torch/testing/_internal/distributed/_tensor/{m}.py"
       for m in ("contract_candidates", "contract_sweep", "contract_capture")},
    **{f"torch.distributed.tensor._ops.{m}": f"torch/distributed/tensor/_ops/{m}.py"
       for m in ("_contract_validation", "_contract_mode")},
}
# Failing ops the per-op text of the report shows (the JSON counts them all).
REPORT_OPS = 15


def load_validation() -> Any:
    """``_contract_validation`` as the torch holds it, else the repository's copy (stock)."""
    for name, rel in MODULES.items():
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            load_by_path(name, REPO_ROOT / rel)
    return importlib.import_module("torch.distributed.tensor._ops._contract_validation")


def load_mode() -> Any:
    """``_contract_mode`` (options, op selection, capture and report), loaded as above."""
    load_validation()
    return importlib.import_module("torch.distributed.tensor._ops._contract_mode")


def load_checker() -> Any:
    """The repository's strategy_contract.py, loaded by path so both torches are judged by one file."""
    load_validation()  # the modules it imports, where this torch lacks them
    return load_by_path("_audit_strategy_contract", CHECKER)


def query_id(call: Any) -> str:
    """A short id of a captured call, the same in every process and venv."""
    return hashlib.sha1(str(call).encode(), usedforsecurity=False).hexdigest()[:12]


def selection(cv: Any, runtime: Any, timeout: float | None) -> dict[str, Any]:
    """What DTensor's dispatch selects for a runtime schema, as plain data both torches compare on."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec

    def plc(x: Any) -> Any:
        if isinstance(x, DTensorSpec):
            return str(tuple(x.placements))
        if isinstance(x, (list, tuple)):
            return [plc(e) for e in x]
        return None if x is None else type(x).__name__

    try:
        with cv.time_limit(timeout):
            out = cv.sweep.runtime_selection(runtime)
    except (Exception, cv.QueryTimeout) as e:
        kind, message = cv._short(e)
        return {"error": f"{kind}: {message}"}
    rec = {"output": plc(out.output_spec), "needs_redistribute": bool(out.needs_redistribute)}
    if out.redistribute_schema is not None:
        rec["redistribute"] = [str(tuple(s.placements)) for s in out.redistribute_schema.args_spec]
    return rec


def selection_recorder(cv: Any, selections: dict[str, dict], timeout: float | None) -> Callable[[Any, Any], None]:
    """A contract-mode ``after_runtime`` hook recording DTensor's selection per runtime query."""

    def record(query: Any, answer: Any) -> None:
        mesh = "x".join(map(str, query.mesh.shape))
        if isinstance(answer.error, cv.QueryTimeout):
            sel = {"error": "QueryTimeout: not selected, the strategy query timed out"}
        else:
            sel = selection(cv, query.runtime, timeout)
        selections[f"{query_id(query.call)}|{mesh}|{query.label}"] = {"op": str(query.call.op), **sel}

    return record


def results_json(cv: Any, validation: Any) -> list[dict[str, Any]]:
    """Per (mode, mesh): the contract mode's totals, per registry, and the details per op."""
    out = []
    for (mode, mesh), per_op in validation.results.items():
        ops = sorted(per_op.values(), key=lambda c: c.op)
        rec: dict[str, Any] = {"mode": mode, "mesh": mesh, **cv.totals(ops)}
        rec["by_registry"] = {r: cv.totals(c for c in ops if c.registry == r) for r in sorted({c.registry for c in ops})}
        for name, attr in (("error_details", "errors"), ("refusal_details", "refusals")):
            rec[name] = sorted((e for c in ops for e in getattr(c, attr).values()),
                               key=lambda d: (d["op"], d["type"], d["message"]))
        rec["violating_ops"] = [{"op": c.op, "registry": c.registry, "specs_by_clause": dict(sorted(c.clauses.items())),
                                 "examples": c.examples} for c in ops if c.clauses]
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    t_start = time.monotonic()
    cv, contract_mode = load_validation(), load_mode()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    contract_mode.add_arguments(ap)
    ap.add_argument("--op", "--ops", dest="op", default=None, help="as strategy_validation's --op")
    ap.add_argument("--max-samples", type=int, default=None, help="samples per OpInfo and dtype (default 3)")
    ap.add_argument("--role", default="torch", help="stock or built: in progress lines and the JSON")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--preload", default=None, help="python file to run after setup, before querying")
    ap.add_argument("--full-space", default="", help="full_space.py candidate modes, comma-separated")
    ap.set_defaults(all_registered=False)
    args = ap.parse_args(argv)
    checker = load_checker()

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    if args.preload:
        # once DTensor is set up, before anything is queried (tests plant a bad strategy)
        runpy.run_path(args.preload, run_name="__audit_preload__")
    selections: dict[str, dict] = {}
    shown = [""]

    def progress(phase: str, n: int, total: int) -> None:
        step = f"{phase} {10 * n // max(total, 1)}"
        if step != shown[0]:
            shown[0] = step
            print(f"[audit {args.role}] {phase} {n}/{total}", file=sys.stderr, flush=True)

    t_setup = time.monotonic()
    validation, _, counts = contract_mode.validate(
        args, checker.check_strategy_contract, checker.infer_output_metas,
        selection_recorder(cv, selections, args.query_timeout), progress)
    t_query = time.monotonic()
    doc: dict[str, Any] = {
        "torch": args.role, "torch_version": torch.__version__, "python": sys.executable,
        "config": {"ops": args.op, "meshes": args.meshes, "modes": args.modes, "dtypes": args.dtypes,
                   "max_samples": args.max_samples or 3, "max_calls_per_op": args.calls_per_op,
                   "max_candidates": args.candidates, "foreach_tensors": args.foreach_tensors,
                   "query_timeout": args.query_timeout, "preload": args.preload},
        "capture": {**counts, "calls_queried": sum(len(v) for v in validation.calls.values())},
        "results": results_json(cv, validation),
        # the contract mode's own text: its ops that break the contract or raise, and its summary
        "report": contract_mode.format_ops(validation, only_failed=True, limit=REPORT_OPS),
        "summary": contract_mode.format_summary(validation, per_op_table=False),
        "refusal_reasons": {**cv.sweep.RUNTIME_REFUSALS,
                            **{t.__name__: r for t, r in cv.sweep.RUNTIME_REFUSAL_TYPES.items()}},
        "selections": selections,
    }
    if args.full_space:
        from tools.audit import full_space

        doc["full_space"] = full_space.audit(validation.calls, validation.meshes.items(), args.candidates,
                                             [m for m in args.full_space.split(",") if m])
    doc["timing"] = {"startup_s": round(t_setup - t_start, 1), "query_s": round(t_query - t_setup, 1),
                     "total_s": round(time.monotonic() - t_start, 1)}
    write_json_atomically(Path(args.out), doc)
    print(f"[audit {args.role}] done in {doc['timing']['total_s']}s -> {args.out}", file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
