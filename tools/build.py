#!/usr/bin/env python3
"""Build, export and step-check the out-of-tree DTensor change on torch 2.14.1.

The repository holds the change as

* ``patches/torch/**.py.patch``: one unified diff per edited upstream file
  (``--- a/torch/...`` / ``+++ b/torch/...``) against pristine torch 2.14.1;
* ``patches/test/**.py.patch``: one unified diff per edited upstream test file,
  which the wheel does not ship, against the pytorch/pytorch version its first
  line names (``# pytorch/pytorch test/... at commit <sha>``); exported, never
  applied here (:func:`check_upstream_tests` checks them against a copy);
* ``torch/**``: new upstream modules; ``test/**``: new upstream tests;
* ``tools/stack.toml``: the PR stack, which step each file or hunk belongs to.

Commands (``make`` calls them; see the Makefile):

``build``
    ``.venv-stock``: a venv with ``requirements/test.txt`` installed by pip,
    recreated only when its stamp (interpreter, pins, pip arguments) changes.
    ``.venv``: an overlay of it, a venv whose ``torch`` is the stock one but
    for real copies of the directories in :data:`OVERLAY_DIRS`; the patches are
    applied there and the new modules added. Every upstream file a patch
    touches is read from the stock venv and checked against the wheel's RECORD
    first. The overlay is rebuilt when its stamp (stock stamp, this script,
    patches, modules) changes; edits belong in patches/ and torch/, since a
    rebuild replaces ``.venv`` whole.
``export``
    ``dist/stack/NNNN-<slug>.patch`` and ``.md`` per step, ``dist/stack.md``;
    prints a size table and fails on any of the stack rules (:func:`rule_violations`).
``check-stack``
    For each step k, a fresh overlay holding steps 1..k only; runs pytest on the
    test files of step k. Writes ``.build/check-stack.log``.
``check-upstream-tests --dir DIR``
    ``git apply --check`` of each ``patches/test/`` patch on its upstream file
    in DIR (a pytorch checkout, or a folder holding the files by name).

Errors are :class:`BuildError`; the command line prints them and exits 1.
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import difflib
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH_VERSION = "2.14.1"
#: Directories and single files of the stock torch an overlay holds as real copies;
#: everything the change patches or adds under torch/ must be or lie in one of them.
OVERLAY_DIRS: tuple[str, ...] = ("torch/distributed/tensor", "torch/testing/_internal/distributed")
OVERLAY_FILES: tuple[str, ...] = ("torch/testing/_internal/common_methods_invocations.py",)
STAMP_NAME = ".build-stamp"
OVERLAY_PTH = "_stock_site.pth"

MAX_STEPS = 14
#: Where the repo keeps the files the change adds, as in a pytorch checkout.
NEW_FILE_DIRS = ("torch", "test", "benchmarks")
MAX_STEP_LINES = 400
MAX_PRODUCT_LINES = 800
MAX_FIRST_STEP_PRODUCT_LINES = 150
MAX_TEST_LINES = 2000
#: What a PR text may not contain (matched case-insensitively), with the reason shown.
BANNED_TEXT: tuple[tuple[str, str], ...] = (
    (r"rebase", "mentions a rebase"),
    (r"2\.13", "mentions release 2.13"),
    (r"/work|/root|/tmp|/home|\.venv", "holds a local path"),
    (r"\b\d{4}-\d{2}-\d{2}\b", "holds a date"),
)

STEP_KEYS = {"slug", "title", "files", "run", "what", "why", "test_plan", "closes"}
REQUIRED_TEXT = ("what", "why", "test_plan")
_SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_UPSTREAM_RE = re.compile(r"# pytorch/pytorch (\S+) at commit ([0-9a-f]{40})")
_SUMMARY_RE = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)\b")

Log = Callable[[str], None]


class BuildError(Exception):
    """A problem to fix in the repo or the venvs; the message says what and where."""


# --- Files and RECORD --------------------------------------------------------


def split_lines(text: str) -> list[str]:
    """Lines split on '\\n' only, each keeping it (form feeds stay inside lines)."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def decode(data: bytes, where: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{where}: not UTF-8 text ({exc})") from exc


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(f"{len(data)}\0".encode() + data)
    return h.hexdigest()


def walk(base: Path) -> list[Path]:
    """Files under ``base``, sorted, without bytecode or hidden entries."""
    if not base.is_dir():
        return []
    return sorted(
        p for p in base.rglob("*")
        if p.is_file() and p.suffix != ".pyc" and not any(s.startswith(".") or s == "__pycache__"
                                                          for s in p.relative_to(base).parts)
    )


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if len(found) != 1:
        raise BuildError(f"{venv} has no single lib/python3*/site-packages; run `make build`")
    return found[0]


@dataclasses.dataclass(frozen=True)
class Record:
    """The installed torch wheel's RECORD: sha256 (urlsafe base64) per file."""

    path: Path
    hashes: dict[str, str]

    def verified(self, site: Path, rel: str) -> bytes:
        """The stock ``rel``, raising unless it is byte for byte the wheel's."""
        want = self.hashes.get(rel)
        if want is None:
            raise BuildError(f"{rel} is not a file of torch {TORCH_VERSION} (not listed in {self.path})")
        data = (site / rel).read_bytes() if (site / rel).is_file() else b""
        got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if got != want:
            raise BuildError(
                f"{site / rel} is not pristine: its sha256 {got} differs from {want} in {self.path}; "
                "recreate the stock venv (`make clean build`)"
            )
        return data


def load_record(site: Path) -> Record:
    infos = sorted(site.glob("torch-*.dist-info"))
    if len(infos) != 1:
        raise BuildError(f"{site} holds {len(infos)} torch-*.dist-info directories, expected one; run `make build`")
    version = infos[0].name[len("torch-"):-len(".dist-info")].split("+")[0]
    if version != TORCH_VERSION:
        raise BuildError(f"{site} holds torch {version}; this change is built on torch {TORCH_VERSION}")
    path = infos[0] / "RECORD"
    hashes: dict[str, str] = {}
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if len(row) > 1 and row[1].startswith("sha256="):
                hashes[row[0]] = row[1][len("sha256="):]
    return Record(path, hashes)


# --- Patches: a strict parser and applier ------------------------------------


@dataclasses.dataclass(frozen=True)
class Hunk:
    index: int  # 1-based, as stack.toml counts
    header: str
    old_start: int
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class FilePatch:
    source: str  # the patch file, for messages
    path: str  # the upstream file, torch/...
    hunks: tuple[Hunk, ...]


def parse_patch(text: str, source: str) -> FilePatch:
    """Parse a one-file unified diff; hunk bodies must match their headers' counts."""
    lines = split_lines(text if text.endswith("\n") else text + "\n")
    i = next((n for n, line in enumerate(lines) if line.startswith("--- ")), None)
    if i is None or i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise BuildError(f"{source}: no `--- a/<path>` / `+++ b/<path>` header")
    old = lines[i][4:].rstrip("\n").split("\t")[0]
    new = lines[i + 1][4:].rstrip("\n").split("\t")[0]
    if not old.startswith("a/") or new != "b/" + old[2:]:
        raise BuildError(f"{source}:{i + 1}: headers must be `--- a/<path>` and `+++ b/<same path>`")
    i += 2
    hunks: list[Hunk] = []
    while i < len(lines):
        header = lines[i].rstrip("\n")
        match = _HUNK_RE.match(header)
        if match is None:
            raise BuildError(f"{source}:{i + 1}: expected a `@@ -l,n +l,n @@` hunk header, found {header!r}")
        index = len(hunks) + 1
        old_start = int(match[1])
        old_left = int(match[2]) if match[2] is not None else 1
        new_left = int(match[4]) if match[4] is not None else 1
        body: list[tuple[str, str]] = []
        i += 1
        while old_left > 0 or new_left > 0 or (i < len(lines) and lines[i].startswith("\\")):
            if i >= len(lines):
                raise BuildError(f"{source}: hunk #{index} ({header}) ends before the line counts of its header")
            op, rest = lines[i][:1], lines[i][1:]
            if op == "\\":
                if not body:
                    raise BuildError(f"{source}:{i + 1}: `\\ No newline` marker without a line before it")
                body[-1] = (body[-1][0], body[-1][1].rstrip("\n"))
            elif op in " -+" and op:
                body.append((op, rest))
                old_left -= op != "+"
                new_left -= op != "-"
                if old_left < 0 or new_left < 0:
                    break
            else:
                raise BuildError(f"{source}:{i + 1}: hunk #{index} ({header}): line {lines[i].rstrip()!r} is not "
                                 "' ', '-', '+' or '\\'; are the header's line counts right?")
            i += 1
        if old_left or new_left:
            raise BuildError(f"{source}: hunk #{index} ({header}): body and header line counts differ")
        old_lines = tuple(t for op, t in body if op != "+")
        first = old_start - 1 if old_lines else old_start
        if hunks and first < hunks[-1].old_start - 1 + len(hunks[-1].old_lines):
            raise BuildError(f"{source}: hunk #{index} ({header}) overlaps or precedes hunk #{index - 1}")
        hunks.append(Hunk(index, header, old_start, old_lines, tuple(t for op, t in body if op != "-")))
    if not hunks:
        raise BuildError(f"{source}: the patch holds no hunk")
    return FilePatch(source, old[2:], tuple(hunks))


@dataclasses.dataclass(frozen=True)
class UpstreamTest:
    """An edit to an upstream test file, which the wheel does not ship."""

    patch: FilePatch
    commit: str  # the pytorch/pytorch commit whose file the patch applies to
    hunks: str  # the patch's text from its first ``@@`` line on

    def git_diff(self, only: Iterable[int] | None = None, applied: Iterable[int] = ()) -> str:
        """The patch as a ``git apply``-able entry of a PR: all its hunks, or those ``only``, numbered for
        the file as the hunks ``applied`` by earlier PRs leave it."""
        rel = self.patch.path
        body = self.hunks
        if only is not None:
            texts = re.split(r"(?m)^(?=@@ )", self.hunks)[1:]  # one per hunk, in order
            chosen, done, out = set(only), set(applied), []
            old_shift = new_shift = 0
            for hunk, text in zip(self.patch.hunks, texts, strict=True):
                delta = len(hunk.new_lines) - len(hunk.old_lines)
                if hunk.index in chosen:
                    start = hunk.old_start + old_shift
                    out.append(f"@@ -{start},{len(hunk.old_lines)} +{start + new_shift},{len(hunk.new_lines)} @@"
                               + text[text.index(" @@", 2) + 3:])
                    new_shift += delta
                elif hunk.index in done:
                    old_shift += delta
            body = "".join(out)
        return f"diff --git a/{rel} b/{rel}\n--- a/{rel}\n+++ b/{rel}\n{body}"


def parse_upstream_test(text: str, source: str) -> UpstreamTest:
    """Parse a ``patches/test/`` patch: a line naming the upstream version, then a one-file diff.

    ``git apply`` skips that first line, so the patch file applies as it is.
    """
    lines = split_lines(text if text.endswith("\n") else text + "\n")
    match = _UPSTREAM_RE.fullmatch(lines[0].rstrip("\n"))
    if match is None or len(lines) < 2 or not lines[1].startswith("--- "):
        raise BuildError(f"{source}: the first line must name the upstream version, `# pytorch/pytorch <path> "
                         "at commit <40 hex digits>`, and the `--- a/<path>` header follow it")
    patch = parse_patch(text, source)
    if match[1] != patch.path:
        raise BuildError(f"{source}: its first line names {match[1]}, its headers {patch.path}")
    return UpstreamTest(patch, match[2], "".join(lines[3:]))


def apply_hunks(patch: FilePatch, original: str, only: Iterable[int] | None = None) -> str:
    """``original`` with the hunks ``only`` (default: all) of ``patch`` applied.

    Hunks are applied at exactly the line their header states in the pristine
    file, with no offset and no fuzz; a mismatch names the patch, file and hunk.
    """
    wanted = set(only) if only is not None else {h.index for h in patch.hunks}
    src = split_lines(original)
    out: list[str] = []
    pos = 0
    for hunk in patch.hunks:
        if hunk.index not in wanted:
            continue
        at = hunk.old_start - 1 if hunk.old_lines else hunk.old_start
        found = src[at:at + len(hunk.old_lines)]
        if at < pos or list(hunk.old_lines) != found:
            bad = next((n for n, (a, b) in enumerate(zip(hunk.old_lines, found)) if a != b), len(found))
            what = (f"line {at + bad + 1} is {found[bad]!r}, the hunk expects {hunk.old_lines[bad]!r}"
                    if bad < len(found) else f"the file ends at line {len(src)}")
            raise BuildError(f"{patch.source}: hunk #{hunk.index} ({hunk.header}) does not apply to {patch.path} "
                             f"of torch {TORCH_VERSION}: {what}")
        out += src[pos:at] + list(hunk.new_lines)
        pos = at + len(hunk.old_lines)
    return "".join(out + src[pos:])


# --- The repo's change -------------------------------------------------------


def is_test_file(rel: str) -> bool:
    return rel.startswith("test/") and Path(rel).name.startswith("test_") and rel.endswith(".py")


def is_test_side(rel: str) -> bool:
    """Counted as test lines (the rest of the change is product lines)."""
    return rel.startswith(("test/", "torch/testing/"))


@dataclasses.dataclass(frozen=True)
class Change:
    """Everything the repo changes: parsed patches, new files (path -> bytes), upstream test edits."""

    patches: dict[str, FilePatch]
    new_files: dict[str, bytes]
    upstream_tests: dict[str, UpstreamTest] = dataclasses.field(default_factory=dict)

    def originals(self, site: Path) -> dict[str, str]:
        """The pristine text of every patched file, verified against RECORD (new files must not be in it)."""
        record = load_record(site)
        clashes = [rel for rel in self.new_files if rel in record.hashes]
        if clashes:
            raise BuildError(f"new files {', '.join(clashes)} are files of torch {TORCH_VERSION}: change them "
                             "through patches/ instead")
        return {rel: decode(record.verified(site, rel), rel) for rel in sorted(self.patches)}

    def files(self, originals: Mapping[str, str], hunks: Mapping[str, Iterable[int]],
              new: Iterable[str]) -> dict[str, bytes]:
        """Contents of the patched files with ``hunks`` applied, and of the ``new`` files."""
        out = {rel: apply_hunks(self.patches[rel], originals[rel], sel).encode() for rel, sel in hunks.items()}
        out.update({rel: self.new_files[rel] for rel in new})
        return out

    def all_files(self, originals: Mapping[str, str]) -> dict[str, bytes]:
        return self.files(originals, {rel: [h.index for h in p.hunks] for rel, p in self.patches.items()},
                          self.new_files)


def read_change(root: Path) -> Change:
    patches: dict[str, FilePatch] = {}
    upstream_tests: dict[str, UpstreamTest] = {}
    for path in walk(root / "patches"):
        rel = path.relative_to(root / "patches").as_posix()
        text = decode(path.read_bytes(), str(path))
        if rel.startswith("torch/") and rel.endswith(".patch"):
            patch = parse_patch(text, f"patches/{rel}")
            patches[patch.path] = patch
        elif rel.endswith(".patch") and is_test_file(rel[:-len(".patch")]):
            upstream = parse_upstream_test(text, f"patches/{rel}")
            patch = upstream.patch
            upstream_tests[patch.path] = upstream
        else:
            raise BuildError(f"{path}: patches/ holds only torch/<upstream path>.patch and "
                             "test/<upstream test path>.patch files")
        if patch.path != rel[:-len(".patch")]:
            raise BuildError(f"{path}: its headers name {patch.path}, its location {rel[:-len('.patch')]}")
    new_files = {p.relative_to(root).as_posix(): p.read_bytes() for d in NEW_FILE_DIRS for p in walk(root / d)}
    both = sorted((set(patches) | set(upstream_tests)) & set(new_files))
    if both:
        raise BuildError(f"both patched and added as new files: {', '.join(both)}")
    return Change(patches, new_files, upstream_tests)


# --- The stack (tools/stack.toml) --------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    number: int
    slug: str
    title: str
    text: dict[str, str]  # what, why, test_plan, closes
    hunks: dict[str, frozenset[int]]  # patched file -> the hunks this step applies
    new: tuple[str, ...]  # new files this step adds
    run: tuple[str, ...]  # earlier test files to run at this step (stack.toml's `run`)
    tests: tuple[str, ...] = ()  # the test files check-stack runs at this step
    upstream_tests: tuple[str, ...] = ()  # upstream test files this step edits (exported only)
    upstream_hunks: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)  # their hunks

    @property
    def name(self) -> str:
        return f"{self.number:04d}-{self.slug}"


def _hunk_set(spec: str, where: str) -> frozenset[int]:
    found: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if not low.isdigit() or not (high or low).isdigit() or not 1 <= int(low) <= int(high or low):
            raise BuildError(f"{where}: bad hunk range {part!r} (hunks count from 1: `3`, `1-2`)")
        found.update(range(int(low), int(high or low) + 1))
    return frozenset(found)


def load_stack(path: Path, change: Change) -> list[Step]:
    """Parse ``stack.toml`` and check that it places every hunk, new file and upstream test edit exactly once."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise BuildError(f"{path}: {exc}") from exc
    entries = raw.get("step")
    if not isinstance(entries, list) or not entries:
        raise BuildError(f"{path}: no [[step]] tables")
    owner: dict[tuple[str, int], str] = {}  # (file, hunk or 0 for a new file) -> slug
    problems: list[str] = []
    steps: list[Step] = []
    for number, entry in enumerate(entries, 1):
        slug = entry.get("slug")
        where = f"{path.name}: step {number} ({slug})"
        if not isinstance(slug, str) or not _SLUG_RE.match(slug) or any(s.slug == slug for s in steps):
            raise BuildError(f"{where}: slug must be unique, lower-case letters, digits and dashes")
        if set(entry) - STEP_KEYS:
            raise BuildError(f"{where}: unknown key(s) {', '.join(sorted(set(entry) - STEP_KEYS))}")
        title = entry.get("title")
        if not isinstance(title, str) or not title.strip() or "\n" in title.strip():
            raise BuildError(f"{where}: title must be one non-empty line")
        text = {key: entry.get(key, "") for key in ("what", "why", "test_plan", "closes")}
        if any(not isinstance(v, str) for v in text.values()) or not all(text[k].strip() for k in REQUIRED_TEXT):
            raise BuildError(f"{where}: `what`, `why` and `test_plan` must be non-empty strings (`closes` optional)")
        files, run = entry.get("files"), entry.get("run", [])
        for key, value in (("files", files), ("run", run)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise BuildError(f"{where}: `{key}` must be a list of strings")
        if not files:
            raise BuildError(f"{where}: `files` is empty")
        hunks: dict[str, set[int]] = {}
        new: list[str] = []
        upstream: list[str] = []
        upstream_hunks: dict[str, frozenset[int]] = {}
        for item in files:
            rel, _, spec = item.partition("#")
            patched = {**{r: u.patch for r, u in change.upstream_tests.items()}, **change.patches}
            if rel in patched:
                count = len(patched[rel].hunks)
                chosen = _hunk_set(spec, f"{where}: {item}") if spec else frozenset(range(1, count + 1))
                if max(chosen) > count:
                    problems.append(f"{where}: {item}: patches/{rel}.patch has {count} hunk(s)")
                for h in sorted(chosen):
                    if (rel, h) in owner:
                        problems.append(f"{where}: hunk #{h} of {rel} is already in step {owner[rel, h]}")
                    owner[rel, h] = slug
                if rel in change.patches:
                    hunks.setdefault(rel, set()).update(chosen)
                else:
                    upstream.append(rel)
                    upstream_hunks[rel] = chosen
            elif rel in change.new_files and not spec:
                if (rel, 0) in owner:
                    problems.append(f"{where}: {rel} is already in step {owner[rel, 0]}")
                owner[rel, 0] = slug
                new.append(rel)
            else:
                problems.append(f"{where}: {item} is neither patched (patches/{rel}.patch) nor a new file "
                                "under torch/, test/ or benchmarks/ (hunks are chosen only from patches/)")
        steps.append(Step(number, slug, title.strip(), {k: v.strip() for k, v in text.items()},
                          {r: frozenset(h) for r, h in hunks.items()}, tuple(new), tuple(run),
                          upstream_tests=tuple(upstream), upstream_hunks=upstream_hunks))
    patches = {**{r: u.patch for r, u in change.upstream_tests.items()}, **change.patches}
    for rel, patch in sorted(patches.items()):
        missing = [h.index for h in patch.hunks if (rel, h.index) not in owner]
        if missing:
            problems.append(f"hunk(s) {', '.join(f'#{h}' for h in missing)} of {rel} are in no step")
    problems += [f"{rel} is in no step" for rel in sorted(change.new_files) if (rel, 0) not in owner]
    if problems:
        raise BuildError(f"{path} does not place the change exactly once:\n  " + "\n  ".join(problems))
    return _assign_tests(path, steps)


def _assign_tests(path: Path, steps: list[Step]) -> list[Step]:
    """Each test file runs once: at the step whose `run` names it, else at the step adding it."""
    added_at = {rel: s.number for s in steps for rel in s.new if is_test_file(rel)}
    moved: dict[str, int] = {}
    for step in steps:
        for rel in step.run:
            where = f"{path.name}: step {step.number} ({step.slug}): run entry {rel}"
            if rel not in added_at:
                raise BuildError(f"{where} is not a test file (test/**/test_*.py) of the change")
            if added_at[rel] > step.number:
                raise BuildError(f"{where} is only added by step {added_at[rel]}")
            if rel in moved and moved[rel] != step.number:
                raise BuildError(f"{where} is already run by step {moved[rel]}; each test file runs once")
            moved[rel] = step.number
    out: list[Step] = []
    for step in steps:
        tests = sorted(rel for rel, n in added_at.items() if moved.get(rel, n) == step.number)
        if not tests:
            raise BuildError(f"{path.name}: step {step.number} ({step.slug}) has no test file to run: add a "
                             "test/**/test_*.py file to its `files`, or name an earlier one in its `run`")
        out.append(dataclasses.replace(step, tests=tuple(tests)))
    return out


def state_after(steps: Sequence[Step], k: int) -> tuple[dict[str, set[int]], list[str]]:
    """The hunks per patched file and the new files of steps 1..k."""
    hunks: dict[str, set[int]] = {}
    new: list[str] = []
    for step in steps[:k]:
        for rel, chosen in step.hunks.items():
            hunks.setdefault(rel, set()).update(chosen)
        new += step.new
    return hunks, new


# --- Venvs -------------------------------------------------------------------


def read_stamp(venv: Path) -> str | None:
    path = venv / STAMP_NAME
    return path.read_text().strip() if path.is_file() and (venv / "bin" / "python").exists() else None


def ensure_stock(root: Path, stock: Path, pip_args: Sequence[str], log: Log) -> str:
    """(Re)create the stock venv with pip unless its stamp matches; returns the stamp."""
    requirements = root / "requirements" / "test.txt"
    stamp = digest(sys.version, requirements.read_bytes(), "\0".join(pip_args))
    if read_stamp(stock) == stamp:
        return stamp
    if stock.exists():
        log(f"build: {stock.name} is out of date, recreating it")
        shutil.rmtree(stock)
    subprocess.run([sys.executable, "-m", "venv", str(stock)], check=True)
    pip_log = stock / ".pip.log"
    log(f"build: pip install -r requirements/test.txt into {stock.name} (log: {pip_log})")
    with pip_log.open("wb") as out:
        proc = subprocess.run([str(stock / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                               "-r", str(requirements), *pip_args], stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = pip_log.read_text(errors="replace").splitlines()[-20:]
        raise BuildError(f"pip install into {stock} failed ({proc.returncode}):\n  " + "\n  ".join(tail))
    load_record(site_packages(stock))
    (stock / STAMP_NAME).write_text(stamp + "\n")
    return stamp


def make_overlay(stock: Path, venv: Path, files: Mapping[str, bytes]) -> Path:
    """A new venv at ``venv`` seeing the stock torch but for real copies of :data:`OVERLAY_DIRS` and
    :data:`OVERLAY_FILES`.

    Directories on the way down to a copy are real, their other entries
    symlinks into the stock install; torch's dist-info is linked (its RECORD
    stays readable) and a ``.pth`` puts the stock site-packages after the
    overlay's. Then ``files`` (``torch/...``) are written into the copies.
    Nothing is ever written to the stock venv.
    """
    stock_site = site_packages(stock)
    record = load_record(stock_site)
    outside = [rel for rel in files
               if rel not in OVERLAY_FILES and not any(rel.startswith(d + "/") for d in OVERLAY_DIRS)]
    if outside:
        raise BuildError(f"only files under {' and '.join(OVERLAY_DIRS)} and {', '.join(OVERLAY_FILES)} can be "
                         f"patched or added: {', '.join(outside)}")
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([str(stock / "bin" / "python"), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = site_packages(venv)
    copies = OVERLAY_DIRS + OVERLAY_FILES
    parents = {"/".join(Path(d).parts[:n]) for d in copies for n in range(1, len(Path(d).parts))}
    for rel in sorted(parents, key=lambda r: r.count("/")):
        (site / rel).mkdir(parents=True, exist_ok=True)
        for entry in sorted((stock_site / rel).iterdir()):
            child = f"{rel}/{entry.name}"
            if child not in parents and child not in copies and entry.name != "__pycache__":
                (site / child).symlink_to(entry)
    for rel in OVERLAY_DIRS:
        shutil.copytree(stock_site / rel, site / rel, ignore=shutil.ignore_patterns("__pycache__"), symlinks=True)
    for rel in OVERLAY_FILES:
        shutil.copyfile(stock_site / rel, site / rel)
    (site / record.path.parent.name).symlink_to(record.path.parent)
    # The path line serves Python and mypy alike; the import line also runs the stock site's .pth files.
    (site / OVERLAY_PTH).write_text(f"{stock_site}\nimport site; site.addsitedir({str(stock_site)!r})\n")
    for rel, data in sorted(files.items()):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    return site


def build(root: Path, venv: Path, stock: Path, pip_args: Sequence[str], force: bool, log: Log) -> bool:
    """Bring both venvs up to date; returns whether the overlay was rebuilt."""
    stock_stamp = ensure_stock(root, stock, pip_args, log)
    change = read_change(root)
    inputs = [(p.relative_to(root).as_posix(), p.read_bytes()) for d in ("patches", "torch") for p in walk(root / d)]
    stamp = digest(stock_stamp, Path(__file__).read_bytes(), *(part for pair in inputs for part in pair))
    if read_stamp(venv) == stamp and not force:
        log(f"build: {venv.name} is up to date")
        return False
    originals = change.originals(site_packages(stock))
    files = {rel: data for rel, data in change.all_files(originals).items() if rel.startswith("torch/")}
    make_overlay(stock, venv, files)
    (venv / STAMP_NAME).write_text(stamp + "\n")
    log(f"build: {venv.name} holds {len(change.patches)} patched and "
        f"{sum(r.startswith('torch/') for r in change.new_files)} new module(s) over {stock.name}")
    return True


# --- export ------------------------------------------------------------------


def file_diff(rel: str, old: bytes | None, new: bytes) -> str:
    """A ``git apply``-able entry taking ``rel`` from ``old`` (None: absent) to ``new``."""
    head = f"diff --git a/{rel} b/{rel}\n" + ("new file mode 100644\n" if old is None else "")
    body = difflib.unified_diff(split_lines(decode(old or b"", rel)), split_lines(decode(new, rel)),
                                "/dev/null" if old is None else f"a/{rel}", f"b/{rel}", n=3)
    return head + "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in body)


def changed_lines(diff: str) -> int:
    return sum(1 for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++ ", "--- ")))


@dataclasses.dataclass(frozen=True)
class StepExport:
    step: Step
    diffs: dict[str, str]  # file -> its diff entry
    text: str  # the PR text

    @property
    def product(self) -> int:
        return sum(changed_lines(d) for rel, d in self.diffs.items() if not is_test_side(rel))

    @property
    def tests(self) -> int:
        return sum(changed_lines(d) for rel, d in self.diffs.items() if is_test_side(rel))

    @property
    def lines(self) -> int:
        return self.product + self.tests


def render_text(step: Step) -> str:
    sections = [("What", step.text["what"]), ("Why", step.text["why"]), ("Test plan", step.text["test_plan"]),
                ("Issues", step.text["closes"] or "None.")]
    return f"# {step.title}\n\n" + "\n\n".join(f"## {head}\n\n{body}" for head, body in sections) + "\n"


def export_steps(change: Change, steps: Sequence[Step], originals: Mapping[str, str]) -> list[StepExport]:
    before: dict[str, bytes | None] = {rel: text.encode() for rel, text in originals.items()}
    out: list[StepExport] = []
    for k, step in enumerate(steps, 1):
        after = change.files(originals, *state_after(steps, k))
        diffs = {rel: file_diff(rel, before.get(rel), after[rel]) for rel in sorted(set(step.hunks) | set(step.new))
                 if before.get(rel) != after[rel]}
        for rel in step.upstream_tests:
            earlier = {h for s in steps[:k - 1] for h in s.upstream_hunks.get(rel, ())}
            diffs[rel] = change.upstream_tests[rel].git_diff(step.upstream_hunks.get(rel), earlier)
        out.append(StepExport(step, diffs, render_text(step)))
        before.update(after)
    return out


def rule_violations(exports: Sequence[StepExport]) -> list[str]:
    """Every stack rule the export breaks, each naming the step and the rule."""
    bad: list[str] = []
    if len(exports) > MAX_STEPS:
        bad.append(f"the stack has {len(exports)} steps (at most {MAX_STEPS})")
    for e in exports:
        name = f"step {e.step.number} ({e.step.slug})"
        if e.lines > MAX_STEP_LINES:
            bad.append(f"{name} changes {e.lines} lines (at most {MAX_STEP_LINES} per step)")
        for pattern, why in BANNED_TEXT:
            match = re.search(pattern, e.text, re.IGNORECASE)
            if match:
                bad.append(f"{name}: its PR text {why} ({match.group(0)!r})")
    if exports and exports[0].product > MAX_FIRST_STEP_PRODUCT_LINES:
        bad.append(f"step 1 ({exports[0].step.slug}) has {exports[0].product} product lines "
                   f"(at most {MAX_FIRST_STEP_PRODUCT_LINES} in the first step)")
    product, tests = sum(e.product for e in exports), sum(e.tests for e in exports)
    if product > MAX_PRODUCT_LINES:
        bad.append(f"the stack has {product} product lines (at most {MAX_PRODUCT_LINES})")
    if tests > MAX_TEST_LINES:
        bad.append(f"the stack has {tests} test lines (at most {MAX_TEST_LINES})")
    return bad


def size_table(exports: Sequence[StepExport]) -> list[str]:
    rows = [f"{'step':<4}  {'slug':<36} {'lines':>6} {'product':>8} {'test':>6}"]
    rows += [f"{e.step.number:<4}  {e.step.slug:<36} {e.lines:>6} {e.product:>8} {e.tests:>6}" for e in exports]
    rows.append(f"{'':<4}  {'total':<36} {sum(e.lines for e in exports):>6} "
                f"{sum(e.product for e in exports):>8} {sum(e.tests for e in exports):>6}")
    return rows


def verify_series(originals: Mapping[str, str], patches: Sequence[Path], expected: Mapping[str, bytes],
                  upstream_tests: Iterable[str] = ()) -> None:
    """``git apply --check`` then ``git apply`` each patch in turn on pristine files; compare the end.

    The entries for ``upstream_tests`` are left out: no copy of those files is at
    hand (``check-upstream-tests`` checks them).
    """
    skip = [f"--exclude={rel}" for rel in upstream_tests]
    with tempfile.TemporaryDirectory(prefix="stack-apply-") as tmp:
        tree = Path(tmp)
        subprocess.run(["git", "init", "-q", str(tree)], check=True)
        for rel, text in originals.items():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / rel).write_bytes(text.encode())
        for patch in patches:
            for extra in (["--check"], []):
                proc = subprocess.run(["git", "apply", *extra, *skip, str(patch)], cwd=tree, capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    raise BuildError(f"`git apply {' '.join(extra)}` rejects {patch.name} on pristine torch "
                                     f"{TORCH_VERSION} with the earlier steps applied:\n{proc.stderr.strip()}")
        for rel, data in expected.items():
            if not (tree / rel).is_file() or (tree / rel).read_bytes() != data:
                raise BuildError(f"the exported series gives a different {rel} than the repo's change")


def export(root: Path, stock: Path, out: Path, log: Log) -> int:
    change = read_change(root)
    steps = load_stack(root / "tools" / "stack.toml", change)
    originals = change.originals(site_packages(stock))
    exports = export_steps(change, steps, originals)
    for row in size_table(exports):
        log(row)
    shutil.rmtree(out / "stack", ignore_errors=True)
    (out / "stack.md").unlink(missing_ok=True)
    bad = rule_violations(exports)
    if bad:
        for problem in bad:
            log(f"export: FAIL: {problem}")
        return 1
    (out / "stack").mkdir(parents=True)
    written: list[Path] = []
    for e in exports:
        written.append(out / "stack" / f"{e.step.name}.patch")
        written[-1].write_text("".join(e.diffs[rel] for rel in sorted(e.diffs)))
        (out / "stack" / f"{e.step.name}.md").write_text(e.text)
    verify_series(originals, written, change.all_files(originals), change.upstream_tests)
    index = ["# The PR stack", "", f"Against torch {TORCH_VERSION}; apply the patches in order.", "",
             "| # | title | lines | product | test | patch | text |", "|---|---|---|---|---|---|---|"]
    index += [f"| {e.step.number} | {e.step.title} | {e.lines} | {e.product} | {e.tests} | "
              f"[{e.step.name}.patch](stack/{e.step.name}.patch) | [{e.step.name}.md](stack/{e.step.name}.md) |"
              for e in exports]
    (out / "stack.md").write_text("\n".join(index) + "\n")
    log(f"export: {len(exports)} step(s) written to {out / 'stack'}; they apply in order with `git apply`")
    return 0


# --- check-stack -------------------------------------------------------------


def run_tests(python: Path, cwd: Path, tests: Sequence[str], timeout: float) -> tuple[int, str]:
    cmd = [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    try:
        # upstream CI's hypothesis profile (50 examples a test) unless the caller picks one
        env = {"PYTORCH_HYPOTHESIS_PROFILE": "pytorch_ci", **env, "PYTHONNOUSERSITE": "1"}
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
        return proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return -1, f"{partial}\ntimed out after {timeout:.0f} s"


def summarize(output: str) -> str:
    """The counts of pytest's closing line (``3 passed, 1 skipped``)."""
    lines = [line.strip(" =") for line in output.splitlines() if re.search(r" in [\d.]+s\b", line)]
    if not lines:
        return "no pytest summary"
    return ", ".join(f"{n} {w}" for n, w in _SUMMARY_RE.findall(lines[-1])) or lines[-1].split(" in ")[0]


def check_stack(root: Path, stock: Path, only: Sequence[str], timeout: float, log_file: Path, log: Log) -> int:
    """Per step k: a fresh overlay with steps 1..k, pytest on step k's test files."""
    change = read_change(root)
    steps = load_stack(root / "tools" / "stack.toml", change)
    unknown = sorted(set(only) - {s.slug for s in steps})
    if unknown:
        raise BuildError(f"unknown step(s) {', '.join(unknown)}; stack.toml has {', '.join(s.slug for s in steps)}")
    originals = change.originals(site_packages(stock))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    with log_file.open("w") as log_out, tempfile.TemporaryDirectory(prefix="check-stack-") as tmp:
        for k, step in enumerate(steps, 1):
            if only and step.slug not in only:
                continue
            files = change.files(originals, *state_after(steps, k))
            work = Path(tmp) / step.name
            make_overlay(stock, work / "venv", {r: d for r, d in files.items() if r.startswith("torch/")})
            for rel, data in files.items():
                if rel.startswith("test/"):
                    (work / rel).parent.mkdir(parents=True, exist_ok=True)
                    (work / rel).write_bytes(data)
            started = time.monotonic()
            code, output = run_tests(work / "venv" / "bin" / "python", work, step.tests, timeout)
            seconds = time.monotonic() - started
            status = "pass" if code == 0 else "FAIL"
            line = (f"check-stack: {k}/{len(steps)} {step.slug}: {status}, {summarize(output)}, {seconds:.1f} s "
                    f"({len(step.tests)} test file(s))")
            log(line)
            log_out.write(f"{line}\n$ pytest {' '.join(step.tests)}\n{output}\n")
            if code != 0:
                failed.append(step.slug)
                log("    " + "\n    ".join(output.strip().splitlines()[-25:]))
            shutil.rmtree(work)
    log(f"check-stack: {'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'} (log: {log_file})")
    return 1 if failed else 0


# --- check-upstream-tests ----------------------------------------------------


def check_upstream_tests(root: Path, directory: Path, log: Log) -> int:
    """``git apply --check`` of each ``patches/test/`` patch, as exported, on its file in ``directory``.

    ``directory`` is a pytorch checkout (``test/...`` under it) or a folder of the
    files by name; they should be the versions the patches' first lines name.
    Offsets ``git apply`` allows are shown: they mean another version.
    """
    if not directory.is_dir():
        raise BuildError(f"check-upstream-tests: {directory} is not a directory")
    change = read_change(root)
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="upstream-tests-") as tmp:
        tree = Path(tmp)
        subprocess.run(["git", "init", "-q", str(tree)], check=True)
        for rel, upstream in sorted(change.upstream_tests.items()):
            name = f"check-upstream-tests: patches/{rel}.patch (commit {upstream.commit})"
            found = next((p for p in (directory / rel, directory / Path(rel).name) if p.is_file()), None)
            if found is None:
                failed.append(rel)
                log(f"{name}: FAIL, {directory} holds neither {rel} nor {Path(rel).name}")
                continue
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, tree / rel)
            (tree / "entry.patch").write_text(upstream.git_diff())
            proc = subprocess.run(["git", "apply", "--check", "--verbose", "entry.patch"], cwd=tree,
                                  capture_output=True, text=True)
            ok = proc.returncode == 0
            if not ok:
                failed.append(rel)
            detail = [line.strip() for line in proc.stderr.splitlines() if not ok or "offset" in line]
            log(f"{name}: {'applies' if ok else 'FAIL'} to {found}" + "".join(f"\n    {line}" for line in detail))
    log(f"check-upstream-tests: {len(change.upstream_tests) - len(failed)} of {len(change.upstream_tests)} "
        "patch(es) apply" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# --- Command line ------------------------------------------------------------


def main(argv: Sequence[str] | None = None, log: Log = lambda m: print(m, flush=True)) -> int:
    parser = argparse.ArgumentParser(prog="tools/build.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["build", "export", "check-stack", "check-upstream-tests"],
                        help="build: both venvs; export: the PR stack into dist/; "
                        "check-stack: each PR's tests on stock torch with the PRs up to it; "
                        "check-upstream-tests: patches/test/ applied to the upstream files in --dir")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the repository root (default: this checkout)")
    parser.add_argument("--venv", type=Path, default=None, help="the overlay venv (default: <repo>/.venv)")
    parser.add_argument("--stock-venv", type=Path, default=None, help="the pip venv (default: <repo>/.venv-stock)")
    parser.add_argument("--pip-args", default="", help="build: extra arguments for pip install")
    parser.add_argument("--force", action="store_true", help="build: rebuild the overlay even if up to date")
    parser.add_argument("--out", type=Path, default=None, help="export: output directory (default: <repo>/dist)")
    parser.add_argument("--steps", default="", help="check-stack: comma-separated slugs to test (default: every step)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="check-stack: seconds per step (default: 1800)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="check-upstream-tests: a pytorch checkout or a folder of its test files by name")
    args = parser.parse_args(argv)
    root = args.repo.resolve()
    venv = (args.venv or root / ".venv").absolute()
    stock = (args.stock_venv or root / ".venv-stock").absolute()
    try:
        if args.command == "build":
            started = time.monotonic()
            build(root, venv, stock, shlex.split(args.pip_args), args.force, log)
            log(f"build: done in {time.monotonic() - started:.1f} s")
            return 0
        if args.command == "check-upstream-tests":
            if args.dir is None:
                raise BuildError("check-upstream-tests needs --dir DIR, a directory of upstream test files")
            return check_upstream_tests(root, args.dir.resolve(), log)
        if not (stock / "bin" / "python").exists():
            raise BuildError(f"{stock} does not exist; run `make build`")
        if args.command == "export":
            return export(root, stock, (args.out or root / "dist").absolute(), log)
        only = [s for s in args.steps.split(",") if s]
        return check_stack(root, stock, only, args.timeout, root / ".build" / "check-stack.log", log)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
