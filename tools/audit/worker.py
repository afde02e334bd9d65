"""One interpreter's side of the audit: capture aten calls, ask DTensor, judge, write JSON.

Runs under the torch being judged (``python -m tools.audit.worker --out F`` from the
repository root). The judge is the repository's ``strategy_contract.py``, loaded by file
path, so a stock and a built torch are judged by the same code.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import itertools
import json
import logging
import os
import pickle
import re
import signal
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import _expand_single_dim_strategy_to_mesh, _ShardingPlaceholder
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils._pytree import tree_flatten, tree_map, tree_map_only

from tools.audit import extend
from tools.audit.report import CATEGORIES, CLAUSES, MESHES, MODES, clauses, raised_category, typed_error

CHECKER = Path(__file__).resolve().parents[2] / "torch/testing/_internal/distributed/_tensor/strategy_contract.py"
CAPTURE = Path(__file__).resolve().with_name("capture.py")
PLANNER_CANDIDATES = 6  # per input: enough to mix Replicate and Shard on every mesh dim, cheap to expand
QUERY_TIMEOUT_S = 20  # a planner waiting longer than this for one answer has no answer
# Timed in this process's CPU time, so that a loaded machine does not time queries out.


def _alarm(seconds: float) -> None:
    signal.setitimer(signal.ITIMER_PROF, seconds)
MESSAGE_CHARS = 300
Call = tuple[Any, tuple, dict]  # (op, args, kwargs) with tensors as TensorMeta
# (call text, mesh, mode): eager DTensor's error or None, and how it was asked ("" in LocalTensorMode)
EagerCache = dict[tuple[str, str, str], tuple["str | None", str]]
# LocalTensorMode's check that the ranks' non-tensor results agree. Failing in sharding propagation, it is the
# simulation's: that propagation runs the op's shape inference on LocalTensors, once per simulated rank, where a
# job's every process runs it alone on global metadata.
PER_RANK_CHECK = "Non Tensor or int rank results must be equal for all ranks"
ALONE = "eager asked as one rank alone, since in LocalTensorMode its per-rank check failed in sharding propagation"


def load_checker() -> SimpleNamespace:
    """The contract check, the capture and the audit's extension of it, loaded by file path
    (the stock torch ships neither test module), as one namespace."""
    if not hasattr(OpSpec, "local_output_metas"):  # stock: no rank-local result has its meta
        OpSpec.local_output_metas = None  # type: ignore[attr-defined]
    modules = {}
    for name, path in (("strategy_contract", CHECKER), ("capture", CAPTURE)):
        full = f"torch.testing._internal.distributed._tensor.{name}"
        spec = importlib.util.spec_from_file_location(full, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {name} from {path}")
        modules[name] = importlib.util.module_from_spec(spec)
        sys.modules[full] = modules[name]  # the capture imports the check by this name
        spec.loader.exec_module(modules[name])
    names = {k: v for m in modules.values() for k, v in vars(m).items() if not k.startswith("__")}
    return SimpleNamespace(**names, extend=functools.partial(extend.extend, cap=modules["capture"]),
                           registered_ops=extend.registered_ops, unreached=extend.unreached)


def propagator() -> Any:
    return DTensor._op_dispatcher.sharding_propagator


def registry(op: Any) -> str | None:
    """Which registry DTensor's dispatch asks for ``op``, in dispatch's order."""
    if op in propagator().op_single_dim_strategy_funcs:
        return "single_dim"
    if op in propagator().op_strategy_funcs:
        return "op_strategy"
    return "decomposition" if DecompShardingStrategy.has_decomp(op) else None


def _metas(x: Any) -> Any:
    return tree_map_only(torch.Tensor, lambda t: TensorMeta(t.shape, t.stride(), t.dtype), x)


def _has_meta(x: Any) -> bool:
    is_meta = lambda v: isinstance(v, TensorMeta)  # noqa: E731  (a NamedTuple: a leaf, not a tuple)
    return any(is_meta(v) for v in tree_flatten(x, is_leaf=is_meta)[0])


def _describe(x: Any) -> str:
    if isinstance(x, TensorMeta):
        return f"{str(x.dtype).removeprefix('torch.')}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_describe(e) for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(x))


def describe_call(op: Any, args: tuple, kwargs: dict) -> str:
    """The call as short, address-free text: the report's example and the key stock and built share."""
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    return f"{op}({', '.join(parts)})"


def capture(checker: SimpleNamespace, names: set[str] | None, samples: int,
            per_op: int | None) -> tuple[list[Call], dict[str, Any]]:
    """The calls the checker's capture makes (its one capture path, shared with the tests), with
    tensors as TensorMeta, and what it reached: registered ops asked, and each one not asked with why."""
    found = checker.capture_calls(names, samples=samples, per_op=per_op)
    if names is not None and not found.opinfos and not found.runs:
        raise SystemExit(f"--ops {','.join(sorted(names))}: no OpInfo or run by hand of that name")
    checker.extend(found, names=names)
    calls = [(op, _metas(args), _metas(kwargs)) for _, op, args, kwargs in found.calls]
    registered = checker.registered_ops()
    asked = {op for op, _, _ in calls} & registered
    failed = Counter(run.rsplit(" ", 2)[-2] for run in found.failures)  # per variant
    stats = {"opinfos": found.opinfos, "runs": found.runs, "failed_runs": dict(sorted(failed.items())),
             "served": len(calls),
             "registered": len(registered), "reached": len(asked),
             "unreached": {str(op): why for op, why in checker.unreached(found).items()}}
    return calls, stats


class NoStrategy(Exception):
    """Nothing to judge: the registry declined, or the mode does not apply to the call."""

    def __init__(self, category: str, reason: str) -> None:
        super().__init__(reason)
        self.category = category


class QueryTimeout(BaseException):
    """A query that took too long; not an Exception, so no strategy's ``except Exception`` swallows it."""


def _expire(signum: int, frame: Any) -> None:
    raise QueryTimeout(f"no answer within {QUERY_TIMEOUT_S}s of CPU time")


def placements(meta: TensorMeta, mesh: DeviceMesh, mode: str) -> list[tuple[Placement, ...]]:
    """An input's candidates: one sharded placement at runtime, a few mixes for a planner or a rule author."""
    ndim = len(meta.shape)
    if mode == "runtime":
        return [tuple(Shard(min(i, ndim - 1)) if ndim else Replicate() for i in range(mesh.ndim))]
    options = [Replicate(), *(Shard(d) for d in range(ndim))]
    return list(itertools.islice(itertools.product(options, repeat=mesh.ndim), PLANNER_CANDIDATES))


def strategy_schema(call: Call, mesh: DeviceMesh, mode: str) -> OpSchema:
    """The OpStrategy schema DTensor builds for the call; a tensor list becomes a TupleStrategy."""

    def wrap(x: Any) -> Any:
        if isinstance(x, TensorMeta):
            return OpStrategy([OpSpec(DTensorSpec(mesh, p, tensor_meta=x)) for p in placements(x, mesh, mode)])
        if isinstance(x, (list, tuple)) and x and all(isinstance(e, TensorMeta) for e in x):
            children = [wrap(e) for e in x]
            return TupleStrategy(tuple(children) if isinstance(x, tuple) else children)
        return [wrap(e) for e in x] if isinstance(x, (list, tuple)) and _has_meta(x) else x

    op, args, kwargs = call
    prop = propagator()
    if registry(op) == "decomposition":
        prop.decomp_strategy.ensure_schema_info(op)
    info = prop.op_to_schema_info.get(op) or prop.op_to_schema_info_for_single_dim_strategy.get(op)
    return OpSchema(op, tuple(wrap(a) for a in args), {k: wrap(v) for k, v in kwargs.items()}, schema_info=info)


def spec_schema(schema: OpSchema) -> OpSchema:
    """The DTensorSpec schema dispatch starts from: each input's first candidate."""

    def first(x: Any) -> Any:
        if isinstance(x, OpStrategy):
            return x.strategies[0].output_spec
        if isinstance(x, TupleStrategy):
            return [first(c) for c in x.children]
        return [first(e) for e in x] if isinstance(x, list) else x

    args = tuple(first(a) for a in schema.args_schema)
    return OpSchema(schema.op, args, {k: first(v) for k, v in schema.kwargs_schema.items()},
                    schema_info=schema.schema_info)


def utility_rules(schema: OpSchema, info: Any) -> tuple[list[list[Placement | None]], int]:
    """The op's single-dim rules as a rule author resolves them, and how many outputs lead each."""
    op = schema.op
    n_inputs = len(schema.args_strategy) + len(schema.kwargs_strategy)
    rules = info.func(op, schema.args_meta, schema.kwargs_meta)
    n_outputs = len(rules[0]) - n_inputs if rules else sum("Tensor" in str(r.type) for r in op._schema.returns)
    resolved = [[Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in rule] for rule in rules]
    if not any(all(p is None or isinstance(p, Replicate) for p in rule) for rule in resolved):
        # As DTensor's own replication rule: None where every rule places None (rank-local results)
        none = [bool(resolved) and all(rule[i] is None for rule in resolved) for i in range(n_outputs + n_inputs)]
        resolved.insert(0, [None if n else Replicate() for n in none])
    return resolved, n_outputs


def composite(op: Any) -> bool:
    """Whether dispatch decomposes ``op`` when its strategy query raises NotImplementedError."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), torch._C.DispatchKey.CompositeImplicitAutograd)


def query(schema: OpSchema, mesh: DeviceMesh, mode: str) -> Any:
    """Ask the op's registry as ``mode`` asks it; NoStrategy when there is nothing to judge.

    A planner asks through ``ShardingPropagator.enumerate_strategies`` where the torch has it;
    stock has none, so there a planner had to call each registry itself, as done here. Dispatch
    meets a composite op only under inference mode (elsewhere autograd decomposes it first), so
    a runtime query asks there too: the op's shape inference differs (istft's outside it asks
    ``aten.equal``, data-dependent, and raises; under it, it gives the result's meta)."""
    if mode == "runtime" and composite(schema.op) and not torch.is_inference_mode_enabled():
        with torch.inference_mode():
            return query(schema, mesh, mode)
    op, prop, where = schema.op, propagator(), registry(schema.op)
    info = prop.op_single_dim_strategy_funcs.get(op)
    if mode == "utility":
        if info is None:
            raise NoStrategy("no_strategy", f"no single-dim rule to expand: the {where} registry holds the op")
        if any(isinstance(x, TupleStrategy) or (isinstance(x, list) and any(isinstance(e, OpStrategy) for e in x))
               for x in (*schema.args_schema, *schema.kwargs_schema.values())):
            raise NoStrategy("tensor_list", "a tensor-list argument, which the utility does not expand")
        rules, n_outputs = utility_rules(schema, info)
        inplace = op.name().split("::")[-1].split(".")[0].endswith("_")
        return expand_to_full_mesh_op_strategy(mesh, schema, rules, input_index=n_outputs, inplace_op=inplace,
                                               allow_uneven_sharding=info.allow_uneven_sharding)
    if mode == "planner" and hasattr(prop, "enumerate_strategies"):
        return prop.enumerate_strategies(schema)
    if mode == "runtime" and op == torch.ops.aten._local_scalar_dense.default:
        raise NoStrategy("no_strategy", "dispatch asks no strategy for it")
    runtime = spec_schema(schema) if mode == "runtime" else None
    metas = prop._propagate_tensor_meta_non_cached(runtime) if runtime is not None else None
    if runtime is not None and "output_tensor_meta" in {f.name for f in dataclasses.fields(OpSchema)}:
        schema = dataclasses.replace(schema, output_tensor_meta=metas)  # as dispatch wraps it
    if info is not None:
        return _expand_single_dim_strategy_to_mesh(mesh, schema, info, metas)(op, schema.args_meta,
                                                                              schema.kwargs_meta)
    if where == "op_strategy":
        return prop.op_strategy_funcs[op](schema)
    if runtime is None:
        answer = prop.decomp_strategy.propagate_strategy(schema)
    else:
        try:
            answer = prop.decomp_strategy.propagate_strategy(runtime, metas)
        except Exception as e:  # dispatch reports this as the op having no sharding strategy
            raise NotImplementedError(f"Operator {op} does not have a sharding strategy registered.") from e
        if answer is None:  # so does dispatch here
            raise NotImplementedError(f"Operator {op} does not have a sharding strategy registered.")
    if answer is None:
        raise NoStrategy("no_strategy", "the decomposition registry answered None")
    return answer


def op_rejects(checker: SimpleNamespace, call: Call, mesh: DeviceMesh) -> bool:
    """Whether the op itself rejects ``call`` on plain (fake) tensors, whatever DTensor would do."""
    try:
        checker.expected_output_metas(strategy_schema(call, mesh, "runtime"))
    except (DataDependentOutputException, DynamicOutputShapeException):
        return False  # its result is data: it does not reject the call
    except Exception:
        return True
    return False


def _meta_tensors(x: Any) -> Any:
    """TensorMeta leaves as meta tensors, which ``eager_error`` turns into DTensors of that shape and dtype."""
    return tree_map(lambda m: torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")
                    if isinstance(m, TensorMeta) else m, x, is_leaf=lambda v: isinstance(v, TensorMeta))


def simulation_artifact(refusal: str | None) -> bool:
    """Whether eager DTensor's ``refusal`` is LocalTensorMode's per-rank check failing in sharding propagation."""
    return refusal is not None and PER_RANK_CHECK in refusal and "Sharding propagation failed" in refusal


def eager_refusal(checker: SimpleNamespace, call: Call, mesh: DeviceMesh, mode: str,
                  compare: bool = False) -> tuple[str | None, str]:
    """Why eager DTensor refuses ``call`` with its inputs placed as ``mode``'s first candidate, or None
    when it runs it, and how it was asked: in LocalTensorMode (""), or as this process's rank alone
    (ALONE) where LocalTensorMode's refusal is its own; a run that does not finish raises QueryTimeout.
    ``compare``: a run whose results are not plain torch's counts as a refusal (``eager_error``)."""
    op, args, kwargs = call

    def first(t: torch.Tensor, m: DeviceMesh) -> list[tuple[Placement, ...]]:
        return placements(TensorMeta(t.shape, t.stride(), t.dtype), m, mode)

    _alarm(QUERY_TIMEOUT_S)
    try:
        refusal = checker.eager_error(op, _meta_tensors(args), _meta_tensors(kwargs), mesh, first, compare=compare)
        if simulation_artifact(refusal):
            return checker.eager_error(op, _meta_tensors(args), _meta_tensors(kwargs), mesh, first, False), ALONE
        return refusal, ""
    finally:
        _alarm(0)


def message(exc: BaseException) -> str:
    """``Type: message`` without addresses or absolute paths; a terse one says where it was raised."""
    text = " ".join(str(exc).split())
    tb = exc.__traceback__
    if len(text) < 20 and tb is not None:
        while tb.tb_next is not None:
            tb = tb.tb_next
        path = tb.tb_frame.f_code.co_filename
        path = path.split("site-packages/", 1)[1] if "site-packages/" in path else Path(path).name
        text = f"{text} (raised at {path}:{tb.tb_lineno})".strip()
    text = re.sub(r"/\S*/site-packages/", "", re.sub(r"0x[0-9a-f]{6,}", "0x..", f"{type(exc).__name__}: {text}"))
    return text if len(text) <= MESSAGE_CHARS else text[: MESSAGE_CHARS - 3] + "..."


def judge(checker: SimpleNamespace, call: Call, mesh: DeviceMesh, mode: str, expected: list[Any],
          eager: EagerCache, mesh_name: str = "") -> tuple[str, str, set[str]]:
    """(category, example text, clauses broken) of one query; ``expected`` keeps the call's result metas,
    ``eager`` eager DTensor's verdict per (call, mesh, mode), asked only for queries that raise."""
    _alarm(QUERY_TIMEOUT_S)  # one stuck strategy must not stall the whole audit
    try:
        schema = strategy_schema(call, mesh, mode)
        answer = query(schema, mesh, mode)
    except NoStrategy as e:
        return e.category, str(e), set()
    except QueryTimeout as e:
        return "error", message(e), set()
    except Exception as e:
        _alarm(0)
        decomposes = isinstance(e, NotImplementedError) and composite(call[0])
        if decomposes:
            return raised_category(mode, decomposes, None), message(e), set()
        key = (describe_call(*call), mesh_name or str(mesh.shape), mode)
        if key not in eager:
            try:
                eager[key] = eager_refusal(checker, call, mesh, mode)
            except QueryTimeout:
                return "error", f"QueryTimeout: eager DTensor ran over {QUERY_TIMEOUT_S}s; {message(e)}", set()
        refusal, how = eager[key]
        verdict = f"eager DTensor also raises {refusal}" if refusal else "eager DTensor runs the call"
        text = f"{message(e)} [{how + ': ' if how else ''}{verdict}]"
        error = typed_error(e, mode)
        category = raised_category(mode, False, refusal, error, refusal is not None and op_rejects(checker, call, mesh))
        return category, text[: 2 * MESSAGE_CHARS], set()
    finally:
        _alarm(0)
    if not expected:
        try:
            expected.append(("ok", checker.expected_output_metas(strategy_schema(call, mesh, "runtime"))))
        except Exception as e:
            expected.append(("unjudged", f"no result meta from input metas alone: {message(e)}"))
    kind, metas = expected[0]
    if kind != "ok":
        return kind, metas, set()
    found = checker.contract_violations(schema, answer, metas)
    if not found:
        return "ok", "", set()
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return "violation", " ".join(found[0].split()) + more, clauses(found)


def save_calls(calls: list[Call], path: Path) -> None:
    """The calls by their text, each pickled with its op by name, for asking eager DTensor about later;
    a call with an argument pickle cannot hold is left out (and so cannot be asked)."""
    kept = {}
    for op, args, kwargs in calls:
        try:
            kept[describe_call(op, args, kwargs)] = pickle.dumps((str(op), args, kwargs))
        except (pickle.PicklingError, TypeError, AttributeError):
            continue
    path.write_bytes(pickle.dumps(kept))


def resolve(name: str) -> Any:
    """The op named ``namespace.packet.overload``."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def ask_eager(checker: SimpleNamespace, asks: list[dict[str, str]], saved: dict[str, bytes],
              meshes: dict[str, DeviceMesh]) -> list[dict[str, Any]]:
    """Eager DTensor on each asked ``{call, mesh}``, its inputs placed as at runtime: ``eager`` its refusal or
    None (it runs the call) and ``how`` as ``eager_refusal`` gives them, or ``unasked`` with why."""
    answers: list[dict[str, Any]] = []
    for ask in asks:
        entry: dict[str, Any] = {"call": ask["call"], "mesh": ask["mesh"]}
        if ask["call"] not in saved:
            answers.append({**entry, "unasked": "the call was not saved"})
            continue
        name, args, kwargs = pickle.loads(saved[ask["call"]])
        try:
            refusal, how = eager_refusal(checker, (resolve(name), args, kwargs), meshes[ask["mesh"]], "runtime",
                                         compare=True)
        except QueryTimeout:
            answers.append({**entry, "unasked": f"eager DTensor ran over {QUERY_TIMEOUT_S}s"})
            continue
        answers.append({**entry, "eager": refusal, "how": how})
    return answers


class Restart(Exception):
    """A query timed out: the worker saved its progress and goes on in a fresh process, since an
    interrupted strategy may leave state behind (a mode on a stack, a half-filled cache)."""


def _fresh(keys: list[tuple[str, str]]) -> dict[str, Any]:
    return {"next_call": 0, "next_key": 0, "timed_out": {}, "results": {
        " ".join(k): {"counts": dict.fromkeys((*CATEGORIES, *CLAUSES), 0), "ops": [], "by_call": {},
                      "examples": {c: {} for c in CATEGORIES[1:]}} for k in keys}}


def run(checker: SimpleNamespace, calls: list[Call], modes: list[str], meshes: dict[str, DeviceMesh],
        progress: Path) -> list[dict]:
    """Per (mode, mesh): counts per category and clause, each op's first example per category, and
    each call's category where it is not ok (keyed by its text, which stock and built share).
    Starts from ``progress`` when it exists; raises Restart after saving it when a query times out."""
    keys = list(itertools.product(modes, meshes))
    state = json.loads(progress.read_text()) if progress.exists() else _fresh(keys)
    started = time.monotonic()
    for i in range(state["next_call"], len(calls)):
        call = calls[i]
        if i % 500 == 0:
            print(f"[worker] call {i}/{len(calls)} at {time.monotonic() - started:.0f}s", flush=True)
        expected: list[Any] = []
        eager: EagerCache = {}
        text = describe_call(*call)
        for j, key in enumerate(keys):
            if i == state["next_call"] and j < state["next_key"]:
                continue  # asked before the restart
            r, skip = state["results"][" ".join(key)], " ".join((*key, str(call[0])))
            if skip in state["timed_out"]:
                broken: set[str] = set()
                category, message_text = "error", f"not asked: {state['timed_out'][skip]} timed out"
            else:
                category, message_text, broken = judge(checker, call, meshes[key[1]], key[0], expected, eager, key[1])
            r["counts"][category] += 1
            r["ops"] = sorted({*r["ops"], str(call[0])})
            for clause in broken:
                r["counts"][clause] += 1
            if category != "ok":
                r["by_call"][text] = category
                where = text if len(text) <= 160 else text[:157] + "..."
                r["examples"][category].setdefault(str(call[0]), {"call": where, "message": message_text})
            if message_text.startswith(QueryTimeout.__name__):
                state["timed_out"][skip] = text[:120]
                state["next_call"], state["next_key"] = i, j + 1
                progress.write_text(json.dumps(state))
                raise Restart(f"call {i} ({text[:120]}) timed out in {' '.join(key)}")
    return [{"mode": mode, "mesh": mesh,
             "counts": {"ops": len(r["ops"]), "queries": len(calls), **r["counts"]},
             "examples": {c: dict(sorted(ex.items())) for c, ex in r["examples"].items()},
             "by_call": r["by_call"]}
            for (mode, mesh), r in ((k, state["results"][" ".join(k)]) for k in keys)]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--ops", default=None, help="OpInfo (or run by hand) names, comma-separated (unset: all)")
    ap.add_argument("--modes", default=",".join(MODES), help="query modes, comma-separated")
    ap.add_argument("--meshes", default=",".join(MESHES), help="mesh shapes, comma-separated")
    ap.add_argument("--samples", type=int, default=6, help="samples per OpInfo")
    ap.add_argument("--per-op", type=int, default=4, help="distinct calls asked per op at most (0: all)")
    ap.add_argument("--resume", action="store_true", help="go on from <out>.progress (after a timed-out query)")
    ap.add_argument("--eager-asks", default=None, help="a JSON list of {call, mesh}: only ask eager DTensor about "
                    "those calls (from --calls, inputs placed as at runtime), its answers to --out")
    ap.add_argument("--calls", default=None, help="with --eager-asks: the <out>.calls a run of this worker saved")
    args = ap.parse_args(argv)
    progress = Path(args.out + ".progress")
    if not args.resume:
        progress.unlink(missing_ok=True)
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)  # fake tensors log every kernel they cannot run
    torch.set_num_threads(1)
    signal.signal(signal.SIGPROF, _expire)
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    meshes = {n: DeviceMesh("cpu", torch.arange(4).reshape([int(s) for s in n.split("x")]))
              for n in args.meshes.split(",")}
    started = time.monotonic()
    checker = load_checker()
    if args.eager_asks:
        if not args.calls:
            ap.error("--eager-asks needs --calls")
        asks, saved = json.loads(Path(args.eager_asks).read_text()), pickle.loads(Path(args.calls).read_bytes())
        Path(args.out).write_text(json.dumps(ask_eager(checker, asks, saved, meshes), indent=1) + "\n")
        dist.destroy_process_group()
        return 0
    names = {n.strip() for n in (args.ops or "").split(",") if n.strip()} or None
    calls, stats = capture(checker, names, args.samples, args.per_op or None)
    print(f"[worker] captured {len(calls)} calls in {time.monotonic() - started:.0f}s", flush=True)
    save_calls(calls, Path(args.out + ".calls"))
    try:
        results = run(checker, calls, args.modes.split(","), meshes, progress)
    except Restart as e:
        print(f"[worker] {e}; going on in a fresh process", flush=True)
        dist.destroy_process_group()
        os.execv(sys.executable, [sys.executable, "-m", "tools.audit.worker", *argv,
                                  *([] if args.resume else ["--resume"])])
    doc = {"torch": torch.__version__, "capture": stats, "calls": [describe_call(*c) for c in calls],
           "results": results}
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    progress.unlink(missing_ok=True)
    print(f"[worker] done in {time.monotonic() - started:.0f}s", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
