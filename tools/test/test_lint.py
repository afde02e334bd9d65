"""Tests of `make lint`'s bookkeeping (tools/lint.py): which lines of a patched
upstream file count as the change's, how linter output is read, and what is linted.
"""

from __future__ import annotations

import json
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
        patch = "--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n---- removed\n++++ added\n keep\n"
        self.assertEqual(lint.added_lines(patch), {1})

    def test_pure_deletion_adds_nothing(self) -> None:
        patch = "--- a/x.py\n+++ b/x.py\n@@ -3,2 +3,1 @@\n keep\n-gone\n"
        self.assertEqual(lint.added_lines(patch), set())

    def test_keep_added_filters_patched_files_only(self) -> None:
        def at(path: str, line: int) -> lint.Finding:
            return lint.Finding(path, line, 1, "ruff", "F401", "unused")

        upstream = "torch/distributed/tensor/x.py"
        findings = [at(upstream, 2), at(upstream, 3), at(upstream, 23), at("tools/a.py", 3)]
        kept, dropped = lint.keep_added(findings, {upstream: lint.added_lines(PATCH)})
        self.assertEqual(kept, [at(upstream, 2), at(upstream, 23), at("tools/a.py", 3)])
        self.assertEqual(dropped, 1)


class ParseTest(unittest.TestCase):
    def test_flake8(self) -> None:
        out = "/venv/site-packages/torch/x.py:7:1: B950 line too long (140 > 120 characters)\nnoise\n"
        self.assertEqual(lint.parse_flake8(out, TO_REL), [
            lint.Finding("torch/x.py", 7, 1, "flake8", "B950", "line too long (140 > 120 characters)")
        ])

    def test_ruff(self) -> None:
        out = json.dumps(
            [{"code": "F401", "filename": "tools/a.py", "location": {"row": 3, "column": 8}, "message": "`os` unused"}]
        )
        self.assertEqual(lint.parse_ruff(out, {}), [lint.Finding("tools/a.py", 3, 8, "ruff", "F401", "`os` unused")])

    def test_mypy_errors_only(self) -> None:
        out = (
            "/venv/site-packages/torch/x.py:5:3: error: Incompatible return value type  [return-value]\n"
            "/venv/site-packages/torch/x.py:5:3: note: a note\n"
            "tools/a.py: error: Source file found twice  [misc]\n"
        )
        self.assertEqual(lint.parse_mypy(out, TO_REL), [
            lint.Finding("torch/x.py", 5, 3, "mypy", "return-value", "Incompatible return value type"),
            lint.Finding("tools/a.py", 0, 0, "mypy", "misc", "Source file found twice"),
        ])


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
        self.assertEqual(targets.repo_files, [
            "test/distributed/tensor/test_new.py",
            "tools/tool.py",
            "torch/distributed/tensor/_new.py",
            "torch/testing/_internal/distributed/helper.py",
        ])
        self.assertEqual(targets.patched, {upstream: site / upstream})
        self.assertEqual(targets.added, {upstream: {2, 4, 22, 23, 24}})
        self.assertEqual(targets.mypy_modules, ["tools.tool", "torch.distributed.tensor._new", "torch.distributed.tensor.x"])


if __name__ == "__main__":
    unittest.main()
