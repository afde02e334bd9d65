"""`make lint`: ruff, flake8 and mypy on exactly what the change touches.

What is linted, and with which settings (``ruff.toml``, ``.flake8`` and
``mypy.ini`` at the repo root restate the selection PyTorch's own lint
configuration applies to these paths):

- the new modules in ``torch/`` and the tests in ``test/``: whole files, with
  ruff and flake8;
- ``tools/``: whole files, with ruff, flake8 and mypy;
- the upstream files ``patches/`` edits: the patched file as installed in
  ``.venv`` goes through all three tools, and only findings on lines the patch
  adds are kept (the rest of the file is upstream's, judged by upstream);
- mypy checks the new modules and the patched files as installed in ``.venv``,
  so their imports resolve against torch 2.14.1 with the change applied.
  ``torch/testing/_internal/**`` and ``test/**`` get no mypy run: PyTorch's
  MYPY linter leaves both out.

Findings are printed one a line (``path:line:col: TOOL CODE message``, with the
upstream file's repo-relative path for patched files) and grouped by code; the
exit status is 1 when there is any.  The linters come from the lint venv
(``--lint-venv``, made by ``make lint`` from ``requirements/lint.txt``); mypy
runs with ``--python-executable`` of the built venv.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

ROOT = Path(__file__).resolve().parent.parent

#: Repo directories whose Python files belong to the change.
CHANGE_DIRS = ("torch", "test", "tools")
#: Paths (repo-relative, as in pytorch) that PyTorch's mypy linter skips.
MYPY_SKIPPED_PREFIXES = ("torch/testing/_internal/", "test/")

_HUNK_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FLAKE8_RE = re.compile(r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]+[0-9]+) (?P<msg>.*)$")
_MYPY_RE = re.compile(
    r"^(?P<path>[^:]+?):(?:(?P<line>\d+):)?(?:(?P<col>\d+):)? (?P<sev>error|note|warning): (?P<msg>.*?)"
    r"(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One linter message; ``path`` is repo-relative (pytorch layout)."""

    path: str
    line: int
    col: int
    tool: str
    code: str
    message: str

    def render(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.tool} {self.code} {self.message}"


def added_lines(patch_text: str) -> set[int]:
    """Line numbers, in the patched file, of the lines a unified diff adds.

    Hunk bodies are read by the counts in their headers, so a removed or added
    line that looks like a header (``--- x``) is still read as a body line.
    """
    added: set[int] = set()
    old_left = new_left = 0
    new_line = 0
    for raw in patch_text.splitlines():
        if old_left <= 0 and new_left <= 0:
            match = _HUNK_RE.match(raw)
            if match is not None:
                old_left = int(match.group(1) or 1)
                new_line = int(match.group(2))
                new_left = int(match.group(3) or 1)
            continue
        op = raw[:1]
        if op == "+":
            added.add(new_line)
            new_line += 1
            new_left -= 1
        elif op == "-":
            old_left -= 1
        elif op == "\\":
            continue
        else:  # context (an empty line is a context line whose space was stripped)
            new_line += 1
            new_left -= 1
            old_left -= 1
    return added


def keep_added(findings: Iterable[Finding], added: dict[str, set[int]]) -> tuple[list[Finding], int]:
    """Findings on files in ``added`` survive only on added lines; others pass.

    Returns the kept findings and how many were dropped.
    """
    kept: list[Finding] = []
    dropped = 0
    for finding in findings:
        lines = added.get(finding.path)
        if lines is not None and finding.line not in lines:
            dropped += 1
            continue
        kept.append(finding)
    return kept, dropped


def parse_ruff(output: str, to_rel: dict[str, str]) -> list[Finding]:
    """Findings from ``ruff check --output-format json``."""
    findings = []
    for item in json.loads(output or "[]"):
        path = to_rel.get(os.path.realpath(item["filename"]), item["filename"])
        loc = item.get("location") or {}
        findings.append(
            Finding(path, int(loc.get("row", 0)), int(loc.get("column", 0)), "ruff", item.get("code") or "syntax", item["message"])
        )
    return findings


def parse_flake8(output: str, to_rel: dict[str, str]) -> list[Finding]:
    findings = []
    for raw in output.splitlines():
        match = _FLAKE8_RE.match(raw.strip())
        if match is None:
            continue
        path = to_rel.get(os.path.realpath(match["path"]), match["path"])
        findings.append(Finding(path, int(match["line"]), int(match["col"]), "flake8", match["code"], match["msg"]))
    return findings


def parse_mypy(output: str, to_rel: dict[str, str]) -> list[Finding]:
    """Errors from mypy's default output (notes are context, not findings)."""
    findings = []
    for raw in output.splitlines():
        match = _MYPY_RE.match(raw)
        if match is None or match["sev"] != "error":
            continue
        path = to_rel.get(os.path.realpath(match["path"]), match["path"])
        findings.append(
            Finding(path, int(match["line"] or 0), int(match["col"] or 0), "mypy", match["code"] or "error", match["msg"])
        )
    return findings


@dataclasses.dataclass
class Targets:
    """What the change touches, resolved to paths the linters are given."""

    repo_files: list[str]  # repo-relative .py files (new modules, tests, tools)
    patched: dict[str, Path]  # repo-relative upstream path -> installed file
    added: dict[str, set[int]]  # repo-relative upstream path -> added lines
    mypy_modules: list[str]  # dotted names, checked with the built venv
    to_rel: dict[str, str]  # realpath of any linted file -> repo-relative path


def _module_name(rel: str) -> str:
    dotted = rel[: -len(".py")].replace("/", ".")
    return dotted.removesuffix(".__init__")


def collect(root: Path, site: Path) -> Targets:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *CHANGE_DIRS],
        cwd=root, check=True, capture_output=True, text=True,
    ).stdout.split()
    repo_files = sorted({rel for rel in listed if rel.endswith(".py") and (root / rel).is_file()})
    patched: dict[str, Path] = {}
    added: dict[str, set[int]] = {}
    patches = root / "patches"
    for patch in sorted(patches.rglob("*.py.patch")):
        rel = patch.relative_to(patches).as_posix()[: -len(".patch")]
        installed = site / rel
        if not installed.is_file():
            raise SystemExit(f"lint: {installed} (patched by {patch}) is missing; run `make build`")
        patched[rel] = installed
        added[rel] = added_lines(patch.read_text())
    to_rel = {os.path.realpath(root / rel): rel for rel in repo_files}
    to_rel.update({os.path.realpath(path): rel for rel, path in patched.items()})
    mypy_modules = []
    for rel in [*repo_files, *patched]:
        if rel.startswith(MYPY_SKIPPED_PREFIXES):
            continue
        mypy_modules.append(_module_name(rel))
        if rel.startswith("torch/"):
            # new modules are type-checked as installed, like the patched files
            to_rel[os.path.realpath(site / rel)] = rel
    return Targets(repo_files, patched, added, sorted(set(mypy_modules)), to_rel)


def _tool(lint_venv: Path, name: str) -> str:
    path = lint_venv / "bin" / name
    if not path.is_file():
        raise SystemExit(f"lint: {path} is missing; `make lint` installs requirements/lint.txt there")
    return str(path)


def run_linters(root: Path, lint_venv: Path, python: Path, targets: Targets, jobs: int) -> tuple[list[Finding], dict[str, float]]:
    """Run the three tools (mypy and flake8 side by side) and parse their output."""
    files = [*targets.repo_files, *(str(p) for p in targets.patched.values())]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    timings: dict[str, float] = {}
    started = time.monotonic()
    mypy_cmd = [_tool(lint_venv, "mypy"), "--config-file", "mypy.ini", "--python-executable", str(python),
                "--no-error-summary", "--hide-error-context", "--no-pretty", "--no-color-output"]
    for module in targets.mypy_modules:
        mypy_cmd += ["-m", module]
    mypy_proc = subprocess.Popen(mypy_cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    flake8_proc = subprocess.Popen(
        [_tool(lint_venv, "flake8"), "--config", ".flake8", f"--jobs={jobs}",
         "--format=%(path)s:%(row)d:%(col)d: %(code)s %(text)s", *files],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    ruff = subprocess.run(
        [_tool(lint_venv, "ruff"), "check", "--config", "ruff.toml", "--no-cache", "--output-format", "json", *files],
        cwd=root, env=env, capture_output=True, text=True,
    )
    timings["ruff"] = time.monotonic() - started
    if ruff.returncode not in (0, 1):
        raise SystemExit(f"lint: ruff failed ({ruff.returncode}):\n{ruff.stderr}")
    findings = parse_ruff(ruff.stdout, targets.to_rel)
    flake8_out, flake8_err = flake8_proc.communicate()
    timings["flake8"] = time.monotonic() - started
    if flake8_proc.returncode not in (0, 1):
        raise SystemExit(f"lint: flake8 failed ({flake8_proc.returncode}):\n{flake8_err}")
    findings += parse_flake8(flake8_out, targets.to_rel)
    mypy_out, _ = mypy_proc.communicate()
    timings["mypy"] = time.monotonic() - started
    if mypy_proc.returncode not in (0, 1):
        raise SystemExit(f"lint: mypy failed ({mypy_proc.returncode}):\n{mypy_out}")
    findings += parse_mypy(mypy_out, targets.to_rel)
    return findings, timings


def report(findings: Sequence[Finding], dropped: int, timings: dict[str, float], targets: Targets) -> str:
    lines = [finding.render() for finding in sorted(findings)]
    by_code = Counter(f"{f.tool} {f.code}" for f in findings)
    lines.append("")
    for code, count in sorted(by_code.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{count:5d}  {code}")
    took = ", ".join(f"{tool} {seconds:.1f}s" for tool, seconds in timings.items())
    lines.append(
        f"lint: {len(findings)} finding(s) in {len({f.path for f in findings})} file(s); "
        f"{len(targets.repo_files)} repo files, {len(targets.patched)} patched upstream files "
        f"({dropped} finding(s) on their unchanged lines not counted), {len(targets.mypy_modules)} modules "
        f"type-checked; {took}"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the built venv (torch with the change)")
    parser.add_argument("--lint-venv", type=Path, default=ROOT / ".venv-lint", help="venv holding the pinned linters")
    parser.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    args = parser.parse_args(argv)
    python = args.venv / "bin" / "python"
    sites = sorted(args.venv.glob("lib/python3*/site-packages"))
    if len(sites) != 1:
        raise SystemExit(f"lint: {args.venv} is not a built venv; run `make build`")
    targets = collect(ROOT, sites[0])
    raw, timings = run_linters(ROOT, args.lint_venv, python, targets, args.jobs)
    findings, dropped = keep_added(raw, targets.added)
    print(report(findings, dropped, timings, targets))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
