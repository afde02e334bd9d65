"""Helpers of the tests of tools/build.py (not a test file): a fake stock venv and a fake repo.

The stock venv is a real venv (made without pip, in a fraction of a second)
whose site-packages holds a few-file ``torch`` 2.14.1 with its RECORD, and a
``.pth`` naming the running interpreter's site-packages so pytest imports in
the overlays made from it. The repo holds patches made here with difflib, new
files and a ``tools/stack.toml`` written by each test; ``patches/test/`` edits
an upstream test file the wheel does not ship (``UPSTREAM_TEST``).
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import importlib.util
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tools import build as bt

UTILS = "torch/distributed/tensor/_ops/utils.py"
UTILS_TEXT = "".join(f"def rule_{i}():\n    return {i}\n\n\n" for i in range(20))
UPSTREAM: dict[str, str] = {
    "torch/__init__.py": "",
    "torch/_utils.py": "a = 1\n\x0c\nb = 2\n",
    "torch/distributed/__init__.py": "",
    "torch/distributed/tensor/__init__.py": "",
    "torch/distributed/tensor/_ops/__init__.py": "",
    UTILS: UTILS_TEXT,
    # no newline at the end, as in some upstream files
    "torch/distributed/tensor/_api.py": "class DTensor:\n    pass",
    "torch/testing/__init__.py": "",
    "torch/testing/_internal/__init__.py": "",
    "torch/testing/_internal/distributed/__init__.py": "",
    "torch/testing/_internal/common_methods_invocations.py": "op_db = []\n",
}

#: An upstream test file (not in the wheel) and the version its patch names.
UPSTREAM_TEST = "test/distributed/tensor/test_upstream.py"
UPSTREAM_TEST_TEXT = "".join(f"def test_{i}():\n    assert {i} >= 0\n\n\n" for i in range(12))
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_patch(rel: str, old: str, new: str) -> str:
    return "".join(difflib.unified_diff(bt.split_lines(old), bt.split_lines(new), f"a/{rel}", f"b/{rel}"))


def upstream_test_edit(*tests: int) -> str:
    """UPSTREAM_TEST_TEXT with ``test_<i>`` asserting ``<i> < 100`` for each given ``i``."""
    text = UPSTREAM_TEST_TEXT
    for i in tests:
        text = text.replace(f"    assert {i} >= 0\n", f"    assert {i} < 100\n", 1)
    return text


def write_upstream_test(root: Path, new: str, header: str | None = None) -> Path:
    """``patches/<UPSTREAM_TEST>.patch`` taking UPSTREAM_TEST_TEXT to ``new``, after ``header``
    (default: the line naming ``COMMIT``)."""
    path = root / "patches" / f"{UPSTREAM_TEST}.patch"
    path.parent.mkdir(parents=True, exist_ok=True)
    if header is None:
        header = f"# pytorch/pytorch {UPSTREAM_TEST} at commit {COMMIT}\n"
    path.write_text(header + make_patch(UPSTREAM_TEST, UPSTREAM_TEST_TEXT, new))
    return path


def utils_edit(*rules: int) -> str:
    """UTILS_TEXT with ``rule_<i>`` returning ``-i`` for each given ``i`` (one hunk per rule far apart)."""
    text = UTILS_TEXT
    for i in rules:
        text = text.replace(f"    return {i}\n", f"    return -{i}\n", 1)
    return text


def make_stock(venv: Path) -> Path:
    """The fake stock venv at ``venv``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = bt.site_packages(venv)
    rows = []
    for rel, text in UPSTREAM.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
        rows.append(f"{rel},{record_hash(text.encode())},{len(text.encode())}")
    info = site / "torch-2.14.1+cpu.dist-info"
    info.mkdir()
    (info / "RECORD").write_text("\n".join([*rows, "torch-2.14.1+cpu.dist-info/RECORD,,"]) + "\n")
    spec = importlib.util.find_spec("pytest")
    if spec is None or spec.origin is None:
        raise RuntimeError("pytest is not importable")
    (site / "host.pth").write_text(str(Path(spec.origin).resolve().parents[1]) + "\n")
    return venv


class FakeStockTest(unittest.TestCase):
    """A fake stock venv per class (``self.stock``) and a fresh directory per test (``self.tmp``)."""

    stock: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.stock = make_stock(Path(cls.enterClassContext(tempfile.TemporaryDirectory())) / "stock")

    def setUp(self) -> None:
        self.tmp = Path(self.enterContext(tempfile.TemporaryDirectory()))


def step_toml(slug: str, files: list[str], run: list[str] | None = None, text: str = "Placeholder.") -> str:
    return textwrap.dedent(f"""\
        [[step]]
        slug = "{slug}"
        title = "[DTensor] {slug}"
        files = {files!r}
        run = {run or []!r}
        what = "{text}"
        why = "Because."
        test_plan = "pytest"
        """).replace("'", '"')


def write_repo(root: Path, patches: dict[str, str], new_files: dict[str, str], stack: str) -> Path:
    """A repo at ``root``: ``patches`` maps an upstream path to its patched text."""
    for rel, new in patches.items():
        path = root / "patches" / f"{rel}.patch"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make_patch(rel, UPSTREAM[rel], new))
    for rel, text in new_files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "tools").mkdir(parents=True, exist_ok=True)
    (root / "tools" / "stack.toml").write_text(stack)
    return root


class Log(list[str]):
    """Collects what the tool logs."""

    def __call__(self, message: str) -> None:
        self.append(message)

    @property
    def text(self) -> str:
        return "\n".join(self)
