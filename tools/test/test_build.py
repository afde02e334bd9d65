# Owner(s): ["oncall: distributed"]
"""Tests for tools/build.py.

Most tests run the patch/verify/stamp/refresh/export logic on a tiny fake
site-packages tree (a few-file ``torch`` package plus a RECORD generated
here), so the whole file takes seconds.  ``RealVenvTest`` looks at the real
``.venv`` read-only when it exists.

Run with ``.venv/bin/python -m pytest tools/test`` or as a script.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from torch.testing._internal.common_utils import run_tests, TestCase

if TYPE_CHECKING:
    from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build.py"


def _load_build_tool() -> ModuleType:
    """Import tools/build.py by path (a `tools` package elsewhere can't shadow it)."""
    spec = importlib.util.spec_from_file_location("dtensor_build_tool", BUILD_SCRIPT)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {BUILD_SCRIPT}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    # the module the loader returns, as the type checker knows it
    import tools.build as bt
else:
    bt = _load_build_tool()

PROP = "torch/distributed/tensor/_sharding_prop.py"
API = "torch/distributed/tensor/_api.py"
UTILS = "torch/_utils.py"
NEW_MODULE = "torch/distributed/tensor/_ops/strategy_contract.py"

UPSTREAM: dict[str, str] = {
    "torch/__init__.py": "",
    "torch/distributed/__init__.py": "",
    "torch/distributed/tensor/__init__.py": "from torch.distributed.tensor._api import *\n",
    "torch/distributed/tensor/_ops/__init__.py": "",
    PROP: "".join(f"def rule_{i}(x):\n    return x + {i}\n\n" for i in range(30)),
    # no trailing newline, like some upstream files
    API: "class DTensor:\n    pass\n\n\ndef distribute_tensor(t):\n    return t",
    # a form feed must not be taken for a line break
    UTILS: "a = 1\n\x0c\nb = 2\nc = 3\nd = 4\n",
}


def _replace_line(text: str, old: str, new: str) -> str:
    if old not in text:
        raise ValueError(f"{old!r} not in text")
    return text.replace(old, new, 1)


def make_site(root: Path, files: dict[str, str] = UPSTREAM) -> Path:
    """A fake site-packages with ``files`` and a torch RECORD listing them."""
    site = root
    rows: list[list[str]] = []
    for rel, text in files.items():
        data = text.encode()
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        rows.append([rel, f"sha256={bt.record_digest(data)}", str(len(data))])
        pyc = Path(rel).parent / "__pycache__" / f"{Path(rel).stem}.cpython-311.pyc"
        rows.append([pyc.as_posix(), "", ""])
    dist = site / f"torch-{bt.TORCH_VERSION}+cpu.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Name: torch\nVersion: {bt.TORCH_VERSION}+cpu\n")
    rows.append([f"{dist.name}/METADATA", f"sha256={bt.record_digest((dist / 'METADATA').read_bytes())}", "1"])
    rows.append([f"{dist.name}/RECORD", "", ""])
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (dist / "RECORD").write_text(buf.getvalue())
    return site


class FakeTreeTestCase(TestCase):
    """A fake repo, a fake venv (site + state dir) and a fake stock site."""

    def setUp(self) -> None:
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="build-tool-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        self.repo = self.tmp / "repo"
        (self.repo / "requirements").mkdir(parents=True)
        (self.repo / "requirements" / "test.txt").write_text("torch==2.13.0\n")
        (self.repo / "tools").mkdir()
        shutil.copy(REPO_ROOT / "tools" / "pr_template.md", self.repo / "tools" / "pr_template.md")
        self.sources = bt.Sources(self.repo)
        self.target = bt.Target(make_site(self.tmp / "venv" / "site"), self.tmp / "venv")
        self.stock = make_site(self.tmp / "stock" / "site")

    # -- helpers ---------------------------------------------------------
    def installed(self, rel: str) -> str:
        return (self.target.site / rel).read_text()

    def edit_installed(self, rel: str, text: str) -> None:
        (self.target.site / rel).write_text(text)

    def write_patch(self, rel: str, new_text: str) -> Path:
        path = self.sources.patch_path(rel)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(bt.make_patch(rel, UPSTREAM[rel], new_text))
        return path

    def write_module(self, rel: str, text: str) -> Path:
        path = self.repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def build(self, force: bool = False) -> bt.BuildReport:
        return bt.apply_to_tree(self.sources, self.target, force=force)

    def snapshot(self) -> dict[str, bytes]:
        return {
            p.relative_to(self.target.site).as_posix(): p.read_bytes()
            for p in sorted(self.target.site.rglob("*"))
            if p.is_file()
        }

    def cli(self, *argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        lines: list[str] = []
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = bt.main(
                [
                    *argv,
                    "--repo", str(self.repo),
                    "--site-packages", str(self.target.site),
                    "--state-dir", str(self.target.state_dir),
                    "--stock-site-packages", str(self.stock),
                ],
                log=lines.append,
            )
        return code, "\n".join(lines) + out.getvalue(), err.getvalue()


PROP_EDIT_A = _replace_line(UPSTREAM[PROP], "return x + 7\n", "return x + 7  # contract A\n")
PROP_EDIT_B = _replace_line(UPSTREAM[PROP], "return x + 20\n", "return x + 20  # contract B\n")


class BuildTest(FakeTreeTestCase):
    def test_build_applies_patches_and_installs_modules(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.write_module(NEW_MODULE, "CONTRACT = True\n")
        report = self.build()
        self.assertEqual(report.patched, [PROP])
        self.assertEqual(report.installed, [NEW_MODULE])
        self.assertEqual(self.installed(PROP), PROP_EDIT_A)
        self.assertEqual(self.installed(NEW_MODULE), "CONTRACT = True\n")
        # the pristine copy is the wheel's text
        self.assertEqual(self.target.pristine(PROP).read_text(), UPSTREAM[PROP])

    def test_tampered_upstream_file_is_refused(self) -> None:
        self.edit_installed(PROP, UPSTREAM[PROP] + "# tampered\n")
        self.write_patch(PROP, PROP_EDIT_A)
        before = self.snapshot()
        with self.assertRaisesRegex(bt.BuildError, r"_sharding_prop\.py does not match torch 2\.13\.0's RECORD"):
            self.build()
        self.assertEqual(self.snapshot(), before)
        self.assertFalse(self.target.pristine(PROP).exists())

    def test_tampered_pristine_copy_is_refused(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.build()
        self.target.pristine(PROP).write_text("not the original\n")
        self.write_patch(PROP, PROP_EDIT_B)
        with self.assertRaisesRegex(bt.BuildError, r"\.pristine/torch/distributed/tensor/_sharding_prop\.py does not match"):
            self.build()

    def test_rebuild_is_a_noop_and_never_double_patches(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.write_patch(API, UPSTREAM[API] + "\n")
        self.assertFalse(self.build().up_to_date)
        first = self.snapshot()
        mtime = (self.target.site / PROP).stat().st_mtime_ns
        second = self.build()
        self.assertTrue(second.up_to_date)
        self.assertEqual(self.snapshot(), first)
        self.assertEqual((self.target.site / PROP).stat().st_mtime_ns, mtime)
        # without the stamp every patch is re-applied, to the pristine text
        self.target.state_file.unlink()
        third = self.build()
        self.assertFalse(third.up_to_date)
        self.assertEqual(self.snapshot(), first)
        self.assertEqual(self.installed(PROP).count("# contract A"), 1)

    def test_stamp_covers_inputs(self) -> None:
        self.build()
        self.assertTrue(self.build().up_to_date)
        self.write_module(NEW_MODULE, "X = 1\n")
        self.assertFalse(self.build().up_to_date)
        self.assertTrue(self.build().up_to_date)
        (self.repo / "requirements" / "test.txt").write_text("torch==2.13.0\npytest==9.2.0\n")
        self.assertFalse(self.build().up_to_date)

    def test_changed_patch_is_reapplied_on_pristine(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.build()
        self.write_patch(PROP, PROP_EDIT_B)
        report = self.build()
        self.assertEqual(report.patched, [PROP])
        self.assertEqual(self.installed(PROP), PROP_EDIT_B)
        self.assertNotIn("contract A", self.installed(PROP))

    def test_deleted_patch_restores_pristine(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.build()
        self.sources.patch_path(PROP).unlink()
        report = self.build()
        self.assertEqual(report.restored, [PROP])
        self.assertEqual(self.installed(PROP), UPSTREAM[PROP])

    def test_bad_patch_names_patch_file_target_and_hunk(self) -> None:
        text = _replace_line(PROP_EDIT_A, "return x + 2\n", "return x + 2  # first\n")
        patch = self.write_patch(PROP, text)
        self.write_patch(API, UPSTREAM[API] + "\n")
        # corrupt the context of the second hunk only
        lines = patch.read_text().splitlines(keepends=True)
        hunk_headers = [i for i, line in enumerate(lines) if line.startswith("@@")]
        self.assertEqual(len(hunk_headers), 2)
        second = hunk_headers[1]
        lines[second + 1] = " def rule_WRONG(x):\n"
        patch.write_text("".join(lines))
        header = lines[second].rstrip("\n")
        before = self.snapshot()
        with self.assertRaises(bt.BuildError) as ctx:
            self.build()
        message = str(ctx.exception)
        self.assertIn(str(patch), message)
        self.assertIn(str(self.target.site / PROP), message)
        self.assertIn(f"hunk #2 ({header})", message)
        self.assertIn("rule_WRONG", message)
        # nothing was written, not even the other (good) patch
        self.assertEqual(self.snapshot(), before)

    def test_patch_headers_must_name_the_mirrored_file(self) -> None:
        path = self.sources.patch_path(PROP)
        path.parent.mkdir(parents=True)
        path.write_text(bt.make_patch(API, UPSTREAM[API], UPSTREAM[API] + "\n"))
        with self.assertRaisesRegex(bt.BuildError, r"headers name a/torch/distributed/tensor/_api\.py"):
            self.build()

    def test_new_module_must_not_overwrite_upstream_file(self) -> None:
        clash = self.write_module(PROP, "evil = True\n")
        self.write_module(NEW_MODULE, "ok = True\n")
        before = self.snapshot()
        with self.assertRaisesRegex(bt.BuildError, r"refusing to install new modules over upstream files") as ctx:
            self.build()
        self.assertIn(str(clash), str(ctx.exception))
        self.assertEqual(self.snapshot(), before)

    def test_deleted_module_is_removed(self) -> None:
        deep = "torch/distributed/tensor/_ops/contract/checks.py"
        self.write_module(NEW_MODULE, "a = 1\n")
        self.write_module(deep, "b = 2\n")
        self.build()
        self.assertTrue((self.target.site / deep).is_file())
        shutil.rmtree(self.repo / "torch" / "distributed" / "tensor" / "_ops" / "contract")
        report = self.build()
        self.assertEqual(report.removed, [deep])
        self.assertFalse((self.target.site / deep).exists())
        self.assertFalse((self.target.site / deep).parent.exists())  # the empty new package dir too
        self.assertTrue((self.target.site / NEW_MODULE).is_file())
        self.assertTrue((self.target.site / "torch/distributed/tensor/_ops/__init__.py").is_file())

    def test_build_refuses_to_overwrite_unrefreshed_edits(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.build()
        edited = PROP_EDIT_A + "# work in progress\n"
        self.edit_installed(PROP, edited)
        self.write_patch(PROP, PROP_EDIT_B)  # the repo moves on too
        with self.assertRaisesRegex(bt.BuildError, r"make refresh") as ctx:
            self.build()
        self.assertIn(str(self.target.site / PROP), str(ctx.exception))
        self.assertEqual(self.installed(PROP), edited)
        self.build(force=True)
        self.assertEqual(self.installed(PROP), PROP_EDIT_B)

    def test_cli_prints_error_and_exits_1(self) -> None:
        patch = self.write_patch(PROP, PROP_EDIT_A)
        patch.write_text(patch.read_text().replace("return x + 7\n", "return x + 70\n"))
        proc = subprocess.run(
            [sys.executable, str(BUILD_SCRIPT), "build", "--repo", str(self.repo),
             "--site-packages", str(self.target.site), "--state-dir", str(self.target.state_dir)],
            capture_output=True, text=True, timeout=120,
        )
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("error: patch ", proc.stderr)
        self.assertIn("hunk #1 (@@ -", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


class RefreshTest(FakeTreeTestCase):
    def test_edit_becomes_a_patch_and_reverting_removes_it(self) -> None:
        self.build()
        self.edit_installed(UTILS, UPSTREAM[UTILS].replace("c = 3\n", "c = 33\n"))
        changes = bt.refresh_tree(self.sources, self.target, self.stock)
        self.assertEqual([(c.kind, c.rel) for c in changes], [("patch-add", UTILS)])
        patch = self.sources.patch_path(UTILS)
        self.assertEqual(
            patch.read_text(),
            "--- a/torch/_utils.py\n+++ b/torch/_utils.py\n"
            "@@ -1,5 +1,5 @@\n a = 1\n \x0c\n b = 2\n-c = 3\n+c = 33\n d = 4\n",
        )
        # the original came from the stock tree and is now kept for builds
        self.assertEqual(self.target.pristine(UTILS).read_text(), UPSTREAM[UTILS])
        report = self.build()
        self.assertEqual(report.patched, [])  # already in place
        self.assertEqual(bt.scan_tree(self.sources, self.target, self.stock), [])
        # undo the edit in place: refresh removes the patch (and its empty dirs)
        self.edit_installed(UTILS, UPSTREAM[UTILS])
        changes = bt.refresh_tree(self.sources, self.target, self.stock)
        self.assertEqual([(c.kind, c.rel) for c in changes], [("patch-remove", UTILS)])
        self.assertFalse(patch.exists())
        self.assertFalse((self.repo / "patches" / "torch").exists())

    def test_edit_of_patched_file_updates_the_patch(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.write_patch(API, UPSTREAM[API] + "\n")
        self.build()
        api_patch_before = self.sources.patch_path(API).read_text()
        both = _replace_line(PROP_EDIT_A, "return x + 20\n", "return x + 20  # contract B\n")
        self.edit_installed(PROP, both)
        changes = bt.refresh_tree(self.sources, self.target, stock_site=None)  # pristine copy suffices
        self.assertEqual([(c.kind, c.rel) for c in changes], [("patch-update", PROP)])
        self.assertEqual(self.sources.patch_path(API).read_text(), api_patch_before)
        # a fresh tree built from the refreshed patches reproduces the edit
        fresh = bt.Target(make_site(self.tmp / "fresh" / "site"), self.tmp / "fresh")
        bt.apply_to_tree(self.sources, fresh)
        self.assertEqual((fresh.site / PROP).read_text(), both)
        self.assertEqual((fresh.site / API).read_text(), UPSTREAM[API] + "\n")

    def test_new_and_edited_modules_are_copied_back(self) -> None:
        self.write_module(NEW_MODULE, "v = 1\n")
        self.build()
        (self.target.site / NEW_MODULE).write_text("v = 2\n")
        brand_new = "torch/testing/_internal/distributed/contract_utils.py"
        (self.target.site / brand_new).parent.mkdir(parents=True)
        (self.target.site / brand_new).write_text("helper = 1\n")
        (self.target.site / "torch/unrelated_scratch.py").write_text("ignored = 1\n")
        changes = bt.refresh_tree(self.sources, self.target, self.stock)
        self.assertEqual(
            sorted((c.kind, c.rel) for c in changes),
            [("module-add", brand_new), ("module-update", NEW_MODULE)],
        )
        self.assertEqual((self.repo / NEW_MODULE).read_text(), "v = 2\n")
        self.assertEqual((self.repo / brand_new).read_text(), "helper = 1\n")
        self.assertFalse((self.repo / "torch/unrelated_scratch.py").exists())

    def test_edit_without_any_pristine_source_is_reported(self) -> None:
        self.build()
        self.edit_installed(UTILS, "changed\n")
        (self.stock / UTILS).write_text("stock was tampered with\n")
        with self.assertRaisesRegex(bt.BuildError, r"no pristine copy verifies against RECORD"):
            bt.refresh_tree(self.sources, self.target, self.stock)
        self.assertFalse(self.sources.patch_path(UTILS).exists())

    def test_refresh_refuses_when_repo_changed_since_build(self) -> None:
        self.build()
        self.write_patch(PROP, PROP_EDIT_A)  # e.g. pulled from a colleague
        with self.assertRaisesRegex(bt.BuildError, r"Run `make build` first"):
            bt.refresh_tree(self.sources, self.target, self.stock)
        self.assertTrue(self.sources.patch_path(PROP).exists())

    def test_check_refreshed(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.write_module(NEW_MODULE, "v = 1\n")
        self.build()
        code, out, err = self.cli("check-refreshed")
        self.assertEqual(code, 0, err)
        self.assertIn("matches the repo", out)

        self.edit_installed(API, UPSTREAM[API] + "\n# edited\n")
        extra = "torch/distributed/tensor/_ops/_new_rules.py"
        (self.target.site / extra).write_text("rules = []\n")
        code, out, err = self.cli("check-refreshed")
        self.assertEqual(code, bt.EXIT_NOT_REFRESHED)
        self.assertIn(API, err)
        self.assertIn(extra, err)
        self.assertNotIn(PROP, err)

        code, out, err = self.cli("refresh")
        self.assertEqual(code, 0, err)
        self.assertIn(API, out)
        code, out, err = self.cli("check-refreshed")
        self.assertEqual(code, 0, err)
        self.assertTrue((self.repo / extra).is_file())

    def test_check_refreshed_sees_unapplied_repo_changes(self) -> None:
        self.build()
        self.write_module(NEW_MODULE, "v = 1\n")
        code, _, err = self.cli("check-refreshed")
        self.assertEqual(code, bt.EXIT_NOT_REFRESHED)
        self.assertIn("module-missing", err)


class ExportTest(FakeTreeTestCase):
    def _populate(self) -> None:
        self.write_patch(PROP, PROP_EDIT_A)
        self.write_patch(API, UPSTREAM[API] + "\n\ndef extra():\n    return 1")
        self.write_patch(UTILS, UPSTREAM[UTILS].replace("b = 2\n", ""))
        self.write_module(NEW_MODULE, "CONTRACT = 1\n")
        self.write_module("torch/distributed/tensor/_ops/empty_marker.py", "")
        test_file = self.repo / "test/distributed/tensor/test_strategy_contract.py"
        test_file.parent.mkdir(parents=True)
        test_file.write_text("def test_it():\n    pass\n")
        (test_file.parent / "__pycache__").mkdir()
        (test_file.parent / "__pycache__" / "junk.cpython-311.pyc").write_bytes(b"\0junk")
        self.build()

    def test_export_applies_to_a_pristine_tree(self) -> None:
        self._populate()
        out = self.tmp / "dist"
        # the PR stack needs tools/stack.toml (tools/test/test_stack.py); without one export says so
        code, stdout, err = self.cli("export", "--out", str(out))
        self.assertEqual(code, 1)
        self.assertIn("stack.toml is missing: it defines the PR stack", err)
        code, stdout, err = self.cli("export", "--out", str(out), "--no-stack")
        self.assertEqual(code, 0, err)
        patch = out / bt.EXPORT_PATCH_NAME
        text = patch.read_text()
        for rel in (PROP, API, UTILS):
            self.assertIn(f"diff --git a/{rel} b/{rel}\n--- a/{rel}\n+++ b/{rel}\n", text)
        for rel in (NEW_MODULE, "test/distributed/tensor/test_strategy_contract.py",
                    "torch/distributed/tensor/_ops/empty_marker.py"):
            self.assertIn(f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n", text)
        self.assertNotIn("junk", text)
        # independent check: rebuild a pristine tree from the wheel's files and git apply for real
        tree = self.tmp / "pytorch"
        subprocess.run(["git", "init", "-q", str(tree)], check=True)
        for rel in (PROP, API, UTILS):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(UPSTREAM[rel])
        subprocess.run(["git", "apply", "--check", str(patch)], cwd=tree, check=True)
        subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
        self.assertEqual((tree / PROP).read_text(), PROP_EDIT_A)
        self.assertEqual((tree / API).read_text(), UPSTREAM[API] + "\n\ndef extra():\n    return 1")
        self.assertEqual((tree / NEW_MODULE).read_text(), "CONTRACT = 1\n")
        self.assertEqual((tree / "torch/distributed/tensor/_ops/empty_marker.py").read_bytes(), b"")
        self.assertTrue((tree / "test/distributed/tensor/test_strategy_contract.py").is_file())

    def test_export_uses_stock_when_pristine_copy_is_missing(self) -> None:
        self._populate()
        shutil.rmtree(self.target.pristine_root)
        stock_target = bt.Target(self.stock, self.tmp / "stock")
        files = bt.export(self.sources, [self.target, stock_target], self.tmp / "dist")
        self.assertTrue(files[0].is_file())
        # with no verified original anywhere export must refuse
        (self.stock / PROP).write_text("tampered\n")
        with self.assertRaisesRegex(bt.BuildError, r"no pristine copy of torch/distributed/tensor/_sharding_prop\.py"):
            bt.export(self.sources, [self.target, stock_target], self.tmp / "dist2")

    def test_export_rejects_patch_git_cannot_apply(self) -> None:
        self._populate()
        with self.assertRaisesRegex(bt.BuildError, r"git apply --check"):
            bt.verify_with_git(
                self._write(self.tmp / "bad.patch", bt.git_modified_entry(PROP, "nothing\nlike\nit\n", "x\n")),
                {PROP: UPSTREAM[PROP].encode()},
                {},
            )

    def test_export_runs_git_verification(self) -> None:
        self._populate()
        real_entry = bt.git_modified_entry

        def broken(rel: str, old: str, new: str) -> str:
            return real_entry(rel, "not the upstream text\n", new)

        with mock.patch.object(bt, "git_modified_entry", broken):
            with self.assertRaisesRegex(bt.BuildError, r"rejected .*dtensor-strategy-contract\.patch"):
                bt.export(self.sources, [self.target], self.tmp / "dist")

    def _write(self, path: Path, text: str) -> Path:
        path.write_text(text)
        return path

    def test_pr_description(self) -> None:
        self._populate()
        pr = bt.render_pr(self.sources)
        headings = [line for line in pr.splitlines() if line.startswith("## ")]
        self.assertEqual(headings, ["## Summary", "## Motivation", "## Design", "## Test plan", "## Results"])
        self.assertIn("no audit report found; run `make audit`", pr)
        (self.repo / "reports").mkdir()
        (self.repo / "reports" / "audit.md").write_text(
            "# Audit\n\nSome prose.\n\n## Ops checked\n\n| op | ok |\n|---|---|\n| aten.mm | yes |\n\nTrailing prose.\n"
        )
        pr = bt.render_pr(self.sources)
        self.assertIn("### Ops checked\n\n| op | ok |\n|---|---|\n| aten.mm | yes |\n", pr)
        self.assertNotIn("Trailing prose", pr)
        (self.repo / "tools" / "pr_template.md").write_text("# T\n\n## Summary\n\nx\n")
        with self.assertRaisesRegex(bt.BuildError, r"## Motivation"):
            bt.render_pr(self.sources)


class DiffTest(TestCase):
    def test_patch_format_is_deterministic(self) -> None:
        text = bt.make_patch("torch/x.py", "a\nb\nc", "a\nB\nc")
        self.assertEqual(
            text,
            "--- a/torch/x.py\n+++ b/torch/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n\\ No newline at end of file\n",
        )
        self.assertEqual(bt.make_patch("torch/x.py", "same\n", "same\n"), "")

    def test_small_offset_is_accepted_large_is_rejected(self) -> None:
        old = "".join(f"line {i}\n" for i in range(40))
        new = old.replace("line 20\n", "line twenty\n")
        patch = bt.parse_patch(bt.make_patch("torch/x.py", old, new), "x.patch")
        shifted = "extra\n" * 3 + old
        self.assertEqual(bt.apply_patch(patch, shifted, "x.py"), "extra\n" * 3 + new)
        too_far = "extra\n" * (bt.MAX_HUNK_OFFSET + 1) + old
        with self.assertRaisesRegex(bt.BuildError, r"hunk #1 \(@@ -18,7 \+18,7 @@\)"):
            bt.apply_patch(patch, too_far, "x.py")

    def test_header_counts_are_strict(self) -> None:
        bad = "--- a/torch/x.py\n+++ b/torch/x.py\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n"
        with self.assertRaisesRegex(bt.BuildError, r"hunk #1 \(@@ -1,3 \+1,3 @@\) ends early"):
            bt.parse_patch(bad, "x.patch")

    def test_hand_written_patch(self) -> None:
        patch = bt.parse_patch(
            "diff --git a/torch/x.py b/torch/x.py\n--- a/torch/x.py\n+++ b/torch/x.py\n"
            "@@ -2 +2,2 @@\n-two\n+2\n+2.5\n@@ -4,0 +6 @@ tail\n+five\n",
            "x.patch",
        )
        self.assertEqual(bt.apply_patch(patch, "one\ntwo\nthree\nfour\n", "x.py"), "one\n2\n2.5\nthree\nfour\nfive\n")

    def test_round_trip_agrees_with_git_apply(self) -> None:
        rng = random.Random(1234)
        vocab = ["x = 1", "y = 2", "\x0cpage", "", "    pass", "def f():", "# c"]
        work = Path(tempfile.mkdtemp(prefix="diff-oracle-"))
        self.addCleanup(shutil.rmtree, work, ignore_errors=True)
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        for case in range(25):
            old_lines = [rng.choice(vocab) for _ in range(rng.randint(0, 30))]
            new_lines = list(old_lines)
            for _ in range(rng.randint(1, 4)):
                op = rng.random()
                at = rng.randint(0, len(new_lines))
                if op < 0.4:
                    new_lines.insert(at, rng.choice(vocab) + f" #{case}")
                elif new_lines and op < 0.7:
                    del new_lines[min(at, len(new_lines) - 1)]
                elif new_lines:
                    new_lines[min(at, len(new_lines) - 1)] = f"changed {case}"
            old = "\n".join(old_lines) + ("\n" if rng.random() < 0.5 and old_lines else "")
            new = "\n".join(new_lines) + ("\n" if rng.random() < 0.5 and new_lines else "")
            text = bt.make_patch("torch/x.py", old, new)
            if old == new:
                self.assertEqual(text, "")
                continue
            self.assertEqual(bt.apply_patch(bt.parse_patch(text, "p"), old, "x"), new, f"case {case}")
            target = work / "torch" / "x.py"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(old.encode())
            (work / "p.patch").write_text(f"diff --git a/torch/x.py b/torch/x.py\n{text}")
            subprocess.run(["git", "apply", "p.patch"], cwd=work, check=True, capture_output=True)
            self.assertEqual(target.read_bytes().decode(), new, f"case {case}")


class RealVenvTest(TestCase):
    """Read-only checks of the venv running the tests (.venv under `make test`)."""

    def setUp(self) -> None:
        super().setUp()
        self.venv = Path(sys.prefix)
        if not (self.venv / bt.STATE_FILE_NAME).is_file():
            self.skipTest(f"{self.venv} is not a venv made by tools/build.py (run `make test`)")
        self.sources = bt.Sources(REPO_ROOT)
        self.target = bt.venv_target(self.venv)

    def test_real_venv_matches_the_build_state(self) -> None:
        record = bt.load_record(self.target.site)
        state = self.target.load_state()
        self.assertEqual(state.stamp, bt.input_stamp(self.sources, record), "run `make build`")
        patches = self.sources.patches()
        self.assertEqual(sorted(state.patched), sorted(patches))
        for rel in patches:
            record.expect(rel, self.target.pristine(rel).read_bytes(), self.target.pristine(rel))
        self.assertEqual(sorted(state.modules), sorted(self.sources.modules()))
        for rel in self.sources.modules():
            self.assertTrue(self.target.installed(rel).is_file(), rel)

    def test_check_refreshed_on_real_venv_is_fast(self) -> None:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(BUILD_SCRIPT), "check-refreshed", "--venv", str(self.venv)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        )
        elapsed = time.monotonic() - started
        # 0: in sync; 3: in-place edits not refreshed yet (a developer's work in progress)
        self.assertIn(proc.returncode, (0, bt.EXIT_NOT_REFRESHED), proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertLess(elapsed, 15.0)


if __name__ == "__main__":
    run_tests()
