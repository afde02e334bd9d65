"""`make lint` and `make format`: the change's lines, judged as PyTorch judges its own.

What is checked, and with which settings (``ruff.toml``, ``.flake8`` and
``mypy.ini`` at the repo root restate the settings PyTorch's own lint
configuration applies to these paths):

- ``ruff format`` (88 columns, code in docstrings formatted too): the stack's
  new files under ``torch/`` and ``test/`` whole, and the upstream files
  ``patches/`` edits, each as the patch leaves pristine torch and as each PR of
  ``tools/stack.toml`` that edits it leaves it.  A rewrite the formatter would
  also make to the pristine file is upstream's and not counted; every other one
  is the change's (see :func:`change_rewrites`).  ``tools/`` is not exported
  and not held to it;
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

``--fix`` (``make format``) writes the formatter's rewrites of the change's
lines instead: new files in place, and each patch regenerated with ``diff -u``
from pristine torch to the rewritten file.  It refuses while ``.venv`` holds an
edit that its patch does not, so an edit not yet written back is never lost.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tools import build

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

#: Repo directories whose Python files belong to the change.
CHANGE_DIRS = ("torch", "test", "benchmarks", "tools")
#: Paths (repo-relative, as in pytorch) that PyTorch's mypy linter skips.
MYPY_SKIPPED_PREFIXES = ("torch/testing/_internal/", "test/", "benchmarks/")

_HUNK_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_FLAKE8_RE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+):(?P<col>\d+): (?P<code>[A-Z]+[0-9]+) (?P<msg>.*)$"
)
_MYPY_RE = re.compile(
    r"^(?P<path>[^:]+?):(?:(?P<line>\d+):)?(?:(?P<col>\d+):)? "
    r"(?P<sev>error|note|warning): (?P<msg>.*?)"
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


def keep_added(
    findings: Iterable[Finding], added: dict[str, set[int]]
) -> tuple[list[Finding], int]:
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
            Finding(
                path,
                int(loc.get("row", 0)),
                int(loc.get("column", 0)),
                "ruff",
                item.get("code") or "syntax",
                item["message"],
            )
        )
    return findings


def parse_flake8(output: str, to_rel: dict[str, str]) -> list[Finding]:
    findings = []
    for raw in output.splitlines():
        match = _FLAKE8_RE.match(raw.strip())
        if match is None:
            continue
        path = to_rel.get(os.path.realpath(match["path"]), match["path"])
        findings.append(
            Finding(
                path,
                int(match["line"]),
                int(match["col"]),
                "flake8",
                match["code"],
                match["msg"],
            )
        )
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
            Finding(
                path,
                int(match["line"] or 0),
                int(match["col"] or 0),
                "mypy",
                match["code"] or "error",
                match["msg"],
            )
        )
    return findings


# --- ruff format --------------------------------------------------------------

#: ``(text, repo-relative path) -> the text as the formatter writes it``.
Formatter = Callable[[str, str], str]


class FormatError(Exception):
    """The formatter could not read a text (a syntax error, or ruff failing)."""


def ruff_formatter(ruff: str, root: Path) -> Formatter:
    """A :data:`Formatter` running ``ruff format`` with the repo's ``ruff.toml``."""

    def run(text: str, rel: str) -> str:
        proc = subprocess.run(
            [ruff, "format", "--config", str(root / "ruff.toml")]
            + ["--stdin-filename", rel, "-"],
            cwd=root,
            input=text.encode(),
            capture_output=True,
            check=False,
        )
        if proc.returncode != 0:
            message = proc.stderr.decode(errors="replace").strip()
            raise FormatError(message or f"ruff format exited {proc.returncode}")
        return proc.stdout.decode()

    return run


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """The formatter replacing lines ``start:end`` (0-based) of a text by ``new``.

    ``before`` and ``after`` are the lines around the replaced ones (None at
    either end of the text): a rewrite of code is known by the code it
    rewrites, one of blank lines (an insertion among them) also by where it is.
    """

    start: int
    end: int
    old: tuple[str, ...]
    new: tuple[str, ...]
    before: str | None
    after: str | None

    def key(self) -> tuple[object, ...]:
        if any(line.strip() for line in self.old):
            return (self.old, self.new)
        return (self.old, self.new, self.before, self.after)

    def describe(self) -> str:
        """What the formatter does here, with the first line it would write."""
        lines = f"line {self.start + 1}" + (
            f"-{self.end}" if self.end - self.start > 1 else ""
        )
        shown = next((s.strip() for s in self.new if s.strip()), "")
        if len(shown) > 60:
            shown = shown[:57] + "..."
        if not self.old:
            place = "above" if self.after is not None else "at the end"
            what = f"insert {len(self.new)} line(s) {place}"
        elif not self.new:
            what = f"remove {lines}"
        else:
            what = f"rewrite {lines} as {len(self.new)} line(s)"
        return f"would {what}" + (f": {shown}" if shown else "")


def rewrites(text: str, formatted: str) -> list[Rewrite]:
    """The formatter's changes from ``text`` to ``formatted``, as line ranges."""
    old, new = build.split_lines(text), build.split_lines(formatted)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        Rewrite(
            i1,
            i2,
            tuple(old[i1:i2]),
            tuple(new[j1:j2]),
            old[i1 - 1] if i1 > 0 else None,
            old[i2] if i2 < len(old) else None,
        )
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def change_rewrites(patched: list[Rewrite], pristine: list[Rewrite]) -> list[Rewrite]:
    """The rewrites of a patched file that are the change's, not upstream's.

    A rewrite the formatter also makes to the pristine file (the same lines
    rewritten the same way; for blank lines, also between the same lines) is
    upstream's own and is left alone, each pristine rewrite excusing one.
    Every other one is the change's: it rewrites lines the patch adds, or
    upstream lines the patch made the formatter treat differently.
    """
    known = Counter(r.key() for r in pristine)
    mine = []
    for rewrite in patched:
        if known[rewrite.key()] > 0:
            known[rewrite.key()] -= 1
        else:
            mine.append(rewrite)
    return mine


def apply_rewrites(text: str, chosen: Iterable[Rewrite]) -> str:
    lines = build.split_lines(text)
    for rewrite in sorted(chosen, key=lambda r: r.start, reverse=True):
        lines[rewrite.start : rewrite.end] = rewrite.new
    return "".join(lines)


@dataclasses.dataclass(frozen=True)
class FormatState:
    """A file of the stack as the change leaves it, and its formatter rewrites."""

    rel: str
    text: str  # the file as the change (or the PR named by ``at``) leaves it
    pristine: str | None  # upstream's file for a patched one, None for a new one
    rewrites: tuple[Rewrite, ...]  # the change's rewrites (all, for a new file)
    at: str = ""  # "" for the whole stack, else the PR whose state this is
    error: str = ""  # why the formatter could not read the file

    @property
    def fixed(self) -> str:
        return apply_rewrites(self.text, self.rewrites)

    def findings(self) -> list[Finding]:
        where = f" (as {self.at} leaves the file)" if self.at else ""
        if self.error:
            first = self.error.splitlines()[0]
            return [Finding(self.rel, 1, 1, "ruff", "format-error", first + where)]
        count = len(build.split_lines(self.text))
        return [
            Finding(
                self.rel,
                min(r.start + 1, max(count, 1)),
                1,
                "ruff",
                "format",
                r.describe() + where,
            )
            for r in self.rewrites
        ]


class _Judge:
    """Formats texts and tells the change's rewrites from upstream's."""

    def __init__(self, fmt: Formatter) -> None:
        self.fmt = fmt
        self._pristine: dict[str, list[Rewrite]] = {}

    def __call__(
        self, rel: str, pristine: str | None, text: str, at: str = ""
    ) -> FormatState:
        try:
            found = rewrites(text, self.fmt(text, rel))
            if pristine is not None:
                if rel not in self._pristine:
                    self._pristine[rel] = rewrites(pristine, self.fmt(pristine, rel))
                found = change_rewrites(found, self._pristine[rel])
        except FormatError as exc:
            return FormatState(rel, text, pristine, (), at, str(exc) or "unreadable")
        return FormatState(rel, text, pristine, tuple(found), at)


def _adds_lines(patch: build.FilePatch) -> bool:
    """Whether a patch adds or changes any line (removals alone add none)."""
    return any(
        line not in hunk.old_lines for hunk in patch.hunks for line in hunk.new_lines
    )


def format_states(root: Path, stock_site: Path, fmt: Formatter) -> list[FormatState]:
    """The stack's files, formatted: every new ``.py`` file, every patched file
    as the whole patch leaves it, and, for a patched file whose whole patch is
    clean, the file as each PR of ``tools/stack.toml`` that edits it with only
    some of its hunks leaves it (upstream formats each PR, and a rewrite one
    hunk needs may come only with a later one).
    """
    change = build.read_change(root)
    originals = change.originals(stock_site)
    judge = _Judge(fmt)
    states = [
        judge(rel, None, build.decode(data, rel))
        for rel, data in sorted(change.new_files.items())
        if rel.endswith(".py")
    ]
    for rel, patch in sorted(change.patches.items()):
        if not _adds_lines(patch):
            continue  # a patch that only removes lines leaves upstream's formatting
        states.append(
            judge(rel, originals[rel], build.apply_hunks(patch, originals[rel]))
        )
    clean = {s.rel for s in states if not s.rewrites and not s.error}
    steps = build.load_stack(root / "tools" / "stack.toml", change)
    for step in steps:
        hunks, _ = build.state_after(steps, step.number)
        for rel in sorted(step.hunks):
            patch = change.patches[rel]
            if rel not in clean or len(hunks[rel]) == len(patch.hunks):
                continue
            text = build.apply_hunks(patch, originals[rel], hunks[rel])
            states.append(
                judge(rel, originals[rel], text, f"PR {step.number} `{step.slug}`")
            )
    return states


def _context_lines(patch: str) -> int:
    """The context a patch was made with (``diff -U``, 3 at most): the most
    unchanged lines any of its hunks starts with."""
    most, lead = 0, None
    for line in patch.splitlines():
        if line.startswith("@@"):
            lead = 0
        elif lead is not None and line.startswith(" "):
            lead += 1
            most = max(most, lead)
        else:
            lead = None
    return min(most, 3)


def _unified_diff(rel: str, pristine: Path, text: str, context: int = 3) -> str:
    """``diff -U<context>`` from the pristine file to ``text``, labelled as README's
    loop does."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(text)
    try:
        proc = subprocess.run(
            ["diff", f"-U{context}", "--label", f"a/{rel}", "--label", f"b/{rel}"]
            + [str(pristine), handle.name],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        os.unlink(handle.name)
    if proc.returncode != 1:
        raise SystemExit(
            f"lint: diff -u for {rel} exited {proc.returncode}: {proc.stderr}"
        )
    return proc.stdout


def fix(
    root: Path, stock_site: Path, site: Path | None, states: Sequence[FormatState]
) -> list[str]:
    """Write the change's rewrites; returns what it did, one line per file.

    New files are rewritten in place; a patch is regenerated from pristine torch
    to its rewritten file, and read back to check it applies and gives that
    file.  Nothing is written when ``site`` (the built venv's site-packages)
    holds a patched file that differs from what its patch makes, or the
    formatter cannot read a file.
    """
    whole = [s for s in states if not s.at and (s.rewrites or s.error)]
    unreadable = [f"{s.rel}: {s.error}" for s in whole if s.error]
    if unreadable:
        raise SystemExit(
            "lint: the formatter cannot read:\n  " + "\n  ".join(unreadable)
        )
    if site is not None:
        unsaved = [
            str(site / s.rel)
            for s in whole
            if s.pristine is not None
            and (site / s.rel).is_file()
            and (site / s.rel).read_text() != s.text
        ]
        if unsaved:
            raise SystemExit(
                "lint: nothing written: these installed files differ from what their "
                "patches make; write the edit back as a patch (README, Making a change) "
                "or, if patches/ changed since, run `make build`:\n  "
                + "\n  ".join(unsaved)
            )
    done = []
    for state in whole:
        fixed = state.fixed
        if state.pristine is None:
            (root / state.rel).write_text(fixed)
            done.append(f"{state.rel}: {len(state.rewrites)} rewrite(s)")
            continue
        patch_path = root / "patches" / f"{state.rel}.patch"
        old_text = patch_path.read_text()
        before = build.parse_patch(old_text, str(patch_path))
        context = _context_lines(old_text)
        text = _unified_diff(state.rel, stock_site / state.rel, fixed, context)
        after = build.parse_patch(text, str(patch_path))
        if build.apply_hunks(after, state.pristine) != fixed:
            raise SystemExit(
                f"lint: the regenerated {patch_path} does not give the file"
            )
        patch_path.write_text(text)
        note = ""
        if len(after.hunks) != len(before.hunks):
            note = (
                f"; it now has {len(after.hunks)} hunks (was {len(before.hunks)}): "
                "check its hunk numbers in tools/stack.toml"
            )
        done.append(
            f"patches/{state.rel}.patch: {len(state.rewrites)} rewrite(s){note}"
        )
    return done


# --- ruff check, flake8, mypy -------------------------------------------------


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
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--"]
        + list(CHANGE_DIRS),
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    repo_files = sorted(
        {rel for rel in listed if rel.endswith(".py") and (root / rel).is_file()}
    )
    patched: dict[str, Path] = {}
    added: dict[str, set[int]] = {}
    patches = root / "patches"
    # patches/test/ edits upstream test files that are not installed
    for patch in sorted((patches / "torch").rglob("*.py.patch")):
        rel = patch.relative_to(patches).as_posix()[: -len(".patch")]
        installed = site / rel
        if not installed.is_file():
            raise SystemExit(
                f"lint: {installed} (patched by {patch}) is missing; run `make build`"
            )
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
        raise SystemExit(
            f"lint: {path} is missing; `make lint` installs requirements/lint.txt there"
        )
    return str(path)


def run_linters(
    root: Path, lint_venv: Path, python: Path, targets: Targets, jobs: int
) -> tuple[list[Finding], dict[str, float]]:
    """Run the three tools (mypy and flake8 side by side) and parse their output."""
    files = [*targets.repo_files, *(str(p) for p in targets.patched.values())]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    timings: dict[str, float] = {}
    started = time.monotonic()
    mypy_cmd = [
        _tool(lint_venv, "mypy"),
        "--config-file",
        "mypy.ini",
        "--python-executable",
        str(python),
        "--no-error-summary",
        "--hide-error-context",
        "--no-pretty",
        "--no-color-output",
    ]
    for module in targets.mypy_modules:
        mypy_cmd += ["-m", module]
    mypy_proc = subprocess.Popen(
        mypy_cmd,
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    flake8_proc = subprocess.Popen(
        [
            _tool(lint_venv, "flake8"),
            "--config",
            ".flake8",
            f"--jobs={jobs}",
            "--format=%(path)s:%(row)d:%(col)d: %(code)s %(text)s",
            *files,
        ],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ruff = subprocess.run(
        [_tool(lint_venv, "ruff"), "check", "--config", "ruff.toml", "--no-cache"]
        + ["--output-format", "json", *files],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    timings["ruff"] = time.monotonic() - started
    if ruff.returncode not in (0, 1):
        raise SystemExit(f"lint: ruff failed ({ruff.returncode}):\n{ruff.stderr}")
    findings = parse_ruff(ruff.stdout, targets.to_rel)
    flake8_out, flake8_err = flake8_proc.communicate()
    timings["flake8"] = time.monotonic() - started
    if flake8_proc.returncode not in (0, 1):
        raise SystemExit(
            f"lint: flake8 failed ({flake8_proc.returncode}):\n{flake8_err}"
        )
    findings += parse_flake8(flake8_out, targets.to_rel)
    mypy_out, _ = mypy_proc.communicate()
    timings["mypy"] = time.monotonic() - started
    if mypy_proc.returncode not in (0, 1):
        raise SystemExit(f"lint: mypy failed ({mypy_proc.returncode}):\n{mypy_out}")
    findings += parse_mypy(mypy_out, targets.to_rel)
    return findings, timings


def report(
    findings: Sequence[Finding],
    dropped: int,
    timings: dict[str, float],
    targets: Targets,
    formatted: int,
) -> str:
    lines = [finding.render() for finding in sorted(findings)]
    by_code = Counter(f"{f.tool} {f.code}" for f in findings)
    lines.append("")
    for code, count in sorted(by_code.items(), key=lambda item: (-item[1], item[0])):
        lines.append(f"{count:5d}  {code}")
    took = ", ".join(f"{tool} {seconds:.1f}s" for tool, seconds in timings.items())
    lines.append(
        f"lint: {len(findings)} finding(s) in {len({f.path for f in findings})} "
        f"file(s); {len(targets.repo_files)} repo files, {len(targets.patched)} "
        f"patched upstream files ({dropped} finding(s) on their unchanged lines not "
        f"counted), {formatted} file states format-checked, "
        f"{len(targets.mypy_modules)} modules type-checked; {took}"
    )
    return "\n".join(lines)


def _site(venv: Path) -> Path:
    sites = sorted(venv.glob("lib/python3*/site-packages"))
    if len(sites) != 1:
        raise SystemExit(f"lint: {venv} is not a built venv; run `make build`")
    return sites[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--venv",
        type=Path,
        default=ROOT / ".venv",
        help="the built venv (torch with the change)",
    )
    parser.add_argument(
        "--stock-venv",
        type=Path,
        default=ROOT / ".venv-stock",
        help="the stock venv (pristine torch, for the patched files' own lines)",
    )
    parser.add_argument(
        "--lint-venv",
        type=Path,
        default=ROOT / ".venv-lint",
        help="venv holding the pinned linters",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=max(1, min(2, os.cpu_count() or 1)),
        help="flake8 processes (default: up to 2)",
    )
    parser.add_argument(
        "--fix",
        action="store_true",
        help="write `ruff format`'s rewrites of the change's lines into the new "
        "files and patches/ instead of checking (no other linter runs)",
    )
    args = parser.parse_args(argv)
    fmt = ruff_formatter(_tool(args.lint_venv, "ruff"), ROOT)
    stock_site = _site(args.stock_venv)
    started = time.monotonic()
    done: list[str] = []
    try:
        states = format_states(ROOT, stock_site, fmt)
        if args.fix:
            site = _site(args.venv) if args.venv.exists() else None
            done = fix(ROOT, stock_site, site, states)
            for line in done:
                print(f"format: {line}")
            states = format_states(ROOT, stock_site, fmt)
    except build.BuildError as exc:
        raise SystemExit(f"lint: {exc}") from exc
    format_findings = [f for state in states for f in state.findings()]
    if args.fix:
        for finding in sorted(format_findings):
            print(finding.render())
        print(f"format: {len(done)} file(s) rewritten, {len(format_findings)} left")
        if format_findings:
            # what is left is a PR's own state (or a rewrite the formatter
            # undoes on a second pass); its hunks are mended by hand
            print("format: mend those by hand; `make build` puts patches/ in .venv")
        return 1 if format_findings else 0
    format_took = time.monotonic() - started
    targets = collect(ROOT, _site(args.venv))
    raw, timings = run_linters(
        ROOT, args.lint_venv, args.venv / "bin" / "python", targets, args.jobs
    )
    findings, dropped = keep_added(raw, targets.added)
    timings = {"ruff format": format_took, **timings}
    print(report(findings + format_findings, dropped, timings, targets, len(states)))
    return 1 if findings or format_findings else 0


if __name__ == "__main__":
    sys.exit(main())
