# Owner(s): ["oncall: distributed"]
"""Tests for the PR stack (tools/stack.py) and its rebase (tools/rebase.py).

They run on the fake site-packages trees of ``test_build`` (a few-file
``torch``), so the stack logic, git verification, check-stack's overlay runs and
the three-way rebase with stored resolutions all take seconds.
``RealStackTest`` checks the repo's own manifest against the repo as it is now.

Run with ``.venv/bin/python -m pytest tools/test`` or as a script.
"""

from __future__ import annotations

import csv
import hashlib
import base64
import io
import os
import subprocess
import shutil
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING
from unittest import mock

from torch.testing._internal.common_utils import run_tests, TestCase

if TYPE_CHECKING:
    # the modules the imports below give at run time, as the type checker knows them
    import tools.rebase as rebase
    import tools.stack as stack
    from tools.test import test_build as tb
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_build as tb

    stack = tb.bt._load_tool("stack")
    rebase = tb.bt._load_tool("rebase")

bt = tb.bt

PROP, API, NEW_MODULE = tb.PROP, tb.API, tb.NEW_MODULE
TEST_FILE = "test/distributed/tensor/test_strategy_contract.py"
HELPER = "torch/testing/_internal/distributed/_tensor/contract_common.py"
# two hunks far apart, so a manifest can split them
PROP_TWO_HUNKS = tb._replace_line(tb.PROP_EDIT_A, "return x + 25\n", "return x + 25  # contract C\n")


def step_toml(slug: str, files: list[str], run: list[str] | None = None, results: str = "{check_stack}") -> str:
    entries = ", ".join(f'"{f}"' for f in files)
    extra = f"run = [{', '.join(repr(r).replace(chr(39), chr(34)) for r in run)}]\n" if run else ""
    return textwrap.dedent(
        f"""
        [[step]]
        slug = "{slug}"
        title = "[DTensor] step {slug}"
        files = [{entries}]
        {extra}what = "What {slug} does."
        why = "Why {slug}."
        downstream = "What a planner can delete after {slug}."
        test_plan = "How {slug} is tested."
        results = \"\"\"{results}\"\"\"
        """
    )


class StackTestCase(tb.FakeTreeTestCase):
    """A fake repo holding two patches, a new module, a test helper and a test."""

    def setUp(self) -> None:
        super().setUp()
        (self.stock / "torch/testing/_internal/distributed").mkdir(parents=True)
        (self.stock / "torch/testing/_internal/distributed/__init__.py").write_text("")
        (self.stock / "torch/testing/__init__.py").write_text("")
        (self.stock / "torch/testing/_internal/__init__.py").write_text("")
        self.write_patch(PROP, PROP_TWO_HUNKS)
        self.write_patch(API, tb.UPSTREAM[API] + "\n\ndef extra():\n    return 1")
        self.write_module(NEW_MODULE, "CONTRACT = 1\n")
        self.write_module(HELPER, "HELPER = 2\n")
        test = self.repo / TEST_FILE
        test.parent.mkdir(parents=True)
        test.write_text(
            "from torch.distributed.tensor._ops.strategy_contract import CONTRACT\n\n"
            "def test_contract():\n    assert CONTRACT == 1\n"
        )
        self.build()
        self.targets = [self.target, bt.Target(self.stock, self.tmp / "stock")]

    def write_manifest(self, *steps: str) -> Path:
        path = self.repo / "tools" / "stack.toml"
        path.write_text("".join(steps))
        return path

    def default_manifest(self) -> Path:
        return self.write_manifest(
            step_toml("contract", [NEW_MODULE, HELPER, TEST_FILE]),
            step_toml("prop", [PROP], run=[TEST_FILE]),
            step_toml("api", [API]),
        )


class DeriveTest(StackTestCase):
    def test_steps_follow_the_manifest(self) -> None:
        self.default_manifest()
        derived = stack.derive_stack(self.sources, self.targets)
        self.assertEqual([s.file_name for s in derived.steps],
                         ["0001-contract.patch", "0002-prop.patch", "0003-api.patch"])
        first, second, third = derived.steps
        self.assertEqual(first.tests, (TEST_FILE,))
        self.assertEqual(second.tests, (TEST_FILE,))  # `run` re-runs an earlier step's test
        self.assertEqual(third.tests, ())
        self.assertIsNone(first.before[NEW_MODULE])
        self.assertEqual(first.after[PROP], tb.UPSTREAM[PROP].encode())
        self.assertEqual(second.after[PROP], PROP_TWO_HUNKS.encode())
        self.assertEqual(dict(third.after), dict(derived.results))

    def test_unassigned_file_fails_by_name(self) -> None:
        self.default_manifest()
        self.write_module("torch/distributed/tensor/_ops/_late_addition.py", "x = 1\n")
        with self.assertRaisesRegex(bt.BuildError, r"not assigned to any step[\s\S]*_late_addition\.py"):
            stack.derive_stack(self.sources, self.targets)

    def test_stale_or_double_entries_fail(self) -> None:
        self.write_manifest(step_toml("a", [NEW_MODULE, HELPER, TEST_FILE, PROP, API, "torch/gone.py"]))
        with self.assertRaisesRegex(bt.BuildError, r"names torch/gone\.py, which is neither patched"):
            stack.derive_stack(self.sources, self.targets)
        self.write_manifest(step_toml("a", [NEW_MODULE, HELPER, TEST_FILE, PROP, API]), step_toml("b", [API]))
        with self.assertRaisesRegex(bt.BuildError, r"placed by two steps \(a and b\)"):
            stack.derive_stack(self.sources, self.targets)

    def test_exact_path_wins_over_glob(self) -> None:
        self.write_manifest(
            step_toml("code", [NEW_MODULE, HELPER, PROP, API]),
            step_toml("tests", ["test/distributed/tensor/test_*.py"]),
        )
        late = self.repo / "test/distributed/tensor/test_strategy_contract_fuzz.py"
        late.write_text("def test_fuzz():\n    pass\n")
        derived = stack.derive_stack(self.sources, self.targets)
        self.assertEqual(derived.steps[1].changed, (TEST_FILE, late.relative_to(self.repo).as_posix()))
        self.write_manifest(
            step_toml("code", [NEW_MODULE, HELPER, PROP, API, TEST_FILE]),
            step_toml("tests", ["test/distributed/tensor/test_*.py"]),
        )
        derived = stack.derive_stack(self.sources, self.targets)
        self.assertEqual(derived.steps[1].changed, ("test/distributed/tensor/test_strategy_contract_fuzz.py",))

    def test_hunks_split_across_steps(self) -> None:
        self.write_manifest(
            step_toml("first-hunk", [NEW_MODULE, HELPER, TEST_FILE, f"{PROP}#1", API]),
            step_toml("second-hunk", [f"{PROP}#2"]),
        )
        derived = stack.derive_stack(self.sources, self.targets)
        after = derived.steps[0].after[PROP]
        if after is None:
            self.fail(f"step 1 deletes {PROP}")
        middle = after.decode()
        self.assertIn("# contract A", middle)
        self.assertNotIn("# contract C", middle)
        self.assertEqual(derived.steps[1].after[PROP], PROP_TWO_HUNKS.encode())
        self.write_manifest(step_toml("only-one", [NEW_MODULE, HELPER, TEST_FILE, f"{PROP}#1", API]))
        with self.assertRaisesRegex(bt.BuildError, r"cover hunks \[1\] but its patch has hunks 1-2"):
            stack.derive_stack(self.sources, self.targets)

    def test_manifest_errors_are_clear(self) -> None:
        self.write_manifest(step_toml("Bad Slug", [API]))
        with self.assertRaisesRegex(bt.BuildError, r"slug 'Bad Slug'"):
            stack.derive_stack(self.sources, self.targets)
        self.write_manifest(step_toml("a", [API]).replace('what = "What a does."', 'what = "---"'))
        with self.assertRaisesRegex(bt.BuildError, r"would end a patch's message"):
            stack.derive_stack(self.sources, self.targets)
        self.write_manifest(step_toml("a", [NEW_MODULE, HELPER, TEST_FILE, PROP, API], results="{nonsense}"))
        with self.assertRaisesRegex(bt.BuildError, r"unknown placeholder \{nonsense\}"):
            stack.export_stack(self.sources, self.targets, self.tmp / "dist", lambda _: None)


class ExportStackTest(StackTestCase):
    def test_export_writes_a_series_git_applies_and_am_takes(self) -> None:
        self.default_manifest()
        out = self.tmp / "dist"
        code, stdout, err = self.cli("export", "--out", str(out))
        self.assertEqual(code, 0, err)
        self.assertIn("wrote 3 stacked patches", stdout)
        names = (out / "stack" / "series").read_text().split()
        self.assertEqual(names, ["0001-contract.patch", "0002-prop.patch", "0003-api.patch"])
        first = (out / "stack" / names[0]).read_text()
        self.assertIn("Subject: [PATCH 1/3] [DTensor] step contract\n", first)
        for heading in ("## What", "## Why", "## Downstream", "## Test plan", "## Results"):
            self.assertIn(heading, first)
        self.assertIn("Not measured yet: run `make check-stack`.", first)
        # independent check: git am the series onto a pristine repo; the end equals the combined patch
        tree = self.tmp / "pytorch"
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
        subprocess.run(["git", "init", "-q", str(tree)], check=True, env=env)
        for rel in (PROP, API):
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_text(tb.UPSTREAM[rel])
        subprocess.run(["git", "add", "."], cwd=tree, check=True, env=env)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "commit", "-qm", "base"],
                       cwd=tree, check=True, env=env)
        series = [str(out / "stack" / n) for n in names]
        subprocess.run(["git", "am", "-q", "--keep-non-patch", *series], cwd=tree, check=True, env=env)
        log = subprocess.run(["git", "log", "--format=%s"], cwd=tree, check=True, env=env, capture_output=True, text=True)
        self.assertEqual(log.stdout.split("\n")[:3], ["[DTensor] step api", "[DTensor] step prop", "[DTensor] step contract"])
        combined = self.tmp / "combined"
        subprocess.run(["git", "init", "-q", str(combined)], check=True, env=env)
        for rel in (PROP, API):
            (combined / rel).parent.mkdir(parents=True, exist_ok=True)
            (combined / rel).write_text(tb.UPSTREAM[rel])
        subprocess.run(["git", "apply", str(out / bt.EXPORT_PATCH_NAME)], cwd=combined, check=True, env=env)
        for rel in (PROP, API, NEW_MODULE, HELPER, TEST_FILE):
            self.assertEqual((tree / rel).read_bytes(), (combined / rel).read_bytes(), rel)

    def test_verification_catches_a_wrong_step(self) -> None:
        self.default_manifest()
        real = stack.step_diff

        def swapped(step: stack.Step) -> str:  # step 2 claims to start from pristine text that is not there
            text = real(step)
            return text.replace("return x + 7\n", "return x + 70\n", 1) if step.slug == "prop" else text

        with mock.patch.object(stack, "step_diff", swapped):
            with self.assertRaisesRegex(bt.BuildError, r"rejected 0002-prop\.patch"):
                stack.export_stack(self.sources, self.targets, self.tmp / "dist", lambda _: None)

    def test_results_come_from_a_current_measurement_only(self) -> None:
        self.default_manifest()
        derived = stack.derive_stack(self.sources, self.targets)
        step = derived.steps[0]
        report = {"format": stack.STACK_REPORT_FORMAT, "torch": "2.13.0", "steps": {"contract": {
            "digest": step.digest(), "date": "2026-11-30", "tests": [TEST_FILE], "summary": "1 passed", "seconds": 1.5}}}
        self.assertIn("1 passed (1.5 s wall)", stack.check_stack_result(step, report))
        self.write_module(NEW_MODULE, "CONTRACT = 1  # changed\n")
        changed = stack.derive_stack(self.sources, self.targets).steps[0]
        self.assertIn("Not measured for this content", stack.check_stack_result(changed, report))


class CheckStackTest(StackTestCase):
    def test_each_step_runs_on_a_stock_overlay(self) -> None:
        self.default_manifest()
        report = self.repo / "reports" / "stack.json"
        logs: list[str] = []
        runs = stack.check_stack(self.sources, self.targets, self.stock, Path(sys.executable), logs.append,
                                 report_path=report)
        self.assertEqual([(r.slug, r.ok) for r in runs], [("contract", True), ("prop", True), ("api", True)])
        self.assertEqual(runs[0].summary, "1 passed")
        self.assertEqual(runs[2].summary, "import check passed")
        # the stock tree was only read: its DTensor files are untouched
        self.assertEqual((self.stock / PROP).read_text(), tb.UPSTREAM[PROP])
        self.assertFalse((self.stock / NEW_MODULE).exists())
        recorded = stack.load_stack_report(report)
        if recorded is None:
            self.fail(f"no stack report at {report}")
        self.assertEqual(sorted(recorded["steps"]), ["api", "contract", "prop"])
        exported = stack.export_stack(self.sources, self.targets, self.tmp / "dist", lambda _: None)
        self.assertIn("1 passed", exported[0].read_text())

    def test_ci_subset_leaves_the_last_steps_tests_to_make_test(self) -> None:
        self.write_manifest(
            step_toml("code", [NEW_MODULE, HELPER, PROP, API]),
            step_toml("tests", [TEST_FILE]),
        )
        logs: list[str] = []
        runs = stack.check_stack(self.sources, self.targets, self.stock, Path(sys.executable), logs.append,
                                 skip_final_tests=True)
        self.assertEqual([r.slug for r in runs], ["code"])
        self.assertIn("import check passed (its tests are `make test`'s)", logs[-1])

    def test_a_step_that_needs_a_later_one_fails(self) -> None:
        self.write_manifest(
            step_toml("tests-first", [TEST_FILE, HELPER, PROP]),
            step_toml("module-later", [NEW_MODULE, API]),
        )
        logs: list[str] = []
        with self.assertRaisesRegex(bt.BuildError, r"failed on their own: tests-first"):
            stack.check_stack(self.sources, self.targets, self.stock, Path(sys.executable), logs.append)
        self.assertTrue(any("FAIL 1/2 tests-first" in line for line in logs), logs)

    def test_overlay_links_everything_else(self) -> None:
        overlay = self.tmp / "overlay"
        stack.build_overlay(self.stock, overlay)
        self.assertTrue((overlay / "torch/__init__.py").is_symlink())
        self.assertFalse((overlay / "torch/distributed").is_symlink())
        self.assertFalse((overlay / "torch/distributed/tensor").is_symlink())
        self.assertFalse((overlay / PROP).is_symlink())
        self.assertTrue((overlay / "torch/distributed/__init__.py").is_symlink())


class OverlayVenvTest(StackTestCase):
    def test_overlay_venv_imports_its_copies_and_verifies_against_record(self) -> None:
        """A built venv of another release: DTensor from its real copies, the rest
        of torch linked to the stock venv, RECORD readable, the stock tree untouched."""
        stock_venv = self.tmp / "stock-venv"
        stock_site = bt.venv_site_packages(stock_venv)
        stock_site.parent.mkdir(parents=True)
        shutil.copytree(self.stock, stock_site, symlinks=True)
        (stock_site / "torch/testing/_internal/__init__.py").write_text("")
        built = self.tmp / "built-venv"
        site = stack.overlay_venv(stock_venv, built)
        self.assertTrue((site / "torch/__init__.py").is_symlink())
        self.assertFalse((site / PROP).is_symlink())
        self.assertEqual(bt.load_record(site).version, bt.TORCH_VERSION)
        (site / PROP).write_text("# edited in the overlay\n")
        self.assertEqual((stock_site / PROP).read_text(), tb.UPSTREAM[PROP])
        proc = subprocess.run(
            [str(built / "bin" / "python"), "-c", "import torch.distributed.tensor as t; print(t.__file__)"],
            capture_output=True, text=True, cwd=self.tmp, env={**os.environ, "PYTHONPATH": ""},
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(proc.stdout.strip().startswith(str(site)), proc.stdout)


def fake_wheel(path: Path, files: dict[str, str], corrupt: str | None = None) -> Path:
    """A wheel-shaped zip holding ``files`` and a RECORD (``corrupt`` gets a wrong hash)."""
    rows = []
    with zipfile.ZipFile(path, "w") as archive:
        for rel, text in files.items():
            data = text.encode()
            archive.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(b"x" if rel == corrupt else data).digest()).rstrip(b"=")
            rows.append([rel, f"sha256={digest.decode()}", str(len(data))])
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        archive.writestr("torch-9.9.9.dist-info/RECORD", buf.getvalue())
    return path


class RebaseTest(StackTestCase):
    VERSION = "9.9.9"

    def setUp(self) -> None:
        super().setUp()
        self.cache = self.tmp / "wheels"
        self.cache.mkdir()
        tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
        self.wheel = self.cache / f"torch-{self.VERSION}-{tag}-{tag}-linux_x86_64.whl"
        patcher = mock.patch.dict(os.environ, {"DTENSOR_WHEEL_CACHE": str(self.cache)})
        patcher.start()
        self.addCleanup(patcher.stop)
        self.default_manifest()

    def release(self, prop: str, api: str = tb.UPSTREAM[API], corrupt: str | None = None) -> None:
        fake_wheel(self.wheel, {PROP: prop, API: api, "torch/distributed/tensor/__init__.py": "",
                                "torch/distributed/tensor/_ops/__init__.py": "", "torch/other.py": "no"}, corrupt)

    def test_clean_merge_rebases_every_step(self) -> None:
        newer = "# a header line the release added\n" + tb.UPSTREAM[PROP]
        self.release(newer)
        out = self.tmp / "dist"
        code, stdout, err = self.cli("export", "--out", str(out), "--base", self.VERSION)
        self.assertEqual(code, 0, err)
        self.assertEqual((out / f"stack-{self.VERSION}" / "series").read_text().split(),
                         ["0001-contract.patch", "0002-prop.patch", "0003-api.patch"])
        text = (out / f"stack-{self.VERSION}" / "0002-prop.patch").read_text()
        self.assertIn("Rebased onto torch 9.9.9 from the 2.13.0 patches", text)
        self.assertIn(f"`{PROP}`: three-way merge without conflicts.", text)
        extracted = self.cache / f"torch-{self.VERSION}-sources"
        self.assertEqual((extracted / PROP).read_text(), newer)
        self.assertFalse((extracted / "torch/other.py").exists())  # only the DTensor members

    def test_conflict_fails_then_a_recorded_resolution_is_used_and_checked(self) -> None:
        self.release(tb.UPSTREAM[PROP].replace("return x + 7\n", "return x + 7  # upstream moved on\n"))
        missing = r"rebase/9\.9\.9/torch/distributed/tensor/_sharding_prop\.py\.patch is missing"
        with self.assertRaisesRegex(bt.BuildError, r"1 conflict\(s\)[\s\S]*" + missing):
            rebase.export_rebased_stack(self.sources, self.targets, self.VERSION, self.tmp / "out", lambda _: None)
        work = rebase.start_resolution(self.sources, self.targets, self.VERSION, PROP, self.tmp / "work", lambda _: None)
        self.assertIn("<<<<<<<", work.read_text())
        resolved = PROP_TWO_HUNKS.replace("return x + 7  # contract A\n", "return x + 7  # upstream moved on; contract A\n")
        work.write_text(resolved)
        path = rebase.record_resolution(self.sources, self.targets, self.VERSION, PROP, work, "Both comments kept.", lambda _: None)
        self.assertTrue(path.read_text().startswith(f"Resolution of {PROP}"))
        written = rebase.export_rebased_stack(self.sources, self.targets, self.VERSION, self.tmp / "out", lambda _: None)
        self.assertIn("Both comments kept.", written[1].read_text())
        # the change's patch moves on: the stored resolution is now stale and says so
        self.write_patch(PROP, tb.PROP_EDIT_A)
        with self.assertRaisesRegex(bt.BuildError, r"is stale: it was made from a different ours"):
            rebase.export_rebased_stack(self.sources, self.targets, self.VERSION, self.tmp / "out", lambda _: None)

    def test_release_already_holding_the_edit_drops_the_file(self) -> None:
        self.release(tb.UPSTREAM[PROP], api=tb.UPSTREAM[API] + "\n\ndef extra():\n    return 1")
        written = rebase.export_rebased_stack(self.sources, self.targets, self.VERSION, self.tmp / "out", lambda _: None)
        self.assertEqual([p.name for p in written], ["0001-contract.patch", "0002-prop.patch"])

    def test_wheel_members_are_verified(self) -> None:
        self.release(tb.UPSTREAM[PROP], corrupt=PROP)
        with self.assertRaisesRegex(bt.BuildError, r"does not match the wheel's RECORD"):
            rebase.release_sources(self.VERSION, lambda _: None)

    def test_imports_of_the_rebased_code_are_checked(self) -> None:
        tree = {
            "torch/distributed/tensor/_a.py": b"def present():\n    pass\n",
            "torch/distributed/tensor/_b.py": b"from torch.distributed.tensor._a import present, gone\n"
                                              b"def f():\n    from torch.distributed.tensor._c import x\n",
        }
        problems = rebase.unresolved_imports(tree, ["torch/distributed/tensor/_b.py"])
        self.assertEqual(problems, [
            "torch/distributed/tensor/_b.py:1: torch.distributed.tensor._a has no gone",
            "torch/distributed/tensor/_b.py:3: module torch.distributed.tensor._c does not exist",
        ])


class RealStackTest(TestCase):
    """The repo's manifest covers the repo as it is now (read-only)."""

    def test_manifest_covers_the_change(self) -> None:
        root = tb.REPO_ROOT
        venv, stock = root / ".venv", root / ".venv-stock"
        if not (stock / "bin" / "python").exists():
            self.skipTest("no .venv-stock (run `make build`)")
        sources = bt.Sources(root)
        targets = [bt.venv_target(venv), bt.Target(bt.venv_site_packages(stock), stock)]
        derived = stack.derive_stack(sources, targets)
        self.assertGreater(derived.total, 1)
        for step in derived.steps:
            self.assertTrue(step.spec.text["results"].strip())


if __name__ == "__main__":
    run_tests()
