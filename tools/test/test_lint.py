"""Tests of `make lint` and `make format` (tools/lint.py): which lines of a patched
upstream file count as the change's, how linter output is read, what is linted,
which formatter rewrites are the change's, and what `--fix` writes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import lint
from tools.test import fakes

PATCH = textwrap.dedent(
    """\
    --- a/torch/distributed/tensor/x.py
    +++ b/torch/distributed/tensor/x.py
    @@ -1,4 +1,5 @@
     import a
    +import b
     import c
    -import d
    +import e
     x = 1
    @@ -20,2 +21,4 @@
     def f():
    -    return 1
    +    # --- looks like a header, is an added line
    +    return 2
    +    # tail
    \\ No newline at end of file
    """
)


TO_REL = {"/venv/site-packages/torch/x.py": "torch/x.py"}


class AddedLinesTest(unittest.TestCase):
    def test_numbered_in_the_new_file(self) -> None:
        # hunk 1: new lines 1 a, 2 +b, 3 c, 4 +e, 5 x = 1; hunk 2 starts at 21
        self.assertEqual(lint.added_lines(PATCH), {2, 4, 22, 23, 24})

    def test_removed_lines_that_look_like_headers(self) -> None:
        patch = (
            "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n---- removed\n++++ added\n keep\n"
        )
        self.assertEqual(lint.added_lines(patch), {1})

    def test_pure_deletion_adds_nothing(self) -> None:
        patch = "--- a/x.py\n+++ b/x.py\n@@ -3,2 +3,1 @@\n keep\n-gone\n"
        self.assertEqual(lint.added_lines(patch), set())

    def test_keep_added_filters_patched_files_only(self) -> None:
        def at(path: str, line: int) -> lint.Finding:
            return lint.Finding(path, line, 1, "ruff", "F401", "unused")

        upstream = "torch/distributed/tensor/x.py"
        findings = [
            at(upstream, 2),
            at(upstream, 3),
            at(upstream, 23),
            at("tools/a.py", 3),
        ]
        kept, dropped = lint.keep_added(findings, {upstream: lint.added_lines(PATCH)})
        self.assertEqual(kept, [at(upstream, 2), at(upstream, 23), at("tools/a.py", 3)])
        self.assertEqual(dropped, 1)


class ParseTest(unittest.TestCase):
    def test_flake8(self) -> None:
        out = "/venv/site-packages/torch/x.py:7:1: B950 line too long (140 > 120 characters)\nnoise\n"
        self.assertEqual(
            lint.parse_flake8(out, TO_REL),
            [
                lint.Finding(
                    "torch/x.py",
                    7,
                    1,
                    "flake8",
                    "B950",
                    "line too long (140 > 120 characters)",
                )
            ],
        )

    def test_ruff(self) -> None:
        out = json.dumps(
            [
                {
                    "code": "F401",
                    "filename": "tools/a.py",
                    "location": {"row": 3, "column": 8},
                    "message": "`os` unused",
                }
            ]
        )
        self.assertEqual(
            lint.parse_ruff(out, {}),
            [lint.Finding("tools/a.py", 3, 8, "ruff", "F401", "`os` unused")],
        )

    def test_mypy_errors_only(self) -> None:
        out = (
            "/venv/site-packages/torch/x.py:5:3: error: Incompatible return value type  [return-value]\n"
            "/venv/site-packages/torch/x.py:5:3: note: a note\n"
            "tools/a.py: error: Source file found twice  [misc]\n"
        )
        self.assertEqual(
            lint.parse_mypy(out, TO_REL),
            [
                lint.Finding(
                    "torch/x.py",
                    5,
                    3,
                    "mypy",
                    "return-value",
                    "Incompatible return value type",
                ),
                lint.Finding(
                    "tools/a.py", 0, 0, "mypy", "misc", "Source file found twice"
                ),
            ],
        )


class CollectTest(unittest.TestCase):
    def test_what_is_linted(self) -> None:
        tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))
        root, site = tmp / "repo", tmp / "site"
        upstream = "torch/distributed/tensor/x.py"
        files = {
            f"repo/patches/{upstream}.patch": PATCH,
            "repo/torch/distributed/tensor/_new.py": "",
            "repo/torch/testing/_internal/distributed/helper.py": "",
            "repo/test/distributed/tensor/test_new.py": "",
            "repo/tools/tool.py": "",
            f"site/{upstream}": "",
        }
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        targets = lint.collect(root, site)
        self.assertEqual(
            targets.repo_files,
            [
                "test/distributed/tensor/test_new.py",
                "tools/tool.py",
                "torch/distributed/tensor/_new.py",
                "torch/testing/_internal/distributed/helper.py",
            ],
        )
        self.assertEqual(targets.patched, {upstream: site / upstream})
        self.assertEqual(targets.added, {upstream: {2, 4, 22, 23, 24}})
        self.assertEqual(
            targets.mypy_modules,
            [
                "tools.tool",
                "torch.distributed.tensor._new",
                "torch.distributed.tensor.x",
            ],
        )


def spaced(text: str, rel: str) -> str:
    """A stand-in formatter: `name=value` gets spaces around `=`, a file ends in
    one newline, and a lone `# pair` line is marked (its rewrite depends on
    another line, as ruff's does for a call two hunks touch); `(((` is
    unreadable."""
    if "(((" in text:
        raise lint.FormatError(f"{rel}: cannot parse")
    text = re.sub(r"(?m)^(\s*\w+)=(\S)", r"\1 = \2", text)
    if text.count("# pair\n") == 1:
        text = text.replace("# pair\n", "# pair (unmatched)\n")
    return text.rstrip("\n") + "\n" if text.strip() else text


def lines_of(text: str) -> tuple[str, ...]:
    return tuple(text.splitlines(keepends=True))


class RewritesTest(unittest.TestCase):
    def test_line_ranges(self) -> None:
        found = lint.rewrites("a=1\nb = 2\nc=3\n", spaced("a=1\nb = 2\nc=3\n", "x.py"))
        self.assertEqual(
            [(r.start, r.end, r.new) for r in found],
            [(0, 1, ("a = 1\n",)), (2, 3, ("c = 3\n",))],
        )

    def test_upstreams_own_rewrite_is_not_the_changes(self) -> None:
        pristine = "a=1\nb = 2\n"
        patched = "a=1\nb = 2\nc=3\n"
        mine = lint.change_rewrites(
            lint.rewrites(patched, spaced(patched, "x.py")),
            lint.rewrites(pristine, spaced(pristine, "x.py")),
        )
        self.assertEqual([(r.start, r.old) for r in mine], [(2, ("c=3\n",))])

    def test_each_pristine_rewrite_excuses_one(self) -> None:
        pristine = "a=1\n"
        patched = "a=1\nb = 0\na=1\n"
        mine = lint.change_rewrites(
            lint.rewrites(patched, spaced(patched, "x.py")),
            lint.rewrites(pristine, spaced(pristine, "x.py")),
        )
        self.assertEqual(len(mine), 1)

    def test_blank_lines_are_known_by_place(self) -> None:
        # the formatter wants a blank line between statements; upstream lacks
        # one, and the patch adds a statement that lacks one too
        pristine, pristine_done = "x = 1\ny = 2\n", "x = 1\n\ny = 2\n"
        patched, patched_done = "x = 1\ny = 2\nz = 3\n", "x = 1\n\ny = 2\n\nz = 3\n"
        mine = lint.change_rewrites(
            lint.rewrites(patched, patched_done), lint.rewrites(pristine, pristine_done)
        )
        self.assertEqual([(r.start, r.old, r.new) for r in mine], [(2, (), ("\n",))])
        self.assertEqual(lint.apply_rewrites(patched, mine), "x = 1\ny = 2\n\nz = 3\n")

    def test_describe(self) -> None:
        found = lint.rewrites("a\nb\nc\n", "a\nb2\nb3\n")
        self.assertEqual(
            [r.describe() for r in found], ["would rewrite line 2-3 as 2 line(s): b2"]
        )
        found = lint.rewrites("a\nb\n", "a\n\nb\n")
        self.assertEqual(
            [r.describe() for r in found], ["would insert 1 line(s) above"]
        )


def _utils_with(*edits: tuple[int, str]) -> str:
    """fakes.UTILS_TEXT with ``rule_i``'s body replaced, per ``(i, body)``."""
    text = fakes.UTILS_TEXT
    for i, body in edits:
        text = text.replace(f"    return {i}\n", body, 1)
    return text


#: The line of ``rule_i``'s body in fakes.UTILS_TEXT (four lines per rule).
def _body_line(i: int) -> int:
    return 4 * i + 2


TEST_A = "test/distributed/tensor/test_a.py"
TEST_B = "test/distributed/tensor/test_b.py"


class FormatStatesTest(fakes.FakeStockTest):
    def states(
        self, utils: str, new_files: dict[str, str], stack: str | None = None
    ) -> list[lint.FormatState]:
        root = self.tmp / "repo"
        stack = stack or fakes.step_toml("one", [fakes.UTILS, *new_files])
        fakes.write_repo(root, {fakes.UTILS: utils}, new_files, stack)
        return lint.format_states(root, fakes.bt.site_packages(self.stock), spaced)

    def findings(self, states: list[lint.FormatState]) -> list[tuple[str, int, str]]:
        return [(f.path, f.line, f.code) for s in states for f in s.findings()]

    def test_unformatted_added_lines_and_new_files_fail(self) -> None:
        states = self.states(
            _utils_with((3, "    out=3\n    return out\n")),
            {TEST_A: "a=1\nb = 2\n"},
        )
        self.assertEqual(
            self.findings(states),
            [(TEST_A, 1, "format"), (fakes.UTILS, _body_line(3), "format")],
        )
        # the pristine file's trailing blank lines are upstream's, never counted
        self.assertTrue(fakes.UTILS_TEXT.endswith("\n\n\n"))

    def test_formatted_change_passes(self) -> None:
        states = self.states(
            _utils_with((3, "    out = 3\n    return out\n")),
            {TEST_A: "a = 1\nb = 2\n"},
        )
        self.assertEqual(self.findings(states), [])

    def test_unreadable_file(self) -> None:
        states = self.states(_utils_with((3, "    return -3\n")), {TEST_A: "f(((\n"})
        self.assertEqual(self.findings(states), [(TEST_A, 1, "format-error")])

    def test_each_prs_state_of_a_clean_file(self) -> None:
        # rule_2 and rule_12 each get a `# pair` line; apart they are far enough
        # for two hunks, and only the first PR's state has a lone one
        utils = _utils_with(
            (2, "    # pair\n    return 2\n"), (12, "    # pair\n    return 12\n")
        )
        stack = fakes.step_toml("first", [f"{fakes.UTILS}#1", TEST_A])
        stack += "\n" + fakes.step_toml("second", [f"{fakes.UTILS}#2", TEST_B])
        states = self.states(utils, {TEST_A: "", TEST_B: ""}, stack)
        found = [f for s in states for f in s.findings()]
        self.assertEqual([(f.path, f.line) for f in found], [(fakes.UTILS, 10)])
        self.assertIn("as PR 1 `first` leaves the file", found[0].message)


class FixTest(fakes.FakeStockTest):
    def repo(self, utils: str, new_files: dict[str, str]) -> Path:
        stack = fakes.step_toml("one", [fakes.UTILS, *new_files])
        return fakes.write_repo(
            self.tmp / "repo", {fakes.UTILS: utils}, new_files, stack
        )

    def test_fix_writes_new_files_and_patches(self) -> None:
        root = self.repo(
            _utils_with((3, "    out=3\n    return out\n")), {TEST_A: "a=1\n"}
        )
        site = fakes.bt.site_packages(self.stock)
        states = lint.format_states(root, site, spaced)
        done = lint.fix(root, site, None, states)
        self.assertEqual(len(done), 2)
        self.assertEqual((root / TEST_A).read_text(), "a = 1\n")
        patch_path = root / "patches" / f"{fakes.UTILS}.patch"
        patch = fakes.bt.parse_patch(patch_path.read_text(), "patch")
        # the added line is formatted; upstream's trailing blank lines stay
        self.assertEqual(
            fakes.bt.apply_hunks(patch, fakes.UTILS_TEXT),
            _utils_with((3, "    out = 3\n    return out\n")),
        )
        self.assertTrue(
            patch_path.read_text().startswith(
                f"--- a/{fakes.UTILS}\n+++ b/{fakes.UTILS}\n"
            )
        )
        again = lint.format_states(root, site, spaced)
        self.assertEqual([f for s in again for f in s.findings()], [])

    def test_fix_refuses_an_unsaved_edit(self) -> None:
        utils = _utils_with((3, "    out=3\n    return out\n"))
        root = self.repo(utils, {TEST_A: "a=1\n"})
        patch_path = root / "patches" / f"{fakes.UTILS}.patch"
        before = patch_path.read_text()
        installed = self.tmp / "site"
        (installed / fakes.UTILS).parent.mkdir(parents=True)
        (installed / fakes.UTILS).write_text(utils.replace("out=3", "out=4"))
        stock_site = fakes.bt.site_packages(self.stock)
        states = lint.format_states(root, stock_site, spaced)
        with self.assertRaisesRegex(SystemExit, "differ from what their patches make"):
            lint.fix(root, stock_site, installed, states)
        self.assertEqual(patch_path.read_text(), before)
        self.assertEqual((root / TEST_A).read_text(), "a=1\n")


RUFF = REPO_ROOT / ".venv-lint" / "bin" / "ruff"


@unittest.skipUnless(RUFF.is_file(), "needs ruff in .venv-lint (made by `make lint`)")
class RuffSettingsTest(fakes.FakeStockTest):
    """The repo's ruff.toml, through the real pinned ruff."""

    def findings(self, utils: str, new_files: dict[str, str]) -> list[lint.Finding]:
        root = self.tmp / "repo"
        stack = fakes.step_toml("one", [fakes.UTILS, *new_files])
        fakes.write_repo(root, {fakes.UTILS: utils}, new_files, stack)
        fmt = lint.ruff_formatter(str(RUFF), REPO_ROOT)
        states = lint.format_states(root, fakes.bt.site_packages(self.stock), fmt)
        return [f for s in states for f in s.findings()]

    def test_badly_formatted_added_line_fails(self) -> None:
        found = self.findings(_utils_with((3, "    return max( 3,4 )\n")), {TEST_A: ""})
        self.assertEqual(
            [f.render() for f in found],
            [
                f"{fakes.UTILS}:{_body_line(3)}:1: ruff format would rewrite line "
                f"{_body_line(3)} as 1 line(s): return max(3, 4)"
            ],
        )

    def test_formatted_added_line_passes(self) -> None:
        found = self.findings(_utils_with((3, "    return max(3, 4)\n")), {TEST_A: ""})
        self.assertEqual(found, [])

    def test_88_columns(self) -> None:
        def body(width: int) -> str:
            return "    x = f(" + "b" * (width - 14) + ", c)\n    return x\n"

        self.assertEqual(len(body(88).splitlines()[0]), 88)
        ok = self.findings(_utils_with((3, body(88))), {TEST_A: ""})
        self.assertEqual(ok, [])
        found = self.findings(_utils_with((3, body(89))), {TEST_A: ""})
        self.assertEqual([f.line for f in found], [_body_line(3)])

    def test_code_in_docstrings(self) -> None:
        new = 'def double(a: int) -> int:\n    """Twice ``a``.\n\n    >>> double( 1 )\n    2\n    """\n    return 2 * a\n'
        found = self.findings(_utils_with((3, "    return -3\n")), {TEST_A: new})
        self.assertEqual([(f.path, f.line) for f in found], [(TEST_A, 4)])


if __name__ == "__main__":
    unittest.main()
