# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Property-based fuzzing of DTensor's sharding strategies against the contract C1-C5.

The targeted tests pick their shapes and placements by hand; this file lets
hypothesis pick them: shapes with 0-size and size-1 dims, non-contiguous,
sliced and expanded (stride 0) strides, several dtypes, 1-D, 2-D and 3-D meshes
on the harness's fake process group, and candidate placements mixing
``Replicate``, ``Shard`` on every dim (uneven and empty shards included),
``Partial`` and ``_StridedShard``, over a representative op set, one test per
family: pointwise with broadcasting here; in-place and ``out=``, the matmul family,
reductions, views, normalization forward and backward with output masks,
attention, embedding, convolution and foreach in test_strategy_contract_fuzz_ops.py,
which uses this file's machinery (:class:`FuzzTestBase`).

Every generated call is asked twice:

* a *planner* query through ``ShardingPropagator.get_op_strategy``, every tensor
  input offering several candidates (the all-``Replicate`` one always among
  them, at a drawn position);
* a *runtime* query, one placement per input, built and answered as DTensor's
  dispatch does (``runtime_schema``, ``_wrap_with_op_strategy``,
  ``query_strategy`` of the shared harness).

Each answer must be a strategy that ``check_strategy_contract`` finds no
violation in (expected metas from shape inference on the global inputs), or one
of the *named* outcomes below; anything else fails the test, and hypothesis
shrinks it to a minimal call (op, shapes, strides, dtypes, placements, mesh),
which it prints. A planner answer must also hold at least one ``OpSpec`` per
``OpStrategy`` (every input offers all-Replicate, which every op can run on); a
runtime answer may be empty (no spec keeps an ``out=`` tensor's ``Partial``:
vacuously within the contract, and dispatch then fails choosing a spec, as on
stock), which the report counts apart.

Named outcomes (see :func:`named_outcome`):

* ``not-implemented``: ``NotImplementedError`` whose message names the op
  (``str(op)``), e.g. ``get_op_strategy`` for an op no source can answer;
* ``refusal: <message or type>``, runtime queries only: a refusal the
  harness's ``runtime_refusal`` classifies (a ``RUNTIME_REFUSALS`` message or a
  data-dependent-size exception type) or a message of
  :data:`EXTRA_RUNTIME_REFUSALS` (DTensor deliberately refusing one input
  placement, as stock does); a planner query never refuses, it always offers
  all-Replicate;
* ``declined`` / ``unregistered``, runtime queries only: the decomposition
  answers ``None`` or raises (not ``StrategyContractError``), or no registry
  knows the op (``query_strategy`` raises ``ValueError`` naming it); dispatch
  turns all of these into ``NotImplementedError`` naming the op.

``StrategyContractError`` names the op too, but it is *not* an accepted outcome
here: every strategy the fuzzer reaches is DTensor's own, and the finalizer
rejecting one means DTensor fails an op it registers. Failures found that way
(and stock bugs the fuzzer reaches) are listed in a test class's ``known_failures``
/ ``known_hangs``, each with its reason and a reproducer; they are counted as
known failures in the report, never as passes. A query running longer than
``DTENSOR_FUZZ_QUERY_TIMEOUT`` seconds (60) fails as a hang.

A generated call that shape inference itself rejects is not a DTensor question:
hypothesis discards it (``reject``); the generators keep that rare.

The examples run with a fixed seed (``derandomize`` profile and ``@seed``):
``DTENSOR_FUZZ_EXAMPLES`` (default 2000) is the total over all families,
``DTENSOR_FUZZ_SEED`` changes the seed, ``DTENSOR_FUZZ_REPORT=path`` writes the
outcome counts as JSON, and ``DTENSOR_FUZZ_BREAK=<variant>`` runs against a
deliberately broken DTensor (see :data:`BROKEN_VARIANTS`) to show the test
fails and shrinks.
"""

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from hypothesis import given, HealthCheck, Phase, reject, seed, settings, strategies as st
from torch._ops import OpOverload
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    format_violations,
    infer_output_metas,
    OutputMetas,
)
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import (
    _StridedShard,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_capture import CapturedCall
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    query_strategy,
    runtime_refusal_key,
    runtime_schema,
    strategy_registry,
    strategy_schema,
)


# Strategy queries are tiny; more threads only fight the other jobs on CI's 2 cores.
torch.set_num_threads(1)

aten = torch.ops.aten

# ---------------------------------------------------------------------------
# Budget, seed and profile
# ---------------------------------------------------------------------------

TOTAL_EXAMPLES = int(os.environ.get("DTENSOR_FUZZ_EXAMPLES", "2000"))
FUZZ_SEED = int(os.environ.get("DTENSOR_FUZZ_SEED", "20261130"))

def examples_for(weight: int) -> int:
    """A family's share (``weight`` percent) of ``TOTAL_EXAMPLES``, rounded up."""
    return max(1, math.ceil(TOTAL_EXAMPLES * weight / 100))


settings.register_profile(
    "dtensor_fuzz",
    # Fixed seed, no example database: CI sees the same examples every run.
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    # no "explain" phase: it traces every line, which makes shrinking a slow
    # strategy take minutes; the shrunk case and the failure say enough
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    # Generation is cheap; a slow example is a slow strategy, not a test problem.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_SETTINGS = settings.get_profile("dtensor_fuzz")


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

# Dim sizes: small, uneven for every mesh size, with size 1 and size 0 among them.
DIM_SIZES = (2, 4, 1, 3, 8, 6, 5, 0)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.float16)
INT_DTYPES = (torch.int64, torch.int32)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)
# How a tensor's strides are laid out; "expanded" gives stride-0 dims.
LAYOUTS = ("contiguous", "permuted", "sliced", "expanded")
WRITABLE_LAYOUTS = ("contiguous", "permuted", "sliced")


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def dims(min_size: int = 0, max_size: int = 4, sizes: Sequence[int] = DIM_SIZES) -> st.SearchStrategy[list[int]]:
    return st.lists(st.sampled_from(sizes), min_size=min_size, max_size=max_size)


@st.composite
def tensor_meta(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: torch.dtype,
    layouts: Sequence[str] = LAYOUTS,
) -> TensorMeta:
    """A global ``TensorMeta`` of ``shape`` with drawn strides."""
    shape = tuple(shape)
    n = len(shape)
    layout = draw(st.sampled_from(layouts)) if n > 0 else "contiguous"
    if layout == "permuted":
        # memory order: order[-1] is innermost
        order = draw(st.permutations(range(n)))
        stride = [0] * n
        running = 1
        for d in reversed(order):
            stride[d] = running
            running *= max(shape[d], 1)
        strides = tuple(stride)
    elif layout == "sliced":
        # x[::s0, ::s1, ...] of a contiguous base
        steps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        base = contiguous_strides([s * k for s, k in zip(shape, steps)])
        strides = tuple(b * k for b, k in zip(base, steps))
    elif layout == "expanded":
        # some dims broadcast (stride 0), the rest contiguous among themselves
        zero = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        kept = contiguous_strides([1 if z else s for s, z in zip(shape, zero)])
        strides = tuple(0 if z else k for k, z in zip(kept, zero))
    else:
        strides = contiguous_strides(shape)
    return TensorMeta(shape=torch.Size(shape), stride=strides, dtype=dtype)


@st.composite
def broadcast_shape(draw: st.DrawFn, shape: Sequence[int]) -> list[int]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    kept = list(shape[drop:])
    ones = draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept)))
    return [1 if o else s for s, o in zip(kept, ones)]


def promote(*dtypes: torch.dtype) -> torch.dtype:
    result = dtypes[0]
    for d in dtypes[1:]:
        result = torch.promote_types(result, d)
    return result


# ---------------------------------------------------------------------------
# Calls, one generator per family: (op, args, kwargs), tensors as TensorMeta
# ---------------------------------------------------------------------------

Call = tuple[OpOverload, tuple[Any, ...], dict[str, Any]]


@st.composite
def pointwise_calls(draw: st.DrawFn) -> Call:
    kind = draw(st.sampled_from(["binary", "unary", "scalar", "ternary", "convert"]))
    out = draw(dims(0, 4))
    if kind == "binary":
        op = draw(
            st.sampled_from(
                [aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.div.Tensor,
                 aten.maximum.default, aten.eq.Tensor, aten.pow.Tensor_Tensor]
            )
        )
        pool = ALL_DTYPES if op in (aten.add.Tensor, aten.mul.Tensor, aten.eq.Tensor) else FLOAT_DTYPES + INT_DTYPES
        a = draw(tensor_meta(draw(broadcast_shape(out)), draw(st.sampled_from(pool))))
        b = draw(tensor_meta(draw(broadcast_shape(out)), draw(st.sampled_from(pool))))
        kwargs: dict[str, Any] = {}
        if op in (aten.add.Tensor, aten.sub.Tensor) and draw(st.booleans()):
            kwargs["alpha"] = 2
        return op, (a, b), kwargs
    if kind == "unary":
        op = draw(
            st.sampled_from(
                [aten.relu.default, aten.gelu.default, aten.exp.default, aten.neg.default,
                 aten.sigmoid.default, aten.abs.default]
            )
        )
        pool = FLOAT_DTYPES + INT_DTYPES if op in (aten.neg.default, aten.abs.default, aten.relu.default) else FLOAT_DTYPES
        return op, (draw(tensor_meta(out, draw(st.sampled_from(pool)))),), {}
    if kind == "scalar":
        op = draw(st.sampled_from([aten.add.Scalar, aten.mul.Scalar]))
        x = draw(tensor_meta(out, draw(st.sampled_from(ALL_DTYPES[:-1]))))
        return op, (x, draw(st.sampled_from([2, 0.5]))), {}
    if kind == "ternary":
        op = draw(st.sampled_from([aten.where.self, aten.addcmul.default, aten.lerp.Scalar]))
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        metas = [draw(tensor_meta(draw(broadcast_shape(out)), dtype)) for _ in range(3)]
        if op == aten.where.self:
            cond = draw(tensor_meta(draw(broadcast_shape(out)), torch.bool))
            return op, (cond, metas[0], metas[1]), {}
        if op == aten.addcmul.default:
            return op, tuple(metas), {"value": 0.5}
        # lerp's self and end broadcast to the output, not past it
        return op, (draw(tensor_meta(out, dtype)), metas[0], 0.25), {}
    op = draw(st.sampled_from([aten._to_copy.default, aten.clone.default]))
    x = draw(tensor_meta(out, draw(st.sampled_from(ALL_DTYPES))))
    if op == aten._to_copy.default:
        return op, (x,), {"dtype": draw(st.sampled_from(ALL_DTYPES))}
    fmt = draw(st.sampled_from([torch.preserve_format, torch.contiguous_format]))
    return op, (x,), {"memory_format": fmt}


# family -> (its calls, its share of the examples in percent; with the families of
# test_strategy_contract_fuzz_ops.py the shares sum to 100: more where the op set
# and the argument space are larger)
FAMILIES: dict[str, tuple[st.SearchStrategy[Call], int]] = {
    "pointwise": (pointwise_calls(), 15),
}

# ---------------------------------------------------------------------------
# Meshes and placements
# ---------------------------------------------------------------------------

# Simplest first (hypothesis shrinks towards the front); all fit the fake world of 8.
MESH_SHAPES: tuple[tuple[int, ...], ...] = (
    (2,), (4,), (2, 2), (2, 2, 2), (3,), (1,), (8,), (2, 4), (4, 2), (2, 3), (1, 4), (2, 1, 2),
)
# Candidates per planner input (the all-Replicate one added when not drawn).
MAX_CANDIDATES = 4
PARTIAL_OPS = ("sum", "avg", "max")


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


@st.composite
def placements_for(draw: st.DrawFn, mesh_shape: tuple[int, ...], meta: TensorMeta) -> tuple[Placement, ...]:
    """One placement per mesh dim for a tensor with ``meta``.

    ``Shard`` may pick any dim, so shards are uneven or empty as often as not;
    ``Partial`` only for floating dtypes; ``_StridedShard`` in the two forms
    DTensor produces: alone (what flattening a dim sharded behind another gives)
    or followed by ``Shard`` of the same dim on a later mesh dim (sharding order
    right to left), with sizes that divide evenly.
    """
    ndim = len(meta.shape)
    kinds = ["R"] + (["S"] if ndim else []) + (["P"] if is_float(meta.dtype) else [])
    result: list[Placement] = []
    for _ in mesh_shape:
        kind = draw(st.sampled_from(kinds))
        if kind == "S":
            result.append(Shard(draw(st.integers(0, ndim - 1))))
        elif kind == "P":
            result.append(Partial(draw(st.sampled_from(PARTIAL_OPS))))
        else:
            result.append(Replicate())
    if ndim and draw(st.integers(0, 5)) == 5:
        strided = strided_options(mesh_shape, meta)
        if strided:
            i, j, d, sf = draw(st.sampled_from(strided))
            result[i] = _StridedShard(d, split_factor=sf)
            if j is not None:
                result[j] = Shard(d)
    return tuple(result)


def strided_options(mesh_shape: tuple[int, ...], meta: TensorMeta) -> list[tuple[int, int | None, int, int]]:
    """(mesh dim, later mesh dim or None, tensor dim, split factor) for valid ``_StridedShard``s."""
    options: list[tuple[int, int | None, int, int]] = []
    for d, size in enumerate(meta.shape):
        if size <= 0:
            continue
        for i, mi in enumerate(mesh_shape):
            for sf in (2, 3):
                if mi > 1 and size % (sf * mi) == 0:
                    options.append((i, None, d, sf))
            for j in range(i + 1, len(mesh_shape)):
                mj = mesh_shape[j]
                if mi > 1 and mj > 1 and size % (mi * mj) == 0:
                    options.append((i, j, d, mj))
    return options


@st.composite
def candidates_for(draw: st.DrawFn, mesh_shape: tuple[int, ...], meta: TensorMeta) -> tuple[tuple[Placement, ...], ...]:
    """A planner's candidates: distinct drawn tuples, all-Replicate among them at a drawn position."""
    drawn = draw(st.lists(placements_for(mesh_shape, meta), min_size=1, max_size=MAX_CANDIDATES - 1, unique=True))
    replicate = (Replicate(),) * len(mesh_shape)
    if replicate not in drawn:
        drawn.insert(draw(st.integers(0, len(drawn))), replicate)
    return tuple(drawn)


def placement_text(placements: Sequence[Placement]) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


@dataclass
class FuzzCase:
    """One generated call with its mesh and the placements both queries offer."""

    family: str
    op: OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    mesh_shape: tuple[int, ...]
    # per tensor input, in flattened argument order
    candidates: tuple[tuple[tuple[Placement, ...], ...], ...]
    runtime: tuple[tuple[Placement, ...], ...]

    @property
    def call(self) -> CapturedCall:
        return CapturedCall(self.op, self.args, self.kwargs, self.family)

    def __repr__(self) -> str:
        # What hypothesis prints for a falsifying example: every line readable.
        lines = [
            f"call: {self.call}",
            "  (tensors as T[shape]s[stride]:dtype)",
            f"mesh: {'x'.join(map(str, self.mesh_shape))}",
        ]
        for i, (cands, rt) in enumerate(zip(self.candidates, self.runtime)):
            lines.append(
                f"input {i}: planner candidates [{', '.join(placement_text(c) for c in cands)}]"
                f"; runtime {placement_text(rt)}"
            )
        return "FuzzCase(\n  " + "\n  ".join(lines) + "\n)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis pretty-prints dataclasses field by field; this reads better
        printer.text(repr(self))


@st.composite
def fuzz_cases(draw: st.DrawFn, family: str, calls: st.SearchStrategy[Call]) -> FuzzCase:
    op, args, kwargs = draw(calls)
    mesh_shape = draw(st.sampled_from(MESH_SHAPES))
    metas = CapturedCall(op, args, kwargs, family).tensor_metas
    candidates = tuple(draw(candidates_for(mesh_shape, m)) for m in metas)
    runtime = tuple(draw(placements_for(mesh_shape, m)) for m in metas)
    return FuzzCase(family, op, args, kwargs, mesh_shape, candidates, runtime)


# ---------------------------------------------------------------------------
# Outcomes
# ---------------------------------------------------------------------------

# (query kind, outcome) -> count, over every example run in this process.
OUTCOMES: Counter[tuple[str, str]] = Counter()
# (query kind, outcome) -> the first call that had it, with the message
FIRST_SEEN: dict[tuple[str, str], str] = {}
EXAMPLES: Counter[str] = Counter()
REJECTED: Counter[str] = Counter()
STARTED = time.monotonic()


# A query taking longer than this is a hang: it fails with the case instead of
# stalling CI (DTENSOR_FUZZ_QUERY_TIMEOUT, seconds).
QUERY_TIMEOUT = float(os.environ.get("DTENSOR_FUZZ_QUERY_TIMEOUT", "60"))


class QueryTimeout(Exception):
    """A strategy query ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise QueryTimeout in the block after ``seconds`` (main thread, POSIX only; else no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise QueryTimeout(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class KnownFailure:
    """A failure of the change the fuzzer found, excused until it is fixed."""

    # str(OpOverload) of every op it applies to
    ops: tuple[str, ...]
    # exception type names (a failure may surface differently across releases)
    # and a fragment of its message
    exception: tuple[str, ...]
    message: str
    reason: str
    reproducer: str
    # also fails on stock torch (not a bug of the change)
    stock: bool = False
    # narrows the entry to the cases it is about, when the message cannot
    applies: Callable[["FuzzCase", str], bool] | None = None


def known_failure(
    exc: BaseException, case: "FuzzCase", kind: str, table: Sequence[KnownFailure]
) -> KnownFailure | None:
    for known in table:
        if (
            str(case.op) in known.ops
            and type(exc).__name__ in known.exception
            and known.message in str(exc)
            and (known.applies is None or known.applies(case, kind))
        ):
            return known
    return None


# Refusals the fuzzer reaches that the harness's RUNTIME_REFUSALS does not list;
# stock refuses the same inputs with the same message.
EXTRA_RUNTIME_REFUSALS: dict[str, str] = {
    "would remove or reshape sharded dimension": (
        "a view that would merge, split or drop a sharded dim needs a "
        "redistribution, which a view cannot do (stock refuses even the identity "
        "view of a 0-size sharded tensor, T[0] -> [0], with this message)"
    ),
    "Cannot unflatten unevenly sharded tensor": (
        "the counterpart of flattening: a view splitting a sharded dim needs the "
        "split-off leading size to divide evenly over the mesh dim, and a view "
        "cannot redistribute its input"
    ),
    "no valid sharding strategy for the input placements": (
        "no spec keeps a placement that cannot be redistributed (an out= tensor "
        "sharded unevenly or Partial); where torch 2.13.0's expansion hands back "
        "an empty strategy (counted apart below), later releases raise this"
    ),
}


def named_outcome(exc: BaseException, op: OpOverload, runtime: bool) -> str | None:
    """The named outcome ``exc`` is (see the module docstring), or ``None``."""
    message = str(exc)
    if isinstance(exc, QueryTimeout):
        return None  # a query without an answer is a hang, whatever the registry
    if runtime and not isinstance(exc, StrategyContractError) and strategy_registry(op) == "decomposition":
        # DTensor's dispatch turns any failure of the decomposition into
        # NotImplementedError naming the op (as get_op_strategy does)
        return f"declined: decomposition raised {type(exc).__name__}"
    if isinstance(exc, NotImplementedError) and str(op) in message:
        return "not-implemented"
    if runtime:
        refusal = runtime_refusal_key(exc)
        if refusal is not None:
            return f"refusal: {refusal}"
        extra = next((p for p in EXTRA_RUNTIME_REFUSALS if p in message), None)
        if extra is not None:
            return f"refusal: {extra}"
        if isinstance(exc, ValueError) and message == f"DTensor has no sharding strategy for {op}":
            return "unregistered"
    return None


def empty_children(strategy: StrategyType) -> list[str]:
    """Where ``strategy`` holds an ``OpStrategy`` with no ``OpSpec``: an answer a consumer cannot use."""
    if isinstance(strategy, OpStrategy):
        return [] if strategy.strategies else ["the strategy"]
    if isinstance(strategy, TupleStrategy):
        return [f"child {i}" for i, c in enumerate(strategy.children) if isinstance(c, OpStrategy) and not c.strategies]
    return []


def count(kind: str, outcome: str, case: FuzzCase, detail: str = "") -> None:
    OUTCOMES[(kind, outcome)] += 1
    if (kind, outcome) not in FIRST_SEEN and outcome != "strategy checked":
        where = f"{case.call} on mesh {case.mesh_shape}"
        if kind == "runtime":
            where += f", placements {', '.join(placement_text(p) for p in case.runtime)}"
        FIRST_SEEN[(kind, outcome)] = where + (f": {detail}" if detail else "")


def short_traceback(exc: BaseException, frames: int = 8) -> str:
    return "".join(traceback.format_exception(exc)[-frames:])


# ---------------------------------------------------------------------------
# Deliberately broken variants: DTENSOR_FUZZ_BREAK=<name> shows the test fails
# ---------------------------------------------------------------------------


def _drop_meta_on_size1(strategy: StrategyType) -> StrategyType:
    def fix(spec: OpSpec) -> None:
        outs = spec.output_specs
        if isinstance(outs, DTensorSpec) and outs.tensor_meta is not None and 1 in outs.tensor_meta.shape:
            spec.output_specs = DTensorSpec(outs.mesh, outs.placements, tensor_meta=None)

    for child in strategy.children if isinstance(strategy, TupleStrategy) else [strategy]:
        if isinstance(child, OpStrategy) and child.mesh.ndim >= 2:
            for spec in child.strategies:
                fix(spec)
    return strategy


def _break_route(transform: Callable[[StrategyType], StrategyType]) -> Any:
    original = ShardingPropagator._route_op_strategy

    def route(self: ShardingPropagator, *args: Any, **kwargs: Any) -> Any:
        strategy, exc = original(self, *args, **kwargs)
        return (None if strategy is None else transform(strategy)), exc

    return mock.patch.object(ShardingPropagator, "_route_op_strategy", route)


def _copy_input_meta(strategy: StrategyType) -> StrategyType:
    for child in strategy.children if isinstance(strategy, TupleStrategy) else [strategy]:
        if not isinstance(child, OpStrategy):
            continue
        for spec in child.strategies:
            outs = spec.output_specs
            if isinstance(outs, DTensorSpec) and spec.input_specs:
                spec.output_specs = DTensorSpec(outs.mesh, outs.placements, tensor_meta=spec.input_specs[0].tensor_meta)
    return strategy


# name -> (what it breaks, patch context manager factory). Planner queries only
# (they go through ``_route_op_strategy``); the test must fail and print a shrunk case.
BROKEN_VARIANTS: dict[str, tuple[str, Callable[[], Any]]] = {
    "drop-meta-size1-dim": (
        "get_op_strategy drops the output tensor_meta of single-output specs whose "
        "shape has a size-1 dim, on meshes of 2 or more dims",
        lambda: _break_route(_drop_meta_on_size1),
    ),
    "copy-input-meta": (
        "get_op_strategy copies input 0's tensor_meta onto single outputs "
        "(the stock bug after _to_copy, t, reductions)",
        lambda: _break_route(_copy_input_meta),
    ),
}


# ---------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------


class FuzzTestBase(StrategyContractTestBase):
    """Asks and judges fuzz cases; a subclass adds one test per family
    (:func:`family_test`) and the known failures of its families."""

    known_failures: tuple[KnownFailure, ...] = ()
    # name -> (the failure, whether a case is one): the query is skipped, it hangs
    known_hangs: dict[str, tuple[KnownFailure, Callable[[FuzzCase], bool]]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._break = None
        name = os.environ.get("DTENSOR_FUZZ_BREAK")
        if name:
            if name not in BROKEN_VARIANTS:
                raise ValueError(f"DTENSOR_FUZZ_BREAK={name!r}: not one of {sorted(BROKEN_VARIANTS)}")
            print(f"fuzzing a broken DTensor: {name}: {BROKEN_VARIANTS[name][0]}", file=sys.stderr)
            cls._break = BROKEN_VARIANTS[name][1]()
            cls._break.start()

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._break is not None:
            cls._break.stop()
        report_outcomes()
        super().tearDownClass()

    def check_case(self, case: FuzzCase) -> None:
        """Ask ``case`` as a planner and as DTensor's runtime; judge both answers."""
        propagator = DTensor._op_dispatcher.sharding_propagator
        mesh = self.mesh(case.mesh_shape)
        per_input = iter(case.candidates)
        planner = strategy_schema(mesh, case.op, case.args, case.kwargs, lambda _m, _meta: next(per_input))
        try:
            expected = infer_output_metas(planner)
        except Exception as e:
            REJECTED[f"{case.op}: {type(e).__name__}"] += 1
            reject()
        EXAMPLES[case.family] += 1
        for name, (known, hangs) in self.known_hangs.items():
            if hangs(case):
                for kind in ("planner", "runtime"):
                    count(kind, f"KNOWN FAILURE: {name} (query skipped, it hangs)", case)
                return
        self.judge(case, "planner", planner, lambda: propagator.get_op_strategy(planner), expected)

        runtime = runtime_schema(mesh, case.op, case.args, case.kwargs, case.runtime)
        wrapped = propagator._wrap_with_op_strategy(runtime)
        self.judge(case, "runtime", wrapped, lambda: query_strategy(wrapped, mesh, runtime), expected)

    def judge(
        self,
        case: FuzzCase,
        kind: str,
        schema: OpSchema,
        ask: Callable[[], StrategyType | None],
        expected: OutputMetas,
    ) -> None:
        is_runtime = kind == "runtime"
        try:
            with time_limit(QUERY_TIMEOUT):
                strategy = ask()
        except Exception as e:
            outcome = named_outcome(e, case.op, is_runtime)
            if outcome is None and known_failure(e, case, kind, self.known_failures) is not None:
                outcome = f"KNOWN FAILURE: {case.op}"
            if outcome is None:
                OUTCOMES[(kind, "UNEXPLAINED")] += 1
                if isinstance(e, StrategyContractError):
                    # every strategy queried here is DTensor's own: the finalizer
                    # rejecting one means DTensor cannot answer an op it registers
                    self.fail(
                        f"{kind} query: DTensor's own strategy was rejected by the "
                        f"finalizer: {e}\n{case!r}\n{short_traceback(e)}"
                    )
                self.fail(
                    f"{kind} query raised an exception that is no named outcome: "
                    f"{type(e).__name__}: {e}\n{case!r}\n{short_traceback(e)}"
                )
            count(kind, outcome, case, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return
        if strategy is None:
            if not is_runtime:
                OUTCOMES[(kind, "UNEXPLAINED")] += 1
                self.fail(f"get_op_strategy returned None instead of raising\n{case!r}")
            count(kind, "declined", case)
            return
        violations = check_strategy_contract(schema, strategy, expected)
        if violations:
            OUTCOMES[(kind, "VIOLATION")] += 1
            self.fail(
                f"{kind} strategy breaks the contract ({len(violations)} violation(s)):\n"
                f"{format_violations(violations[:10])}\n{case!r}"
            )
        empty = empty_children(strategy)
        if empty and not is_runtime:
            # every planner input offers all-Replicate, which every op can run on
            OUTCOMES[(kind, "EMPTY")] += 1
            self.fail(f"{kind} strategy has no OpSpec in {', '.join(empty)}\n{case!r}")
        if empty:
            # No spec keeps this runtime placement (an out= tensor that is Partial):
            # vacuously within the contract; dispatch then fails choosing a spec, as
            # on stock. Counted apart so the report shows how often.
            count(kind, "strategy checked, empty (no spec serves the placement)", case)
            return
        count(kind, "strategy checked", case)


def family_test(family: str, calls: st.SearchStrategy[Call], weight: int) -> Callable[..., None]:
    """The hypothesis test of one family: fixed seed, ``weight`` percent of the examples."""

    @seed(FUZZ_SEED)
    @settings(FUZZ_SETTINGS, max_examples=examples_for(weight))
    @given(case=fuzz_cases(family, calls))
    def test(self: FuzzTestBase, case: FuzzCase) -> None:
        self.check_case(case)

    test.__name__ = f"test_{family}"
    return test


class TestStrategyContractFuzz(FuzzTestBase):
    """The pointwise family (the others: test_strategy_contract_fuzz_ops.py)."""


for _family, (_calls, _weight) in FAMILIES.items():
    setattr(TestStrategyContractFuzz, f"test_{_family}", family_test(_family, _calls, _weight))


def report_outcomes() -> None:
    """Print the outcome counts of every family run in this process so far (and write
    them as JSON to ``DTENSOR_FUZZ_REPORT``)."""
    report = {
        "seed": FUZZ_SEED,
        "examples_requested": TOTAL_EXAMPLES,
        "examples_run": dict(EXAMPLES),
        "examples_run_total": sum(EXAMPLES.values()),
        "rejected_by_shape_inference": dict(REJECTED),
        "outcomes": {f"{k}: {o}": n for (k, o), n in sorted(OUTCOMES.items())},
        "first_seen": {f"{k}: {o}": text for (k, o), text in sorted(FIRST_SEEN.items())},
        "seconds": round(time.monotonic() - STARTED, 1),
        "broken_variant": os.environ.get("DTENSOR_FUZZ_BREAK"),
    }
    print("strategy-contract fuzz:", json.dumps(report, indent=1), file=sys.stderr)
    path = os.environ.get("DTENSOR_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    run_tests()
