# Owner: tools/audit. Run: python -m pytest tools/test/test_audit.py
"""Tests of the stock-vs-built contract audit (tools/audit).

The pure parts (refusal classification, merging, ``--strict``, the markdown) are
tested on small documents made here, and the orchestrator on stand-in workers that
write canned JSON, so neither needs torch. One real worker run on ``mm`` under the
interpreter running the tests checks that the worker's document holds together.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import pickle
import stat
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any
from unittest import mock

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools.audit import __main__ as orchestrator
from tools.audit import report


def counts(**given: int) -> dict[str, int]:
    return {**dict.fromkeys(("ops", "queries", *report.CATEGORIES, *report.CLAUSES), 0), **given}


def ex(message: str, call: str = "aten.x.default(float32[4])") -> dict[str, str]:
    return {"call": call, "message": message}


CALLS = ["aten.mm.default(float32[4, 4], float32[4, 4])", "aten.view.default(float32[4, 4], [16])"]


def capture_stats(reached: int = 1200, registered: int = 1239, **unreached: str) -> dict[str, Any]:
    return {"opinfos": 1, "runs": 3, "failed_runs": {"out": 1}, "served": 2, "registered": registered,
            "reached": reached, "unreached": unreached}


def worker_doc(version: str, by_call: dict[str, dict[str, str]] | None = None, capture: dict | None = None,
               **per_key: tuple[dict[str, int], dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """A worker document; keys are ``<mode>_<mesh>``, values (counts, examples by category and op);
    ``by_call`` gives a key's calls that are not ok."""
    results = []
    for key, (c, examples) in per_key.items():
        mode, mesh = key.split("_")
        results.append({"mode": mode, "mesh": mesh, "counts": c, "by_call": (by_call or {}).get(key, {}),
                        "examples": {cat: examples.get(cat, {}) for cat in report.CATEGORIES[1:]}})
    return {"torch": version, "capture": capture or capture_stats(), "calls": CALLS, "results": results}


STOCK = worker_doc(
    "stock-version",
    runtime_4=(counts(ops=1, queries=2, ok=1, violation=1, C1=1),
               {"violation": {"aten.mm.default": ex("C1 tensor_meta None")}}),
    planner_4=(counts(ops=1, queries=2, error=2), {"error": {"aten.mm.default": ex("AssertionError: boom")}}),
)
BUILT = worker_doc(
    "built-version",
    runtime_4=(counts(ops=1, queries=2, ok=1, refused=1),
               {"refused": {"aten.view.default": ex("RuntimeError: ... requires redistribution")}}),
    planner_4=(counts(ops=1, queries=2, ok=1, no_strategy=1),
               {"no_strategy": {"aten.addr.default": ex("the decomposition registry answered None")}}),
)
CONFIG = {"ops": "mm", "modes": ["runtime", "planner"], "meshes": ["4"], "samples": 1}


class TestRaisedQueries(unittest.TestCase):
    def test_a_raise_is_refused_only_where_eager_dtensor_refuses_too(self) -> None:
        eager = "RuntimeError: requires redistribution of Shard(0)"
        self.assertEqual(report.raised_category("runtime", False, eager, "RuntimeError: requires redistribution"),
                         "refused")
        self.assertEqual(report.raised_category("runtime", False, None, "RuntimeError: requires redistribution"),
                         "error")
        # a planner relaxes a placement a rule refuses: only "no strategy" refuses alike
        self.assertEqual(report.raised_category("planner", False, eager, "RuntimeError: requires redistribution"),
                         "error")
        missing = "NotImplementedError: Operator aten.x.default does not have a sharding strategy registered."
        self.assertEqual(report.raised_category("planner", False, missing, missing), "refused")

    def test_an_internal_error_or_another_reason_is_an_error(self) -> None:
        for mode in ("runtime", "planner", "utility"):
            self.assertEqual(report.raised_category(mode, False, "KeyError: 1", "KeyError: 1"), "error")
            self.assertEqual(report.raised_category(mode, False, "NotImplementedError: y", "NotImplementedError: x"),
                             "error")
        # unless the op rejects the call on plain tensors, and eager DTensor raises too
        self.assertEqual(report.raised_category("runtime", False, "IndexError: out of range", "IndexError: out",
                                                op_rejects=True), "refused")

    def test_a_data_dependent_shape_is_typed_as_dispatch_reports_it(self) -> None:
        class DataDependentOutputException(RuntimeError):  # shape inference's, a RuntimeError
            pass

        raised = DataDependentOutputException("aten._local_scalar_dense.default")
        eager = "RuntimeError: aten._local_scalar_dense.default Sharding propagation failed for aten.item.default"
        error = report.typed_error(raised, "runtime")
        self.assertEqual(error, "RuntimeError: aten._local_scalar_dense.default")
        self.assertEqual(report.raised_category("runtime", False, eager, error), "refused")
        # a planner's refusal is NotImplementedError only; an internal error keeps its type
        self.assertEqual(report.typed_error(raised, "planner"), "DataDependentOutputException: " + str(raised))
        self.assertEqual(report.typed_error(KeyError(1), "runtime"), "KeyError: 1")
        self.assertEqual(report.typed_error(NotImplementedError("x"), "runtime"), "NotImplementedError: x")

    def test_a_composite_op_dispatch_decomposes_is_refused(self) -> None:
        self.assertEqual(report.raised_category("runtime", True, None), "refused")
        self.assertEqual(report.raised_category("planner", True, None), "refused")

    def test_a_utility_raise_is_judged_like_the_others(self) -> None:
        self.assertEqual(report.raised_category("utility", False, "RuntimeError: x", "RuntimeError: x"), "refused")
        self.assertEqual(report.raised_category("utility", False, None), "error")


class TestClauses(unittest.TestCase):
    def test_each_violation_counts_the_clause_it_names(self) -> None:
        found = ["output 0: C1 tensor_meta None, expected TensorMeta(...)", "C3 input_specs None for 2 tensor inputs",
                 "aten.mm.default OpSpec 3 input 1: C4 cost row of 2 for 3 candidates", "no clause here"]
        self.assertEqual(report.clauses(found), {"C1", "C3", "C4"})


class TestReport(unittest.TestCase):
    def merged(self, built: dict[str, Any] = BUILT) -> dict[str, Any]:
        return report.merge({"stock": STOCK, "built": built}, CONFIG)

    def test_merge_pairs_stock_and_built_per_mode_and_mesh(self) -> None:
        merged = self.merged()
        self.assertEqual([(r["mode"], r["mesh"]) for r in merged["results"]], [("runtime", "4"), ("planner", "4")])
        self.assertEqual(merged["results"][0]["stock"]["counts"]["violation"], 1)
        self.assertEqual(merged["results"][0]["built"]["counts"]["refused"], 1)
        self.assertEqual(merged["torch"], {"stock": "stock-version", "built": "built-version"})

    def test_merge_names_what_is_missing(self) -> None:
        with self.assertRaisesRegex(ValueError, "built worker"):
            report.merge({"stock": STOCK}, CONFIG)
        with self.assertRaisesRegex(ValueError, "mode planner on mesh 4"):
            self.merged(worker_doc("b", runtime_4=(counts(), {})))

    def test_strict_counts_built_failures_and_planner_gaps_only(self) -> None:
        # stock's violation and errors do not count, nor does a runtime refusal
        self.assertEqual(self.merged()["strict_failures"], ["built planner mesh 4: 1 without a strategy of 2 queries"])
        clean = worker_doc("b", runtime_4=(counts(queries=2, ok=2), {}), planner_4=(counts(queries=2, ok=2), {}))
        self.assertEqual(self.merged(clean)["strict_failures"], [])
        bad = worker_doc("b", runtime_4=(counts(queries=2, violation=1, error=1), {}), planner_4=(counts(), {}))
        (failure,) = self.merged(bad)["strict_failures"]
        for part in ("runtime mesh 4", "1 with violations", "1 errors"):
            self.assertIn(part, failure)

    def test_new_only_lists_ops_built_breaks_and_stock_does_not(self) -> None:
        built = worker_doc("b", runtime_4=(counts(violation=2), {"violation": {"aten.mm.default": ex("x"),
                                                                               "aten.t.default": ex("y")}}),
                           planner_4=(counts(), {}))
        found = report.by_op(self.merged(built), "built", ("violation", "error"), new_only=True)
        self.assertEqual(list(found), ["aten.t.default"])

    def test_render_has_both_columns_the_legend_and_the_per_op_lists(self) -> None:
        text = report.render(self.merged())
        header = next(line for line in text.splitlines() if line.startswith("| count"))
        for column in ("runtime 4 stock", "runtime 4 built", "planner 4 built"):
            self.assertIn(column, header)
        for label in ("no strategy", "refused", "tensor-list call", "unjudged", "C1-C5"):
            self.assertIn(f"- `{label}`:", text)
        for part in ("addr.default", "the decomposition registry answered None", "FAIL: built planner mesh 4"):
            self.assertIn(part, text)
        self.assertEqual(text, report.render(self.merged()))

    def test_a_refusal_stock_does_not_make_fails_strict(self) -> None:
        refusing = {"runtime_4": {CALLS[1]: "refused"}}
        stock = worker_doc("s", by_call=refusing, runtime_4=(counts(queries=2, ok=1, refused=1), {}),
                           planner_4=(counts(queries=2, ok=2), {}))
        built = worker_doc("b", by_call={"runtime_4": {CALLS[0]: "refused", CALLS[1]: "refused"}},
                           runtime_4=(counts(queries=2, refused=2), {}), planner_4=(counts(queries=2, ok=2), {}))
        merged = report.merge({"stock": stock, "built": built}, CONFIG)
        # view is refused by both, mm only by built
        self.assertEqual(merged["results"][0]["new_refusals"], [CALLS[0]])
        self.assertEqual(merged["strict_failures"], ["built runtime mesh 4: 1 refused where stock answers of 2 queries"])
        self.assertIn(CALLS[0], report.render(merged))

    def test_a_refusal_is_new_only_where_stocks_eager_dtensor_runs_the_call(self) -> None:
        built = worker_doc("b", by_call={"runtime_4": {CALLS[0]: "refused", CALLS[1]: "refused"}},
                           runtime_4=(counts(queries=2, refused=2), {}), planner_4=(counts(queries=2, ok=2), {}))
        docs = {"stock": STOCK, "built": built}
        self.assertEqual(report.refusal_candidates(docs), [{"call": c, "mesh": "4"} for c in sorted(CALLS)])
        shape = "RuntimeError: shape '[16]' is invalid for input of size 5"
        stock_eager: list[dict[str, Any]] = [{"call": CALLS[0], "mesh": "4", "eager": None, "how": ""},
                                             {"call": CALLS[1], "mesh": "4", "eager": shape, "how": ""}]
        merged = report.merge(docs, CONFIG, stock_eager)
        runtime = merged["results"][0]
        self.assertEqual(runtime["new_refusals"], [CALLS[0]])  # stock's eager DTensor runs mm
        self.assertEqual(runtime["stock_eager_raises"], [{"call": CALLS[1], "message": shape, "how": ""}])
        self.assertEqual(merged["strict_failures"], ["built runtime mesh 4: 1 refused where stock answers of 2 queries"])
        text = report.render(merged)
        self.assertIn("stock's eager DTensor raises too", text)
        self.assertIn("is invalid for input of size 5", text)
        # where stock's eager DTensor raises on both, or was not asked about one, only the unasked one is new
        stock_eager[0] = {"call": CALLS[0], "mesh": "4", "unasked": "the call was not saved"}
        self.assertEqual(report.merge(docs, CONFIG, stock_eager)["results"][0]["new_refusals"], [CALLS[0]])
        stock_eager[0] = {**stock_eager[1], "call": CALLS[0]}
        self.assertEqual(report.merge(docs, CONFIG, stock_eager)["strict_failures"], [])

    def test_a_full_audit_must_reach_the_registered_ops(self) -> None:
        full = {**CONFIG, "ops": None}
        clean: dict[str, Any] = {"runtime_4": (counts(queries=2, ok=2), {}), "planner_4": (counts(queries=2, ok=2), {})}
        low = worker_doc("b", capture=capture_stats(1000, 1239, **{"aten.x.default": "no sample calls it"}), **clean)
        (failure,) = report.merge({"stock": STOCK, "built": low}, full)["strict_failures"]
        self.assertIn("1000 of 1239 registered ops", failure)
        self.assertEqual(report.merge({"stock": STOCK, "built": low}, CONFIG)["strict_failures"], [])
        text = report.render(report.merge({"stock": STOCK, "built": low}, full))
        self.assertIn("1000 of 1239 registered ops asked", text)
        self.assertIn("| aten.x.default", text)
        self.assertIn("no sample calls it", text)
        enough = worker_doc("b", capture=capture_stats(1178, 1239), **clean)
        self.assertEqual(report.merge({"stock": STOCK, "built": enough}, full)["strict_failures"], [])

    def test_tables_escape_pipes_and_group_ops_by_reason(self) -> None:
        self.assertIn("a \\| b", report.op_table({"aten.x.default": {"where": ["runtime 4"], **ex("a | b")}}))
        same = {op: {"where": ["utility 4"], **ex("held elsewhere")} for op in ("aten.a.default", "aten.b.default")}
        rows = report.reason_table(same).splitlines()[2:]
        self.assertEqual(len(rows), 1)
        self.assertIn("| 2 ", rows[0])
        self.assertIn("a.default, b.default", rows[0])


def stand_in_python(tmp: Path, name: str, body: str) -> str:
    """An executable standing in for a venv's python."""
    exe = tmp / f"python-{name}"
    exe.write_text(f"#!{sys.executable}\nimport shutil, sys\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def canned(tmp: Path, doc: dict[str, Any]) -> str:
    """A stand-in worker that writes ``doc`` where its --out says."""
    source = tmp / f"{doc['torch']}.json"
    source.write_text(json.dumps(doc))
    return stand_in_python(tmp, doc["torch"], f"shutil.copy({str(source)!r}, sys.argv[sys.argv.index('--out') + 1])")


class TestOrchestrator(unittest.TestCase):
    def run_main(self, tmp: Path, argv: list[str]) -> int:
        with mock.patch.object(orchestrator, "BUILD_DIR", tmp / "build"), \
                contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return orchestrator.main(argv)

    def test_writes_reports_and_exits_per_strict(self) -> None:
        for strict, code in ((False, 0), (True, 1)):
            with tempfile.TemporaryDirectory() as d:
                tmp = Path(d)
                argv = ["--stock-python", canned(tmp, STOCK), "--built-python", canned(tmp, BUILT),
                        "--out-dir", str(tmp / "out"), "--modes", "runtime,planner", "--meshes", "4"]
                self.assertEqual(self.run_main(tmp, argv + (["--strict"] if strict else [])), code)
                raw = (tmp / "out" / "audit.json").read_text()
                saved = json.loads(raw)
                self.assertTrue(saved["strict_failures"])
                # The tracked JSON holds counts; the markdown renders the full report.
                self.assertNotIn("examples", raw)
                full = json.loads((tmp / "build" / "audit-full.json").read_text())
                self.assertEqual((tmp / "out" / "audit.md").read_text(), report.render(full))
                self.assertNotIn(str(tmp), raw)  # no absolute paths, so re-runs compare equal

    def test_asks_stocks_eager_dtensor_about_the_refusals_stocks_registry_answers(self) -> None:
        built = worker_doc("b", by_call={"runtime_4": {CALLS[1]: "refused"}},
                           runtime_4=(counts(queries=2, ok=1, refused=1), {}), planner_4=(counts(queries=2, ok=2), {}))
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            answer = tmp / "eager.json"
            answer.write_text(json.dumps([{"call": CALLS[1], "mesh": "4", "eager": "RuntimeError: no", "how": ""}]))
            source = tmp / "stock.json"
            source.write_text(json.dumps(STOCK))
            # the stock python: its worker's document, or asked about the calls, stock's eager DTensor's answers
            stock = stand_in_python(tmp, "stock", f"argv = sys.argv\nasked = '--eager-asks' in argv\n"
                                    f"shutil.copy({str(answer)!r} if asked else {str(source)!r}, "
                                    f"argv[argv.index('--out') + 1])\n"
                                    f"if asked: shutil.copy(argv[argv.index('--eager-asks') + 1], {str(tmp / 'asks')!r})")
            argv = ["--stock-python", stock, "--built-python", canned(tmp, built), "--out-dir", str(tmp / "out"),
                    "--modes", "runtime,planner", "--meshes", "4", "--strict"]
            self.assertEqual(self.run_main(tmp, argv), 0)
            self.assertEqual(json.loads((tmp / "asks").read_text()), [{"call": CALLS[1], "mesh": "4"}])
            self.assertIn("stock.json.calls", (tmp / "build" / "stock-eager.log").read_text())
            saved = json.loads((tmp / "out" / "audit.json").read_text())
            self.assertEqual([r["stock_eager_raises"] for r in saved["results"]], [1, 0])

    def test_reports_a_failing_worker(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            broken = stand_in_python(tmp, "broken", "print('no torch here')\nraise SystemExit(3)")
            argv = ["--stock-python", broken, "--built-python", broken, "--jobs", "1", "--out-dir", str(tmp / "out")]
            with self.assertRaises(SystemExit) as caught:
                self.run_main(tmp, argv)
            self.assertEqual(caught.exception.code, 2)
            self.assertIn("no torch here", (tmp / "build" / "stock.log").read_text())

    def test_a_partial_audit_writes_under_build_not_reports(self) -> None:
        self.assertEqual(orchestrator.parse_args([]).out_dir, "reports")
        self.assertEqual(orchestrator.parse_args(["--ops", "t"]).out_dir, str(orchestrator.BUILD_DIR))
        self.assertEqual(orchestrator.parse_args(["--ops", "t", "--out-dir", "x"]).out_dir, "x")

    def test_bad_options_are_refused_before_any_worker_runs(self) -> None:
        for flag in (["--modes", "runtime,bogus"], ["--meshes", "3x3"], ["--samples", "0"], ["--per-op", "-1"]):
            with self.assertRaises(SystemExit) as caught, contextlib.redirect_stderr(io.StringIO()):
                orchestrator.parse_args(flag)
            self.assertEqual(caught.exception.code, 2, flag)


@unittest.skipIf(importlib.util.find_spec("torch") is None, "the worker needs torch")
class TestJudge(unittest.TestCase):
    """The worker's queries and judgement in this process, on a fake process group of four ranks."""

    worker: Any  # tools.audit.worker, which imports torch
    checker: Any
    mesh: Any
    previous_handler: Any

    @classmethod
    def setUpClass(cls) -> None:
        import signal

        import torch
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from tools.audit import worker

        cls.worker = worker
        cls.previous_handler = signal.signal(signal.SIGPROF, worker._expire)
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        cls.mesh = DeviceMesh("cpu", torch.arange(4))
        cls.checker = worker.load_checker()

    @classmethod
    def tearDownClass(cls) -> None:
        import signal

        import torch.distributed as dist

        dist.destroy_process_group()
        signal.signal(signal.SIGPROF, cls.previous_handler)

    def call(self, op_name: str, *shapes: list[int], rest: tuple = ()) -> tuple[Any, tuple, dict]:
        import torch
        from torch.distributed.tensor._dtensor_spec import TensorMeta

        packet, overload = op_name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload)
        metas = tuple(TensorMeta(torch.Size(s), torch.empty(s).stride(), torch.float32) for s in shapes)
        return op, (*metas, *rest), {}

    def test_planner_asks_enumerate_strategies_where_the_torch_has_it(self) -> None:
        prop = self.worker.propagator()
        if not hasattr(prop, "enumerate_strategies"):
            self.skipTest("this torch has no planner entry point (stock)")
        call = self.call("mm.default", [4, 8], [8, 4])
        schema = self.worker.strategy_schema(call, self.mesh, "planner")
        answer = object()
        with mock.patch.object(prop, "enumerate_strategies", return_value=answer) as asked:
            self.assertIs(self.worker.query(schema, self.mesh, "planner"), answer)
        asked.assert_called_once_with(schema)

    def test_a_raise_is_judged_against_eager_dtensor_once_per_call(self) -> None:
        call = self.call("mm.default", [4, 8], [8, 4])
        for eager_says, category in ((None, "error"), ("RuntimeError: cannot", "error"),
                                     ("RuntimeError: strategy broke", "refused")):
            checker = mock.Mock()
            checker.eager_error.return_value = eager_says
            cache: dict = {}
            with mock.patch.object(self.worker, "query", side_effect=RuntimeError("strategy broke")):
                for _ in range(2):
                    got, text, _ = self.worker.judge(checker, call, self.mesh, "runtime", [], cache, "4")
                    self.assertEqual(got, category)
                    self.assertIn("strategy broke", text)
            checker.eager_error.assert_called_once()
            (op, args, kwargs, mesh, candidates) = checker.eager_error.call_args.args
            self.assertEqual([a.device.type for a in args], ["meta", "meta"])
            # the runtime candidate the query was asked with
            self.assertEqual(str(candidates(args[0], mesh)), str(self.worker.placements(call[1][0], mesh, "runtime")))

    def test_a_composite_op_is_asked_at_runtime_under_inference_mode_where_dispatch_meets_it(self) -> None:
        import torch
        from torch.distributed.tensor._dtensor_spec import TensorMeta

        spectrum = TensorMeta(torch.Size([10, 2]), (2, 1), torch.complex64)
        call: tuple[Any, tuple, dict] = (torch.ops.aten.istft.default, (spectrum, 10), {})
        schema = self.worker.strategy_schema(call, self.mesh, "runtime")
        # as dispatch's propagation raises for it, which then decomposes istft (outside inference mode its
        # shape inference raised a data-dependent error instead)
        with self.assertRaisesRegex(NotImplementedError, "does not have a sharding strategy registered"):
            self.worker.query(schema, self.mesh, "runtime")
        self.assertFalse(torch.is_inference_mode_enabled())
        category, text, _ = self.worker.judge(self.checker, call, self.mesh, "runtime", [], {}, "4")
        self.assertEqual(category, "refused", text)

    def test_local_tensor_modes_own_refusal_in_sharding_propagation_is_asked_again_of_one_rank(self) -> None:
        import torch
        from torch.distributed.tensor._dtensor_spec import TensorMeta

        def meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
            return TensorMeta(torch.Size(shape), torch.empty(shape).stride(), dtype)

        # an out= call whose empty outputs the op resizes: in LocalTensorMode shape inference runs per
        # simulated rank and the ranks' results disagree; one process alone refuses as the query does
        outs = {"result": meta(5), "LU": meta(0), "pivots": meta(0, dtype=torch.int32),
                "info": meta(0, dtype=torch.int32)}
        call = (torch.ops.aten._linalg_solve_ex.result, (meta(5, 5), meta(5)), outs)
        cache: dict = {}
        category, text, _ = self.worker.judge(self.checker, call, self.mesh, "runtime", [], cache, "4")
        self.assertEqual(category, "refused", text)
        self.assertIn(self.worker.ALONE, text)
        self.assertIn("eager DTensor also raises RuntimeError: aten._linalg_solve_ex.result: no valid sharding", text)
        ((refusal, how),) = cache.values()
        self.assertEqual(how, self.worker.ALONE)
        self.assertNotIn(self.worker.PER_RANK_CHECK, refusal)

    def test_only_a_per_rank_check_failing_in_sharding_propagation_is_the_simulations(self) -> None:
        check = self.worker.PER_RANK_CHECK
        self.assertTrue(self.worker.simulation_artifact(f"RuntimeError: {check} Sharding propagation failed for x"))
        self.assertFalse(self.worker.simulation_artifact(f"AssertionError: {check}"))  # the op's own results
        self.assertFalse(self.worker.simulation_artifact("RuntimeError: x Sharding propagation failed for y"))
        self.assertFalse(self.worker.simulation_artifact(None))

    def test_saved_calls_are_asked_of_eager_dtensor_by_their_text(self) -> None:
        calls = [self.call("mm.default", [4, 8], [8, 4]), self.call("view.default", [5, 2], rest=([10],))]
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "calls"
            self.worker.save_calls(calls, path)
            saved = pickle.loads(path.read_bytes())
        asks = [{"call": self.worker.describe_call(*c), "mesh": "4"} for c in calls] + [{"call": "x()", "mesh": "4"}]
        mm, view, unknown = self.worker.ask_eager(self.checker, asks, saved, {"4": self.mesh})
        self.assertEqual((mm["eager"], mm["how"]), (None, ""))  # mm on Shard(0) of 4 rows runs
        self.assertIn("Error", view["eager"])  # a view of 5 rows, sharded unevenly, does not
        self.assertEqual(unknown, {**asks[2], "unasked": "the call was not saved"})

    def test_compared_runs_count_results_other_than_plain_torchs_as_refusals(self) -> None:
        import torch

        from tools.audit import capture

        a, b = torch.randn(4, 3), torch.randn(4, 3)
        add = torch.ops.aten.add.Tensor
        self.assertIsNone(capture._wrong_result(add, (a, b), {}, iter([a, b]), a + b))
        wrong = capture._wrong_result(add, (a, b), {}, iter([a, b]), a - b)
        self.assertRegex(wrong or "", r"^WrongResult: eager DTensor runs it, but .*AssertionError")
        op, args, kwargs = self.call("mm.default", [4, 8], [8, 4])
        metas = self.worker._meta_tensors(args)
        self.assertIsNone(self.checker.eager_error(op, metas, {}, self.mesh, compare=True))  # mm is right

    def test_a_view_that_needs_redistribution_is_refused_as_eager_dtensor_refuses_it(self) -> None:
        call = self.call("view.default", [1, 2], rest=([2],))
        category, text, _ = self.worker.judge(self.checker, call, self.mesh, "runtime", [], {}, "4")
        self.assertEqual(category, "refused", text)
        self.assertIn("eager DTensor also raises", text)


@unittest.skipIf(importlib.util.find_spec("torch") is None, "the worker needs torch")
class TestWorker(unittest.TestCase):
    def test_worker_on_mm_under_this_python(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "w.json"
            subprocess.run([sys.executable, "-m", "tools.audit.worker", "--out", str(out), "--ops", "mm",
                            "--samples", "1", "--meshes", "4"], cwd=REPO_ROOT, check=True, capture_output=True,
                           timeout=300)
            doc = json.loads(out.read_text())
        cap = doc["capture"]
        self.assertEqual(cap["served"], len(doc["calls"]))
        self.assertEqual(cap["reached"] + len(cap["unreached"]), cap["registered"])
        # forward, backward and out= of mm: mm, its out= form and a transpose at least
        asked = {call.split("(")[0] for call in doc["calls"]}
        self.assertLessEqual({"aten.mm.default", "aten.mm.out", "aten.t.default"}, asked)
        self.assertEqual([r["mode"] for r in doc["results"]], list(report.MODES))
        for r in doc["results"]:
            c = r["counts"]
            self.assertEqual(c["queries"], sum(c[k] for k in report.CATEGORIES))
            self.assertEqual(c["queries"], cap["served"])
            self.assertEqual(set(r["examples"]), set(report.CATEGORIES[1:]))
            self.assertEqual(sum(c[k] for k in report.CATEGORIES[1:]), len(r["by_call"]))
        # asked as dispatch asks, mm itself is answered on every torch: judged, never refused or raising
        runtime = doc["results"][0]["by_call"]
        mm = [call for call in doc["calls"] if call.startswith("aten.mm.default(")]
        self.assertTrue(mm)
        self.assertTrue(all(runtime.get(call, "ok") in ("ok", "violation") for call in mm))


if __name__ == "__main__":
    unittest.main()
