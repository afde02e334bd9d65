"""One side of the strategy-contract audit: runs inside one venv, writes one JSON.

Run from the repository root (the orchestrator does this for you)::

    .venv/bin/python -m tools.audit.worker --role built --out /tmp/built.json --op mm,t

Choosing the ops, capturing their calls, asking and judging every query and
counting the answers is the contract mode of ``strategy_validation``
(``_contract_validation``, what ``strategy_validation --contract`` runs, with the
same options and defaults). A torch that lacks it (stock) gets the repository's
copy loaded by path, with ``contract_sweep`` and the checker, so both torches are
swept and judged by the same code. This file adds only what the comparison of two
torches needs: DTensor's runtime selection for every runtime query, the
registries' coverage, cache sizes and timing.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

from tools._modules import load_by_path, write_json_atomically


REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CHECKER = REPO_ROOT / "torch/distributed/tensor/_ops/strategy_contract.py"
# The repository's modules the audit runs, by the name torch would import them as.
MODULES = {
    "torch.distributed.tensor._ops._op_returns": "torch/distributed/tensor/_ops/_op_returns.py",
    **{f"torch.testing._internal.distributed._tensor.{m}": f"torch/testing/_internal/distributed/_tensor/{m}.py"
       for m in ("contract_candidates", "contract_sweep", "contract_capture")},
    **{f"torch.distributed.tensor._ops.{m}": f"torch/distributed/tensor/_ops/{m}.py"
       for m in ("_contract_validation", "_contract_mode")},
}
REGISTRIES = ("single_dim", "op_strategy", "decomposition")
# Ops the per-op text of the report shows (failing ops; the JSON has them all).
REPORT_OPS = 15


def load_validation() -> Any:
    """``_contract_validation`` as the torch holds it, else the repository's copy (stock)."""
    for name, rel in MODULES.items():
        if name not in sys.modules and importlib.util.find_spec(name) is None:
            load_by_path(name, REPO_ROOT / rel)
    return importlib.import_module("torch.distributed.tensor._ops._contract_validation")


def load_mode() -> Any:
    """``_contract_mode`` (options, op selection and capture, report), loaded as above."""
    load_validation()
    return importlib.import_module("torch.distributed.tensor._ops._contract_mode")


def load_contract_sweep() -> Any:
    return load_validation().sweep


def load_checker(path: Path) -> Any:
    """Import strategy_contract.py from ``path`` so both torches are judged by the same file."""
    load_validation()  # the modules it imports, where this torch lacks them
    return load_by_path(f"_audit_{path.stem}", path)


def opinfo_label(info: Any) -> str:
    variant = getattr(info, "variant_test_name", "") or ""
    return f"{info.name}.{variant}" if variant else info.name


def query_id(call: Any) -> str:
    """A short id of a captured call, the same in every process and venv."""
    return hashlib.sha1(str(call).encode(), usedforsecurity=False).hexdigest()[:12]


def selection(cv: Any, runtime: Any, timeout: float | None) -> dict:
    """The strategy DTensor's dispatch selects for a runtime schema, in comparable form."""
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
    """A ``ContractValidation`` ``after_runtime`` hook recording DTensor's selection per runtime query."""

    def record(query: Any, answer: Any) -> None:
        mesh = "x".join(map(str, query.mesh.shape))
        if isinstance(answer.error, cv.QueryTimeout):
            sel = {"error": "QueryTimeout: not selected, the strategy query timed out"}
        else:
            sel = selection(cv, query.runtime, timeout)
        selections[f"{query_id(query.call)}|{mesh}|{query.label}"] = {"op": str(query.call.op), **sel}

    return record


def cache_sizes(propagator: Any) -> dict[str, dict[str, int | None]]:
    """Entries (and bound) of each strategy cache once every query has run.

    The shape-inference and redistribute-cost caches exist only on the built torch;
    DTensor's own sharding-propagation cache is on both.
    """
    info = propagator.propagate_op_sharding.cache_info()
    sizes: dict[str, dict[str, int | None]] = {"sharding_prop": {"entries": info.currsize, "bound": info.maxsize}}
    try:
        from torch.distributed.tensor._ops import _output_metas, _redistribute_cost_cache
    except ImportError:
        return sizes
    sizes["output_metas"] = {"entries": _output_metas.meta_cache_size(),
                             "bound": _output_metas._META_CACHE_SIZE}
    sizes["redistribute_cost"] = {"entries": _redistribute_cost_cache.cost_cache_size(),
                                  "bound": _redistribute_cost_cache.COST_CACHE_SIZE}
    return sizes


def coverage(sweep: Any, propagator: Any, captured: set[Any]) -> dict:
    """Registered ops the samples reached, per registry, and the captured ops DTensor does not know.

    ``captured`` holds every aten op a sample called (those called only without
    tensors, never queried, included).
    """
    from torch._decomp import decomposition_table

    single = {str(o) for o in propagator.op_single_dim_strategy_funcs}
    strat = {str(o) for o in propagator.op_strategy_funcs} - single
    # propagation rules: DTensor's runtime asks them after strategies; the contract mode
    # does not (on torch 2.13.0 every op with a rule also has a strategy)
    rules = {str(o) for o in propagator.op_to_rules} - single - strat
    direct = {*propagator.op_single_dim_strategy_funcs, *propagator.op_strategy_funcs, *propagator.op_to_rules}
    registered = {"single_dim": single, "op_strategy": strat, "rules": rules,
                  "decomposition": {str(o) for o in decomposition_table if o not in direct}}
    reached: dict[str, set[str]] = defaultdict(set)
    unregistered = []
    for op in captured:
        reg = sweep.strategy_registry(op) or ("rules" if str(op) in rules else None)
        if reg is None:
            unregistered.append(str(op))
        else:
            reached[reg].add(str(op))
    cov: dict[str, Any] = {}
    for reg in (*REGISTRIES, "rules"):
        got = reached.get(reg, set())
        known = registered[reg]
        cov[reg] = {"registered": None if reg == "decomposition" else len(known),
                    "reached": len(got) if reg == "decomposition" else len(got & known),
                    "not_reached": sorted(known - got)}
    cov["decomposition"]["decomposition_table_entries"] = len(registered["decomposition"])
    # op_to_rules entries also registered as strategies never reach their rule at runtime
    cov["rules"]["shadowed_by_strategies"] = sorted({str(o) for o in propagator.op_to_rules} - rules)
    cov["unregistered_captured"] = sorted(unregistered)
    return cov


def results_json(cv: Any, validation: Any) -> list[dict[str, Any]]:
    """Per (mode, mesh) of the contract mode's counts: totals, per registry, details per op."""
    out = []
    for (mode, mesh), per_op in validation.results.items():
        ops = sorted(per_op.values(), key=lambda c: c.op)
        rec: dict[str, Any] = {"mode": mode, "mesh": mesh, **cv.totals(ops)}
        rec["by_registry"] = {r: cv.totals(c for c in ops if c.registry == r) for r in sorted({c.registry for c in ops})}
        for name, attr in (("error_details", "errors"), ("refusal_details", "refusals")):
            rec[name] = sorted((e for c in ops for e in getattr(c, attr).values()),
                               key=lambda d: (d["op"], d["type"], d["message"]))
        rec["violating_ops"] = [{"op": c.op, "registry": c.registry, "specs_by_clause": dict(sorted(c.clauses.items())),
                                 "example": next(iter(c.examples.values()))["violation"], "examples": c.examples}
                                for c in ops if c.clauses]
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore")
    t_start = time.monotonic()
    cv, mode = load_validation(), load_mode()
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode.add_arguments(ap)
    ap.add_argument("--op", "--ops", dest="op", default=None, help="as strategy_validation's --op")
    ap.add_argument("--all-registered", action="store_true", help="every OpInfo (the default without --op)")
    ap.add_argument("--max-samples", type=int, default=None, help="samples per OpInfo and dtype (default 3)")
    ap.add_argument("--role", default="torch", help="label used in progress lines and the JSON (stock/built)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--checker", default=str(DEFAULT_CHECKER), help="path of strategy_contract.py")
    ap.add_argument("--preload", default=None, help="python file to run after setup, before querying")
    ap.add_argument("--full-space", default="", help="full_space candidate modes to compare planner answers in "
                    "(comma-separated; empty: none)")
    args = ap.parse_args(argv)
    checker = load_checker(Path(args.checker))

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    if args.preload:
        # run once DTensor is set up, before anything is queried (tests plant a bad strategy)
        import runpy

        runpy.run_path(args.preload, run_name="__audit_preload__")
    selections: dict[str, dict] = {}
    after_runtime = selection_recorder(cv, selections, args.query_timeout)
    last = [0.0]

    def progress(phase: str, n: int, total: int) -> None:
        now = time.monotonic()
        if now - last[0] > 0.5 or n == total:
            print(f"[audit {args.role}] {phase} {n}/{total}", file=sys.stderr, flush=True)
            last[0] = now

    t_setup = time.monotonic()
    validation, recorder, counts = mode.validate(
        args, checker.check_strategy_contract, checker.infer_output_metas, after_runtime, progress)
    t_query = time.monotonic()

    captured = set(recorder.calls) | set(recorder.tensorless)
    stats = {
        "opinfos": counts.get("opinfos", 0), "samples": counts.get("samples", 0),
        "sample_failures": counts.get("samples failed", 0) + counts.get("in-place samples failed", 0),
        "aten_ops_captured": len(captured),
        # ops called only without a tensor argument (factories): DTensor never sees those calls
        "aten_ops_without_tensor_calls": sum(1 for op in captured if op not in recorder.calls),
        "calls_queried": sum(len(v) for v in validation.calls.values()),
    }
    first: dict[str, Any] = next(iter(validation.results.values()), {})
    infer_failed = [{"op": c.op, "type": e["type"], "message": e["message"], "calls": e["calls"]}
                    for c in first.values() for e in c.uninferable.values()]
    doc = {
        "torch": args.role, "torch_version": torch.__version__, "torch_file": torch.__file__,
        "python": sys.executable, "checker": str(Path(args.checker).resolve()),
        "config": {"ops": args.op, "meshes": args.meshes, "modes": args.modes, "dtypes": args.dtypes,
                   "max_samples": args.max_samples or 3, "max_calls_per_op": args.calls_per_op,
                   "max_candidates": args.candidates, "foreach_tensors": args.foreach_tensors,
                   "query_timeout": args.query_timeout, "preload": args.preload},
        "capture": {"stats": stats, "counts": dict(sorted(counts.items()))},
        "caches": cache_sizes(DTensor._op_dispatcher.sharding_propagator),
        "results": results_json(cv, validation),
        # the contract mode's text: its ops that break the contract or raise, and its summary
        "report": mode.format_ops(validation, only_failed=True, limit=REPORT_OPS),
        "summary": mode.format_summary(validation, per_op_table=False),
        "infer_failed": sorted(infer_failed, key=lambda d: d["op"]),
        "refusal_reasons": {**cv.sweep.RUNTIME_REFUSALS,
                            **{t.__name__: r for t, r in cv.sweep.RUNTIME_REFUSAL_TYPES.items()}},
        "coverage": coverage(cv.sweep, DTensor._op_dispatcher.sharding_propagator, captured),
        "selections": selections,
        "timing": {"startup_s": round(t_setup - t_start, 1), "query_s": round(t_query - t_setup, 1),
                   "total_s": round(time.monotonic() - t_start, 1), "cpu_s": round(time.process_time(), 1)},
    }
    if args.full_space:
        # planner answers against a planner's own expansion of each single-dim rule
        from tools.audit import full_space

        doc["full_space"] = full_space.audit(
            validation.calls, validation.meshes.items(), args.candidates,
            modes=tuple(m for m in args.full_space.split(",") if m))
    write_json_atomically(Path(args.out), doc)
    print(f"[audit {args.role}] done in {doc['timing']['total_s']}s -> {args.out}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
