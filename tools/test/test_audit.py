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


def worker_doc(version: str, **per_key: tuple[dict[str, int], dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """A worker document; keys are ``<mode>_<mesh>``, values (counts, examples by category and op)."""
    results = []
    for key, (c, examples) in per_key.items():
        mode, mesh = key.split("_")
        results.append({"mode": mode, "mesh": mesh, "counts": c,
                        "examples": {cat: examples.get(cat, {}) for cat in report.CATEGORIES[1:]}})
    return {"torch": version, "capture": {"opinfos": 1, "samples": 1, "calls": 2, "served": 1}, "results": results}


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


class TestRefusals(unittest.TestCase):
    def test_refusal_by_type_and_message(self) -> None:
        self.assertEqual(report.refusal_reason(["NotImplementedError"], "anything"), "NotImplementedError")
        self.assertEqual(report.refusal_reason(["RuntimeError", "DynamicOutputShapeException"], ""),
                         "DynamicOutputShapeException")
        msg = "This operation would remove sharded dimension 0, which requires redistribution."
        self.assertEqual(report.refusal_reason(["RuntimeError"], msg), "requires redistribution")
        for text in ("Attempted to unbind along the sharded dimension 0. It cannot be performed without redistribution",
                     "Cannot unflatten unevenly sharded tensor: dim 0"):
            self.assertIsNotNone(report.refusal_reason(["RuntimeError"], text), text)

    def test_failures_are_not_refusals(self) -> None:
        for names, text in ((["AssertionError"], ""), (["KeyError"], "1"),
                            (["RuntimeError"], "Sharding propagation should have produced a strategy")):
            self.assertIsNone(report.refusal_reason(names, text), text)


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

    def test_reports_a_failing_worker(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            broken = stand_in_python(tmp, "broken", "print('no torch here')\nraise SystemExit(3)")
            argv = ["--stock-python", broken, "--built-python", broken, "--jobs", "1", "--out-dir", str(tmp / "out")]
            with self.assertRaises(SystemExit) as caught:
                self.run_main(tmp, argv)
            self.assertEqual(caught.exception.code, 2)
            self.assertIn("no torch here", (tmp / "build" / "stock.log").read_text())

    def test_bad_options_are_refused_before_any_worker_runs(self) -> None:
        for flag in (["--modes", "runtime,bogus"], ["--meshes", "3x3"], ["--samples", "0"]):
            with self.assertRaises(SystemExit) as caught, contextlib.redirect_stderr(io.StringIO()):
                orchestrator.parse_args(flag)
            self.assertEqual(caught.exception.code, 2, flag)


@unittest.skipIf(importlib.util.find_spec("torch") is None, "the worker needs torch")
class TestWorker(unittest.TestCase):
    def test_worker_on_mm_under_this_python(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "w.json"
            subprocess.run([sys.executable, "-m", "tools.audit.worker", "--out", str(out), "--ops", "mm",
                            "--samples", "1", "--meshes", "4"], cwd=REPO_ROOT, check=True, capture_output=True,
                           timeout=120)
            doc = json.loads(out.read_text())
        self.assertGreaterEqual(doc["capture"]["served"], 1)
        self.assertEqual([r["mode"] for r in doc["results"]], list(report.MODES))
        for r in doc["results"]:
            c = r["counts"]
            self.assertEqual(c["queries"], sum(c[k] for k in report.CATEGORIES))
            self.assertEqual(c["queries"], doc["capture"]["served"])
            self.assertEqual(set(r["examples"]), set(report.CATEGORIES[1:]))
        runtime = doc["results"][0]["counts"]
        # asked as dispatch asks, mm is answered on every torch: judged, never refused or raising
        self.assertEqual(runtime["ok"] + runtime["violation"], runtime["queries"])


if __name__ == "__main__":
    unittest.main()
