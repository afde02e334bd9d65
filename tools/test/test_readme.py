"""Tests that README.md describes the repository as it is: its tables name every
test file, tool and make target that exists and nothing that does not, and its
Results section is what ``make results`` writes from ``reports/``.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def table_cells(readme: str) -> set[str]:
    """The backquoted names in the first column of every table row."""
    cells = set()
    for line in readme.splitlines():
        match = re.match(r"\|\s*`([^`]+)`", line)
        if match:
            cells.add(match.group(1))
    return cells


def present(root: Path) -> set[str]:
    """What the README's tables must name: test files, tools and make targets."""
    tests = {p.relative_to(root).as_posix() for p in (root / "test").rglob("test_*.py")}
    tool_tests = {p.relative_to(root).as_posix() for p in (root / "tools" / "test").glob("*.py")}
    tools = {p.relative_to(root).as_posix() for p in (root / "tools").glob("*.py")}
    packages = {f"{p.relative_to(root).as_posix()}/" for p in (root / "tools").iterdir()
                if (p / "__init__.py").exists()}
    makefile = (root / "Makefile").read_text()
    targets = {f"make {t}" for t in re.findall(r"^([a-z][a-z-]*):", makefile, re.MULTILINE)}
    return tests | tool_tests | tools | packages | targets


def named(readme: str) -> set[str]:
    """The README's table entries of the kinds :func:`present` lists."""
    return {c for c in table_cells(readme)
            if re.fullmatch(r"(test|tools)/.*\.py|tools/[a-z_]+/|make [a-z-]+", c)}


class TestReadme(unittest.TestCase):
    def test_tables_name_what_exists(self) -> None:
        readme = (REPO_ROOT / "README.md").read_text()
        have, said = present(REPO_ROOT), named(readme)
        self.assertEqual(sorted(have - said), [], "exist, but no README table names them")
        self.assertEqual(sorted(said - have), [], "named in a README table, but missing")

    def test_a_new_file_without_a_row_is_found(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            (root / "test").mkdir()
            (root / "tools" / "test").mkdir(parents=True)
            (root / "Makefile").write_text("build:\n\ttrue\n")
            (root / "test" / "test_a.py").write_text("")
            (root / "tools" / "t.py").write_text("")
            readme = "| `make build` | x |\n| `test/test_a.py` | x |\n| `tools/gone.py` | x |\n"
            self.assertEqual(present(root) - named(readme), {"tools/t.py"})
            self.assertEqual(named(readme) - present(root), {"tools/gone.py"})

    def test_results_match_reports(self) -> None:
        if not (REPO_ROOT / ".venv-stock").exists():
            self.skipTest("needs `make build` (the stack's sizes read the stock venv)")
        run = subprocess.run([sys.executable, "tools/results.py", "--check"], cwd=REPO_ROOT,
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stdout + run.stderr)


if __name__ == "__main__":
    unittest.main()
