"""Tests of `make build` (tools/build.py): patch parsing and applying (upstream test
patches included), the RECORD check of pristine files, the repo's change, and the
overlay venv with its stamps, on a fake stock venv (tools/test/fakes.py), without
pip or a real torch.
"""

from __future__ import annotations

import io
import re
import shutil
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
from tools.test.fakes import COMMIT, UPSTREAM, UPSTREAM_TEST, UPSTREAM_TEST_TEXT, UTILS, UTILS_TEXT

NEW_MODULE = "torch/testing/_internal/distributed/_tensor/contract.py"
OP_DB = "torch/testing/_internal/common_methods_invocations.py"


def run_python(venv: Path, code: str) -> str:
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


class PatchTest(unittest.TestCase):
    def test_apply_all_and_some_hunks(self) -> None:
        patch = bt.parse_patch(fakes.make_patch(UTILS, UTILS_TEXT, fakes.utils_edit(1, 10, 18)), "p")
        self.assertEqual([h.index for h in patch.hunks], [1, 2, 3])
        self.assertEqual(bt.apply_hunks(patch, UTILS_TEXT), fakes.utils_edit(1, 10, 18))
        self.assertEqual(bt.apply_hunks(patch, UTILS_TEXT, [2]), fakes.utils_edit(10))
        self.assertEqual(bt.apply_hunks(patch, UTILS_TEXT, [1, 3]), fakes.utils_edit(1, 18))

    def test_no_newline_at_end_and_form_feed(self) -> None:
        rel = "torch/distributed/tensor/_api.py"
        old = UPSTREAM[rel]
        new = old.replace("pass", "x = 1\x0c\n    y = 2")
        text = bt.file_diff(rel, old.encode(), new.encode())
        self.assertEqual(text.count("\\ No newline at end of file\n"), 2)
        self.assertEqual(bt.apply_hunks(bt.parse_patch(text, "p"), old), new)

    def test_parse_errors(self) -> None:
        cases = [
            ("@@ -1 +1 @@\n-a\n+b\n", "no `--- a/<path>`"),
            ("--- a/x.py\n+++ b/y.py\n@@ -1 +1 @@\n-a\n+b\n", "same path"),
            ("--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n-a\n+b\n", "ends before"),
            ("--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n+c\n", "expected a `@@"),
            ("--- a/x.py\n+++ b/x.py\n@@ -5 +5 @@\n-a\n+b\n@@ -2 +2 @@\n-c\n+d\n", "hunk #2 (@@ -2 +2 @@) overlaps"),
            ("--- a/x.py\n+++ b/x.py\n", "no hunk"),
        ]
        for text, message in cases:
            with self.subTest(message), self.assertRaisesRegex(bt.BuildError, r"^p\.patch.*" + re.escape(message)):
                bt.parse_patch(text, "p.patch")

    def test_upstream_test_patch(self) -> None:
        header = f"# pytorch/pytorch {UPSTREAM_TEST} at commit {COMMIT}\n"
        diff = fakes.make_patch(UPSTREAM_TEST, UPSTREAM_TEST_TEXT, fakes.upstream_test_edit(2, 9))
        upstream = bt.parse_upstream_test(header + diff, "p")
        self.assertEqual((upstream.patch.path, upstream.commit, len(upstream.patch.hunks)), (UPSTREAM_TEST, COMMIT, 2))
        self.assertEqual(upstream.git_diff(), f"diff --git a/{UPSTREAM_TEST} b/{UPSTREAM_TEST}\n{diff}")
        cases = [
            (diff, "the first line must name the upstream version"),
            (header.replace(COMMIT, COMMIT[:12]) + diff, "the first line must name the upstream version"),
            (header + "\n" + diff, "the first line must name the upstream version"),
            (header.replace("test_upstream", "test_other") + diff,
             f"its first line names test/distributed/tensor/test_other.py, its headers {UPSTREAM_TEST}"),
        ]
        for text, message in cases:
            with self.subTest(message), self.assertRaisesRegex(bt.BuildError, r"^p\.patch: " + re.escape(message)):
                bt.parse_upstream_test(text, "p.patch")

    def test_upstream_test_patch_file_applies_as_it_is(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            tree = Path(tmp)
            patch = fakes.write_upstream_test(tree / "repo", fakes.upstream_test_edit(4))
            (tree / UPSTREAM_TEST).parent.mkdir(parents=True)
            (tree / UPSTREAM_TEST).write_text(UPSTREAM_TEST_TEXT)
            subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
            self.assertEqual((tree / UPSTREAM_TEST).read_text(), fakes.upstream_test_edit(4))

    def test_mismatch_names_patch_hunk_and_line(self) -> None:
        patch = bt.parse_patch(fakes.make_patch(UTILS, UTILS_TEXT, fakes.utils_edit(1, 10)), "patches/u.patch")
        with self.assertRaises(bt.BuildError) as info:
            bt.apply_hunks(patch, UTILS_TEXT.replace("def rule_10", "def other_10"))
        self.assertIn(f"patches/u.patch: hunk #2 (@@ -39,7 +39,7 @@) does not apply to {UTILS}", str(info.exception))
        self.assertIn("line 41 is 'def other_10():\\n'", str(info.exception))


class ChangeTest(fakes.FakeStockTest):
    def test_record_verifies_pristine_files(self) -> None:
        site = bt.site_packages(self.stock)
        record = bt.load_record(site)
        self.assertEqual(record.verified(site, UTILS), UTILS_TEXT.encode())
        with self.assertRaisesRegex(bt.BuildError, "not a file of torch 2.14.1"):
            record.verified(site, "torch/distributed/tensor/_nope.py")
        copy = self.tmp / "site"
        shutil.copytree(site, copy)
        (copy / UTILS).write_text(UTILS_TEXT + "# edited\n")
        with self.assertRaisesRegex(bt.BuildError, f"{copy / UTILS} is not pristine"):
            bt.load_record(copy).verified(copy, UTILS)

    def test_read_change(self) -> None:
        fakes.write_repo(self.tmp, {UTILS: fakes.utils_edit(3)}, {NEW_MODULE: "X = 1\n", "test/t/test_a.py": ""}, "")
        (self.tmp / "torch" / "__pycache__").mkdir()
        (self.tmp / "torch" / "__pycache__" / "x.pyc").write_bytes(b"")
        change = bt.read_change(self.tmp)
        self.assertEqual(list(change.patches), [UTILS])
        self.assertEqual(sorted(change.new_files), ["test/t/test_a.py", NEW_MODULE])
        (self.tmp / "patches" / f"{UTILS}.patch").rename(self.tmp / "patches" / "torch" / "distributed" / "o.py.patch")
        with self.assertRaisesRegex(bt.BuildError, f"headers name {UTILS}, its location torch/distributed/o.py"):
            bt.read_change(self.tmp)

    def test_read_change_with_upstream_tests(self) -> None:
        fakes.write_repo(self.tmp, {UTILS: fakes.utils_edit(3)}, {}, "")
        fakes.write_upstream_test(self.tmp, fakes.upstream_test_edit(4))
        change = bt.read_change(self.tmp)
        self.assertEqual((list(change.patches), list(change.upstream_tests)), ([UTILS], [UPSTREAM_TEST]))
        self.assertEqual(change.upstream_tests[UPSTREAM_TEST].commit, COMMIT)
        (self.tmp / UPSTREAM_TEST).parent.mkdir(parents=True)
        (self.tmp / UPSTREAM_TEST).write_text("")
        with self.assertRaisesRegex(bt.BuildError, f"both patched and added as new files: {UPSTREAM_TEST}"):
            bt.read_change(self.tmp)
        (self.tmp / UPSTREAM_TEST).unlink()
        (self.tmp / "patches" / "test" / "helpers.py.patch").write_text("")
        with self.assertRaisesRegex(bt.BuildError, "helpers.py.patch: patches/ holds only torch/"):
            bt.read_change(self.tmp)

    def test_new_file_may_not_replace_an_upstream_file(self) -> None:
        fakes.write_repo(self.tmp, {}, {UTILS: "x = 1\n"}, "")
        with self.assertRaisesRegex(bt.BuildError, f"new files {UTILS} are files of torch 2.14.1"):
            bt.read_change(self.tmp).originals(bt.site_packages(self.stock))


class BuildTest(fakes.FakeStockTest):
    def repo(self, patched: str, new_files: dict[str, str]) -> Path:
        """A repo patching UTILS to ``patched``, its pins stamped on the fake stock venv so no pip runs."""
        root = fakes.write_repo(self.tmp / "repo", {UTILS: patched}, new_files, "")
        (root / "requirements").mkdir()
        (root / "requirements" / "test.txt").write_text("torch==2.14.1\n")
        (self.stock / bt.STAMP_NAME).write_text(bt.digest(sys.version, b"torch==2.14.1\n", "") + "\n")
        return root

    def test_overlay_and_stamps(self) -> None:
        root = self.repo(fakes.utils_edit(2), {NEW_MODULE: "X = 7\n"})
        venv, log = root / ".venv", fakes.Log()
        self.assertTrue(bt.build(root, venv, self.stock, [], False, log))
        site = bt.site_packages(venv)
        self.assertEqual((site / UTILS).read_text(), fakes.utils_edit(2))
        self.assertFalse((site / UTILS).is_symlink())
        self.assertTrue((site / "torch" / "_utils.py").is_symlink())
        self.assertEqual((bt.site_packages(self.stock) / UTILS).read_text(), UTILS_TEXT)
        code = ("import torch.distributed.tensor._ops.utils as u, torch._utils as t\n"
                "from torch.testing._internal.distributed._tensor.contract import X\n"
                "print(u.rule_2(), X, t.__file__.startswith(u.__file__.split('/torch/')[0]))")
        self.assertEqual(run_python(venv, code), "-2 7 True")
        self.assertFalse(bt.build(root, venv, self.stock, [], False, log))
        self.assertEqual(log[-1], "build: .venv is up to date")
        fakes.write_repo(root, {UTILS: fakes.utils_edit(2, 9)}, {}, "")
        self.assertTrue(bt.build(root, venv, self.stock, [], False, log))
        self.assertEqual(run_python(venv, "import torch.distributed.tensor._ops.utils as u; print(u.rule_9())"), "-9")

    def test_patched_single_file_and_an_upstream_test_patch(self) -> None:
        root = self.repo(fakes.utils_edit(2), {})
        fakes.write_repo(root, {OP_DB: "op_db = [1]\n"}, {}, "")
        fakes.write_upstream_test(root, fakes.upstream_test_edit(4))
        venv, log = root / ".venv", fakes.Log()
        self.assertTrue(bt.build(root, venv, self.stock, [], False, log))
        self.assertEqual(log[-1], "build: .venv holds 2 patched and 0 new module(s) over stock")
        site = bt.site_packages(venv)
        self.assertFalse((site / OP_DB).is_symlink())
        self.assertTrue((site / "torch" / "testing" / "_internal" / "__init__.py").is_symlink())
        self.assertEqual(run_python(venv, "from torch.testing._internal.common_methods_invocations import op_db; "
                                          "print(op_db)"), "[1]")
        self.assertEqual((bt.site_packages(self.stock) / OP_DB).read_text(), UPSTREAM[OP_DB])
        self.assertEqual(list(venv.rglob(Path(UPSTREAM_TEST).name)), [])

    def test_stops_on_a_patch_that_does_not_apply(self) -> None:
        root = self.repo(fakes.utils_edit(2, 12), {})
        patch = root / "patches" / f"{UTILS}.patch"
        patch.write_text(patch.read_text().replace(" def rule_12", " def rule_twelve"))
        message = rf"^patches/{UTILS}.patch: hunk #2 \(@@ -47,7 \+47,7 @@\) does not apply to {UTILS}"
        with self.assertRaisesRegex(bt.BuildError, message):
            bt.build(root, root / ".venv", self.stock, [], False, fakes.Log())
        self.assertIsNone(bt.read_stamp(root / ".venv"))

    def test_overlay_refuses_files_outside_its_copies(self) -> None:
        with self.assertRaisesRegex(bt.BuildError, "only files under .* can be patched or added: torch/_x.py"):
            bt.make_overlay(self.stock, self.tmp / "venv", {"torch/_x.py": b""})

    def test_cli_reports_errors(self) -> None:
        err = io.StringIO()
        with redirect_stderr(err):
            self.assertEqual(bt.main(["export", "--repo", str(self.tmp)]), 1)
        self.assertIn("does not exist; run `make build`", err.getvalue())


if __name__ == "__main__":
    unittest.main()
