# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Strategies under ``torch.compile`` with dynamic shapes.

While Dynamo and AOTAutograd trace a DTensor program, sharding propagation sees
global shapes made of ``SymInt``s. The change builds every output spec with its
``tensor_meta`` and adds caches keyed on metas, so under compile it must:

* hand out output metas that are symbolic exactly where shape inference makes them
  symbolic, and strategies that satisfy the contract with those metas
  (``TestSymbolicStrategies``; the checker itself is held to handling ``SymInt``s);
* never let a cache key raise on an unhashable ``SymInt``, nor keep a symbolic
  entry alive in a cache that outlives the trace (``TestSymbolicStrategies``);
* add no guard stock torch would not add, and no recompile
  (``TestGuardsMatchStock``): the same program is compiled in a fresh interpreter
  of each torch, and the guards of every compiled frame are compared.

The program is a few layers (linear, layer_norm, softmax, view, transpose, cat,
sum, mean), forward and backward, on a fake process group with a 1-D and a 2-D
mesh, compiled with ``dynamic=True`` by the ``eager`` and ``aot_eager`` backends
and called with three batch sizes.

This file also runs under stock torch as a worker
(``python test_strategy_contract_compile.py --capture-guards OUT.json``), so its
module-level imports use only what stock torch has.
"""

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend
from torch._dynamo.utils import counters
from torch._guards import detect_fake_mode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, StrategyType
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils import _pytree as pytree


try:
    from torch.testing._internal.distributed._tensor.contract_common import (
        stock_python,
        STOCK_PYTHON_ENV,
        StrategyContractTestBase,
    )
except ImportError:  # stock torch: only the --capture-guards worker runs there
    StrategyContractTestBase = TestCase  # type: ignore[misc, assignment]

# Compilation is slow on small machines; intra-op threads only add contention.
torch.set_num_threads(1)


WORLD_SIZE = 8
BACKENDS: tuple[str, ...] = ("eager", "aot_eager")
MESHES: dict[str, tuple[int, ...]] = {"1d": (4,), "2d": (2, 2)}
# Three calls: the first compiles, the second recompiles with the batch dim
# dynamic (automatic dynamic on the subclass' inner tensor), the third hits.
BATCH_SIZES: tuple[int, ...] = (8, 12, 20)
CAPTURE_FLAG = "--capture-guards"
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


# ---------------------------------------------------------------------------
# The program, shared by the in-process tests and the guard-capture worker
# ---------------------------------------------------------------------------


def layers(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, gamma: torch.Tensor
) -> torch.Tensor:
    """A few layers whose strategies planners and eager DTensor both hit."""
    h = F.linear(x, w, b)  # (n, 8)
    h = F.layer_norm(h, (h.shape[-1],), gamma)
    p = torch.softmax(h, dim=-1)
    v = p.view(-1, 4, 2).transpose(0, 1)  # (4, n, 2)
    c = torch.cat([v, v * 2], dim=-1)  # (4, n, 4)
    return c.sum(dim=0).mean()


def make_mesh(mesh_key: str) -> DeviceMesh:
    shape = MESHES[mesh_key]
    n = 1
    for s in shape:
        n *= s
    return DeviceMesh("cpu", torch.arange(n).reshape(shape))


def program_inputs(mesh: DeviceMesh, batch: int) -> tuple[DTensor, ...]:
    """Inputs of :func:`layers`: the batch sharded on mesh dim 0; on a 2-D mesh the
    weight column-sharded on mesh dim 1 (so layer_norm needs a redistribution)."""
    rep: list[Placement] = [Replicate()] * mesh.ndim
    x_pl: list[Placement] = [Shard(0)] + [Replicate()] * (mesh.ndim - 1)
    w_pl: list[Placement] = (
        [Replicate(), Shard(0)] if mesh.ndim == 2 else list(rep)
    )
    gen = torch.Generator().manual_seed(batch)

    def make(shape: Sequence[int], placements: list[Placement]) -> DTensor:
        t = torch.randn(*shape, generator=gen)
        return distribute_tensor(t, mesh, placements).requires_grad_(True)

    return (
        make((batch, 16), x_pl),
        make((8, 16), w_pl),
        make((8,), w_pl),
        make((8,), rep),
    )


def run_program(backend: str, mesh: DeviceMesh) -> CompileCounterWithBackend:
    """Compile :func:`layers` afresh and run forward and backward per batch size."""
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(layers, backend=counter, dynamic=True)
    for batch in BATCH_SIZES:
        out = compiled(*program_inputs(mesh, batch))
        out.backward()
    return counter


def init_fake_world() -> None:
    if not dist.is_initialized():
        dist.init_process_group(
            "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
        )


# ---------------------------------------------------------------------------
# Guards: capture and normalisation
# ---------------------------------------------------------------------------

# Object and type ids, and the ids embedded in guard helper names
# (``__dtensor_spec_<id>``, ``___check_opaque_guard_fn_<id>_c0/1``): process-specific.
_ID = re.compile(r"\d{7,}")
# The guard tree's indentation (``| | +- ``): the source of each guard is already
# spelled out in it, and the tree's order follows the order attributes are read.
_TREE_PREFIX = re.compile(r"^[|\s]*\+-\s*")
# Trailing ``  # <user line>  # <file>:<line> in <function>`` comments: source
# locations, with line numbers in DTensor's files, which the change moves.
_COMMENT = re.compile(r"\s+#\s.*$")


def normalize_guards(tree: str) -> list[str]:
    """The guards of one compiled frame as a sorted list of comparable lines.

    Normalisation keeps what a guard checks and drops what differs between two
    interpreters without changing what is checked: source-location comments,
    object/type ids, the tree's indentation and line order (the result is sorted,
    as a multiset). Structural lines (``TREE_GUARD_MANAGER:``, ``RootGuardManager``)
    and blank lines are dropped.
    """
    lines: list[str] = []
    for raw in tree.splitlines():
        line = _TREE_PREFIX.sub("", raw)
        line = _COMMENT.sub("", line)
        line = _ID.sub("<id>", line).strip()
        if not line or line in ("TREE_GUARD_MANAGER:", "RootGuardManager"):
            continue
        lines.append(line)
    return sorted(lines)


class _GuardTreeHandler(logging.Handler):
    """Collects the guard tree Dynamo logs for every frame it compiles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.trees: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "TREE_GUARD_MANAGER:" in message:
            self.trees.append(message)


@dataclass
class GuardCapture:
    """What one compiled run of the program cost in guards and compiles."""

    frames: int  # graphs Dynamo handed the backend (1 + recompiles, no breaks)
    graph_breaks: int
    guards: list[list[str]] = field(default_factory=list)  # per compiled frame

    def as_json(self) -> dict[str, Any]:
        return {"frames": self.frames, "graph_breaks": self.graph_breaks, "guards": self.guards}


def capture_guards(backend: str, mesh: DeviceMesh) -> GuardCapture:
    """Run the program with Dynamo's ``guards`` log artifact captured (not printed)."""
    guards_logger = logging.getLogger("torch._dynamo.guards.__guards")
    handler = _GuardTreeHandler()
    counters.clear()
    torch._logging.set_logs(guards=True)
    propagate = guards_logger.propagate
    guards_logger.propagate = False
    guards_logger.addHandler(handler)
    try:
        counter = run_program(backend, mesh)
    finally:
        guards_logger.removeHandler(handler)
        guards_logger.propagate = propagate
        torch._logging.set_logs()
    return GuardCapture(
        frames=int(counter.frame_count),
        graph_breaks=sum(counters["graph_break"].values()),
        guards=[normalize_guards(tree) for tree in handler.trees],
    )


def guard_capture_worker(out_path: str) -> None:
    """Entry point of the worker process: every (backend, mesh) into ``out_path``."""
    torch.set_num_threads(1)
    init_fake_world()
    results: dict[str, Any] = {"torch": torch.__file__}
    for mesh_key in MESHES:
        mesh = make_mesh(mesh_key)
        for backend in BACKENDS:
            results[f"{backend}/{mesh_key}"] = capture_guards(backend, mesh).as_json()
    with open(out_path, "w") as f:
        json.dump(results, f)


def _worker_env(stock: bool) -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # No stray TORCH_LOGS from the caller: the worker's log settings are its own.
    env.pop("TORCH_LOGS", None)
    if stock:
        # A built torch may be an overlay on PYTHONPATH; stock must import its own.
        env.pop("PYTHONPATH", None)
    return env


def torch_release(python: str | None = None) -> str:
    """The release (no local build tag) of the torch ``python`` imports as the
    stock worker does, or of this interpreter's torch."""
    if python is None:
        return torch.__version__.split("+")[0]
    code = "from importlib.metadata import version; print(version('torch'))"
    out = subprocess.run(
        [python, "-c", code], env=_worker_env(stock=True), cwd=tempfile.gettempdir(),
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip().split("+")[0]


def _start_worker(python: str, out_path: str, stock: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [python, os.path.abspath(__file__), CAPTURE_FLAG, out_path],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=_worker_env(stock),
        cwd=tempfile.gettempdir(),  # never pick up the repo's torch/ by accident
    )


def _finish_worker(proc: subprocess.Popen, out_path: str, label: str) -> dict[str, Any]:
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise RuntimeError(f"{label} guard worker timed out:\n{output.decode()[-4000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"{label} guard worker exited {proc.returncode}:\n{output.decode()[-4000:]}"
        )
    with open(out_path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------
# Symbolic strategies: capture during compilation
# ---------------------------------------------------------------------------


def _is_symbolic(x: object) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) and (
        x.node.maybe_as_int() is None
        if isinstance(x, torch.SymInt)
        else not x.node.is_constant()
    )


def _symbolic_leaves(x: object) -> list[object]:
    """Every symbolic number in ``x`` (metas, specs, nested containers)."""
    if isinstance(x, DTensorSpec):
        x = x.tensor_meta
    if isinstance(x, TensorMeta):
        return [d for d in (*x.shape, *x.stride) if _is_symbolic(d)]
    if isinstance(x, dict):
        return [s for k, v in x.items() for s in (*_symbolic_leaves(k), *_symbolic_leaves(v))]
    if isinstance(x, (list, tuple)):
        return [s for e in x for s in _symbolic_leaves(e)]
    return [x] if _is_symbolic(x) else []


def _input_metas(op_schema: OpSchema) -> list[TensorMeta | None]:
    leaves = pytree.tree_leaves((op_schema.args_schema, op_schema.kwargs_schema))
    return [
        leaf.strategies[0].output_spec.tensor_meta
        for leaf in leaves
        if isinstance(leaf, OpStrategy)
    ]


def _same_dim(a: object, b: object) -> bool:
    """Whether two sizes/strides are the same expression, deciding without a guard."""
    ea = a.node.expr if isinstance(a, torch.SymInt) else sympy.Integer(int(a))  # type: ignore[arg-type]
    eb = b.node.expr if isinstance(b, torch.SymInt) else sympy.Integer(int(b))  # type: ignore[arg-type]
    return ea == eb or sympy.simplify(ea - eb) == 0


def _same_meta(got: TensorMeta | None, expected: TensorMeta) -> bool:
    return (
        got is not None
        and got.dtype == expected.dtype
        and len(got.shape) == len(expected.shape)
        and len(got.stride) == len(expected.stride)
        and all(_same_dim(a, b) for a, b in zip(got.shape, expected.shape))
        and all(_same_dim(a, b) for a, b in zip(got.stride, expected.stride))
    )


def _output_pairs(spec_outputs: object, metas: object) -> Iterator[tuple[str, object, TensorMeta]]:
    """(position, output spec, expected meta) for every tensor result."""
    if isinstance(metas, TensorMeta):
        yield "output", spec_outputs, metas
        return
    if isinstance(metas, (list, tuple)):
        outs = spec_outputs if isinstance(spec_outputs, (list, tuple)) else ()
        for pos, meta in enumerate(metas):
            if isinstance(meta, TensorMeta):
                yield f"output {pos}", outs[pos] if pos < len(outs) else None, meta


@dataclass
class StrategyQuery:
    """One strategy DTensor produced while the program was being compiled."""

    schema: OpSchema
    strategy: StrategyType
    # Shape inference of the op on the schema's (possibly symbolic) global inputs,
    # run independently of the change's own inference, in the trace's fake mode.
    expected: object
    fake_mode: Any

    @property
    def symbolic(self) -> bool:
        return bool(_symbolic_leaves(_input_metas(self.schema)))

    def describe(self) -> str:
        metas = ", ".join(
            "None" if m is None else f"{tuple(m.shape)}" for m in _input_metas(self.schema)
        )
        return f"{self.schema.op}({metas})"


@dataclass
class StrategyCapture:
    queries: list[StrategyQuery]
    frames: int
    # Per query: violations reported by check_strategy_contract, and the guards the
    # checker added to the trace's ShapeEnv while judging it.
    violations: list[list[str]] = field(default_factory=list)
    checker_guards: list[list[str]] = field(default_factory=list)


def _shape_envs(query: StrategyQuery) -> list[Any]:
    envs: dict[int, Any] = {}
    for s in _symbolic_leaves(_input_metas(query.schema)):
        env = s.node.shape_env  # type: ignore[attr-defined]
        envs[id(env)] = env
    return list(envs.values())


def capture_strategies(backend: str, mesh: DeviceMesh) -> StrategyCapture:
    """Run the program, recording every strategy DTensor's propagator produces.

    The hook is the propagator's ``_route_op_strategy``, the one place eager
    dispatch and planner queries both take to a strategy source. For each query the
    expected output metas are inferred right there, inside the trace, with
    ``infer_output_metas`` (the checker's reference, not the change's cached path).
    """
    from torch.distributed.tensor._ops.strategy_contract import (
        check_strategy_contract,
        infer_output_metas,
    )

    propagator = DTensor._op_dispatcher.sharding_propagator
    route = propagator._route_op_strategy
    queries: list[StrategyQuery] = []

    def recording_route(
        strategy_schema: OpSchema, output_metas: object, runtime_schema: OpSchema | None = None
    ) -> tuple[StrategyType | None, Exception | None]:
        strategy, exc = route(strategy_schema, output_metas, runtime_schema)
        if strategy is not None:
            queries.append(
                StrategyQuery(
                    strategy_schema,
                    strategy,
                    infer_output_metas(strategy_schema),
                    detect_fake_mode(),
                )
            )
        return strategy, exc

    propagator._route_op_strategy = recording_route  # type: ignore[method-assign]
    try:
        counter = run_program(backend, mesh)
    finally:
        del propagator._route_op_strategy
    capture = StrategyCapture(queries, int(counter.frame_count))
    for query in queries:
        envs = _shape_envs(query)
        before = [len(env.guards) for env in envs]
        violations = check_strategy_contract(query.schema, query.strategy, query.expected)
        capture.violations.append([str(v) for v in violations])
        capture.checker_guards.append(
            [str(g.expr) for env, n in zip(envs, before) for g in env.guards[n:]]
        )
    return capture


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------

CONFIGS: tuple[str, ...] = tuple(f"{b}/{m}" for m in MESHES for b in BACKENDS)


class TestSymbolicStrategies(StrategyContractTestBase):
    """Strategies produced while compiling with dynamic shapes (built torch only)."""

    _captures: dict[str, StrategyCapture]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._captures = {}

    @classmethod
    def tearDownClass(cls) -> None:
        cls._captures = {}
        torch._dynamo.reset()
        super().tearDownClass()

    def capture(self, config: str) -> StrategyCapture:
        """The program compiled once per (backend, mesh) for all tests of the class."""
        if config not in self._captures:
            backend, mesh_key = config.split("/")
            self._captures[config] = capture_strategies(backend, self.mesh(MESHES[mesh_key]))
        return self._captures[config]

    def symbolic_queries(self, config: str) -> list[StrategyQuery]:
        queries = [q for q in self.capture(config).queries if q.symbolic]
        self.assertGreater(
            len(queries), 0, f"{config}: no strategy query saw a symbolic input"
        )
        return queries

    @parametrize("config", CONFIGS)
    def test_output_metas_symbolic_where_inference_is(self, config: str) -> None:
        """Every output spec carries the symbolic meta shape inference gives, not a
        specialised (hint) value: a concrete size where inference is symbolic would
        silently make a planner's plan shape-specific."""
        mismatches: list[str] = []
        symbolic_outputs = 0
        for query in self.symbolic_queries(config):
            specs = (
                query.strategy.strategies
                if isinstance(query.strategy, OpStrategy)
                else [s for c in query.strategy.children for s in c.strategies]  # type: ignore[attr-defined]
            )
            for index, spec in enumerate(specs):
                for where, out, meta in _output_pairs(spec.output_specs, query.expected):
                    got = out.tensor_meta if isinstance(out, DTensorSpec) else None
                    if not _same_meta(got, meta):
                        mismatches.append(
                            f"{query.describe()} spec {index} {where}: expected "
                            f"{tuple(meta.shape)}/{tuple(meta.stride)}, got "
                            f"{None if got is None else (tuple(got.shape), tuple(got.stride))}"
                        )
                    elif _symbolic_leaves(got):
                        symbolic_outputs += 1
        self.assertEqual(mismatches, [], "\n".join(mismatches[:20]))
        self.assertGreater(symbolic_outputs, 0, f"{config}: no symbolic output meta at all")

    @parametrize("config", CONFIGS)
    def test_contract_holds_with_symbolic_metas(self, config: str) -> None:
        """``check_strategy_contract`` finds nothing on any strategy of the run,
        symbolic or not (the expected metas are symbolic where the inputs are)."""
        capture = self.capture(config)
        failures = [
            f"{q.describe()}: {v}"
            for q, vs in zip(capture.queries, capture.violations)
            for v in vs
        ]
        self.assertEqual(failures, [], "\n".join(failures[:20]))

    # Regression test: the checker used to call float() on every redistribute
    # cost; under dynamic shapes costs are SymFloats, and float() guarded on them
    # (Eq(<cost expression in the batch size>, <hint>)), specialising the trace it
    # judged. Symbolic costs are now skipped (strategy_contract._Checker.check_inputs).
    def test_checker_adds_no_guards(self) -> None:
        """Judging a symbolic strategy must not specialise the trace it judges."""
        capture = self.capture("aot_eager/1d")
        added = [
            f"{q.describe()}: {g}"
            for q, gs in zip(capture.queries, capture.checker_guards)
            for g in gs
        ]
        self.assertEqual(added, [], "\n".join(added[:10]))

    def test_checker_reports_symbolic_violations(self) -> None:
        """The checker judges symbolic metas: a wrong symbolic size is a C1 violation,
        reported without raising."""
        from torch.distributed.tensor._ops.strategy_contract import (
            check_strategy_contract,
        )

        query = next(
            q
            for q in self.symbolic_queries("aot_eager/1d")
            if isinstance(q.expected, TensorMeta) and _symbolic_leaves(q.expected)
        )
        meta = query.expected
        wrong = TensorMeta(
            shape=torch.Size([meta.shape[0] + 1, *meta.shape[1:]]),
            stride=meta.stride,
            dtype=meta.dtype,
        )
        violations = check_strategy_contract(query.schema, query.strategy, wrong)
        self.assertGreater(len(violations), 0, f"{query.describe()}: no violation found")
        self.assertEqual({v.clause for v in violations}, {"C1"}, str(violations[:3]))

    @parametrize("config", CONFIGS)
    def test_caches_tolerate_symints(self, config: str) -> None:
        """Compilation ran through every cache the change adds (the run above did not
        raise); afterwards no cache holds a symbolic key or value (it would pin a dead
        ShapeEnv and hand its symbols to another trace), and a planner query made
        inside the trace's fake mode on a symbolic schema gets a complete answer."""
        from torch.distributed.tensor._ops import (
            _output_metas,
            _redistribute_cost_cache,
        )
        from torch.distributed.tensor._ops.strategy_contract import (
            check_strategy_contract,
        )

        queries = self.symbolic_queries(config)
        propagator = DTensor._op_dispatcher.sharding_propagator
        failures: list[str] = []
        for query in queries[:6]:
            with query.fake_mode:
                try:
                    strategy = propagator.get_op_strategy(query.schema)
                except TypeError as e:
                    failures.append(f"{query.describe()}: planner query raised {e!r}")
                    continue
            violations = check_strategy_contract(query.schema, strategy, query.expected)
            failures += [f"{query.describe()}: planner {v}" for v in violations]
        for name, cache in (
            ("_output_metas._meta_cache", _output_metas._meta_cache),
            ("_redistribute_cost_cache._costs", _redistribute_cost_cache._costs),
        ):
            leaked = _symbolic_leaves(dict(cache.items()))
            if leaked:
                failures.append(f"{name} holds symbolic entries: {leaked[:3]}")
        self.assertEqual(failures, [], "\n".join(failures[:20]))


class TestGuardsMatchStock(TestCase):
    """The same program compiled on stock and built torch, each in a fresh process."""

    def test_guards_and_recompiles_match_stock(self) -> None:
        """Same number of compiled frames, graph breaks and, per frame, the same
        guards (normalised, see :func:`normalize_guards`) on built as on stock."""
        stock = stock_python(os.path.join(REPO_ROOT, ".venv-stock"))
        if stock is None:
            self.skipTest(
                f"no stock torch interpreter: set {STOCK_PYTHON_ENV} or build "
                f"{os.path.join(REPO_ROOT, '.venv-stock')} (make build)"
            )
        if not os.path.exists(stock):
            self.fail(f"{STOCK_PYTHON_ENV}={stock} does not exist")
        stock_release, release = torch_release(stock), torch_release()
        if stock_release != release:
            # Guards of two releases differ for reasons of their own.
            mismatch = f"{stock} has torch {stock_release}, this interpreter {release}"
            if os.environ.get(STOCK_PYTHON_ENV):
                self.fail(mismatch)
            self.skipTest(f"no stock torch {release}: {mismatch}; set {STOCK_PYTHON_ENV}")
        with tempfile.TemporaryDirectory() as tmp:
            paths = {label: os.path.join(tmp, f"{label}.json") for label in ("stock", "built")}
            procs = {
                "stock": _start_worker(stock, paths["stock"], stock=True),
                "built": _start_worker(sys.executable, paths["built"], stock=False),
            }
            results = {label: _finish_worker(p, paths[label], label) for label, p in procs.items()}
        self.assertNotEqual(
            results["stock"]["torch"], results["built"]["torch"],
            "stock and built workers imported the same torch",
        )
        report: list[str] = []
        for config in CONFIGS:
            s, b = results["stock"][config], results["built"][config]
            report.append(
                f"{config}: frames stock {s['frames']} built {b['frames']}, "
                f"graph breaks {s['graph_breaks']}/{b['graph_breaks']}, guards "
                f"{[len(g) for g in s['guards']]} / {[len(g) for g in b['guards']]}"
            )
            self.assertEqual(b["frames"], s["frames"], f"{config}: recompiles differ\n" + "\n".join(report))
            self.assertEqual(b["graph_breaks"], s["graph_breaks"], f"{config}: graph breaks differ")
            self.assertEqual(
                len(b["guards"]), len(s["guards"]), f"{config}: compiled frames with guards differ"
            )
            self.assertGreater(len(s["guards"]), 0, f"{config}: no guards captured")
            for frame, (sg, bg) in enumerate(zip(s["guards"], b["guards"])):
                extra = Counter(bg) - Counter(sg)
                missing = Counter(sg) - Counter(bg)
                self.assertFalse(
                    extra or missing,
                    f"{config} frame {frame}: guards only on built: {sorted(extra)}; "
                    f"only on stock: {sorted(missing)}",
                )
        print("\n".join(report), file=sys.stderr)


instantiate_parametrized_tests(TestSymbolicStrategies)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CAPTURE_FLAG:
        guard_capture_worker(sys.argv[2])
    else:
        torch.set_num_threads(1)
        run_tests()
