# Owner: tools/downstream.py. Run: python -m pytest tools/test/test_downstream.py
"""Tests of ``make downstream`` (tools/downstream.py).

The parts that need no autoparallel checkout are tested here on small inputs:
reading the patches and the tests they add, the CPU rewrite, the clean copy and
``git apply`` (on a small git repo made here, inside another work tree as the
work dir is), the pytest plugin's outcomes (a pytest run on a file made here),
the tables and the command line without ``--autoparallel``. With a checkout
(``AUTOPARALLEL=<dir>``, or the snapshot where ``fetch`` puts it) one test checks
that the patches apply to it; without one it is skipped. The runs themselves are
``make downstream``'s.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import downstream as ds

MIRROR = Path("/work/.mirror/meta-pytorch+autoparallel/repo")

PATCH = """\
diff --git a/autoparallel/x.py b/autoparallel/x.py
--- a/autoparallel/x.py
+++ b/autoparallel/x.py
@@ -1 +1,3 @@
-old = 1
+new = 1
+def test_not_a_test():
+    pass
diff --git a/tests/test_x.py b/tests/test_x.py
--- a/tests/test_x.py
+++ b/tests/test_x.py
@@ -1,2 +1,8 @@
 def test_kept():
     pass
+
+
+def test_added(device):
+    pass
+def helper():
+    pass
"""


def git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_CEILING_DIRECTORIES=str(cwd.parent))
    proc = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr)
    return proc.stdout


class TestPatches(unittest.TestCase):
    def test_added_tests_are_new_test_functions_under_tests(self) -> None:
        self.assertEqual(ds.added_tests(PATCH), ["tests/test_x.py::test_added"])

    def test_find_patches_wants_numbers_and_texts(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            for name in ("0001-a.patch", "0001-a.md", "0002-b-c.patch", "0002-b-c.md"):
                (d / name).write_text("")
            self.assertEqual([p.name for p in ds.find_patches(d)], ["0001-a", "0002-b-c"])
            (d / "0002-b-c.md").unlink()
            with self.assertRaisesRegex(ds.DownstreamError, "no PR text"):
                ds.find_patches(d)
            (d / "0002-b-c.patch").rename(d / "0003-b-c.patch")
            (d / "0003-b-c.md").write_text("")
            with self.assertRaisesRegex(ds.DownstreamError, "expected number 0002"):
                ds.find_patches(d)
            (d / "0003-b-c.patch").rename(d / "3-b.patch")
            with self.assertRaisesRegex(ds.DownstreamError, "not named"):
                ds.find_patches(d)

    def test_the_repo_patches(self) -> None:
        """Each has a PR text with what, why and a test plan; each after the first
        adds the test that reproduces what it fixes."""
        patches = ds.find_patches(REPO_ROOT / "downstream" / "autoparallel")
        for patch in patches:
            text = patch.path.with_suffix(".md").read_text()
            for heading in ("## What", "## Why", "## Test plan"):
                self.assertIn(heading, text, patch.name)
            body = patch.path.read_text()
            self.assertTrue(body.startswith("diff --git "), patch.name)
            if patch.number != "0001":
                self.assertTrue(ds.added_tests(body), f"{patch.name} adds no test")


class TestTrees(unittest.TestCase):
    def test_cpu_adjust(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            (tree / "tests").mkdir()
            (tree / "tests" / "test_a.py").write_text(
                'x = torch.rand(2, device="cuda")\ny = x.cuda()\nmesh("cuda", (2,))\n')
            (tree / "tests" / "conftest.py").write_text('init_device_mesh("cuda", (8,))\n')
            (tree / "other.py").write_text('"cuda"\n')
            self.assertEqual(ds.cpu_adjust(tree), 4)
            self.assertEqual((tree / "tests" / "test_a.py").read_text(),
                             'x = torch.rand(2, device="cpu")\ny = x.cpu()\nmesh("cpu", (2,))\n')
            self.assertEqual((tree / "other.py").read_text(), '"cuda"\n')
            with self.assertRaisesRegex(ds.DownstreamError, "no CUDA device string"):
                ds.cpu_adjust(tree)

    def test_snapshot_and_apply_inside_another_work_tree(self) -> None:
        """The copy is the commit's files (not the work tree's edits), and a patch
        applies whole although the copy lies inside another git work tree; with
        ``tests/*`` only, only the test files change."""
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            origin = root / "origin"
            (origin / "tests").mkdir(parents=True)
            (origin / "autoparallel").mkdir()
            (origin / "autoparallel" / "x.py").write_text("old = 1\n")
            (origin / "tests" / "test_x.py").write_text("def test_kept():\n    pass\n")
            git(origin, "init", "-q")
            git(origin, "add", "-A")
            git(origin, "commit", "-q", "-m", "base")
            (origin / "autoparallel" / "x.py").write_text("uncommitted = 1\n")
            outer = root / "outer"
            outer.mkdir()
            git(outer, "init", "-q")
            patch = root / "0001-x.patch"
            patch.write_text(PATCH)
            dest = outer / "work" / "tree"
            commit = ds.snapshot(origin, "HEAD", dest)
            self.assertEqual(commit, git(origin, "rev-parse", "HEAD").strip())
            self.assertEqual((dest / "autoparallel" / "x.py").read_text(), "old = 1\n")
            ds.apply_patch(dest, patch, include="tests/*")
            self.assertEqual((dest / "autoparallel" / "x.py").read_text(), "old = 1\n")
            self.assertIn("def test_added", (dest / "tests" / "test_x.py").read_text())
            ds.snapshot(origin, "HEAD", dest)
            ds.apply_patch(dest, patch)
            self.assertTrue((dest / "autoparallel" / "x.py").read_text().startswith("new = 1\n"))
            self.assertIn("def test_added", (dest / "tests" / "test_x.py").read_text())
            with self.assertRaisesRegex(ds.DownstreamError, "git apply 0001-x.patch"):
                ds.apply_patch(dest, patch)

    def test_the_patches_apply_to_the_checkout(self) -> None:
        checkout = Path(os.environ.get("AUTOPARALLEL", MIRROR))
        if not checkout.is_dir() or ds.git_dir(checkout) is None:
            self.skipTest(f"no autoparallel checkout (AUTOPARALLEL=<dir>; {ds.FETCH_HINT})")
        try:
            ds.resolve_commit(checkout, ds.BASE_COMMIT)
        except ds.DownstreamError:
            self.skipTest(f"{checkout} does not hold {ds.BASE_COMMIT[:12]}")
        patches = ds.find_patches(REPO_ROOT / "downstream" / "autoparallel")
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp) / "tree"
            ds.make_tree(checkout, ds.BASE_COMMIT, tree, patches)
            text = (tree / "autoparallel" / "shardings" / "placement_options.py").read_text()
            self.assertNotIn("def propagate_tensor_meta", text)
            conftest = (tree / "tests" / "conftest.py").read_text()
            self.assertIn('"cpu"', conftest)
            self.assertNotIn('"cuda"', conftest)


class TestOutcomes(unittest.TestCase):
    def test_plugin_records_each_outcome(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            plugin = ds.plugin_dir(d / "work")
            (d / "test_sample.py").write_text(
                "import pytest\n\n"
                "def test_pass():\n    pass\n\n"
                "def test_fail():\n    assert False\n\n"
                "@pytest.fixture\ndef broken():\n    raise RuntimeError\n\n"
                "def test_error(broken):\n    pass\n\n"
                "@pytest.mark.xfail(strict=False)\ndef test_xfail():\n    assert False\n\n"
                "@pytest.mark.xfail(strict=False)\ndef test_xpass():\n    pass\n\n"
                "@pytest.mark.parametrize('x', [1, 2])\ndef test_cases(x):\n    assert x == 1\n")
            results = d / "results.json"
            env = dict(os.environ, PYTHONPATH=str(plugin), **{ds.ENV_RESULTS: str(results)})
            env.pop(ds.ENV_DEVICE, None)
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "downstream",
                            "test_sample.py"], cwd=d, env=env, capture_output=True, check=False)
            recorded = json.loads(results.read_text())
        self.assertEqual(recorded, {
            "test_sample.py::test_pass": "passed",
            "test_sample.py::test_fail": "failed",
            "test_sample.py::test_error": "error",
            "test_sample.py::test_xfail": "xfailed",
            "test_sample.py::test_xpass": "xpassed",
            "test_sample.py::test_cases[1]": "passed",
            "test_sample.py::test_cases[2]": "failed",
        })
        self.assertEqual(ds.outcome_for("test_sample.py::test_cases", recorded), "failed")
        self.assertEqual(ds.outcome_for("test_sample.py::test_gone", recorded), "missing")
        self.assertEqual(ds.passes(recorded), 3)

    def test_tables(self) -> None:
        ids = ["t::a", "t::b", "t::c"]
        cells = [ds.Cell("stock", "as-is", dict.fromkeys(ids, "passed")),
                 ds.Cell("stack", "0001", {"t::a": "passed", "t::b": "failed", "t::c": "xfailed"}),
                 ds.Cell("stack", "all", {"t::a": "passed", "t::b": "xpassed", "t::c": "error"})]
        lines = ds.acceptance_table(cells, {"as-is": "as it is", "0001": "with 0001", "all": "with all"}, 3)
        self.assertRegex(lines[1], r"^as it is\s+3 of 3\s+-$")
        self.assertRegex(lines[2], r"^with 0001\s+-\s+1 of 3$")
        self.assertRegex(lines[3], r"^with all\s+-\s+2 of 3$")
        self.assertIn("  t::b: passed, failed, xpassed", lines)
        self.assertIn("  t::c: passed, xfailed, error", lines)
        self.assertNotIn("t::a", "\n".join(lines))
        self.assertEqual(ds.regressions(cells[0], cells[2]), ["t::c"])
        runs = [{"first": 2.0, "builds": [1.0, 3.0], "peak_mib": 1.0, "strategies": 10}]
        half = [{"first": 1.0, "builds": [0.5, 1.5], "peak_mib": 1.0, "strategies": 12}]
        summary = ds.timing_summary({"stock": runs, "stack": half})
        self.assertRegex(summary[1], r"caches cleared \(s\)\s+2\.0000\s+1\.0000\s+0\.500$")
        self.assertRegex(summary[4], r"strategies built\s+10\s+12\s+1\.200$")
        same = [{"first": 1.0, "builds": [0.25, 0.75], "peak_mib": 2.0, "strategies": 12}]
        summary = ds.timing_summary({"stock": runs, "stack + repairs": same, "stack": half})
        self.assertRegex(summary[0], r"stack \+ repairs\s+stack, none\s+stack/stock\s+none/repairs$")
        self.assertRegex(summary[1], r"\(s\)\s+2\.0000\s+0\.5000\s+1\.0000\s+0\.500\s+2\.000$")


class TestCommandLine(unittest.TestCase):
    def test_without_autoparallel_it_says_how_to_get_it(self) -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = ds.main(["run"])
        self.assertEqual(status, 2)
        self.assertIn(ds.FETCH_HINT, err.getvalue())
        self.assertIn("AUTOPARALLEL=", err.getvalue())

    def test_a_missing_directory_is_an_error(self) -> None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            status = ds.main(["run", "--autoparallel", "/nonexistent/autoparallel"])
        self.assertEqual(status, 1)
        self.assertIn("no such directory", err.getvalue())


if __name__ == "__main__":
    unittest.main()
