"""Tests of the PR stack (tools/build.py with tools/stack.toml): placing every hunk,
new file and upstream test edit in exactly one step, `make export` (patches that
`git apply` in order, PR texts, the size table and each rule that fails it), `make
check-stack` (steps 1..k on a fresh overlay, each test file run once) and
`check-upstream-tests`, on a fake stock venv. With UPSTREAM_TESTS_DIR set to a
directory of the upstream test files, the repo's own patches/test/ are checked too.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import build as bt
from tools.test import fakes
from tools.test.fakes import COMMIT, UPSTREAM_TEST, UPSTREAM_TEST_TEXT, UTILS, UTILS_TEXT, step_toml

MODULE = "torch/testing/_internal/distributed/_tensor/contract.py"
TEST_ONE = "test/distributed/tensor/test_one.py"
TEST_TWO = "test/distributed/tensor/test_two.py"
EXTRA = "test/distributed/tensor/test_extra.py"

TEST_ONE_TEXT = """\
from torch.distributed.tensor._ops import utils
from torch.testing._internal.distributed._tensor.contract import X


def test_first_hunk_only():
    assert (utils.rule_1(), utils.rule_10(), X) == (-1, 10, 3)
"""
TEST_TWO_TEXT = """\
from torch.distributed.tensor._ops import utils


def test_both_hunks():
    assert (utils.rule_1(), utils.rule_10(), utils.rule_18()) == (-1, -10, -18)
"""


def two_step_repo(root: Path, two: str = TEST_TWO_TEXT) -> Path:
    """Step one: hunk 1 of utils.py, a module, a test; step two: hunks 2-3 and a test."""
    stack = step_toml("one", [f"{UTILS}#1", MODULE, TEST_ONE]) + step_toml("two", [f"{UTILS}#2-3", TEST_TWO])
    files = {MODULE: "X = 3\n", TEST_ONE: TEST_ONE_TEXT, TEST_TWO: two}
    return fakes.write_repo(root, {UTILS: fakes.utils_edit(1, 10, 18)}, files, stack)


def sized_repo(root: Path, sizes: list[tuple[int, int]], text: str = "Placeholder.") -> Path:
    """One step per (product lines, test lines), each adding a module and a test file of those sizes."""
    stack, files = "", {}
    for i, (product, tests) in enumerate(sizes):
        module, test = f"torch/distributed/tensor/_m{i}.py", f"test/distributed/tensor/test_{i}.py"
        files[test] = "x = 1\n" * tests
        stack += step_toml(f"s{i}", [test] + ([module] if product else []), text=text)
        if product:
            files[module] = "y = 2\n" * product
    return fakes.write_repo(root, {}, files, stack)


class ManifestTest(fakes.FakeStockTest):
    def load(self) -> list[bt.Step]:
        return bt.load_stack(self.tmp / "tools" / "stack.toml", bt.read_change(self.tmp))

    def assert_fails(self, message: str) -> None:
        with self.assertRaisesRegex(bt.BuildError, re.escape(message)):
            self.load()

    def test_steps_hunks_and_tests(self) -> None:
        two_step_repo(self.tmp)
        steps = self.load()
        self.assertEqual([(s.slug, dict(s.hunks), s.new, s.tests) for s in steps], [
            ("one", {UTILS: frozenset({1})}, (MODULE, TEST_ONE), (TEST_ONE,)),
            ("two", {UTILS: frozenset({2, 3})}, (TEST_TWO,), (TEST_TWO,)),
        ])
        self.assertEqual(bt.state_after(steps, 1), ({UTILS: {1}}, [MODULE, TEST_ONE]))

    def test_misplaced_change(self) -> None:
        cases = [
            ([f"{UTILS}#1", TEST_ONE], [f"{UTILS}#3", TEST_TWO], f"hunk(s) #2 of {UTILS} are in no step"),
            ([f"{UTILS}#1-2", TEST_ONE], [f"{UTILS}#2-3", TEST_TWO], f"hunk #2 of {UTILS} is already in step one"),
            ([UTILS, TEST_ONE], [f"{UTILS}#4", TEST_TWO], "utils.py.patch has 3 hunk(s)"),
            ([UTILS, TEST_ONE], [TEST_TWO, TEST_ONE], f"{TEST_ONE} is already in step one"),
            ([UTILS, TEST_ONE], [TEST_TWO, "torch/x.py"], "torch/x.py is neither patched"),
            ([UTILS, TEST_ONE, f"{TEST_TWO}#1"], [TEST_TWO], "hunks are chosen only from patches/"),
            ([UTILS, TEST_ONE], [TEST_TWO, f"{UTILS}#2-x"], "bad hunk range '2-x'"),
        ]
        for one, two, message in cases:
            with self.subTest(message):
                fakes.write_repo(self.tmp, {UTILS: fakes.utils_edit(1, 10, 18)}, {TEST_ONE: "", TEST_TWO: ""},
                                 step_toml("one", one) + step_toml("two", two))
                self.assert_fails(message)

    def test_a_new_file_in_no_step(self) -> None:
        fakes.write_repo(self.tmp, {}, {TEST_ONE: "", MODULE: ""}, step_toml("one", [TEST_ONE]))
        self.assert_fails(f"{MODULE} is in no step")

    def test_a_step_must_run_a_test_file(self) -> None:
        stack = step_toml("one", [MODULE]) + step_toml("two", [TEST_ONE])
        fakes.write_repo(self.tmp, {}, {TEST_ONE: "", MODULE: ""}, stack)
        self.assert_fails("step 1 (one) has no test file to run")

    def test_run_moves_a_test_file_to_a_later_step(self) -> None:
        stack = step_toml("one", [TEST_ONE, EXTRA]) + step_toml("two", [TEST_TWO], run=[EXTRA])
        fakes.write_repo(self.tmp, {}, {TEST_ONE: "", TEST_TWO: "", EXTRA: ""}, stack)
        self.assertEqual([s.tests for s in self.load()], [(TEST_ONE,), (EXTRA, TEST_TWO)])
        stack = step_toml("one", [TEST_ONE], run=[TEST_TWO]) + step_toml("two", [TEST_TWO, EXTRA])
        (self.tmp / "tools" / "stack.toml").write_text(stack)
        self.assert_fails(f"run entry {TEST_TWO} is only added by step 2")

    def test_upstream_test_edits(self) -> None:
        fakes.write_repo(self.tmp, {}, {TEST_ONE: "", TEST_TWO: ""},
                         step_toml("one", [TEST_ONE, UPSTREAM_TEST]) + step_toml("two", [TEST_TWO]))
        fakes.write_upstream_test(self.tmp, fakes.upstream_test_edit(1))
        self.assertEqual([(s.new, s.upstream_tests, s.tests) for s in self.load()], [
            ((TEST_ONE,), (UPSTREAM_TEST,), (TEST_ONE,)),
            ((TEST_TWO,), (), (TEST_TWO,)),
        ])
        cases = [
            ([TEST_ONE], [TEST_TWO], f"hunk(s) #1 of {UPSTREAM_TEST} are in no step"),
            ([TEST_ONE, UPSTREAM_TEST], [TEST_TWO, UPSTREAM_TEST], f"hunk #1 of {UPSTREAM_TEST} is already in step one"),
            ([TEST_ONE, f"{UPSTREAM_TEST}#2"], [TEST_TWO], f"{UPSTREAM_TEST}.patch has 1 hunk(s)"),
            ([TEST_ONE, TEST_TWO], [UPSTREAM_TEST], "step 2 (two) has no test file to run"),
        ]
        for one, two, message in cases:
            with self.subTest(message):
                (self.tmp / "tools" / "stack.toml").write_text(step_toml("one", one) + step_toml("two", two))
                self.assert_fails(message)

    def test_bad_step_tables(self) -> None:
        fakes.write_repo(self.tmp, {}, {TEST_ONE: ""}, step_toml("One", [TEST_ONE]))
        self.assert_fails("slug must be unique")
        (self.tmp / "tools" / "stack.toml").write_text(step_toml("one", [TEST_ONE]).replace('what = "Placeholder."', ""))
        self.assert_fails("`what`, `why` and `test_plan` must be non-empty")
        (self.tmp / "tools" / "stack.toml").write_text(step_toml("one", [TEST_ONE]) + 'results = "x"\n')
        self.assert_fails("unknown key(s) results")


class ExportTest(fakes.FakeStockTest):
    def export_fails(self, root: Path) -> str:
        log = fakes.Log()
        self.assertEqual(bt.export(root, self.stock, self.tmp / "out", log), 1)
        self.assertFalse((self.tmp / "out" / "stack").exists())
        return log.text

    def test_writes_a_series_that_applies(self) -> None:
        root, out, log = two_step_repo(self.tmp / "repo"), self.tmp / "dist", fakes.Log()
        self.assertEqual(bt.export(root, self.stock, out, log), 0)
        names = sorted(p.name for p in (out / "stack").iterdir())
        self.assertEqual(names, ["0001-one.md", "0001-one.patch", "0002-two.md", "0002-two.patch"])
        text = (out / "stack" / "0001-one.md").read_text()
        self.assertTrue(text.startswith("# [DTensor] one\n\n## What\n\nPlaceholder.\n\n## Why\n\nBecause.\n\n## Test plan"))
        self.assertTrue(text.endswith("## Issues\n\nNone.\n"))
        self.assertIn("| 2 | [DTensor] two | 9 | 4 | 5 |", (out / "stack.md").read_text())
        self.assertEqual(log[1].split(), ["1", "one", "9", "2", "7"])
        self.assertEqual(log[3].split(), ["total", "18", "6", "12"])
        tree = self.tmp / "tree"
        (tree / UTILS).parent.mkdir(parents=True)
        (tree / UTILS).write_text(UTILS_TEXT)
        for name in ("0001-one.patch", "0002-two.patch"):
            subprocess.run(["git", "apply", str(out / "stack" / name)], cwd=tree, check=True)
        self.assertEqual((tree / UTILS).read_text(), fakes.utils_edit(1, 10, 18))
        self.assertEqual((tree / TEST_TWO).read_text(), TEST_TWO_TEXT)

    def test_exports_an_upstream_test_edit_whole(self) -> None:
        root, out, log = two_step_repo(self.tmp / "repo"), self.tmp / "dist", fakes.Log()
        stack = step_toml("one", [f"{UTILS}#1", MODULE, TEST_ONE])
        (root / "tools" / "stack.toml").write_text(stack + step_toml("two", [f"{UTILS}#2-3", TEST_TWO, UPSTREAM_TEST]))
        fakes.write_upstream_test(root, fakes.upstream_test_edit(3, 7))
        self.assertEqual(bt.export(root, self.stock, out, log), 0, log.text)
        self.assertEqual(log[2].split(), ["2", "two", "13", "4", "9"])
        self.assertNotIn(UPSTREAM_TEST, (out / "stack" / "0001-one.patch").read_text())
        entry = f"diff --git a/{UPSTREAM_TEST} b/{UPSTREAM_TEST}\n" + fakes.make_patch(
            UPSTREAM_TEST, UPSTREAM_TEST_TEXT, fakes.upstream_test_edit(3, 7))
        self.assertIn(entry, (out / "stack" / "0002-two.patch").read_text())
        tree = self.tmp / "tree"
        for rel, text in ((UTILS, UTILS_TEXT), (UPSTREAM_TEST, UPSTREAM_TEST_TEXT)):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(text)
        for name in ("0001-one.patch", "0002-two.patch"):
            subprocess.run(["git", "apply", str(out / "stack" / name)], cwd=tree, check=True)
        self.assertEqual((tree / UPSTREAM_TEST).read_text(), fakes.upstream_test_edit(3, 7))
        self.assertEqual((tree / UTILS).read_text(), fakes.utils_edit(1, 10, 18))

    def test_exports_an_upstream_test_edit_split_over_steps(self) -> None:
        """Each step exports its hunks of the edit, numbered for the file the steps before it leave."""
        root, out, log = two_step_repo(self.tmp / "repo"), self.tmp / "dist", fakes.Log()
        mid = UPSTREAM_TEST_TEXT.replace("    assert 3 >= 0\n", "", 1)  # a line fewer before hunk 2
        final = mid.replace("    assert 7 >= 0\n", "    assert 7 < 100\n", 1)
        (root / "tools" / "stack.toml").write_text(
            step_toml("one", [f"{UTILS}#1", MODULE, TEST_ONE, f"{UPSTREAM_TEST}#1"])
            + step_toml("two", [f"{UTILS}#2-3", TEST_TWO, f"{UPSTREAM_TEST}#2"]))
        fakes.write_upstream_test(root, final)
        self.assertEqual(bt.export(root, self.stock, out, log), 0, log.text)
        for name, old, new in (("0001-one.patch", UPSTREAM_TEST_TEXT, mid), ("0002-two.patch", mid, final)):
            entry = f"diff --git a/{UPSTREAM_TEST} b/{UPSTREAM_TEST}\n" + fakes.make_patch(UPSTREAM_TEST, old, new)
            self.assertIn(entry, (out / "stack" / name).read_text())

    def test_fails_on_size_rules(self) -> None:
        cases = [
            ([(1, 1)] * 15, "the stack has 15 steps (at most 14)"),
            ([(1, 1), (100, 301)], "step 2 (s1) changes 401 lines (at most 400 per step)"),
            ([(151, 1)], "step 1 (s0) has 151 product lines (at most 150 in the first step)"),
            ([(100, 1), (300, 1), (300, 1), (101, 1)], "the stack has 801 product lines (at most 800)"),
            ([(0, 400)] * 5 + [(0, 1)], "the stack has 2001 test lines (at most 2000)"),
        ]
        for i, (sizes, message) in enumerate(cases):
            with self.subTest(message):
                self.assertIn(f"export: FAIL: {message}", self.export_fails(sized_repo(self.tmp / str(i), sizes)))

    def test_passes_at_the_limits(self) -> None:
        sizes = [(150, 100), (200, 200), (150, 250), (100, 300), (200, 200), (0, 400), (0, 400)]
        sizes += [(0, 150)] + [(0, 0)] * 6
        log = fakes.Log()
        self.assertEqual(bt.export(sized_repo(self.tmp / "repo", sizes), self.stock, self.tmp / "out", log), 0, log.text)
        self.assertEqual(log[-2].split(), ["total", "2800", "800", "2000"])

    def test_fails_on_banned_pr_text(self) -> None:
        texts = ["After the ReBase.", "As on 2.13.0.", "See /work/main.", "Ran in /tmp/x.", "In /home/me.",
                 "From /root.", "With .venv-stock.", "Measured 2026-12-01."]
        for i, text in enumerate(texts):
            with self.subTest(text):
                output = self.export_fails(sized_repo(self.tmp / str(i), [(1, 1)], text=text))
                self.assertIn("export: FAIL: step 1 (s0): its PR text ", output)

    def test_fails_on_a_hunk_in_no_step(self) -> None:
        root = two_step_repo(self.tmp / "repo")
        stack = (root / "tools" / "stack.toml").read_text()
        (root / "tools" / "stack.toml").write_text(stack.replace("#2-3", "#3"))
        err = io.StringIO()
        with redirect_stderr(err):
            code = bt.main(["export", "--repo", str(root), "--stock-venv", str(self.stock), "--out", str(self.tmp / "o")])
        self.assertEqual(code, 1)
        self.assertIn(f"hunk(s) #2 of {UTILS} are in no step", err.getvalue())


class CheckStackTest(fakes.FakeStockTest):
    def test_runs_each_step_on_its_own_tree(self) -> None:
        root, log, log_file = two_step_repo(self.tmp / "repo"), fakes.Log(), self.tmp / "check-stack.log"
        self.assertEqual(bt.check_stack(root, self.stock, [], 600, log_file, log), 0, log.text)
        self.assertTrue(log[0].startswith("check-stack: 1/2 one: pass, 1 passed, "), log[0])
        self.assertTrue(log[1].startswith("check-stack: 2/2 two: pass, 1 passed, "), log[1])
        ran = [line for line in log_file.read_text().splitlines() if line.startswith("$ pytest")]
        self.assertEqual(ran, [f"$ pytest {TEST_ONE}", f"$ pytest {TEST_TWO}"])
        self.assertEqual((bt.site_packages(self.stock) / UTILS).read_text(), UTILS_TEXT)

    def test_fails_a_step_and_can_pick_steps(self) -> None:
        root = two_step_repo(self.tmp / "repo", two=TEST_TWO_TEXT + "\n\ndef test_bad():\n    assert False\n")
        log = fakes.Log()
        self.assertEqual(bt.check_stack(root, self.stock, ["two"], 600, self.tmp / "log", log), 1)
        self.assertTrue(log[0].startswith("check-stack: 2/2 two: FAIL, 1 failed, 1 passed, "), log[0])
        self.assertIn("test_bad", log[1])
        self.assertTrue(log[-1].startswith("check-stack: FAILED: two"))
        with self.assertRaisesRegex(bt.BuildError, "unknown step"):
            bt.check_stack(root, self.stock, ["three"], 600, self.tmp / "log", log)

    def test_summarize(self) -> None:
        self.assertEqual(bt.summarize("x\n=== 3 passed, 1 skipped, 2 warnings in 0.52s ===\n"), "3 passed, 1 skipped")
        self.assertEqual(bt.summarize("no tests ran in 0.01s\n"), "no tests ran")
        self.assertEqual(bt.summarize("Traceback\n"), "no pytest summary")


class CheckUpstreamTestsTest(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))
        self.root = fakes.write_repo(self.tmp / "repo", {}, {TEST_ONE: ""}, step_toml("one", [TEST_ONE, UPSTREAM_TEST]))
        fakes.write_upstream_test(self.root, fakes.upstream_test_edit(3, 7))

    def check(self, directory: Path, files: dict[str, str]) -> tuple[int, fakes.Log]:
        for rel, text in files.items():
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            (directory / rel).write_text(text)
        log = fakes.Log()
        return bt.check_upstream_tests(self.root, directory, log), log

    def test_applies_to_a_folder_by_name_or_a_checkout(self) -> None:
        name = f"check-upstream-tests: patches/{UPSTREAM_TEST}.patch (commit {COMMIT})"
        code, log = self.check(self.tmp / "flat", {"test_upstream.py": UPSTREAM_TEST_TEXT})
        self.assertEqual((code, log), (0, [f"{name}: applies to {self.tmp / 'flat' / 'test_upstream.py'}",
                                           "check-upstream-tests: 1 of 1 patch(es) apply"]))
        code, log = self.check(self.tmp / "checkout", {UPSTREAM_TEST: "import os\n" + UPSTREAM_TEST_TEXT})
        self.assertEqual(code, 0, log.text)
        hunks = bt.read_change(self.root).upstream_tests[UPSTREAM_TEST].patch.hunks
        self.assertEqual(log[0], f"{name}: applies to {self.tmp / 'checkout' / UPSTREAM_TEST}" + "".join(
            f"\n    Hunk #{h.index} succeeded at {h.old_start + 1} (offset 1 line)." for h in hunks))

    def test_fails_on_another_version_or_no_file(self) -> None:
        code, log = self.check(self.tmp / "flat", {"test_upstream.py": UPSTREAM_TEST_TEXT.replace("7 >= 0", "7 > -1")})
        self.assertEqual(code, 1)
        self.assertIn(f"patches/{UPSTREAM_TEST}.patch (commit {COMMIT}): FAIL to ", log[0])
        self.assertIn(f"error: patch failed: {UPSTREAM_TEST}:", log[0])
        self.assertEqual(log[-1], f"check-upstream-tests: 0 of 1 patch(es) apply; FAILED: {UPSTREAM_TEST}")
        (self.tmp / "empty").mkdir()
        code, log = self.check(self.tmp / "empty", {})
        self.assertEqual(code, 1)
        self.assertIn(f"FAIL, {self.tmp / 'empty'} holds neither {UPSTREAM_TEST} nor test_upstream.py", log[0])
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(bt.main(["check-upstream-tests", "--repo", str(self.root)]), 1)
        self.assertIn("check-upstream-tests needs --dir DIR", err.getvalue())
        with self.assertRaisesRegex(bt.BuildError, "is not a directory"):
            bt.check_upstream_tests(self.root, self.tmp / "missing", fakes.Log())


@unittest.skipUnless(os.environ.get("UPSTREAM_TESTS_DIR"),
                     "set UPSTREAM_TESTS_DIR to a directory of the upstream test files patches/test/ edits")
class RepoUpstreamTestsTest(unittest.TestCase):
    def test_the_repo_patches_apply(self) -> None:
        log = fakes.Log()
        code = bt.check_upstream_tests(REPO_ROOT, Path(os.environ["UPSTREAM_TESTS_DIR"]), log)
        self.assertEqual(code, 0, log.text)


if __name__ == "__main__":
    unittest.main()
