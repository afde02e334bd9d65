# Copyright (c) Meta Platforms, Inc. and affiliates
"""
The strategy-spec contract as a mode of ``strategy_validation``: ``--contract``.

``strategy_validation`` checks which placements a rule offers against ground
truth; this mode checks what every ``OpSpec`` handed out carries, clauses C1-C5
of :mod:`torch.distributed.tensor._ops.strategy_contract`::

    python -m torch.distributed.tensor._ops.strategy_validation --contract --device cpu --op mm,t
    python -m torch.distributed.tensor._ops.strategy_validation --contract --device cpu --op "nn.functional.*"
    python -m torch.distributed.tensor._ops.strategy_validation --contract --device cpu --all-registered

Ops are chosen by ``strategy_validation``'s own name resolution
(``resolve_op_names``, ``get_opinfo_by_name``; a pattern naming no OpInfo is taken
as an aten op name, such as ``aten.convolution_backward.default``, and every OpInfo
is sampled for it). The samples' aten calls are captured by ``contract_sweep``,
which, unlike ``strategy_validation``'s capture, also runs backward and the
in-place variant, takes the foreach OpInfo lists and records inputs as they were
before an in-place call. Every captured call of an op some registry holds is asked
on each mesh in three modes and each answer is judged by
``check_strategy_contract``:

* ``runtime``: one placement per input, as DTensor's dispatch asks (all
  ``Replicate``, and input 0 sharded on dim 0); a refusal DTensor makes on purpose
  (``contract_sweep.runtime_refusal``) is counted as refused, not as an error;
* ``planner``: several candidate placements per input;
* ``utility``: the single-dim rules expanded by ``expand_to_full_mesh_op_strategy``
  without output metas, as a downstream rule author expands them.

Counts are ``OpSpec``s per clause, per op, mode and mesh. The repository's audit
(stock vs changed torch, which loads this file by path into the stock torch) and
its registry test run this same code.
"""

import argparse
import contextlib
import fnmatch
import functools
import math
import signal
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.testing._internal.distributed._tensor.contract_sweep as sweep
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_validation import (
    get_opinfo_by_name,
    resolve_op_names,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard


__all__ = [
    "Answer",
    "ContractValidation",
    "OpCounts",
    "Query",
    "QueryTimeout",
    "add_arguments",
    "capture",
    "main",
    "select_opinfos",
]

CLAUSES = ("C1", "C2", "C3", "C4", "C5")
# The sizes strategy_validation's command line gives OpInfo samples (so that they
# shard evenly); the contract mode and the audit sample with the same ones.
CLI_SAMPLE_SIZES = {"L": 24, "M": 12, "S": 4, "XS": 2}
# Samples of these dtypes also run backward (the others forward and in-place only).
BACKWARD_DTYPES = ("float32",)

# check_strategy_contract(op_schema, strategy, output_metas) -> violations, each
# with a ``clause``; infer_output_metas(op_schema) -> the expected output metas.
CheckFunc = Callable[[OpSchema, StrategyType, Any], Sequence[Any]]
InferFunc = Callable[[OpSchema], Any]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--contract`` flag and the options only the contract mode reads.

    ``--op``, ``--all-registered`` (here: every OpInfo, each reaching what it
    reaches), ``--device`` and ``--max-samples`` (per OpInfo and dtype, default 3)
    are ``strategy_validation``'s own; the audit's worker parses these same
    options, so both run with the same defaults.
    """
    group = parser.add_argument_group("strategy contract (--contract)")
    group.add_argument(
        "--contract",
        action="store_true",
        help="check C1-C5 of strategy_contract for every strategy the samples reach",
    )
    group.add_argument(
        "--meshes", default="4,2x2", help="mesh shapes, e.g. 4,2x2,2x2x2"
    )
    group.add_argument("--modes", default=",".join(sweep.MODES))
    group.add_argument(
        "--dtypes",
        default="float32,bfloat16,int64,bool,complex64",
        help="dtypes to sample in (each one an OpInfo supports; --dtype is not read)",
    )
    group.add_argument(
        "--calls-per-op", type=int, default=4, help="captured calls asked per aten op"
    )
    group.add_argument(
        "--candidates", type=int, default=16, help="planner candidates per input"
    )
    group.add_argument(
        "--foreach-tensors",
        type=int,
        default=8,
        help="tensors per foreach list (0: 20)",
    )
    group.add_argument(
        "--query-timeout",
        type=float,
        default=60.0,
        help="CPU seconds per query (0: none)",
    )


# --------------------------------------------------------------------------------------
# Choosing and sampling ops
# --------------------------------------------------------------------------------------


def _aten_names(op: OpOverload) -> tuple[str, ...]:
    """Names an aten op answers to: ``aten.mm.default``, ``mm.default``, ``mm``."""
    packet = op._schema.name.split("::")[-1]
    return (str(op), f"{packet}.{op._overloadname}", packet)


def aten_selected(patterns: Sequence[str], op: OpOverload) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in _aten_names(op))


def select_opinfos(patterns: Sequence[str]) -> tuple[list[tuple[Any, bool]], list[str]]:
    """(OpInfo, record every op it calls) pairs to sample, and the aten patterns.

    No patterns: every OpInfo. A pattern ``resolve_op_names`` resolves picks
    those OpInfos; any other is an aten op name (globs allowed), for which every
    other OpInfo is sampled too, recording only the matching ops.
    """
    db = sweep.opinfo_db()
    if not patterns:
        return [(info, True) for info in db], []
    chosen: set[int] = set()
    aten: list[str] = []
    for pattern in patterns:
        try:
            names = resolve_op_names([pattern])
        except ValueError:
            aten.append(pattern)
            continue
        chosen.update(id(info) for name in names for info in get_opinfo_by_name(name))
    picked = [(info, True) for info in db if id(info) in chosen]
    if aten:
        picked += [(info, False) for info in db if id(info) not in chosen]
    return picked, aten


def use_cli_sample_sizes() -> None:
    """Give OpInfo samples the sizes strategy_validation's command line gives them."""
    import torch.testing._internal.common_methods_invocations as common_ops
    from torch.testing._internal.opinfo import core as opinfo_core

    for module in (opinfo_core, common_ops):
        for name, value in CLI_SAMPLE_SIZES.items():
            setattr(module, name, value)


def capture(
    picked: Sequence[tuple[Any, bool]],
    aten: Sequence[str],
    args: argparse.Namespace,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[sweep.CallRecorder, dict[str, int]]:
    """Run the samples of ``picked`` under one recorder; return it and its counters."""
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    backward = {getattr(torch, d) for d in BACKWARD_DTYPES}
    recorder = sweep.CallRecorder(64)
    counts: Counter[str] = Counter()
    for n, (info, everything) in enumerate(picked, 1):
        recorder.keep = None if everything else (lambda op: aten_selected(aten, op))
        _, got = sweep.capture_calls(
            [info],
            dtypes=(),
            extra_dtypes=dtypes,
            samples=args.max_samples or 3,
            backward=True,
            backward_dtypes=backward,
            foreach_tensors=args.foreach_tensors or None,
            recorder=recorder,
        )
        counts.update(got)
        if progress is not None:
            progress(n, len(picked))
    matched = set(recorder.calls) | set(recorder.tensorless)
    for pattern in aten:
        if not any(aten_selected([pattern], op) for op in matched):
            raise ValueError(
                f'"{pattern}" names no OpInfo and no aten op the samples call'
            )
    return recorder, dict(counts)


# --------------------------------------------------------------------------------------
# Queries and answers
# --------------------------------------------------------------------------------------


class QueryTimeout(BaseException):
    """A query used more CPU time than ``--query-timeout`` (or a block its wall time).

    A ``BaseException``, so that DTensor's own ``except Exception`` (decomposition
    fallbacks) cannot swallow it.
    """

    where: str = ""


def _where(code: Any, line: int) -> str:
    return f"{Path(code.co_filename).name}:{line} in {code.co_name}"


@contextlib.contextmanager
def time_limit(
    seconds: float | None, wall: bool = False, message: str = ""
) -> Iterator[None]:
    """Raise :class:`QueryTimeout` once the block used ``seconds`` (main thread only).

    CPU time by default, so that a loaded machine does not fail a query; with
    ``wall``, wall time, re-raised every 5 s in case something catches the first
    (the audit's parity sweep bounds eager runs, which may block).
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return
    clock = "wall time" if wall else "CPU"
    text = message or f"query used more than {seconds:g}s of {clock} (--query-timeout)"

    def expire(signum: int, frame: Any) -> None:
        exc = QueryTimeout(text)
        if frame is not None:
            exc.where = _where(frame.f_code, frame.f_lineno)
        raise exc

    sig, timer = (
        (signal.SIGALRM, signal.ITIMER_REAL)
        if wall
        else (signal.SIGPROF, signal.ITIMER_PROF)
    )
    previous = signal.signal(sig, expire)
    signal.setitimer(timer, seconds, 5.0 if wall else 0.0)
    try:
        yield
    finally:
        signal.setitimer(timer, 0)
        signal.signal(sig, previous)


@dataclass
class Query:
    """One strategy query: a captured call, asked on a mesh in one mode.

    ``label`` is the mode, or for runtime queries names the input placements.
    ``schema`` is the strategy schema the answer is judged against; ``runtime``
    the ``DTensorSpec`` schema it wraps in a runtime query, else ``None``.
    """

    call: sweep.CapturedCall
    mesh: DeviceMesh
    mode: str
    label: str
    schema: OpSchema
    runtime: OpSchema | None = None

    def __str__(self) -> str:
        return f"{self.label}: {self.call} [{self.call.source}]"


@dataclass
class Answer:
    """What a :class:`Query` came to: a judged strategy, no strategy (declined),
    a runtime refusal (``refusal`` is its reason) or an error."""

    strategy: StrategyType | None = None
    violations: Sequence[Any] = ()
    error: BaseException | None = None
    refusal: str | None = None


def _short(exc: BaseException) -> tuple[str, str]:
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    return type(exc).__name__, first if len(first) <= 300 else first[:297] + "..."


def _raised_at(exc: BaseException) -> str:
    """``file.py:line in func`` of the frame that raised (an empty message needs it)."""
    where = getattr(exc, "where", "")
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if where or tb is None:
        return where
    return _where(tb.tb_frame.f_code, tb.tb_lineno)


def _spec_ids(violations: Sequence[Any]) -> dict[str, set[tuple[int, int]]]:
    """Per clause, the (child or -1, strategy index) of each OpSpec breaking it."""
    ids: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for v in violations:
        child = -1
        if v.clause == "C5" and v.position.startswith("child "):
            child = int(v.position.split()[1])
        ids[v.clause].add((child, v.strategy_index))
    return ids


def _count_specs(strategy: object) -> int:
    if isinstance(strategy, OpStrategy):
        return len(strategy.strategies)
    if isinstance(strategy, TupleStrategy):
        return sum(_count_specs(c) for c in strategy.children)
    return 0


@dataclass
class OpCounts:
    """What the queries of one op in one mode on one mesh came to."""

    op: str
    registry: str
    queries: int = 0
    specs: int = 0
    no_strategy: int = 0
    # Calls whose result depends on the data, which shape inference cannot size.
    data_dependent: int = 0
    seconds: float = 0.0
    # OpSpecs breaking each clause; C5 ones also by the clause the child breaks.
    clauses: Counter[str] = field(default_factory=Counter)
    c5_children: Counter[str] = field(default_factory=Counter)
    # The first example per clause; per kind, the errors and refusals (with counts).
    examples: dict[str, dict[str, str]] = field(default_factory=dict)
    errors: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    refusals: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Calls shape inference failed on (nothing to judge them against).
    uninferable: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return bool(self.clauses or self.errors or self.uninferable)


class ContractValidation:
    """Asks every call of ``calls`` on each mesh in each mode, and counts the answers.

    ``check`` and ``infer`` judge a strategy (``check_strategy_contract`` and
    ``infer_output_metas``); they are passed in so that a caller can judge a torch
    that lacks them (the audit's stock side) with the same checker. Shape
    inference runs once per call. ``after_runtime`` is called with each runtime
    query and its answer (the audit records DTensor's selection there).
    """

    def __init__(
        self,
        calls: Mapping[OpOverload, Sequence[sweep.CapturedCall]],
        check: CheckFunc,
        infer: InferFunc,
        meshes: Mapping[str, DeviceMesh] | None = None,
        modes: Sequence[str] = sweep.MODES,
        candidates: sweep.CandidateFunc | None = None,
        query_timeout: float | None = None,
        after_runtime: Callable[[Query, Answer], None] | None = None,
        metas: dict[str, tuple[bool, Any]] | None = None,
    ) -> None:
        for mode in modes:
            if mode not in sweep.MODES:
                raise ValueError(f"mode must be one of {sweep.MODES}, got {mode!r}")
        self.calls = calls
        self.check, self.infer = check, infer
        self.meshes = dict(meshes or {})
        self.modes = list(modes)
        self.candidates = candidates or sweep.capped_candidates(6)
        self.query_timeout = query_timeout
        self.after_runtime = after_runtime
        self.results: dict[tuple[str, str], dict[str, OpCounts]] = {
            (m, name): {} for m in self.modes for name in self.meshes
        }
        # shape inference per call, which callers asking the same calls again may share
        self._metas = {} if metas is None else metas

    def expected(self, call: sweep.CapturedCall, mesh: DeviceMesh) -> Any:
        """The output metas of ``call``; raises what shape inference raised."""
        key = str(call)
        if key not in self._metas:
            try:
                schema = sweep.strategy_schema(mesh, call.op, call.args, call.kwargs)
                self._metas[key] = (True, self.infer(schema))
            except Exception as e:
                self._metas[key] = (False, e)
        ok, value = self._metas[key]
        if not ok:
            raise value
        return value

    @staticmethod
    def runtime_placements(
        mesh: DeviceMesh, call: sweep.CapturedCall
    ) -> list[tuple[str, list[tuple[Placement, ...]]]]:
        """(label, one placement per tensor input) for each runtime query of ``call``.

        Every input replicated, the case dispatch sees most; and input 0 split on
        its dim 0 along mesh dim 0 whenever every rank gets a piece, which reaches
        sharded strategies, redistributions, refusals and uneven shards.
        """
        metas = call.tensor_metas
        replicate: tuple[Placement, ...] = (Replicate(),) * mesh.ndim
        configs = [("all Replicate", [replicate] * len(metas))]
        if len(metas[0].shape) > 0 and metas[0].shape[0] >= mesh.size(0):
            sharded = (Shard(0),) + replicate[1:]
            configs.append(("input 0 Shard(0)", [sharded] + configs[0][1][1:]))
        return configs

    def queries(
        self, call: sweep.CapturedCall, mesh: DeviceMesh, mode: str
    ) -> list[Query]:
        """The queries of ``call`` on ``mesh`` in ``mode``; none for an op no
        registry holds, or, in utility mode, for an op without single-dim rules."""
        registry = sweep.strategy_registry(call.op)
        if registry is None or (mode == "utility" and registry != "single_dim"):
            return []
        if mode != "runtime":
            schema = sweep.strategy_schema(
                mesh, call.op, call.args, call.kwargs, self.candidates
            )
            return [Query(call, mesh, mode, mode, schema)]
        out = []
        propagator = sweep._sharding_propagator()
        for label, placements in self.runtime_placements(mesh, call):
            runtime = sweep.runtime_schema(
                mesh, call.op, call.args, call.kwargs, placements
            )
            schema = propagator._wrap_with_op_strategy(runtime)
            out.append(Query(call, mesh, mode, label, schema, runtime))
        return out

    def ask(self, query: Query, metas: Any) -> Answer:
        """Ask DTensor ``query`` under the time limit and judge the answer."""
        strategy: StrategyType | None
        try:
            with time_limit(self.query_timeout):
                if query.mode == "utility":
                    strategy = sweep.utility_strategy(query.schema, query.mesh)
                else:
                    strategy = sweep.query_strategy(
                        query.schema, query.mesh, query.runtime
                    )
        except (Exception, QueryTimeout) as e:
            refused = None
            if query.runtime is not None and isinstance(e, Exception):
                refused = sweep.runtime_refusal(e)
            return Answer(error=e, refusal=refused)
        if strategy is None:
            return Answer()
        return Answer(strategy, self.check(query.schema, strategy, metas))

    def run(self, progress: Callable[[int, int], None] | None = None) -> None:
        """Ask and count every query of every call, on every mesh in every mode."""
        for n, (op, calls) in enumerate(self.calls.items(), 1):
            for call in calls:
                self.validate_call(call)
            if progress is not None:
                progress(n, len(self.calls))

    def validate_call(self, call: sweep.CapturedCall) -> None:
        registry = sweep.strategy_registry(call.op)
        if registry is None:
            raise ValueError(
                f"{call.op} is in no DTensor registry; only registered ops are asked"
            )
        op = str(call.op)
        for (mode, mesh_name), per_op in self.results.items():
            if mode == "utility" and registry != "single_dim":
                continue
            counts = per_op.setdefault(op, OpCounts(op, registry))
            mesh = self.meshes[mesh_name]
            try:
                metas = self.expected(call, mesh)
            except (DynamicOutputShapeException, DataDependentOutputException):
                counts.data_dependent += 1
                continue
            except Exception as e:
                entry = counts.uninferable.setdefault(
                    _short(e),
                    {
                        "type": _short(e)[0],
                        "message": _short(e)[1],
                        "call": str(call),
                        "calls": 0,
                    },
                )
                entry["calls"] += 1
                continue
            for query in self.queries(call, mesh, mode):
                t0 = time.monotonic()
                answer = self.ask(query, metas)
                counts.seconds += time.monotonic() - t0
                self._record(counts, query, mesh_name, answer)
                if query.runtime is not None and self.after_runtime is not None:
                    self.after_runtime(query, answer)

    def _record(
        self, counts: OpCounts, query: Query, mesh_name: str, answer: Answer
    ) -> None:
        counts.queries += 1
        where = f"{query.mode} {query.label} on mesh {mesh_name}"
        if answer.error is not None:
            kind, message = _short(answer.error)
            key = sweep.runtime_refusal_key(answer.error) if answer.refusal else None
            table: dict[Any, dict[str, Any]] = counts.refusals if key else counts.errors
            entry = table.setdefault(
                key or (kind, message),
                {
                    "op": counts.op,
                    "registry": counts.registry,
                    "mode": query.mode,
                    "mesh": mesh_name,
                    "type": kind,
                    "message": message,
                    "raised_at": _raised_at(answer.error),
                    "query": where,
                    "call": str(query.call),
                    "source": query.call.source,
                    "count": 0,
                },
            )
            if key:
                entry.update(refusal=key, reason=answer.refusal)
            entry["count"] += 1
            return
        if answer.strategy is None:
            counts.no_strategy += 1
            return
        counts.specs += _count_specs(answer.strategy)
        for clause, ids in _spec_ids(answer.violations).items():
            counts.clauses[clause] += len(ids)
        for v in answer.violations:
            if v.clause == "C5" and v.child_clause:
                counts.c5_children[v.child_clause] += 1
            counts.examples.setdefault(
                v.clause, {"violation": str(v), "query": where, "call": str(query.call)}
            )

    # -- summing up ------------------------------------------------------------------

    def format_ops(self, only_failed: bool = False, limit: int | None = None) -> str:
        """Per op: its queries and OpSpecs, then per mode and mesh what broke,
        with the first example of each clause and every error."""
        ops: dict[str, list[tuple[str, OpCounts]]] = defaultdict(list)
        for (mode, mesh_name), per_op in self.results.items():
            for op, counts in per_op.items():
                ops[op].append((f"{mode} mesh {mesh_name}", counts))
        names = sorted(
            o
            for o, cs in ops.items()
            if not only_failed or any(c.failed for _, c in cs)
        )
        lines = []
        for i, op in enumerate(names[:limit], 1):
            per = ops[op]
            queries = sum(c.queries for _, c in per)
            specs = sum(c.specs for _, c in per)
            lines.append(
                f"\n[{i}/{len(names)}] {op} ({per[0][1].registry})"
                f" — Queries: {queries}, OpSpecs: {specs}\n" + "-" * 70
            )
            for where, c in per:
                t = totals([c])
                broke = [f"{k} {n}" for k, n in sorted(c.clauses.items())]
                broke += [f"{t['errors']} errors"] if c.errors else []
                broke += [f"{t['refused']} refused"] if c.refusals else []
                if c.data_dependent:
                    # shape inference could not size the result: nothing to judge
                    broke.append(
                        f"{c.data_dependent} calls not judged (data-dependent size)"
                    )
                if broke:
                    lines.append(f"  {where}: " + ", ".join(broke))
                for e in c.examples.values():
                    lines.append(
                        f"    {e['violation']}\n      in {e['query']}: {e['call']}"
                    )
                for e in c.errors.values():
                    lines.append(
                        f"    raised {e['type']}: {e['message']}\n"
                        f"      in {e['query']}: {e['call']}"
                    )
                for e in c.uninferable.values():
                    lines.append(
                        f"    shape inference raised {e['type']}: {e['message']}\n"
                        f"      in {e['call']}"
                    )
        if limit is not None and len(names) > limit:
            more = names[limit:]
            lines.append(f"... and {len(more)} more ops: {', '.join(more)}")
        return "\n".join(lines)

    def format_summary(self, per_op_table: bool = True) -> str:
        """Two tables: per op summed over modes and meshes, and per mode and mesh."""
        per_op: dict[str, list[OpCounts]] = defaultdict(list)
        for counts in self.results.values():
            for op, c in counts.items():
                per_op[op].append(c)
        rows = [[op, *_cells(cs), _seconds(cs)] for op, cs in sorted(per_op.items())]
        every = [c for cs in per_op.values() for c in cs]
        rows.append(["Total", *_cells(every), _seconds(every)])
        by_mesh = [
            [mode, mesh, len(cs), sum(1 for c in cs.values() if c.clauses)]
            + _cells(cs.values(), True)
            for (mode, mesh), cs in self.results.items()
        ]
        counted = ["errors", "refused", "no strategy"]
        lines = ["\n" + "=" * 70, "Summary (OpSpecs breaking each clause)", "=" * 70]
        if per_op_table:
            headers = ["Op", *CLAUSES, *(h.capitalize() for h in counted), "Time"]
            lines += [_table(headers, rows), ""]
        headers = ["mode", "mesh", "ops", "ops w/ viol", *CLAUSES, *counted]
        lines.append(_table(headers, by_mesh))
        return "\n".join(lines)


def totals(ops: Any) -> dict[str, Any]:
    """What :class:`OpCounts` ``ops`` add up to (OpSpecs per clause, ops per clause, ...)."""
    ops = list(ops)
    return {
        "ops_sampled": len(ops),
        "ops_with_violations": sum(1 for c in ops if c.clauses),
        "violations": {k: sum(c.clauses[k] for c in ops) for k in CLAUSES},
        "ops_by_clause": {k: sum(1 for c in ops if c.clauses[k]) for k in CLAUSES},
        "c5_by_child_clause": dict(
            sorted(sum((c.c5_children for c in ops), Counter()).items())
        ),
        "errors": sum(e["count"] for c in ops for e in c.errors.values()),
        "ops_with_errors": sum(1 for c in ops if c.errors),
        "refused": sum(e["count"] for c in ops for e in c.refusals.values()),
        "ops_refused": sum(1 for c in ops if c.refusals),
        "no_strategy": sum(c.no_strategy for c in ops),
        "ops_no_strategy": sum(1 for c in ops if c.no_strategy),
        "queries": sum(c.queries for c in ops),
        "specs_checked": sum(c.specs for c in ops),
    }


def _cells(ops: Any, with_ops: bool = False) -> list[str]:
    """Table cells of ``ops``' totals: OpSpecs per clause (with ``with_ops``
    followed by the ops breaking it), errors, refused and no-strategy answers."""
    t = totals(ops)
    cells = [
        f"{n} ({t['ops_by_clause'][k]})" if with_ops and n else str(n)
        for k, n in t["violations"].items()
    ]
    return cells + [str(t["errors"]), str(t["refused"]), str(t["no_strategy"])]


def _seconds(ops: Sequence[OpCounts]) -> str:
    return f"{sum(c.seconds for c in ops):.1f}s"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table, the first column left-aligned, the others right."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def fmt(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return "\n".join([fmt(headers), "-" * len(fmt(headers))] + [fmt(r) for r in cells])


def make_meshes(spec: str) -> dict[str, DeviceMesh]:
    """CPU meshes named by their shapes (``4``, ``2x2``)."""
    meshes = {}
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        shape = [int(x) for x in name.split("x")]
        meshes[name] = DeviceMesh("cpu", torch.arange(math.prod(shape)).reshape(shape))
    return meshes


def validate(
    args: argparse.Namespace,
    check: CheckFunc,
    infer: InferFunc,
    after_runtime: Callable[[Query, Answer], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[ContractValidation, sweep.CallRecorder, dict[str, int]]:
    """Choose the ops of ``args``, capture their calls and ask every query.

    The process group must hold as many ranks as the largest mesh.
    """
    use_cli_sample_sizes()
    patterns = (
        []
        if args.all_registered or not args.op
        else [p.strip() for p in args.op.split(",")]
    )
    picked, aten = select_opinfos(patterns)

    def phase(name: str) -> Callable[[int, int], None] | None:
        return None if progress is None else functools.partial(progress, name)

    recorder, counts = capture(picked, aten, args, phase("capture"))
    cv = ContractValidation(
        sweep.select_calls(recorder, args.calls_per_op),
        check,
        infer,
        make_meshes(args.meshes),
        [m for m in args.modes.split(",") if m],
        sweep.first_candidates(args.candidates),
        args.query_timeout,
        after_runtime,
    )
    cv.run(phase("query ops"))
    return cv, recorder, counts


def main(args: argparse.Namespace) -> int:
    """``strategy_validation --contract``: print C1-C5 per op.

    Returns 1 when an op broke a clause, raised (a runtime refusal does not
    count) or could not be shape-inferred, else 0.
    """
    import torch.distributed as dist
    from torch.distributed.tensor._ops.strategy_contract import (
        check_strategy_contract,
        infer_output_metas,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if args.device != "cpu":
        raise SystemExit(
            "--contract asks DTensor's registries on CPU meshes: pass --device cpu"
        )
    if not args.op and not args.all_registered:
        args.op = "add"  # strategy_validation's default
    ranks = max(
        math.prod(int(x) for x in s.split("x")) for s in args.meshes.split(",") if s
    )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        t0 = time.monotonic()
        cv, recorder, counts = validate(
            args, check_strategy_contract, infer_output_metas
        )
        print(f"Testing ops: {', '.join(str(op) for op in cv.calls)}")
        print(
            f"Mode: contract (C1-C5), meshes {args.meshes}, modes {args.modes}; "
            f"Device: cpu, Dtypes: {args.dtypes}"
        )
        print(
            f"Captured: {counts.get('opinfos', 0)} OpInfos, {counts.get('samples', 0)} samples, "
            f"{sum(len(c) for c in cv.calls.values())} calls of {len(cv.calls)} registered aten ops "
            f"({time.monotonic() - t0:.1f}s)"
        )
        print(cv.format_ops())
        print(cv.format_summary())
        failed = any(
            c.failed for per_op in cv.results.values() for c in per_op.values()
        )
        return 1 if failed else 0
    finally:
        dist.destroy_process_group()
