"""One side of the strategy-contract audit: runs inside one venv, writes one JSON.

Run from the repository root (the orchestrator does this for you)::

    .venv/bin/python -m tools.audit.worker --role built --out /tmp/built.json --ops mm,t

The capture, the queries and the judging of refusals are the repository's
``contract_sweep`` (the harness the registry test sweeps with), loaded by path
so that the stock torch, which lacks it, is swept exactly like the built one.
This file only drives it and counts:

1. an in-process fake process group (world size 8) and CPU device meshes;
2. ``contract_sweep.capture_calls`` over the OpInfo db (forward, in-place
   variant, backward of float32 samples), calls capped per aten op, then
   ``select_calls`` per op;
3. every selected call asked through ``RegistrySweep.queries``/``ask`` the way
   dispatch asks ("runtime": one placement per input), the way a planner asks
   ("planner": several candidates per input) and as a rule author expands
   single-dim rules ("utility"), each answer judged by the repository's
   ``strategy_contract.py`` checker; DTensor's runtime selection recorded;
4. counts, examples, errors, refusals, coverage and selections go to JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import signal
import sys
import threading
import time
import traceback
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TYPE_CHECKING

from tools._modules import load_by_path, write_json_atomically

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence


REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CHECKER = REPO_ROOT / "torch/distributed/tensor/_ops/strategy_contract.py"
CONTRACT_SWEEP = REPO_ROOT / "torch/testing/_internal/distributed/_tensor/contract_sweep.py"

REGISTRIES = ("single_dim", "op_strategy", "decomposition")
MODES = ("runtime", "planner", "utility")
DTYPE_NAMES = ("float32", "bfloat16", "int64", "bool", "complex64")
# Samples of these dtypes also run backward (the others only forward and in-place).
BACKWARD_DTYPE_NAMES = ("float32",)


def _progress(role: str, phase: str, done: int, total: int) -> None:
    print(f"[audit {role}] {phase} {done}/{total}", file=sys.stderr, flush=True)


def _short_error(exc: BaseException) -> tuple[str, str]:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if len(first) > 300:
        first = first[:297] + "..."
    return type(exc).__name__, first


def _raised_at(exc: BaseException) -> str:
    """``file.py:line in func`` of the innermost frame that raised (empty messages need it)."""
    where = getattr(exc, "where", None)
    if where:
        return str(where)
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return ""
    code = last.tb_frame.f_code
    return f"{Path(code.co_filename).name}:{last.tb_lineno} in {code.co_name}"


def load_contract_sweep() -> Any:
    """The repo's contract_sweep (stock torch does not have it), loaded once."""
    name = "_audit_contract_sweep"
    if name in sys.modules:
        return sys.modules[name]
    return load_by_path(name, CONTRACT_SWEEP)


def load_checker(path: Path) -> Any:
    """Import strategy_contract.py from ``path`` so both torches are judged by the same file."""
    return load_by_path(f"_audit_{path.stem}", path)


# --------------------------------------------------------------------------------------
# Op selection (--ops)
# --------------------------------------------------------------------------------------


def opinfo_label(info: Any) -> str:
    variant = getattr(info, "variant_test_name", "") or ""
    return f"{info.name}.{variant}" if variant else info.name


def aten_names(op: Any) -> tuple[str, ...]:
    """Names an aten op answers to in --ops: ``aten.mm.default``, ``mm.default``, ``mm``."""
    full = str(op)
    packet = op._schema.name.split("::")[-1]
    overload = op._overloadname
    return (full, f"{packet}.{overload}", packet)


def _match(pattern: str, names: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch.fnmatchcase(n, pattern) for n in names)


def opinfo_names(info: Any) -> list[str]:
    names = [info.name, opinfo_label(info)]
    aten_name = getattr(info, "aten_name", None)
    if aten_name:
        names.append(aten_name)
    return names


@dataclass
class OpFilter:
    """``--ops`` patterns: OpInfo names (sample those) and/or aten op names (keep those calls)."""

    patterns: list[str]
    opinfo_patterns: list[str] = field(default_factory=list)
    aten_patterns: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str | None, all_opinfos: list[Any]) -> OpFilter:
        patterns = [p.strip() for p in (text or "").split(",") if p.strip()]
        flt = cls(patterns)
        for p in patterns:
            if any(_match(p, opinfo_names(i)) for i in all_opinfos):
                flt.opinfo_patterns.append(p)
            else:
                # Not an OpInfo name: taken as an aten op name (matched on capture).
                flt.aten_patterns.append(p)
        return flt

    @property
    def active(self) -> bool:
        return bool(self.patterns)

    def opinfo_selected(self, info: Any) -> bool:
        return any(_match(p, opinfo_names(info)) for p in self.opinfo_patterns)

    def aten_selected(self, op: Any) -> bool:
        return any(_match(p, aten_names(op)) for p in self.aten_patterns)


# --------------------------------------------------------------------------------------
# Capture (contract_sweep.capture_calls)
# --------------------------------------------------------------------------------------


def _no_test_fn() -> None:
    return None


def all_opinfos() -> list[Any]:
    """The OpInfo db the registry test sweeps (the parity sweep samples it too)."""
    import torch.testing._internal.common_utils as common_utils
    import torch.testing._internal.opinfo.core as opinfo_core

    # OpInfo.sample_inputs (which the parity sweep calls) looks for the running
    # unittest by walking the stack with inspect.stack(). There is no test here,
    # and that walk costs ~0.4s per call once torch.distributed is imported.
    common_utils.extract_test_fn = _no_test_fn
    opinfo_core.extract_test_fn = _no_test_fn
    return load_contract_sweep().opinfo_db()


def capture(args: argparse.Namespace, flt: OpFilter) -> tuple[Any, dict]:
    """Run OpInfo samples under one contract_sweep CallRecorder; return it and capture stats.

    OpInfos an --ops pattern names record every aten call they make; with aten
    patterns, the other OpInfos still run and record only the matching ops.
    """
    import torch

    sweep = load_contract_sweep()
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    backward_dtypes = {getattr(torch, d) for d in BACKWARD_DTYPE_NAMES}
    chosen: list[tuple[Any, bool]] = []  # (info, keep every op it calls)
    for info in all_opinfos():
        if not flt.active or flt.opinfo_selected(info):
            chosen.append((info, True))
        elif flt.aten_patterns:
            chosen.append((info, False))

    recorder = sweep.CallRecorder(args.pool_cap)
    counts: Counter = Counter()
    last = 0.0
    for n, (info, everything) in enumerate(chosen, 1):
        recorder.keep = None if everything else flt.aten_selected
        _, got = sweep.capture_calls(
            [info],
            dtypes=(),
            extra_dtypes=dtypes,  # every dtype of the list the OpInfo supports
            samples=args.max_samples,
            backward=True,
            backward_dtypes=backward_dtypes,
            foreach_tensors=args.foreach_tensors or None,
            recorder=recorder,
        )
        counts.update(got)
        now = time.monotonic()
        if now - last > 0.5 or n == len(chosen):
            _progress(args.role, "capture", n, len(chosen))
            last = now
    stats = {
        "opinfos": counts["opinfos"],
        "samples": counts["samples"],
        "sample_failures": counts["samples failed"] + counts["in-place samples failed"],
        "sample_generation_failures": counts["sample_inputs failed"],
        "backward_runs": counts["backward runs"],
        "inplace_runs": counts["in-place runs"],
        "calls_seen": recorder.seen,
        "calls_non_dense": recorder.not_dense,
        # aten calls without a tensor argument (factories): DTensor never sees them
        "calls_without_tensors": sum(recorder.tensorless.values()),
    }
    return recorder, {"stats": stats, "counts": dict(sorted(counts.items()))}


# --------------------------------------------------------------------------------------
# Counting
# --------------------------------------------------------------------------------------


def _spec_id(v: Any) -> tuple[int, int]:
    """(child index or -1, strategy index) of the OpSpec a violation is about."""
    child = -1
    if v.clause == "C5" and v.position.startswith("child "):
        try:
            child = int(v.position.split()[1])
        except ValueError:
            pass
    return child, v.strategy_index


class Bucket:
    """Counts for one (mode, mesh), optionally for one registry."""

    def __init__(self, clauses: tuple[str, ...]) -> None:
        self.clauses = clauses
        self.ops: set[str] = set()
        self.ops_violating: set[str] = set()
        self.ops_by_clause: dict[str, set[str]] = {c: set() for c in clauses}
        self.specs_by_clause: dict[str, int] = dict.fromkeys(clauses, 0)
        self.c5_by_child_clause: Counter = Counter()
        self.queries = 0
        self.specs_checked = 0
        self.errors = 0
        self.ops_with_errors: set[str] = set()
        self.refused = 0
        self.ops_refused: set[str] = set()
        self.no_strategy = 0
        self.ops_no_strategy: set[str] = set()

    def add(self, op: str, violations: Sequence[Any], n_specs: int) -> None:
        self.ops.add(op)
        self.queries += 1
        self.specs_checked += n_specs
        per_clause: dict[str, set] = defaultdict(set)
        for v in violations:
            per_clause[v.clause].add(_spec_id(v))
            if v.clause == "C5" and v.child_clause:
                self.c5_by_child_clause[v.child_clause] += 1
        for clause, ids in per_clause.items():
            self.specs_by_clause[clause] = self.specs_by_clause.get(clause, 0) + len(ids)
            self.ops_by_clause.setdefault(clause, set()).add(op)
        if violations:
            self.ops_violating.add(op)

    def add_error(self, op: str) -> None:
        self.ops.add(op)
        self.queries += 1
        self.errors += 1
        self.ops_with_errors.add(op)

    def add_refusal(self, op: str) -> None:
        self.ops.add(op)
        self.queries += 1
        self.refused += 1
        self.ops_refused.add(op)

    def add_none(self, op: str) -> None:
        self.ops.add(op)
        self.queries += 1
        self.no_strategy += 1
        self.ops_no_strategy.add(op)

    def to_json(self) -> dict:
        return {
            "ops_sampled": len(self.ops),
            "ops_with_violations": len(self.ops_violating),
            "violations": {c: self.specs_by_clause.get(c, 0) for c in self.clauses},
            "ops_by_clause": {c: len(self.ops_by_clause.get(c, ())) for c in self.clauses},
            "c5_by_child_clause": dict(sorted(self.c5_by_child_clause.items())),
            "errors": self.errors,
            "ops_with_errors": len(self.ops_with_errors),
            "refused": self.refused,
            "ops_refused": len(self.ops_refused),
            "no_strategy": self.no_strategy,
            "ops_no_strategy": len(self.ops_no_strategy),
            "queries": self.queries,
            "specs_checked": self.specs_checked,
        }


def cache_sizes(propagator: Any) -> dict[str, dict[str, int | None]]:
    """Entries (and bound) of each strategy cache once every query has run.

    The shape-inference and redistribute-cost caches exist only on the built torch;
    DTensor's own sharding-propagation cache is on both.
    """
    sizes: dict[str, dict[str, int | None]] = {}
    info = propagator.propagate_op_sharding.cache_info()
    sizes["sharding_prop"] = {"entries": info.currsize, "bound": info.maxsize}
    try:
        from torch.distributed.tensor._ops import _output_metas, _redistribute_cost_cache
    except ImportError:
        return sizes
    sizes["output_metas"] = {
        "entries": _output_metas.meta_cache_size(),
        "bound": _output_metas._META_CACHE_SIZE,
    }
    sizes["redistribute_cost"] = {
        "entries": _redistribute_cost_cache.cost_cache_size(),
        "bound": _redistribute_cost_cache.COST_CACHE_SIZE,
    }
    return sizes


def _count_specs(strategy: Any) -> int:
    from torch.distributed.tensor._op_schema import OpStrategy, TupleStrategy

    if isinstance(strategy, OpStrategy):
        return len(strategy.strategies)
    if isinstance(strategy, TupleStrategy):
        return sum(_count_specs(c) for c in strategy.children)
    return 0


def query_id(call: Any) -> str:
    """A short id of a captured call, the same in every process and venv."""
    return hashlib.sha1(str(call).encode(), usedforsecurity=False).hexdigest()[:12]


# --------------------------------------------------------------------------------------
# Driving contract_sweep
# --------------------------------------------------------------------------------------


class QueryTimeout(BaseException):
    """A query used more CPU time than --query-timeout.

    A BaseException, so that DTensor's own ``except Exception`` (decomposition
    fallbacks, for instance) and ``RegistrySweep.ask`` cannot swallow it.
    """

    # where the query was when its time ran out (set by time_limit)
    where: str = ""


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise QueryTimeout in the block once it used ``seconds`` of CPU time (main thread only)."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        exc = QueryTimeout(f"query used more than {seconds:g}s of CPU (--query-timeout)")
        if frame is not None:
            # where the query was when time ran out, not this handler
            exc.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
        raise exc

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


class Auditor:
    """Asks contract_sweep's queries of each call on each mesh and mode, and counts the answers."""

    def __init__(self, args: argparse.Namespace, checker: Any,
                 calls: Mapping[Any, Sequence[Any]] | None = None) -> None:
        from torch.distributed.tensor import DTensor

        self.args = args
        self.checker = checker
        self.sweep = load_contract_sweep()
        self.p = DTensor._op_dispatcher.sharding_propagator
        self.registry_sweep = self.sweep.RegistrySweep(
            calls or {},
            checker.check_strategy_contract,
            checker.infer_output_metas,
            self.sweep.first_candidates(args.max_candidates),
        )
        self.meshes = self._make_meshes(args.meshes)
        self.modes = [m for m in args.modes.split(",") if m]
        for mode in self.modes:
            if mode not in MODES:
                raise SystemExit(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
        self.buckets: dict[tuple[str, str], Bucket] = {}
        self.reg_buckets: dict[tuple[str, str, str], Bucket] = {}
        self.error_details: dict[tuple, dict] = {}
        self.refusal_details: dict[tuple, dict] = {}
        self.violating: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
        self.selections: dict[str, dict] = {}
        self.infer_failed: dict[str, dict] = {}
        self.slow: list[tuple[float, str]] = []
        self.op_seconds: dict[str, float] = defaultdict(float)

    @staticmethod
    def _make_meshes(spec: str) -> list[tuple[str, Any]]:
        import math

        import torch
        from torch.distributed.device_mesh import DeviceMesh

        meshes = []
        for name in [s.strip() for s in spec.split(",") if s.strip()]:
            shape = [int(x) for x in name.split("x")]
            n = math.prod(shape)
            if n > 8:
                raise SystemExit(f"mesh {name} needs {n} ranks; the fake process group has 8")
            meshes.append((name, DeviceMesh("cpu", torch.arange(n).reshape(shape))))
        return meshes

    def bucket(self, mode: str, mesh: str, reg: str) -> tuple[Bucket, Bucket]:
        key = (mode, mesh)
        if key not in self.buckets:
            self.buckets[key] = Bucket(self.checker.CLAUSES)
        rkey = (mode, mesh, reg)
        if rkey not in self.reg_buckets:
            self.reg_buckets[rkey] = Bucket(self.checker.CLAUSES)
        return self.buckets[key], self.reg_buckets[rkey]

    # -- one call ----------------------------------------------------------------------

    def audit_call(self, call: Any) -> None:
        """Every query of ``call``: per mesh, its runtime, planner and utility queries."""
        op = str(call.op)
        reg = self.sweep.strategy_registry(call.op)
        if reg is None:
            raise ValueError(f"{op} is in no DTensor registry; the audit only queries registered ops")
        try:
            # expected results: shape inference on the global inputs (the same on every mesh)
            metas = self.registry_sweep.expected(call, self.meshes[0][1])
        except Exception as e:
            t, m = _short_error(e)
            self.infer_failed.setdefault(op, {"op": op, "type": t, "message": m, "calls": 0})
            self.infer_failed[op]["calls"] += 1
            return
        for mesh_name, mesh in self.meshes:
            for mode in self.modes:
                try:
                    queries = self.registry_sweep.queries(call, mesh, mode)
                except Exception as e:
                    self.count_error(e, None, reg, mode, mesh_name, f"{mode} schema on mesh {mesh_name}", call)
                    continue
                for query in queries:
                    self.ask(query, reg, mesh_name, metas)

    def ask(self, query: Any, reg: str, mesh_name: str, metas: Any) -> None:
        """One query under the time limit, counted; for runtime queries also DTensor's selection."""
        op = str(query.call.op)
        what = f"{query.mode} {query.label} on mesh {mesh_name}" if query.mode == "runtime" else (
            f"{query.mode} on mesh {mesh_name}")
        t0 = time.monotonic()
        timed_out = False
        try:
            with time_limit(self.args.query_timeout):
                answer = self.registry_sweep.ask(query, metas)
        except QueryTimeout as e:
            timed_out = True
            self.count_error(e, None, reg, query.mode, mesh_name, what, query.call)
        else:
            if answer.error is not None:
                self.count_error(answer.error, answer.refusal, reg, query.mode, mesh_name, what, query.call)
            else:
                self.judge(query, reg, mesh_name, what, answer)
        if query.runtime is not None:
            if timed_out:
                sel = {"error": "QueryTimeout: not selected, the strategy query timed out"}
            else:
                try:
                    with time_limit(self.args.query_timeout):
                        sel = self.select(query.runtime)
                except QueryTimeout as e:
                    sel = {"error": f"QueryTimeout: {e}"}
            self.selections[f"{query_id(query.call)}|{mesh_name}|{query.label}"] = {"op": op, **sel}
        self.timed(t0, op, what)

    def select(self, runtime: Any) -> dict:
        """The strategy DTensor's dispatch selects for this runtime schema, in comparable form."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        def plc(x: Any) -> Any:
            if isinstance(x, DTensorSpec):
                return str(tuple(x.placements))
            if isinstance(x, (list, tuple)):
                return [plc(e) for e in x]
            return None if x is None else type(x).__name__

        try:
            out = self.sweep.runtime_selection(runtime)
        except Exception as e:
            t, m = _short_error(e)
            return {"error": f"{t}: {m}"}
        rec = {"output": plc(out.output_spec), "needs_redistribute": bool(out.needs_redistribute)}
        if out.redistribute_schema is not None:
            rec["redistribute"] = [str(tuple(s.placements)) for s in out.redistribute_schema.args_spec]
        return rec

    def timed(self, t0: float, op: str, what: str) -> None:
        dt = time.monotonic() - t0
        self.op_seconds[op] += dt
        self.slow.append((dt, f"{op} {what}"))
        if dt > 2.0:
            print(f"[audit {self.args.role}] slow query {dt:.1f}s: {op} {what}", file=sys.stderr, flush=True)

    def count_error(self, exc: BaseException, refusal: str | None, reg: str, mode: str, mesh: str,
                    what: str, call: Any) -> None:
        """Count a query that raised: a runtime refusal (``refusal`` is its reason) or an error."""
        op = str(call.op)
        total, by_reg = self.bucket(mode, mesh, reg)
        t, m = _short_error(exc)
        if refusal is not None:
            total.add_refusal(op)
            by_reg.add_refusal(op)
            details = self.refusal_details
            key: tuple = (op, reg, mode, mesh, self.sweep.runtime_refusal_key(exc))
        else:
            total.add_error(op)
            by_reg.add_error(op)
            details = self.error_details
            key = (op, reg, mode, mesh, t, m)
        if key not in details:
            details[key] = {
                "op": op, "registry": reg, "mode": mode, "mesh": mesh, "type": t,
                "message": m, "raised_at": _raised_at(exc), "query": what,
                "call": str(call), "source": call.source, "count": 0,
            }
            if refusal is not None:
                details[key].update(refusal=key[-1], reason=refusal)
            if self.args.tracebacks:
                details[key]["traceback"] = "".join(traceback.format_exception(exc, limit=-6))
        details[key]["count"] += 1

    def judge(self, query: Any, reg: str, mesh_name: str, what: str, answer: Any) -> None:
        """Count an answered query: no strategy, or its OpSpecs and their violations."""
        op = str(query.call.op)
        total, by_reg = self.bucket(query.mode, mesh_name, reg)
        if answer.strategy is None:
            total.add_none(op)
            by_reg.add_none(op)
            return
        violations = list(answer.violations)
        n = _count_specs(answer.strategy)
        total.add(op, violations, n)
        by_reg.add(op, violations, n)
        if violations:
            entry = self.violating[(query.mode, mesh_name)].setdefault(
                op, {"op": op, "registry": reg, "specs_by_clause": Counter(), "examples": {}}
            )
            per_clause: dict[str, set] = defaultdict(set)
            for v in violations:
                per_clause[v.clause].add(_spec_id(v))
                if v.clause not in entry["examples"]:
                    entry["examples"][v.clause] = {"violation": str(v), "query": what, "call": str(query.call)}
            for c, ids in per_clause.items():
                entry["specs_by_clause"][c] += len(ids)

    # -- output --------------------------------------------------------------------------

    def results(self) -> list[dict]:
        out = []
        for mode in self.modes:
            for mesh_name, _ in self.meshes:
                if (mode, mesh_name) not in self.buckets:
                    self.buckets[(mode, mesh_name)] = Bucket(self.checker.CLAUSES)
                rec = {"mode": mode, "mesh": mesh_name, **self.buckets[(mode, mesh_name)].to_json()}
                rec["by_registry"] = {
                    reg: self.reg_buckets[(mode, mesh_name, reg)].to_json()
                    for reg in REGISTRIES
                    if (mode, mesh_name, reg) in self.reg_buckets
                }
                for name, details in (("error_details", self.error_details),
                                      ("refusal_details", self.refusal_details)):
                    rec[name] = sorted(
                        (d for d in details.values() if d["mode"] == mode and d["mesh"] == mesh_name),
                        key=lambda d: (d["op"], d["type"], d["message"]),
                    )
                viol = []
                for op, entry in sorted(self.violating[(mode, mesh_name)].items()):
                    viol.append({
                        "op": op,
                        "registry": entry["registry"],
                        "specs_by_clause": dict(sorted(entry["specs_by_clause"].items())),
                        "example": next(iter(entry["examples"].values()))["violation"],
                        "examples": entry["examples"],
                    })
                rec["violating_ops"] = viol
                out.append(rec)
        return out


def coverage(sweep: Any, propagator: Any, captured: set[Any], queried: Mapping[str, set[str]]) -> dict:
    """Registered ops the samples reached, per registry, and the captured ops DTensor does not know.

    ``captured`` holds every aten op a sample called, those called only without
    tensors (never queried) included; ``queried`` the ops queried, per registry.
    """
    from torch._decomp import decomposition_table

    single = {str(o) for o in propagator.op_single_dim_strategy_funcs}
    strat = {str(o) for o in propagator.op_strategy_funcs} - single
    # propagation rules: DTensor's runtime asks them after strategies; contract_sweep does
    # not query them (on torch 2.13.0 every op with a rule also has a strategy)
    rules = {str(o) for o in propagator.op_to_rules} - single - strat
    direct = set(propagator.op_single_dim_strategy_funcs) | set(propagator.op_strategy_funcs) | set(
        propagator.op_to_rules)
    decomp_table_only = {str(o) for o in decomposition_table if o not in direct}
    registered = {"single_dim": single, "op_strategy": strat, "rules": rules}
    reached: dict[str, set[str]] = defaultdict(set)
    unregistered = []
    for op in captured:
        reg = sweep.strategy_registry(op)
        if reg is None:
            reg = "rules" if str(op) in rules else None
        if reg is None:
            unregistered.append(str(op))
        else:
            reached[reg].add(str(op))
    cov: dict[str, Any] = {}
    for reg in (*REGISTRIES, "rules"):
        got = reached.get(reg, set())
        if reg == "decomposition":
            cov[reg] = {
                "registered": None,
                "decomposition_table_entries": len(decomp_table_only),
                "reached": len(got),
                "reached_ops": sorted(got),
                "not_reached": sorted(decomp_table_only - got),
            }
        else:
            cov[reg] = {
                "registered": len(registered[reg]),
                "reached": len(got & registered[reg]),
                "reached_ops": sorted(got),
                "not_reached": sorted(registered[reg] - got),
            }
        cov[reg]["queried"] = len(queried.get(reg, ()))
    # op_to_rules entries also registered as strategies never reach their rule at runtime
    cov["rules"]["shadowed_by_strategies"] = sorted({str(o) for o in propagator.op_to_rules} - rules)
    cov["unregistered_captured"] = sorted(unregistered)
    cov["single_dim_and_op_strategy_overlap"] = sorted(single & {str(o) for o in propagator.op_strategy_funcs})
    return cov


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--role", default="torch", help="label used in progress lines and the JSON (stock/built)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--ops", default=None, help="comma-separated OpInfo and/or aten op names, globs allowed")
    ap.add_argument("--meshes", default="4,2x2", help="comma-separated mesh shapes: 4, 2x2, 2x4, 2x2x2")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dtypes", default=",".join(DTYPE_NAMES))
    ap.add_argument("--max-samples", type=int, default=3, help="samples per OpInfo and dtype")
    ap.add_argument("--max-calls-per-op", type=int, default=4, help="distinct captured calls queried per aten op")
    ap.add_argument("--pool-cap", type=int, default=64, help="distinct calls kept per aten op before selection")
    ap.add_argument("--max-candidates", type=int, default=16, help="planner candidates per tensor input")
    ap.add_argument("--foreach-tensors", type=int, default=8,
                    help="tensors per list in foreach samples (0: the OpInfo default, 20)")
    ap.add_argument("--checker", default=str(DEFAULT_CHECKER), help="path of strategy_contract.py")
    ap.add_argument("--tracebacks", action="store_true", help="keep short tracebacks in error details")
    ap.add_argument("--query-timeout", type=float, default=60.0,
                    help="CPU seconds one query may take before it is recorded as a QueryTimeout error (0: none)")
    ap.add_argument("--preload", default=None, help="python file to run after setup, before querying")
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")
    t_start = time.monotonic()
    checker = load_checker(Path(args.checker))

    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)

    if args.preload:
        # A python file run once DTensor is set up and before anything is queried
        # (tests use it to plant a bad strategy; also handy to try a fix in place).
        import runpy

        runpy.run_path(args.preload, run_name="__audit_preload__")

    sweep = load_contract_sweep()
    flt = OpFilter.parse(args.ops, all_opinfos())
    t_import = time.monotonic()
    recorder, capture_info = capture(args, flt)
    t_capture = time.monotonic()

    selected = sweep.select_calls(recorder, args.max_calls_per_op)
    auditor = Auditor(args, checker, selected)
    queried: dict[str, set[str]] = defaultdict(set)
    last = 0.0
    for n, (op, calls) in enumerate(selected.items(), 1):
        queried[sweep.strategy_registry(op)].add(str(op))
        for call in calls:
            auditor.audit_call(call)
        now = time.monotonic()
        if now - last > 0.5 or n == len(selected):
            _progress(args.role, "query ops", n, len(selected))
            last = now
    t_query = time.monotonic()

    captured = set(recorder.calls) | set(recorder.tensorless)
    capture_info["stats"].update(
        aten_ops_captured=len(captured),
        aten_ops_without_tensor_calls=sum(1 for op in captured if op not in recorder.calls),
        calls_distinct=sum(len(v) for v in recorder.calls.values()),
        calls_queried=sum(len(v) for v in selected.values()),
    )
    slow = sorted(auditor.slow, reverse=True)[:15]
    doc = {
        "torch": args.role,
        "torch_version": torch.__version__,
        "torch_file": torch.__file__,
        "python": sys.executable,
        "checker": str(Path(args.checker).resolve()),
        "config": {
            "ops": args.ops, "opinfo_patterns": flt.opinfo_patterns, "aten_patterns": flt.aten_patterns,
            "meshes": args.meshes, "modes": args.modes, "dtypes": args.dtypes,
            "max_samples": args.max_samples, "max_calls_per_op": args.max_calls_per_op,
            "max_candidates": args.max_candidates, "foreach_tensors": args.foreach_tensors,
            "query_timeout": args.query_timeout,
            "preload": args.preload,
        },
        "capture": capture_info,
        "caches": cache_sizes(auditor.p),
        "results": auditor.results(),
        "infer_failed": sorted(auditor.infer_failed.values(), key=lambda d: d["op"]),
        "refusal_reasons": {
            **sweep.RUNTIME_REFUSALS,
            **{t.__name__: reason for t, reason in sweep.RUNTIME_REFUSAL_TYPES.items()},
        },
        "coverage": coverage(sweep, auditor.p, captured, queried),
        "selections": auditor.selections,
        "slowest_queries": [{"seconds": round(s, 3), "query": q} for s, q in slow],
        "slowest_ops": [{"seconds": round(s, 2), "op": o}
                        for o, s in sorted(auditor.op_seconds.items(), key=lambda kv: -kv[1])[:15]],
        "timing": {
            "startup_s": round(t_import - t_start, 1),
            "capture_s": round(t_capture - t_import, 1),
            "query_s": round(t_query - t_capture, 1),
            "total_s": round(time.monotonic() - t_start, 1),
            "cpu_s": round(time.process_time(), 1),
        },
    }
    out = Path(args.out)
    write_json_atomically(out, doc)
    print(f"[audit {args.role}] done in {doc['timing']['total_s']}s -> {out}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
