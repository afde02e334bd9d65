"""One side of the strategy-contract audit: runs inside one venv, writes one JSON.

Run from the repository root (the orchestrator does this for you)::

    .venv/bin/python -m tools.audit.worker --role built --out /tmp/built.json --ops mm,t

Steps:

1. an in-process fake process group (world size 8) and CPU device meshes;
2. aten calls captured from OpInfo samples (forward, in-place variant, backward
   of float32 samples), tensors reduced to their metadata, deduplicated and
   capped per aten op;
3. every captured call of an op DTensor knows (single-dim strategy, op strategy,
   decomposition, propagation rule) is queried the way dispatch queries it
   ("runtime": one current placement per input) and the way a planner queries it
   ("planner": several candidate placements per input), and every returned
   strategy is judged by the repository's ``strategy_contract.py`` checker;
4. counts, examples, errors, coverage and DTensor's runtime selections go to JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import itertools
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
    from collections.abc import Iterator


REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CHECKER = REPO_ROOT / "torch/distributed/tensor/_ops/strategy_contract.py"

REGISTRIES = ("single_dim", "op_strategy", "decomposition", "rules")
MODES = ("runtime", "planner", "utility")
DTYPE_NAMES = ("float32", "bfloat16", "int64", "bool", "complex64")
# Clauses a propagation rule can be held to: rules return an OutputSharding, not
# OpSpecs, so there are no input_specs (C3) or redistribute costs (C4) to judge.
RULE_CLAUSES = ("C1", "C2")


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
    if getattr(exc, "where", None):
        return exc.where
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
    return load_by_path(
        name, REPO_ROOT / "torch/testing/_internal/distributed/_tensor/contract_sweep.py"
    )


def load_checker(path: Path) -> Any:
    """Import strategy_contract.py from ``path`` so both torches are judged by the same file."""
    return load_by_path(f"_audit_{path.stem}", path)


# --------------------------------------------------------------------------------------
# Op selection
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
# Capture
# --------------------------------------------------------------------------------------


class TArg:
    """A captured tensor argument, reduced to its metadata (a pytree leaf)."""

    __slots__ = ("meta",)

    def __init__(self, meta: Any) -> None:
        self.meta = meta

    def __repr__(self) -> str:
        m = self.meta
        dt = str(m.dtype).replace("torch.", "")
        return f"T{list(m.shape)}s{list(m.stride)}:{dt}"


def canon(x: Any) -> str:
    """A stable text form of captured args (identical across processes and venvs)."""
    if isinstance(x, TArg):
        return repr(x)
    if isinstance(x, (list, tuple)):
        inner = ",".join(canon(e) for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}={canon(v)}" for k, v in x.items()) + "}"
    text = repr(x)
    if " at 0x" in text or "object at" in text:
        return f"<{type(x).__name__}>"
    return text


@dataclass
class Call:
    op: Any
    args: tuple
    kwargs: dict
    key: str
    source: str
    opinfo: str
    dtypes: tuple

    @property
    def qid(self) -> str:
        return hashlib.sha1(self.key.encode(), usedforsecurity=False).hexdigest()[:12]


class CaptureMode:
    """Builds the TorchDispatchMode lazily (torch is imported by the worker's main)."""

    @staticmethod
    def make(pool: dict, pool_cap: int, stats: Counter, keep_op: Any) -> Any:
        import torch
        from torch.distributed.tensor._dtensor_spec import TensorMeta
        from torch.utils import _pytree as pytree
        from torch.utils._python_dispatch import TorchDispatchMode

        class _Capture(TorchDispatchMode):
            source = "forward"
            opinfo = ""

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if getattr(func, "namespace", None) == "aten" and keep_op(func):
                    self._record(func, args, kwargs)
                return out

            def _record(self, func, args, kwargs):
                ok = True

                def to_meta(x):
                    nonlocal ok
                    if isinstance(x, torch.Tensor):
                        if (
                            type(x) is not torch.Tensor and not isinstance(x, torch.nn.Parameter)
                        ) or x.layout != torch.strided or x.device.type != "cpu":
                            ok = False
                            return None
                        return TArg(
                            TensorMeta(shape=torch.Size(x.shape), stride=tuple(x.stride()), dtype=x.dtype)
                        )
                    return x

                margs, mkwargs = pytree.tree_map(to_meta, (tuple(args), dict(kwargs)))
                stats["calls_seen"] += 1
                if not ok:
                    stats["calls_non_dense"] += 1
                    return
                key = f"{func}|{canon(margs)}|{canon(mkwargs)}"
                per_op = pool[func]
                if key in per_op or len(per_op) >= pool_cap:
                    return
                dtypes = tuple(
                    str(leaf.meta.dtype).replace("torch.", "")
                    for leaf in pytree.tree_leaves((margs, mkwargs))
                    if isinstance(leaf, TArg)
                )
                per_op[key] = Call(func, margs, mkwargs, key, self.source, self.opinfo, dtypes)

        return _Capture()


def _no_test_fn() -> None:
    return None


def all_opinfos() -> list[Any]:
    import torch.testing._internal.common_utils as common_utils
    import torch.testing._internal.opinfo.core as opinfo_core

    # OpInfo.sample_inputs looks for the running unittest by walking the stack with
    # inspect.stack() (to apply per-sample skips of test files). There is no test
    # here, and that walk costs ~0.4s per call once torch.distributed is imported.
    common_utils.extract_test_fn = _no_test_fn
    opinfo_core.extract_test_fn = _no_test_fn

    # The same OpInfo lists as the registry-wide test; the repo's file is loaded by
    # path so stock and built sample identically.
    return load_contract_sweep().opinfo_db()


def _clone_sample(sample: Any) -> tuple[Any, tuple, dict]:
    import torch
    from torch.utils import _pytree as pytree

    def c(x):
        return x.detach().clone() if isinstance(x, torch.Tensor) else x

    return pytree.tree_map(c, (sample.input, tuple(sample.args), dict(sample.kwargs)))


def _call_opinfo(fn: Any, inp: Any, args: tuple, kwargs: dict) -> Any:
    return fn(inp, *args, **kwargs)


def _backward(out: Any) -> bool:
    import torch
    from torch.utils import _pytree as pytree

    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor) and leaf.requires_grad:
            if not (leaf.is_floating_point() or leaf.is_complex()):
                continue
            loss = leaf.abs().sum() if leaf.is_complex() else leaf.sum()
            loss.backward()
            return True
    return False


def capture(args: argparse.Namespace, flt: OpFilter) -> tuple[dict, dict]:
    """Run OpInfo samples under the capture mode; return (pool by op, capture stats)."""
    import torch

    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    infos = all_opinfos()
    chosen: list[tuple[Any, bool]] = []  # (info, keep every op it calls)
    for info in infos:
        if not flt.active:
            chosen.append((info, True))
        elif flt.opinfo_selected(info):
            chosen.append((info, True))
        elif flt.aten_patterns:
            chosen.append((info, False))

    pool: dict[Any, dict[str, Call]] = defaultdict(dict)
    stats: Counter = Counter()
    failures: Counter = Counter()
    keep_all = [True]

    def keep_op(func: Any) -> bool:
        return keep_all[0] or flt.aten_selected(func)

    mode = CaptureMode.make(pool, args.pool_cap, stats, keep_op)
    last = 0.0
    for n, (info, everything) in enumerate(chosen, 1):
        keep_all[0] = everything
        mode.opinfo = opinfo_label(info)
        try:
            supported = info.supported_dtypes("cpu")
        except Exception:
            supported = set()
        for dtype in dtypes:
            if dtype not in supported:
                continue
            grad = dtype == torch.float32 and bool(getattr(info, "supports_autograd", False))
            extra = {}
            if args.foreach_tensors and type(info).__name__ == "ForeachFuncInfo":
                # foreach samples default to lists of 20+ tensors (shapes N-i x N-i); a
                # shorter list keeps shardable and unshardable elements at a fraction
                # of the query time (every element is one TupleStrategy child).
                extra["num_input_tensors"] = [args.foreach_tensors]
            try:
                samples = list(
                    itertools.islice(
                        info.sample_inputs("cpu", dtype, requires_grad=grad, **extra), args.max_samples
                    )
                )
            except Exception as e:
                stats["sample_generation_failures"] += 1
                failures[f"{opinfo_label(info)}: sample_inputs: {_short_error(e)[0]}"] += 1
                continue
            inplace = info.get_inplace() if hasattr(info, "get_inplace") else None
            for sample in samples:
                stats["samples"] += 1
                # forward (+ backward for float32 samples of differentiable ops)
                try:
                    with mode:
                        mode.source = "forward"
                        out = _call_opinfo(info, sample.input, tuple(sample.args), dict(sample.kwargs))
                        if grad:
                            mode.source = "backward"
                            if _backward(out):
                                stats["backward_runs"] += 1
                except Exception as e:
                    stats["sample_failures"] += 1
                    failures[f"{opinfo_label(info)}: {mode.source}: {_short_error(e)[0]}"] += 1
                # in-place variant on a detached copy
                if inplace is not None:
                    try:
                        inp, a, kw = _clone_sample(sample)
                        with mode:
                            mode.source = "inplace"
                            inplace(inp, *a, **kw)
                        stats["inplace_runs"] += 1
                    except Exception as e:
                        stats["sample_failures"] += 1
                        failures[f"{opinfo_label(info)}: inplace: {_short_error(e)[0]}"] += 1
        now = time.monotonic()
        if now - last > 0.5 or n == len(chosen):
            _progress(args.role, "capture", n, len(chosen))
            last = now
    stats["opinfos"] = len(chosen)
    return pool, {"stats": dict(stats), "failures": dict(failures.most_common())}


def select_calls(pool: dict[str, Call], cap: int) -> list[Call]:
    """Pick up to ``cap`` calls, preferring unseen dtype signatures, then unseen sources."""
    remaining = list(pool.values())
    picked: list[Call] = []
    seen_dtypes: set = set()
    seen_sources: set = set()
    while remaining and len(picked) < cap:
        best = min(
            range(len(remaining)),
            key=lambda i: (
                remaining[i].dtypes in seen_dtypes,
                remaining[i].source in seen_sources,
                i,
            ),
        )
        call = remaining.pop(best)
        picked.append(call)
        seen_dtypes.add(call.dtypes)
        seen_sources.add(call.source)
    return picked


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
        self.no_strategy = 0
        self.ops_no_strategy: set[str] = set()

    def add(self, op: str, violations: list, n_specs: int, query_key: str) -> None:
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
        from torch.distributed.tensor._ops import _finalize_strategy, _redistribute_cost_cache
    except ImportError:
        return sizes
    sizes["output_metas"] = {
        "entries": _finalize_strategy.meta_cache_size(),
        "bound": _finalize_strategy._META_CACHE_SIZE,
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


# --------------------------------------------------------------------------------------
# Querying DTensor
# --------------------------------------------------------------------------------------


class QueryTimeout(BaseException):
    """A query used more CPU time than --query-timeout.

    A BaseException, so that DTensor's own ``except Exception`` (decomposition
    fallbacks, for instance) cannot swallow it and keep going.
    """


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
    def __init__(self, args: argparse.Namespace, checker: Any) -> None:
        import torch
        from torch.distributed.tensor import DTensor

        self.args = args
        self.checker = checker
        self.p = DTensor._op_dispatcher.sharding_propagator
        self.sweep = load_contract_sweep()
        self.meshes = self._make_meshes(args.meshes)
        self.modes = [m for m in args.modes.split(",") if m]
        self.buckets: dict[tuple[str, str], Bucket] = {}
        self.reg_buckets: dict[tuple[str, str, str], Bucket] = {}
        self.error_details: dict[tuple, dict] = {}
        self.violating: dict[tuple[str, str], dict[str, dict]] = defaultdict(dict)
        self.selections: dict[str, dict] = {}
        self.infer_failed: dict[str, dict] = {}
        self.slow: list[tuple[float, str]] = []
        self.op_seconds: Counter = Counter()
        self.torch = torch

    # -- setup -------------------------------------------------------------------------

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

    def registry(self, op: Any) -> str | None:
        from torch.distributed.tensor._decompositions import DecompShardingStrategy

        if op in self.p.op_single_dim_strategy_funcs:
            return "single_dim"
        if op in self.p.op_strategy_funcs:
            return "op_strategy"
        try:
            if DecompShardingStrategy.has_decomp(op):
                return "decomposition"
        except Exception:
            pass
        if op in self.p.op_to_rules:
            return "rules"
        return None

    def bucket(self, mode: str, mesh: str, reg: str) -> tuple[Bucket, Bucket]:
        key = (mode, mesh)
        if key not in self.buckets:
            self.buckets[key] = Bucket(self.checker.CLAUSES)
        rkey = (mode, mesh, reg)
        if rkey not in self.reg_buckets:
            self.reg_buckets[rkey] = Bucket(self.checker.CLAUSES)
        return self.buckets[key], self.reg_buckets[rkey]

    # -- schemas -------------------------------------------------------------------------

    def _schema_info(self, op: Any, reg: str) -> Any:
        if reg == "decomposition":
            self.p.decomp_strategy.ensure_schema_info(op)
        info = self.p.op_to_schema_info.get(op)
        if info is None:
            info = self.p.op_to_schema_info_for_single_dim_strategy.get(op)
        return info

    @staticmethod
    def tensor_args(call: Call) -> list[TArg]:
        from torch.utils import _pytree as pytree

        return [x for x in pytree.tree_leaves((call.args, call.kwargs)) if isinstance(x, TArg)]

    def runtime_schema(self, call: Call, reg: str, mesh: Any, placements: list[tuple]) -> Any:
        """OpSchema with one DTensorSpec per tensor (as DTensor's dispatch builds it)."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.distributed.tensor._op_schema import OpSchema
        from torch.utils import _pytree as pytree

        it = iter(placements)

        def conv(x):
            if isinstance(x, TArg):
                return DTensorSpec(mesh, next(it), tensor_meta=x.meta)
            return x

        args, kwargs = pytree.tree_map(conv, (call.args, call.kwargs))
        return OpSchema(call.op, tuple(args), kwargs, schema_info=self._schema_info(call.op, reg))

    def candidates(self, meta: Any, mesh: Any) -> list[tuple]:
        """Replicate, each valid Shard(d), Partial (float/complex) per mesh dim; capped.

        Ordered by how many mesh dims are not Replicate, then by per-dim option order
        (R, S(0), S(1), ..., P), so the all-Replicate candidate comes first.
        """
        from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

        per_dim = []
        for d in range(mesh.ndim):
            opts = [Replicate()]
            size = mesh.size(d)
            opts += [Shard(i) for i, s in enumerate(meta.shape) if s >= size]
            if meta.dtype.is_floating_point or meta.dtype.is_complex:
                opts.append(Partial())
            per_dim.append(opts)
        combos = list(itertools.product(*[range(len(o)) for o in per_dim]))
        combos.sort(key=lambda c: (sum(1 for i in c if i != 0), c))
        combos = combos[: self.args.max_candidates]
        return [tuple(per_dim[d][i] for d, i in enumerate(c)) for c in combos]

    def planner_schema(self, call: Call, reg: str, mesh: Any) -> Any:
        """OpSchema with an OpStrategy of candidate placements per tensor input.

        Lists mirror ShardingPropagator._wrap_with_op_strategy: an all-tensor list
        becomes a TupleStrategy, a list mixing tensors and None stays a list.
        """
        from torch.distributed.tensor._dtensor_spec import DTensorSpec
        from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy

        def strat(t: TArg) -> OpStrategy:
            return OpStrategy(
                [OpSpec(DTensorSpec(mesh, pl, tensor_meta=t.meta)) for pl in self.candidates(t.meta, mesh)]
            )

        def conv(x):
            if isinstance(x, TArg):
                return strat(x)
            if isinstance(x, (list, tuple)) and len(x) > 0:
                if all(isinstance(e, TArg) for e in x):
                    children = [conv(e) for e in x]
                    return TupleStrategy(tuple(children) if isinstance(x, tuple) else children)
                if any(isinstance(e, TArg) for e in x):
                    return [conv(e) for e in x]
            return x

        args = tuple(conv(a) for a in call.args)
        kwargs = {k: conv(v) for k, v in call.kwargs.items()}
        return OpSchema(call.op, args, kwargs, schema_info=self._schema_info(call.op, reg))

    # -- queries -------------------------------------------------------------------------

    def query_strategy(self, mode: str, reg: str, mesh: Any, runtime: Any, strategy_schema: Any) -> Any:
        """What DTensor hands out for this schema, called the way its consumer calls it."""
        from torch.distributed.tensor._ops.single_dim_strategy import _expand_single_dim_strategy_to_mesh

        op = strategy_schema.op
        if mode == "utility":
            # the single-dim rules expanded as a downstream rule author does
            return self.sweep.utility_strategy(strategy_schema, mesh)
        if reg == "single_dim":
            info = self.p.op_single_dim_strategy_funcs[op]
            metas = self.p._propagate_tensor_meta_non_cached(runtime) if mode == "runtime" else None
            fn = _expand_single_dim_strategy_to_mesh(mesh, strategy_schema, info, metas)
            return fn(op, strategy_schema.args_meta, strategy_schema.kwargs_meta)
        if reg == "op_strategy":
            return self.p.op_strategy_funcs[op](strategy_schema)
        if reg == "decomposition":
            return self.p.decomp_strategy.propagate_strategy(runtime if mode == "runtime" else strategy_schema)
        raise AssertionError(reg)

    def query_rule(self, runtime: Any, strategy_schema: Any) -> Any:
        """A propagation rule's output, wrapped as a one-OpSpec strategy (C1/C2 only)."""
        from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

        rule = self.p.op_to_rules[runtime.op]
        out = rule(runtime)
        if out.output_spec is None and out.redistribute_schema is not None:
            # as ShardingPropagator does: re-run on the suggested schema
            out = rule(out.redistribute_schema)
        return OpStrategy([OpSpec(output_specs=out.output_spec)])

    def select(self, runtime: Any) -> dict:
        """The strategy DTensor's dispatch selects for this runtime schema."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec

        def plc(x):
            if isinstance(x, DTensorSpec):
                return str(tuple(x.placements))
            if isinstance(x, (list, tuple)):
                return [plc(e) for e in x]
            return None if x is None else type(x).__name__

        try:
            out = self.p.propagate_op_sharding_non_cached(runtime)
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

    def record_error(self, exc: BaseException, op: str, reg: str, mode: str, mesh: str, what: str, call: Call) -> None:
        t, m = _short_error(exc)
        key = (op, reg, mode, mesh, t, m)
        if key not in self.error_details:
            self.error_details[key] = {
                "op": op, "registry": reg, "mode": mode, "mesh": mesh, "type": t,
                "message": m, "raised_at": _raised_at(exc), "query": what,
                "call": call.key.split("|", 1)[1], "count": 0,
            }
            if self.args.tracebacks:
                self.error_details[key]["traceback"] = traceback.format_exc(limit=-6)
        self.error_details[key]["count"] += 1

    def judge(self, mode: str, mesh_name: str, reg: str, call: Call, what: str,
              strategy_schema: Any, strategy: Any, metas: Any) -> None:
        op = str(call.op)
        total, by_reg = self.bucket(mode, mesh_name, reg)
        if strategy is None:
            total.add_none(op)
            by_reg.add_none(op)
            return
        violations = self.checker.check_strategy_contract(strategy_schema, strategy, metas)
        if reg == "rules":
            violations = [
                v for v in violations
                if v.clause in RULE_CLAUSES or (v.clause == "C5" and v.child_clause in RULE_CLAUSES)
            ]
        n = _count_specs(strategy)
        total.add(op, violations, n, what)
        by_reg.add(op, violations, n, what)
        if violations:
            entry = self.violating[(mode, mesh_name)].setdefault(
                op, {"op": op, "registry": reg, "specs_by_clause": Counter(), "examples": {}}
            )
            per_clause: dict[str, set] = defaultdict(set)
            for v in violations:
                per_clause[v.clause].add(_spec_id(v))
                if v.clause not in entry["examples"]:
                    entry["examples"][v.clause] = {
                        "violation": str(v), "query": what, "call": call.key.split("|", 1)[1],
                    }
            for c, ids in per_clause.items():
                entry["specs_by_clause"][c] += len(ids)

    def audit_call(self, call: Call, reg: str) -> None:
        from torch.distributed.tensor.placement_types import Replicate, Shard

        op = str(call.op)
        tensors = self.tensor_args(call)
        metas_done = False
        metas: Any = None
        for mesh_name, mesh in self.meshes:
            rep = (Replicate(),) * mesh.ndim
            configs = [("R", [rep] * len(tensors))]
            first = tensors[0].meta
            if len(first.shape) >= 1 and first.shape[0] >= mesh.size(0):
                s0 = (Shard(0),) + (Replicate(),) * (mesh.ndim - 1)
                configs.append(("S0", [s0] + [rep] * (len(tensors) - 1)))
            if not metas_done:
                # expected results: shape inference on the global inputs (same on every mesh)
                try:
                    runtime = self.runtime_schema(call, reg, mesh, configs[0][1])
                    metas = self.checker.infer_output_metas(self.p._wrap_with_op_strategy(runtime))
                except Exception as e:
                    t, m = _short_error(e)
                    self.infer_failed.setdefault(op, {"op": op, "type": t, "message": m, "calls": 0})
                    self.infer_failed[op]["calls"] += 1
                    return
                metas_done = True

            if "runtime" in self.modes:
                for cfg, placements in configs:
                    what = f"runtime {cfg} on mesh {mesh_name}"
                    t0 = time.monotonic()
                    runtime = self.runtime_schema(call, reg, mesh, placements)
                    strategy_schema = self.p._wrap_with_op_strategy(runtime)
                    timed_out = False
                    try:
                        with time_limit(self.args.query_timeout):
                            if reg == "rules":
                                strategy = self.query_rule(runtime, strategy_schema)
                            else:
                                strategy = self.query_strategy("runtime", reg, mesh, runtime, strategy_schema)
                    except (Exception, QueryTimeout) as e:
                        timed_out = isinstance(e, QueryTimeout)
                        self.record_error(e, op, reg, "runtime", mesh_name, what, call)
                        total, by_reg = self.bucket("runtime", mesh_name, reg)
                        total.add_error(op)
                        by_reg.add_error(op)
                    else:
                        self.judge("runtime", mesh_name, reg, call, what, strategy_schema, strategy, metas)
                    if timed_out:
                        sel = {"error": "QueryTimeout: not selected, the strategy query timed out"}
                    else:
                        try:
                            with time_limit(self.args.query_timeout):
                                sel = self.select(runtime)
                        except QueryTimeout as e:
                            sel = {"error": f"QueryTimeout: {e}"}
                    self.selections[f"{call.qid}|{mesh_name}|{cfg}"] = {"op": op, **sel}
                    self.timed(t0, op, what)

            # planner queries ask the registry; utility queries expand the
            # single-dim rules themselves, as a downstream rule author does
            for mode in ("planner", "utility"):
                if mode not in self.modes or reg == "rules" or (
                    mode == "utility" and reg != "single_dim"
                ):
                    continue
                what = f"{mode} on mesh {mesh_name}"
                t0 = time.monotonic()
                try:
                    strategy_schema = self.planner_schema(call, reg, mesh)
                    with time_limit(self.args.query_timeout):
                        strategy = self.query_strategy(mode, reg, mesh, None, strategy_schema)
                except (Exception, QueryTimeout) as e:
                    self.record_error(e, op, reg, mode, mesh_name, what, call)
                    total, by_reg = self.bucket(mode, mesh_name, reg)
                    total.add_error(op)
                    by_reg.add_error(op)
                else:
                    self.judge(mode, mesh_name, reg, call, what, strategy_schema, strategy, metas)
                self.timed(t0, op, what)

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
                rec["error_details"] = sorted(
                    (d for d in self.error_details.values() if d["mode"] == mode and d["mesh"] == mesh_name),
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="torch", help="label used in progress lines and the JSON (stock/built)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--ops", default=None, help="comma-separated OpInfo and/or aten op names, globs allowed")
    ap.add_argument("--meshes", default="4,2x2", help="comma-separated mesh shapes: 4, 2x2, 2x4, 2x2x2")
    ap.add_argument("--modes", default="runtime,planner,utility")
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

    from tools.audit.skips import SKIPS

    if args.preload:
        # A python file run once DTensor is set up and before anything is queried
        # (tests use it to plant a bad strategy; also handy to try a fix in place).
        import runpy

        runpy.run_path(args.preload, run_name="__audit_preload__")

    flt = OpFilter.parse(args.ops, all_opinfos())
    t_import = time.monotonic()
    pool, capture_info = capture(args, flt)
    t_capture = time.monotonic()

    auditor = Auditor(args, checker)
    p = auditor.p
    by_op: dict[Any, list[Call]] = {}
    for op, calls in pool.items():
        by_op[op] = select_calls(calls, args.max_calls_per_op)
    ops_sorted = sorted(by_op, key=str)
    reached: dict[str, set[str]] = defaultdict(set)
    unregistered: list[str] = []
    skipped: dict[str, int] = {}
    no_tensor_calls = 0
    last = 0.0
    for n, op in enumerate(ops_sorted, 1):
        name = str(op)
        reg = auditor.registry(op)
        if reg is None:
            unregistered.append(name)
        else:
            if name in SKIPS:
                # still queried and reported; the orchestrator keeps it out of --strict
                skipped[name] = len(by_op[op])
            reached[reg].add(name)
            for call in by_op[op]:
                if not auditor.tensor_args(call):
                    no_tensor_calls += 1
                    continue
                auditor.audit_call(call, reg)
        now = time.monotonic()
        if now - last > 0.5 or n == len(ops_sorted):
            _progress(args.role, "query ops", n, len(ops_sorted))
            last = now
    t_query = time.monotonic()

    from torch._decomp import decomposition_table

    single = {str(o) for o in p.op_single_dim_strategy_funcs}
    strat = {str(o) for o in p.op_strategy_funcs} - single
    rules = {str(o) for o in p.op_to_rules} - single - strat
    direct = set(p.op_single_dim_strategy_funcs) | set(p.op_strategy_funcs) | set(p.op_to_rules)
    decomp_table_only = {str(o) for o in decomposition_table if o not in direct}
    registered = {"single_dim": single, "op_strategy": strat, "rules": rules}
    coverage = {}
    for reg in REGISTRIES:
        got = reached.get(reg, set())
        if reg == "decomposition":
            coverage[reg] = {
                "registered": None,
                "decomposition_table_entries": len(decomp_table_only),
                "reached": len(got),
                "reached_ops": sorted(got),
                "not_reached": sorted(decomp_table_only - got),
            }
        else:
            coverage[reg] = {
                "registered": len(registered[reg]),
                "reached": len(got & registered[reg]),
                "reached_ops": sorted(got),
                "not_reached": sorted(registered[reg] - got),
            }
    # op_to_rules entries also registered as strategies never reach their rule at runtime
    coverage["rules"]["shadowed_by_strategies"] = sorted({str(o) for o in p.op_to_rules} - rules)
    coverage["unregistered_captured"] = sorted(unregistered)
    coverage["single_dim_and_op_strategy_overlap"] = sorted(single & {str(o) for o in p.op_strategy_funcs})

    calls_queried = sum(len(v) for k, v in by_op.items() if auditor.registry(k))
    capture_info["stats"].update(
        aten_ops_captured=len(by_op),
        calls_distinct=sum(len(v) for v in pool.values()),
        calls_selected=sum(len(v) for v in by_op.values()),
        calls_queried=calls_queried,
        calls_without_tensor_inputs=no_tensor_calls,
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
        "skipped": [{"op": k, "calls": v, "reason": SKIPS[k]} for k, v in sorted(skipped.items())],
        "coverage": coverage,
        "selections": auditor.selections,
        "slowest_queries": [{"seconds": round(s, 3), "query": q} for s, q in slow],
        "slowest_ops": [{"seconds": round(s, 2), "op": o} for o, s in auditor.op_seconds.most_common(15)],
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
