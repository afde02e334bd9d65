# Owner: tools/audit. Run: python tools/test/test_audit.py  (or: python -m pytest tools/test/test_audit.py)
"""Tests of the stock-vs-built audit (tools/audit).

Strategies are planted in DTensor's registries by hand, so every assertion holds
whichever torch runs the tests: a planted bad strategy must reach the report under
the clause it breaks, a planted exception with op and message, and ``--strict`` must
fail on them; the comparison of two torches' JSON is tested on documents made here.
"""

import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn
from unittest import mock


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch
import torch.distributed as dist
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore

from tools.audit import full_space, worker
from tools.audit import __main__ as orchestrator


aten = torch.ops.aten
CLAUSES = ("C1", "C2", "C3", "C4", "C5")
ROLES = ("stock", "built")

# Planted into the worker subprocess with --preload: aten.t.default answers with
# OpSpecs whose output has no tensor_meta (C1); aten.split.Tensor raises.
PRELOAD = textwrap.dedent(
    """
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

    aten = torch.ops.aten
    p = DTensor._op_dispatcher.sharding_propagator

    def bad_t(op_schema):
        inp = op_schema.args_schema[0]
        n = len(inp.strategies)
        return OpStrategy([
            OpSpec(
                output_specs=DTensorSpec(c.output_spec.mesh, c.output_spec.placements),
                input_specs=(c.output_spec,),
                redistribute_cost=[[0.0] * n],
            )
            for c in inp.strategies
        ])

    def boom(op_schema):
        raise RuntimeError("planted by test_audit")

    for op, fn in ((aten.t.default, bad_t), (aten.split.Tensor, boom)):
        p.op_single_dim_strategy_funcs.pop(op, None)
        p.op_strategy_funcs[op] = fn
    """
)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
    t = torch.empty(shape, dtype=dtype)
    return TensorMeta(shape=t.shape, stride=t.stride(), dtype=dtype)


def _call(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """A captured call as contract_capture's recorder makes it (tensors as TensorMeta)."""
    return worker.load_validation().capture.CapturedCall(op, args, kwargs or {}, "test forward")


@contextlib.contextmanager
def planted(op: OpOverload, strategy_fn: Callable[..., Any]) -> Iterator[None]:
    """Make ``op`` answer through ``strategy_fn`` (an op strategy) only."""
    p = DTensor._op_dispatcher.sharding_propagator
    saved: dict[str, Any] = {
        "single": p.op_single_dim_strategy_funcs.pop(op, None),
        "strategy": p.op_strategy_funcs.pop(op, None),
    }
    p.op_strategy_funcs[op] = strategy_fn
    try:
        yield
    finally:
        p.op_strategy_funcs.pop(op, None)
        if saved["single"] is not None:
            p.op_single_dim_strategy_funcs[op] = saved["single"]
        if saved["strategy"] is not None:
            p.op_strategy_funcs[op] = saved["strategy"]


def _first_input(op_schema: OpSchema) -> OpStrategy:
    inp = op_schema.args_schema[0]
    if not isinstance(inp, OpStrategy):
        raise TypeError(f"{op_schema.op}: expected an OpStrategy input, got {type(inp).__name__}")
    return inp


def _no_meta_strategy(op_schema: OpSchema) -> OpStrategy:
    """One OpSpec per input candidate; outputs lack tensor_meta (C1), costs negative (C4)."""
    inp = _first_input(op_schema)
    n = len(inp.strategies)
    return OpStrategy(
        [
            OpSpec(
                output_specs=DTensorSpec(c.output_spec.mesh, c.output_spec.placements),
                input_specs=(c.output_spec,),
                redistribute_cost=[[-1.0] * n],
            )
            for c in inp.strategies
        ]
    )


def _raising_strategy(op_schema: OpSchema) -> NoReturn:
    raise ValueError("planted failure\nsecond line is dropped")


class _Audit:
    """What the worker runs in process: the contract mode's validation, selections recorded."""

    def __init__(self, checker: ModuleType, meshes: str, modes: str) -> None:
        cv = worker.load_validation()
        self.sweep = cv.sweep
        self.selections: dict[str, dict[str, Any]] = {}
        self.validation = cv.ContractValidation(
            {}, checker.check_strategy_contract, checker.infer_output_metas, cv.make_meshes(meshes),
            modes.split(","), worker.load_mode().first_candidates(16), 60.0,
            worker.selection_recorder(cv, self.selections, 60.0),
        )

    def audit_call(self, call: Any) -> None:
        self.validation.validate_call(call)

    def results(self) -> list[dict[str, Any]]:
        return worker.results_json(worker.load_validation(), self.validation)


class TestAuditInProcess(TestCase):
    own_pg: bool
    checker: ModuleType

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.own_pg = not dist.is_initialized()
        if cls.own_pg:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        cls.checker = worker.load_checker()

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.own_pg and dist.is_initialized():
            dist.destroy_process_group()
        super().tearDownClass()

    def auditor(self, meshes: str = "4", modes: str = "runtime,planner") -> "_Audit":
        return _Audit(self.checker, meshes, modes)

    def result(self, auditor: "_Audit", mode: str, mesh: str) -> dict[str, Any]:
        return next(r for r in auditor.results() if r["mode"] == mode and r["mesh"] == mesh)

    def test_violation_counted_under_its_clause(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))
        a = self.auditor()
        with planted(aten.t.default, _no_meta_strategy):
            self.assertEqual(a.sweep.strategy_registry(aten.t.default), "op_strategy")
            a.audit_call(call)
        # runtime: all-Replicate and Shard(0) (4 >= mesh size 4): one OpSpec each
        rt = self.result(a, "runtime", "4")
        self.assertEqual(rt["ops_sampled"], 1)
        self.assertEqual(rt["ops_with_violations"], 1)
        self.assertEqual(rt["violations"], {"C1": 2, "C2": 0, "C3": 0, "C4": 2, "C5": 0})
        self.assertEqual((rt["errors"], rt["refused"]), (0, 0))
        # planner: candidates R, S(0), S(1), P -> one OpSpec each
        pl = self.result(a, "planner", "4")
        self.assertEqual(pl["violations"], {"C1": 4, "C2": 0, "C3": 0, "C4": 4, "C5": 0})
        (entry,) = pl["violating_ops"]
        self.assertEqual(entry["op"], "aten.t.default")
        self.assertEqual(entry["registry"], "op_strategy")
        self.assertIn("got no tensor_meta", entry["examples"]["C1"]["violation"])
        self.assertIn("-1.0", entry["examples"]["C4"]["violation"])
        self.assertEqual(pl["by_registry"]["op_strategy"]["violations"]["C1"], 4)
        # the runtime selection was recorded for both inputs
        self.assertEqual(
            sorted(k.split("|", 1)[1] for k in a.selections), ["4|all Replicate", "4|input 0 Shard(0)"]
        )

    def test_exception_reported_with_op_and_message(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))
        a = self.auditor(meshes="2x2")
        with planted(aten.t.default, _raising_strategy):
            a.audit_call(call)
        for mode in ("runtime", "planner"):
            r = self.result(a, mode, "2x2")
            self.assertGreater(r["errors"], 0)
            self.assertEqual(r["ops_with_errors"], 1)
            self.assertEqual(r["refused"], 0)
            self.assertEqual(sum(r["violations"].values()), 0)
            (err,) = r["error_details"]
            self.assertEqual(err["op"], "aten.t.default")
            self.assertEqual(err["registry"], "op_strategy")
            self.assertEqual(err["type"], "ValueError")
            self.assertEqual(err["message"], "planted failure")
            self.assertEqual(err["mesh"], "2x2")
            self.assertEqual(err["source"], "test forward")
            self.assertIn("_raising_strategy", err["raised_at"])
        # the selection raised too, and is recorded as such
        self.assertTrue(all("error" in v for v in a.selections.values()))

    def test_runtime_refusal_counted_apart_from_errors(self) -> None:
        """A runtime query DTensor deliberately refuses is counted as refused, per
        query and with its reason; the same exception from a planner query is an error."""
        sweep = worker.load_validation().sweep
        pattern = next(iter(sweep.RUNTIME_REFUSALS))
        call = _call(aten.t.default, (_meta(4, 6),))

        def refuse_sharded(op_schema: OpSchema) -> OpStrategy:
            inp = op_schema.args_schema[0]
            if not isinstance(inp, OpStrategy):
                raise TypeError(f"{op_schema.op}: expected an OpStrategy input, got {type(inp).__name__}")
            if any(not c.output_spec.is_replicated() for c in inp.strategies):
                raise RuntimeError(f"{op_schema.op}: {pattern}")
            return _no_meta_strategy(op_schema)

        a = self.auditor()
        with planted(aten.t.default, refuse_sharded):
            a.audit_call(call)
        rt = self.result(a, "runtime", "4")
        # all-Replicate answered (and judged), Shard(0) refused
        self.assertEqual((rt["queries"], rt["refused"], rt["errors"]), (2, 1, 0))
        self.assertEqual(rt["violations"]["C1"], 1)
        (ref,) = rt["refusal_details"]
        self.assertEqual((ref["op"], ref["refusal"]), ("aten.t.default", pattern))
        self.assertEqual(ref["reason"], sweep.RUNTIME_REFUSALS[pattern])
        self.assertIn("input 0 Shard(0)", ref["query"])
        self.assertEqual(rt["error_details"], [])
        pl = self.result(a, "planner", "4")
        self.assertEqual((pl["refused"], pl["errors"]), (0, 1))
        self.assertIn(pattern, pl["error_details"][0]["message"])

    def test_hanging_query_reported_as_timeout(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))

        def spin(op_schema: OpSchema) -> NoReturn:
            while True:
                pass

        a = self.auditor(modes="planner")
        a.validation.query_timeout = 0.3
        with planted(aten.t.default, spin):
            a.audit_call(call)
        r = self.result(a, "planner", "4")
        self.assertEqual(r["errors"], 1)
        (err,) = r["error_details"]
        self.assertEqual((err["op"], err["type"]), ("aten.t.default", "QueryTimeout"))
        self.assertIn("spin", err["raised_at"])

    def test_full_space_finds_a_strategy_the_answer_lacks(self) -> None:
        """A strategy the planner's own expansion finds and get_op_strategy's answer lacks is missing."""
        p = DTensor._op_dispatcher.sharding_propagator
        if not hasattr(p, "get_op_strategy"):
            self.skipTest("this torch has no planner entry point (get_op_strategy) to compare")
        op = aten.neg.default
        if op not in p.op_single_dim_strategy_funcs:
            self.skipTest(f"{op} has no single-dim rule on this torch")
        sweep = worker.load_validation().sweep
        mesh = DeviceMesh("cpu", torch.arange(4))
        schema = sweep.strategy_schema(mesh, op, (_meta(8, 4),), {}, worker.load_mode().first_candidates(16))
        whole = full_space.compare(schema, mesh)
        self.assertEqual((whole.missing, whole.invalid), ([], []))
        self.assertGreater(whole.dtensor, 1)
        answer = p.get_op_strategy(schema)
        if not isinstance(answer, OpStrategy):
            self.fail(f"{op}: expected an OpStrategy, got {type(answer).__name__}")
        dropped = full_space.strategy_key(answer.strategies[-1], [True])
        kept = [s for s in answer.strategies if full_space.strategy_key(s, [True]) != dropped]
        with mock.patch.object(p, "get_op_strategy", lambda op_schema: OpStrategy(kept)):
            partial = full_space.compare(schema, mesh)
        self.assertEqual(partial.missing, [full_space.describe(dropped)])
        self.assertEqual(partial.dtensor, whole.dtensor - 1)


def _result(torch_: str, **kw: Any) -> dict[str, Any]:
    """One (mode, mesh) result of a worker JSON, as merged (``torch`` added)."""
    zeros = dict.fromkeys(CLAUSES, 0)
    rec: dict[str, Any] = {"torch": torch_, "mode": "runtime", "mesh": "4", "ops_sampled": 1, "ops_with_violations": 0,
                           "violations": zeros, "ops_by_clause": zeros, "errors": 0, "refused": 0, "no_strategy": 0,
                           "violating_ops": [], "error_details": [], "refusal_details": []}
    return {**rec, **kw}


class TestComparison(TestCase):
    """The orchestrator's comparison and report, on documents made here."""

    def test_strict_counts_violations_and_errors_of_built_only(self) -> None:
        rec = _result("built", violating_ops=[{"op": "aten.a.default", "specs_by_clause": {"C1": 2, "C4": 1}}],
                      error_details=[{"op": "aten.b.default", "count": 3}],
                      refusal_details=[{"op": "aten.c.default", "refusal": "x", "count": 5}])
        merged: dict[str, Any] = {"results": [dict(rec, torch="stock"), rec], "selections": {"mismatches": []}}
        reasons = orchestrator.strict_failures(merged)
        self.assertEqual(len(reasons), 2)
        self.assertIn("3 OpSpec violations in 1 ops", reasons[0])
        self.assertIn("3 errors", reasons[1])
        # built's refusals never fail --strict (nor does anything of stock's)
        rec["violating_ops"] = []
        self.assertEqual(len(orchestrator.strict_failures(merged)), 1)
        rec["error_details"] = []
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["selections"]["mismatches"] = [{"key": "k", "kind": "newly_supported"}]
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["selections"]["mismatches"].append({"key": "k2", "kind": "changed"})
        self.assertEqual(
            orchestrator.strict_failures(merged), ["1 runtime selections differ stock vs built (1 changed)"]
        )

    def test_full_space_missing_strategies_fail_strict(self) -> None:
        fs = {"ops_compared": 2, "schemas_compared": 3, "missing": 0, "ops_missing": [],
              "invalid_with_reason": {"not valid for the op: x": 4}, "errors": {}}
        merged: dict[str, Any] = {
            "results": [], "selections": {"mismatches": []},
            "full_space": {"stock": {"skipped": "no planner entry point"}, "built": {"audit": dict(fs)}},
        }
        # strategies the expansion must drop (with their reason) never fail --strict
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["full_space"]["built"]["audit"].update(missing=5, ops_missing=["aten.a.default"])
        (reason,) = orchestrator.strict_failures(merged)
        self.assertIn("full space (audit candidates): 5 strategies missing in 1 ops", reason)
        stock_row, built_row = orchestrator.full_space_rows(merged)
        self.assertIn("skipped: no planner entry point", stock_row[-1])
        self.assertEqual(built_row, ["built", "audit", 2, 3, 5, "a.default", 4, 0])

    def test_selection_kinds(self) -> None:
        ok = {"op": "aten.x", "output": "(Replicate(),)", "needs_redistribute": False}
        other = {"op": "aten.x", "output": "(Shard(dim=0),)", "needs_redistribute": False}
        err = {"op": "aten.x", "error": "RuntimeError: no"}
        err2 = {"op": "aten.x", "error": "ValueError: no"}
        stock = {"a|4|R": ok, "b|4|R": ok, "c|4|R": err, "d|4|R": err, "e|4|R": ok, "f|4|R": ok}
        built = {"a|4|R": other, "b|4|R": err, "c|4|R": ok, "d|4|R": err2, "e|4|R": ok, "g|4|R": ok}
        sel = orchestrator.compare_selections({"stock": {"selections": stock}, "built": {"selections": built}})
        self.assertEqual((sel["compared"], sel["only_stock"], sel["only_built"]), (5, 1, 1))
        self.assertEqual(
            sel["by_kind"], {"changed": 1, "regressed": 1, "newly_supported": 1, "error_changed": 1}
        )
        self.assertEqual([m["key"] for m in sel["mismatches"]], ["a|4|R", "b|4|R", "c|4|R", "d|4|R"])
        self.assertEqual(sel["errors"], {"stock": 2, "built": 2})

    def test_report_tables(self) -> None:
        """The markdown report: contract table, refusals per kind, selections, full space, strict."""
        reasons = {"pattern": "DTensor refuses it on purpose"}
        refusal = {"op": "aten.c.default", "refusal": "pattern", "count": 2}
        c1 = dict.fromkeys(CLAUSES, 0) | {"C1": 3}
        built = _result("built", ops_with_violations=1, violations=c1, ops_by_clause=dict.fromkeys(CLAUSES, 0) | {"C1": 1},
                        violating_ops=[{"op": "aten.a.default", "specs_by_clause": {"C1": 3}}],
                        refusal_details=[refusal], refused=2)
        ok = {"op": "aten.x.default", "output": "(Replicate(),)", "needs_redistribute": False}
        docs = {role: {"selections": {"q|4|all Replicate": dict(ok, output=out)}} for role, out in
                (("stock", "(Replicate(),)"), ("built", "(Shard(dim=0),)"))}
        merged: dict[str, Any] = {
            "config": {"meshes": "4", "modes": "runtime", "ops": "x"},
            "torches": {r: {"torch_version": "v", "python": "py", "capture": {"calls_queried": 1}} for r in ROLES},
            "timing": {r: {"wall_s": 1.0} for r in ROLES},
            "results": [_result("stock", refusal_details=[refusal], refused=2), built],
            "reports": {"stock": "", "built": "[1/1] aten.a.default"}, "refusal_reasons": reasons,
            "selections": orchestrator.compare_selections(docs),
            "full_space": {"built": {"audit": {"ops_compared": 2, "schemas_compared": 3, "missing": 0,
                                               "ops_missing": [], "invalid_with_reason": {}, "errors": {}}}},
        }
        md = orchestrator.render(merged, orchestrator.strict_failures(merged))
        self.assertIn("| runtime | 4 | stock | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 2 | 0 |", md)
        self.assertIn("| runtime | 4 | built | 1 | 1 | 3 (1) | 0 | 0 | 0 | 0 | 0 | 2 | 0 |", md)
        self.assertIn("| `pattern` | stock | 1 | 2 | runtime/4 | c.default | DTensor refuses it on purpose |", md)
        self.assertIn("| `pattern` | built | 1 | 2 | runtime/4 | c.default | DTensor refuses it on purpose |", md)
        self.assertIn("1 runtime queries compared", md)
        self.assertIn("- changed: x.default (1)", md)
        self.assertIn('| aten.x.default | 4 | all Replicate | changed | `{"output": "(Replicate(),)"', md)
        self.assertIn("| built | audit | 2 | 3 | 0 |  | 0 | 0 |", md)
        self.assertIn("```[1/1] aten.a.default\n```", md)
        self.assertIn("### Strict\nFAIL: built runtime mesh 4: 3 OpSpec violations in 1 ops; 1 runtime selections", md)


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, **kw)


class TestAuditSubprocess(TestCase):
    def test_worker_json_schema(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "w.json"
            proc = _run(
                [sys.executable, "-m", "tools.audit.worker", "--role", "built", "--out", str(out),
                 "--op", "mm,t,split", "--meshes", "4,2x2", "--max-samples", "2"]
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            self.assertIn("[audit built] query ops", proc.stderr)
            doc = json.loads(out.read_text())
        self.assertEqual(doc["torch"], "built")
        keys = {(r["mode"], r["mesh"]) for r in doc["results"]}
        self.assertEqual(
            keys, {(m, mesh) for m in ("runtime", "planner", "utility") for mesh in ("4", "2x2")}
        )
        for r in doc["results"]:
            # at least aten.mm, aten.t, aten.split (single-dim ones only in utility mode)
            self.assertGreaterEqual(r["ops_sampled"], 1 if r["mode"] == "utility" else 3)
            for key in ("ops_with_violations", "errors", "refused", "no_strategy"):
                self.assertIsInstance(r[key], int, key)
            self.assertEqual(sorted(r["violations"]), list(CLAUSES))
            self.assertTrue(all(isinstance(v, int) for v in r["violations"].values()))
            self.assertIsInstance(r["by_registry"], dict)
            self.assertIsInstance(r["refusal_details"], list)
        self.assertIn("DynamicOutputShapeException", doc["refusal_reasons"])
        self.assertTrue(doc["selections"])
        self.assertGreater(doc["capture"]["samples"], 0)
        self.assertGreater(doc["capture"]["calls_queried"], 0)
        self.assertNotIn("full_space", doc)  # only when asked for

    def test_contract_mode_counts_as_the_worker(self) -> None:
        """``strategy_validation --contract`` and the audit's worker count the same ops alike."""
        with tempfile.TemporaryDirectory() as tmp:
            out, preload = Path(tmp) / "w.json", Path(tmp) / "plant.py"
            # both sides see the planted bad aten.t strategy, so clause counts are compared too
            preload.write_text(PRELOAD)
            ops = ["--op", "t,nn.functional.relu", "--meshes", "4,2x2", "--max-samples", "2"]
            run_cli = ("import runpy, sys; runpy.run_path(sys.argv.pop(1)); "
                       "runpy.run_module('torch.distributed.tensor._ops.strategy_validation', run_name='__main__')")
            cli = _run([sys.executable, "-c", run_cli, str(preload), "--contract", "--device", "cpu", *ops])
            self.assertEqual(cli.returncode, 1, cli.stderr[-3000:])
            proc = _run([sys.executable, "-m", "tools.audit.worker", "--role", "built", "--out", str(out), *ops,
                         "--preload", str(preload)])
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            doc = json.loads(out.read_text())
        self.assertIn("aten.relu.default", cli.stdout)
        # the per (mode, mesh) table of the CLI is the worker's, from the same counts
        table = doc["summary"].split("=" * 70)[-1].strip()
        self.assertIn(table, cli.stdout)
        table = table.splitlines()
        for r in doc["results"]:
            row = next(line.split() for line in table if line.split()[:2] == [r["mode"], r["mesh"]])
            self.assertEqual(row[2:4], [str(r["ops_sampled"]), str(r["ops_with_violations"])])
            self.assertEqual(row[-3:], [str(r["errors"]), str(r["refused"]), str(r["no_strategy"])])
        self.assertGreater(sum(r["violations"]["C1"] for r in doc["results"]), 0)
        self.assertIn("C1 aten.t.default strategy 0", cli.stdout)

    def test_strict_fails_on_planted_violation(self) -> None:
        """--strict on a planted bad strategy: exit 1, and both report files say why."""
        with tempfile.TemporaryDirectory() as tmp:
            preload = Path(tmp) / "plant.py"
            preload.write_text(PRELOAD)
            proc = _run(
                [sys.executable, "-m", "tools.audit", "--only", "built", "--built-python", sys.executable,
                 "--ops", "t,split", "--meshes", "4", "--modes", "runtime", "--max-samples", "1",
                 "--preload", str(preload), "--out-dir", tmp, "--build-dir", tmp, "--report-name", "r", "--strict"]
            )
            self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
            doc = json.loads((Path(tmp) / "r.json").read_text())
            md = (Path(tmp) / "r.md").read_text()
        self.assertIn(md, proc.stdout)  # the report printed is the one written
        (r,) = doc["results"]
        self.assertEqual((r["torch"], r["mode"], r["mesh"]), ("built", "runtime", "4"))
        self.assertGreater(r["violations"]["C1"], 0)
        t = next(v for v in r["violating_ops"] if v["op"] == "aten.t.default")
        self.assertEqual(t["registry"], "op_strategy")
        self.assertIn("C1", t["specs_by_clause"])
        err = next(e for e in r["error_details"] if e["op"] == "aten.split.Tensor")
        self.assertEqual((err["type"], err["message"]), ("RuntimeError", "planted by test_audit"))
        self.assertTrue(doc["strict"]["failures"])
        self.assertIn("| runtime | 4 | built |", md)
        self.assertIn("### Strict\nFAIL: built runtime mesh 4:", md)
        self.assertIn("| built | audit |", md)  # the full-space comparison ran by default

    def test_failing_worker_shows_its_log(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            preload = Path(tmp) / "fail.py"
            preload.write_text("raise RuntimeError('planted worker failure')\n")
            proc = _run([sys.executable, "-m", "tools.audit", "--only", "built", "--built-python", sys.executable,
                         "--ops", "t", "--preload", str(preload), "--out-dir", tmp, "--build-dir", tmp])
            self.assertEqual(proc.returncode, 2, proc.stdout[-3000:] + proc.stderr[-3000:])
            self.assertFalse((Path(tmp) / "audit.json").exists())
        self.assertIn("[audit built] worker failed (exit 1)", proc.stderr)
        self.assertIn("RuntimeError: planted worker failure", proc.stderr)


if __name__ == "__main__":
    run_tests()
