# Copyright (c) Meta Platforms, Inc. and affiliates
"""
The engine of ``strategy_validation --contract``: ask, judge and count.

:class:`ContractValidation` asks every captured call (``contract_capture``) on
each mesh in three modes and judges each answer against clauses C1-C5 of
:mod:`torch.distributed.tensor._ops.strategy_contract`:

* ``runtime``: one placement per input, as DTensor's dispatch asks (all
  ``Replicate``, and input 0 sharded on dim 0); a refusal DTensor makes on purpose
  (``contract_sweep.runtime_refusal``) is counted as refused, not as an error;
* ``planner``: several candidate placements per input;
* ``utility``: the single-dim rules expanded by ``expand_to_full_mesh_op_strategy``
  without output metas, as a downstream rule author expands them.

Counts are ``OpSpec``s per clause, per op, mode and mesh. ``_contract_mode`` is
the command line over it; the repository's audit (which loads this file by path
into stock torch) and the registry test count with this same code.
"""

import contextlib
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
import torch.testing._internal.distributed._tensor.contract_capture as capture
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
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
    CandidateFunc,
)


CLAUSES = ("C1", "C2", "C3", "C4", "C5")

# check_strategy_contract(op_schema, strategy, output_metas) -> violations, each
# with a ``clause``; infer_output_metas(op_schema) -> the expected output metas.
CheckFunc = Callable[[OpSchema, StrategyType, Any], Sequence[Any]]

InferFunc = Callable[[OpSchema], Any]


class QueryTimeout(BaseException):
    """A query used more CPU time than ``--query-timeout``.

    A ``BaseException``, so that DTensor's own ``except Exception`` (decomposition
    fallbacks) cannot swallow it.
    """

    where: str = ""


def _where(code: Any, line: int) -> str:
    return f"{Path(code.co_filename).name}:{line} in {code.co_name}"


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`QueryTimeout` once the block used ``seconds`` of CPU time (main
    thread only): CPU time, so that a loaded machine does not fail a query."""
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        exc = QueryTimeout(
            f"query used more than {seconds:g}s of CPU (--query-timeout)"
        )
        if frame is not None:
            exc.where = _where(frame.f_code, frame.f_lineno)
        raise exc

    previous = signal.signal(signal.SIGPROF, expire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@dataclass
class Query:
    """One strategy query: a captured call, asked on a mesh in one mode.

    ``label`` is the mode, or for runtime queries names the input placements.
    ``schema`` is the strategy schema the answer is judged against; ``runtime``
    the ``DTensorSpec`` schema it wraps in a runtime query, else ``None``.
    """

    call: capture.CapturedCall
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
        calls: Mapping[OpOverload, Sequence[capture.CapturedCall]],
        check: CheckFunc,
        infer: InferFunc,
        meshes: Mapping[str, DeviceMesh] | None = None,
        modes: Sequence[str] = sweep.MODES,
        candidates: CandidateFunc | None = None,
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
        self.candidates = candidates or capped_candidates(6)
        self.query_timeout = query_timeout
        self.after_runtime = after_runtime
        self.results: dict[tuple[str, str], dict[str, OpCounts]] = {
            (m, name): {} for m in self.modes for name in self.meshes
        }
        # shape inference per call, which callers asking the same calls again may share
        self._metas = {} if metas is None else metas

    def expected(self, call: capture.CapturedCall, mesh: DeviceMesh) -> Any:
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
        mesh: DeviceMesh, call: capture.CapturedCall
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
        self, call: capture.CapturedCall, mesh: DeviceMesh, mode: str
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

    def validate_call(self, call: capture.CapturedCall) -> None:
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


def make_meshes(spec: str) -> dict[str, DeviceMesh]:
    """CPU meshes named by their shapes (``4``, ``2x2``)."""
    meshes = {}
    for name in [s.strip() for s in spec.split(",") if s.strip()]:
        shape = [int(x) for x in name.split("x")]
        meshes[name] = DeviceMesh("cpu", torch.arange(math.prod(shape)).reshape(shape))
    return meshes
