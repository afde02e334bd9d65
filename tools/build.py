#!/usr/bin/env python3.11
"""Build tooling for the out-of-tree DTensor change against torch 2.13.0.

The repository never holds full copies of upstream PyTorch files.  It holds

* ``patches/<upstream path>.patch``: one strict unified diff per edited
  upstream file (headers ``--- a/torch/...`` / ``+++ b/torch/...``),
* ``torch/...``: brand-new upstream modules, installed at the same path,
* ``test/...``: brand-new upstream tests, run from the repository root.

This script turns that into something runnable and back again:

``build``
    Creates ``.venv`` (the change applied) and ``.venv-stock`` (the same pins,
    untouched) with ``pip install -r requirements/test.txt``, then patches
    ``.venv``.  Every upstream file is verified against the sha256 in torch's
    ``RECORD`` before it is patched, and a verified pristine copy is kept in
    ``.venv/.pristine`` so patches are always applied to the original text,
    never on top of a previous application.  A stamp of every input makes a
    re-run with unchanged inputs a no-op that never starts pip.
``refresh``
    Developers may edit upstream code in place in ``.venv``; ``refresh``
    turns those edits back into ``patches/`` and copies new modules back into
    the repository's ``torch/``.  The diff base of a file is its pristine
    copy in ``.venv/.pristine``; for a file that was never patched before,
    pip keeps no original, so it is taken from ``.venv-stock`` (verified
    against RECORD) and kept in ``.venv/.pristine`` from then on.  Refresh
    refuses to run while the repository is newer than the last build.
``check-refreshed``
    Fails (exit code 3) when ``.venv`` and the repository disagree.
``export``
    Writes ``dist/dtensor-strategy-contract.patch`` (one git-style patch for
    pytorch/pytorch at v2.13.0, verified with ``git apply --check`` on a tree
    rebuilt from the wheel's pristine files) and ``dist/PR.md``.

The patch/verify/stamp/refresh/export logic works on any site-packages
directory (``--site-packages``), which lets the tests exercise it on a tiny
fake ``torch`` tree instead of a real install.

Errors are raised as :class:`BuildError`; the command line prints the message
and exits with status 1.
"""

from __future__ import annotations

import argparse
import base64
import csv
import dataclasses
import difflib
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

REPO_ROOT: Path = Path(__file__).resolve().parent.parent
SCRIPT_PATH: Path = Path(__file__).resolve()

#: The upstream release ``patches/`` is written against. Every other release's tree is
#: derived from it by ``tools/rebase.py`` (a three-way merge plus the hand resolutions in
#: ``rebase/<release>/``); see the README's "Two releases" for why 2.13.0 holds the patches.
TORCH_VERSION = "2.13.0"
#: Every release the change is built, tested, audited and benchmarked on; the first one
#: is the PR's base (the release nearest to upstream main that installs here).
RELEASES: tuple[str, ...] = ("2.14.1", "2.13.0")
#: Name of the single git-style patch written by ``export``.
EXPORT_PATCH_NAME = "dtensor-strategy-contract.patch"
#: Bookkeeping file kept in each build's state directory (the venv root).
STATE_FILE_NAME = ".dtensor-build-state.json"
#: Directory (inside the state directory) holding verified pristine copies.
PRISTINE_DIR_NAME = ".pristine"
#: Log of the last ``pip install`` into a venv (inside the venv).
PIP_LOG_NAME = ".pip-install.log"
#: Bump when the meaning of the state file changes.
STATE_FORMAT = 1
#: Installed ``.py`` files outside RECORD under these prefixes are treated as
#: new modules of this change even when the repository does not have them yet.
NEW_MODULE_PREFIXES: tuple[str, ...] = (
    "torch/distributed/",
    "torch/testing/_internal/distributed/",
)
#: How far (in lines) a hunk may be found from the line its header states.
#: Patches are generated from the exact pristine file, so any offset at all
#: only tolerates hand-edited line numbers; the context must still match
#: exactly (there is no fuzz).
MAX_HUNK_OFFSET = 5
#: Exit status of ``check-refreshed`` when ``.venv`` and the repo disagree.
EXIT_NOT_REFRESHED = 3
NO_NEWLINE_MARKER = "\\ No newline at end of file\n"
PR_SECTIONS: tuple[str, ...] = ("Summary", "Motivation", "Design", "Test plan")


class BuildError(Exception):
    """A problem the user has to fix; the message says what and where."""


# tools/stack.py and tools/rebase.py load this module by this name; registering
# the running copy (also when run as a script) keeps one BuildError class.
sys.modules.setdefault("dtensor_build_tool", sys.modules[__name__])


Log = Callable[[str], None]


def _print_log(message: str) -> None:
    print(message, flush=True)


# ---------------------------------------------------------------------------
# Small file helpers
# ---------------------------------------------------------------------------


def record_digest(data: bytes) -> str:
    """Return sha256 the way wheel RECORD files spell it (urlsafe b64, no '=')."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def decode_text(data: bytes, where: Path | str) -> str:
    """Decode UTF-8 without translating newlines, so diffs see the real bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{where}: not UTF-8 text ({exc}); only text files can be patched or exported") from exc


def split_lines(text: str) -> list[str]:
    """Split on '\\n' only, keeping it; a last line without newline stays bare.

    ``str.splitlines`` also splits on form feeds and other separators that
    do occur in Python sources, which would corrupt the diffs.
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def invalidate_bytecode(path: Path) -> None:
    """Remove cached bytecode of ``path`` so Python recompiles the new source.

    Python checks the source mtime and size anyway, but two writes within the
    same second with the same size would otherwise keep a stale ``.pyc``.
    """
    if path.suffix != ".py":
        return
    cache = path.parent / "__pycache__"
    if not cache.is_dir():
        return
    for pyc in cache.glob(f"{path.stem}.*.pyc"):
        if pyc.name.split(".", 1)[0] == path.stem:
            pyc.unlink(missing_ok=True)


def write_file(path: Path, data: bytes) -> None:
    """Atomically replace ``path`` with ``data`` and drop its stale bytecode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    invalidate_bytecode(path)


def remove_file(path: Path, stop_at: Path, keep_dirs: frozenset[str] = frozenset(), base: Path | None = None) -> None:
    """Delete ``path`` and then any directories it leaves empty, up to ``stop_at``.

    ``keep_dirs`` (relative to ``base``) are never removed: they belong to
    the upstream install.
    """
    path.unlink(missing_ok=True)
    invalidate_bytecode(path)
    parent = path.parent
    while parent != stop_at and stop_at in parent.parents:
        if base is not None and parent.relative_to(base).as_posix() in keep_dirs:
            break
        cache = parent / "__pycache__"
        if cache.is_dir() and not any(cache.iterdir()):
            cache.rmdir()
        if any(parent.iterdir()):
            break
        parent.rmdir()
        parent = parent.parent


def walk_files(base: Path) -> list[Path]:
    """All files under ``base`` in a stable order, without bytecode or dotfiles."""
    if not base.is_dir():
        return []
    found: list[Path] = []
    for root, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        for name in sorted(files):
            if name.endswith(".pyc") or name.startswith("."):
                continue
            found.append(Path(root) / name)
    return sorted(found, key=lambda p: p.relative_to(base).as_posix())


# ---------------------------------------------------------------------------
# RECORD
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Record:
    """The installed torch wheel's RECORD: what pip installed, with hashes."""

    path: Path
    digests: dict[str, str]
    listed: frozenset[str]
    upstream_dirs: frozenset[str]
    #: The installed release (``2.13.0``, ``2.14.1``).
    version: str = TORCH_VERSION

    def expect(self, rel: str, data: bytes, where: Path) -> None:
        """Raise unless ``data`` is exactly the wheel's ``rel``."""
        expected = self.digests.get(rel)
        if expected is None:
            raise BuildError(f"{rel} is not listed with a hash in {self.path}; it is not a file of torch {self.version}")
        found = record_digest(data)
        if found != expected:
            raise BuildError(
                f"{where} does not match torch {self.version}'s RECORD "
                f"(sha256 expected {expected}, found {found}): it was modified outside this build"
            )

    def matches(self, rel: str, data: bytes) -> bool:
        return self.digests.get(rel) == record_digest(data)


def find_record(site: Path) -> Path:
    """Locate ``torch-<version>*.dist-info/RECORD`` inside ``site``."""
    if not site.is_dir():
        raise BuildError(f"site-packages directory {site} does not exist; run `make build` first")
    candidates = sorted(p for p in site.glob("torch-*.dist-info") if p.is_dir())
    if len(candidates) != 1 or _record_version(candidates[0]) not in RELEASES:
        found = ", ".join(p.name for p in candidates) or "none"
        raise BuildError(
            f"expected exactly one torch-<release>*.dist-info in {site} (releases: {', '.join(RELEASES)}), found: {found}"
        )
    record = candidates[0] / "RECORD"
    if not record.is_file():
        raise BuildError(f"{record} is missing; the torch install in {site} is broken (reinstall it: `make clean build`)")
    return record


def _record_version(dist_info: Path) -> str:
    """The release a ``torch-<version>[+local].dist-info`` directory holds (``2.13.0+cpu`` -> ``2.13.0``)."""
    return dist_info.name[len("torch-"): -len(".dist-info")].split("+")[0]


def load_record(site: Path) -> Record:
    """Parse the RECORD of the torch wheel installed in ``site``."""
    record_path = find_record(site)
    digests: dict[str, str] = {}
    listed: set[str] = set()
    with record_path.open(newline="", encoding="utf-8") as handle:
        for row in csv.reader(handle):
            if not row:
                continue
            rel = row[0]
            listed.add(rel)
            if len(row) > 1 and row[1]:
                algo, _, digest = row[1].partition("=")
                if algo != "sha256":
                    raise BuildError(f"{record_path}: unsupported hash {algo!r} for {rel}")
                digests[rel] = digest
    dirs: set[str] = set()
    for rel in listed:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return Record(record_path, digests, frozenset(listed), frozenset(dirs), _record_version(record_path.parent))


# ---------------------------------------------------------------------------
# Unified diffs: a strict applier and a deterministic writer
# ---------------------------------------------------------------------------

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclasses.dataclass(frozen=True)
class Hunk:
    """One ``@@`` hunk; ``lines`` holds (op, text) with op in ' ', '-', '+'."""

    index: int
    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[str, str], ...]

    @property
    def old_lines(self) -> list[str]:
        return [text for op, text in self.lines if op != "+"]

    @property
    def new_lines(self) -> list[str]:
        return [text for op, text in self.lines if op != "-"]


@dataclasses.dataclass(frozen=True)
class FilePatch:
    """A unified diff of exactly one file."""

    source: str
    old_path: str
    new_path: str
    hunks: tuple[Hunk, ...]


def _strip_header_path(line: str, marker: str, prefix: str, source: str, lineno: int) -> str:
    body = line[len(marker):].rstrip("\n").split("\t", 1)[0]
    if not body.startswith(prefix):
        raise BuildError(f"{source}:{lineno}: expected `{marker}{prefix}<path>`, found {line.rstrip()!r}")
    return body[len(prefix):]


def parse_patch(text: str, source: str) -> FilePatch:
    """Parse a single-file unified diff strictly; ``source`` names it in errors.

    Lines before ``---`` (e.g. ``diff --git``/``index`` lines) are ignored.
    Hunk line counts must match the header exactly.
    """
    if text and not text.endswith("\n"):
        text += "\n"
    lines = split_lines(text)
    i = 0
    while i < len(lines) and not lines[i].startswith("--- "):
        if lines[i].startswith(("@@", "+++ ")):
            raise BuildError(f"{source}:{i + 1}: hunk or `+++` line before the `--- a/<path>` header")
        i += 1
    if i >= len(lines):
        raise BuildError(f"{source}: no `--- a/<path>` header found; is this a unified diff?")
    old_path = _strip_header_path(lines[i], "--- ", "a/", source, i + 1)
    if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
        raise BuildError(f"{source}:{i + 2}: expected `+++ b/<path>` after the `---` line")
    new_path = _strip_header_path(lines[i + 1], "+++ ", "b/", source, i + 2)
    i += 2
    hunks: list[Hunk] = []
    while i < len(lines):
        header = lines[i].rstrip("\n")
        match = _HUNK_RE.match(header)
        if match is None:
            if header.startswith(("--- ", "diff ")):
                raise BuildError(f"{source}:{i + 1}: a second file starts here; use one patch file per upstream file")
            raise BuildError(f"{source}:{i + 1}: expected a `@@ -l,s +l,s @@` hunk header, found {header!r}")
        old_start, old_count, new_start, new_count = (
            int(match.group(1)),
            int(match.group(2)) if match.group(2) is not None else 1,
            int(match.group(3)),
            int(match.group(4)) if match.group(4) is not None else 1,
        )
        index = len(hunks) + 1
        i += 1
        body: list[tuple[str, str]] = []
        old_seen = new_seen = 0
        while old_seen < old_count or new_seen < new_count:
            if i >= len(lines):
                raise BuildError(
                    f"{source}: hunk #{index} ({header}) ends early: header promises {old_count} old and "
                    f"{new_count} new lines, body has {old_seen} and {new_seen}"
                )
            line = lines[i]
            op = line[:1]
            if op == "\\":
                if not body:
                    raise BuildError(f"{source}:{i + 1}: `\\ No newline` marker without a preceding line")
                prev_op, prev_text = body[-1]
                body[-1] = (prev_op, prev_text.rstrip("\n"))
            elif op in (" ", "-", "+"):
                body.append((op, line[1:]))
                if op != "+":
                    old_seen += 1
                if op != "-":
                    new_seen += 1
            else:
                raise BuildError(
                    f"{source}:{i + 1}: hunk #{index} ({header}): line does not start with ' ', '-', '+' or '\\' "
                    f"(found {line.rstrip()!r}); the header's line counts may be wrong"
                )
            i += 1
        if old_seen != old_count or new_seen != new_count:
            raise BuildError(
                f"{source}: hunk #{index} ({header}) holds {old_seen} old and {new_seen} new lines, "
                f"header says {old_count} and {new_count}"
            )
        if i < len(lines) and lines[i].startswith("\\"):
            prev_op, prev_text = body[-1]
            body[-1] = (prev_op, prev_text.rstrip("\n"))
            i += 1
        if hunks and old_start <= hunks[-1].old_start + max(hunks[-1].old_count - 1, 0):
            raise BuildError(f"{source}: hunk #{index} ({header}) overlaps or precedes hunk #{index - 1}")
        hunks.append(Hunk(index, header, old_start, old_count, new_start, new_count, tuple(body)))
    if not hunks:
        raise BuildError(f"{source}: the patch holds no hunks")
    return FilePatch(source, old_path, new_path, tuple(hunks))


def _describe_mismatch(src: list[str], old: list[str], at: int) -> str:
    for offset, want in enumerate(old):
        pos = at + offset
        if pos >= len(src):
            return f"the file ends after line {len(src)}, the hunk expects {want.rstrip(chr(10))!r} at line {pos + 1}"
        if src[pos] != want:
            return f"line {pos + 1} is {src[pos]!r}, the hunk expects {want!r}"
    return "the hunk would overlap the previous hunk"


def apply_patch(patch: FilePatch, original: str, target: str) -> str:
    """Apply ``patch`` to ``original`` strictly and return the new text.

    Each hunk's context and removed lines must match exactly, at the stated
    line or within :data:`MAX_HUNK_OFFSET` lines of it (nearest first).
    There is no fuzz: anything else raises a :class:`BuildError` naming the
    patch file, ``target`` and the hunk.
    """
    src = split_lines(original)
    out: list[str] = []
    pos = 0
    for hunk in patch.hunks:
        old = hunk.old_lines
        expected = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        offsets = [0] if not old else [0] + [s * d for d in range(1, MAX_HUNK_OFFSET + 1) for s in (-1, 1)]
        found: int | None = None
        for delta in offsets:
            at = expected + delta
            if at < pos or at + len(old) > len(src):
                continue
            if src[at : at + len(old)] == old:
                found = at
                break
        if found is None:
            why = _describe_mismatch(src, old, max(expected, pos))
            raise BuildError(
                f"patch {patch.source} does not apply to {target}: hunk #{hunk.index} ({hunk.header}) "
                f"does not match: {why} (searched +/-{MAX_HUNK_OFFSET} lines, no fuzz)"
            )
        out.extend(src[pos:found])
        out.extend(hunk.new_lines)
        pos = found + len(old)
    out.extend(src[pos:])
    return "".join(out)


def _terminate_lines(diff_lines: Iterable[str]) -> str:
    out: list[str] = []
    for line in diff_lines:
        if line.endswith("\n"):
            out.append(line)
        else:
            out.append(line + "\n" + NO_NEWLINE_MARKER)
    return "".join(out)


def make_patch(rel: str, old: str, new: str) -> str:
    """Deterministic unified diff of ``rel`` (3 lines of context, no dates).

    Returns '' when the texts are equal.  Missing final newlines are written
    as ``\\ No newline at end of file`` like diff and git do.
    """
    if old == new:
        return ""
    diff = difflib.unified_diff(split_lines(old), split_lines(new), f"a/{rel}", f"b/{rel}", n=3)
    return _terminate_lines(diff)


def git_modified_entry(rel: str, old: str, new: str) -> str:
    """A ``diff --git`` entry for an edited file."""
    return f"diff --git a/{rel} b/{rel}\n" + make_patch(rel, old, new)


def git_new_file_entry(rel: str, text: str) -> str:
    """A ``diff --git`` entry creating ``rel`` (mode 100644) with ``text``."""
    head = f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n"
    if not text:
        return head
    body = list(difflib.unified_diff([], split_lines(text), "/dev/null", f"b/{rel}", n=3))
    return head + _terminate_lines(body)


# ---------------------------------------------------------------------------
# Repository inputs and install targets
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sources:
    """The repository side: patches, new modules, new tests, pins."""

    root: Path
    script: Path = SCRIPT_PATH
    #: Where the patches are: ``patches/`` for the release they are written against;
    #: for another release, the rebased tree's diffs that the build generates.
    patches_root: Path | None = None
    #: The requirements file its venvs are installed from.
    requirements_file: str = "test.txt"

    @property
    def patches_dir(self) -> Path:
        return self.patches_root or self.root / "patches"

    @property
    def modules_dir(self) -> Path:
        return self.root / "torch"

    @property
    def tests_dir(self) -> Path:
        return self.root / "test"

    @property
    def requirements(self) -> Path:
        return self.root / "requirements" / self.requirements_file

    @property
    def pr_template(self) -> Path:
        return self.root / "tools" / "pr_template.md"

    @property
    def audit_report(self) -> Path:
        return self.root / "reports" / "audit.md"

    def patch_path(self, rel: str) -> Path:
        return self.patches_dir / f"{rel}.patch"

    def patches(self) -> dict[str, Path]:
        """Map upstream path (``torch/...``) -> patch file, checking names."""
        result: dict[str, Path] = {}
        for path in walk_files(self.patches_dir):
            rel_patch = path.relative_to(self.patches_dir).as_posix()
            if not rel_patch.endswith(".patch"):
                raise BuildError(f"{path}: patches/ may only hold `<upstream path>.patch` files")
            rel = rel_patch[: -len(".patch")]
            if not rel.startswith("torch/"):
                raise BuildError(f"{path}: patch files must mirror an upstream path under torch/ (patches/torch/...)")
            result[rel] = path
        return result

    def read_patch(self, rel: str, path: Path) -> FilePatch:
        """Parse the patch file of ``rel`` and check its headers name ``rel``."""
        patch = parse_patch(decode_text(path.read_bytes(), path), str(path))
        if patch.old_path != rel or patch.new_path != rel:
            raise BuildError(
                f"{path}: headers name a/{patch.old_path} and b/{patch.new_path}, but the file's location "
                f"says it patches {rel}"
            )
        return patch

    def modules(self) -> dict[str, Path]:
        """Map ``torch/...`` -> new module file in the repository."""
        return {p.relative_to(self.root).as_posix(): p for p in walk_files(self.modules_dir)}

    def tests(self) -> dict[str, Path]:
        """Map ``test/...`` -> new test file in the repository."""
        return {p.relative_to(self.root).as_posix(): p for p in walk_files(self.tests_dir)}


@dataclasses.dataclass
class BuildState:
    """What the last build wrote (sha256 per file) and its input stamp."""

    stamp: str | None = None
    env_stamp: str | None = None
    patched: dict[str, str] = dataclasses.field(default_factory=dict)
    modules: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Target:
    """An install: a site-packages tree plus a state directory we own."""

    site: Path
    state_dir: Path

    @property
    def pristine_root(self) -> Path:
        return self.state_dir / PRISTINE_DIR_NAME

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE_NAME

    def installed(self, rel: str) -> Path:
        return self.site / rel

    def pristine(self, rel: str) -> Path:
        return self.pristine_root / rel

    def load_state(self) -> BuildState:
        if not self.state_file.exists():
            return BuildState()
        try:
            raw = json.loads(self.state_file.read_text(encoding="utf-8"))
            if raw.get("format") != STATE_FORMAT:
                return BuildState()
            return BuildState(raw.get("stamp"), raw.get("env_stamp"), dict(raw["patched"]), dict(raw["modules"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BuildError(f"{self.state_file} is corrupt ({exc}); delete the venv and rebuild (`make clean build`)") from exc

    def save_state(self, state: BuildState) -> None:
        payload = {"format": STATE_FORMAT, **dataclasses.asdict(state)}
        write_file(self.state_file, (json.dumps(payload, indent=1, sort_keys=True) + "\n").encode())


def venv_site_packages(venv: Path) -> Path:
    """The site-packages directory of ``venv`` (created by this interpreter)."""
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def venv_target(venv: Path) -> Target:
    return Target(venv_site_packages(venv), venv)


def input_stamp(sources: Sources, record: Record) -> str:
    """Hash of everything the patch phase depends on.

    Requirements, the build script itself, every patch and new module (path
    and bytes) and the installed RECORD (a reinstalled torch rebuilds).
    """
    digest = hashlib.sha256()

    def feed(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    feed("format", str(STATE_FORMAT).encode())
    feed("requirements", sources.requirements.read_bytes() if sources.requirements.exists() else b"")
    feed("script", sources.script.read_bytes())
    feed("record", record.path.read_bytes())
    for rel, path in sorted(sources.patches().items()):
        feed(f"patch:{rel}", path.read_bytes())
    for rel, path in sorted(sources.modules().items()):
        feed(f"module:{rel}", path.read_bytes())
    return digest.hexdigest()


def pristine_bytes(target: Target, record: Record, rel: str, stock_site: Path | None = None, save: bool = False) -> bytes | None:
    """The wheel's original ``rel``, verified against RECORD, or None.

    Looks in the kept pristine copy first, then in the stock install, then
    at the installed file if it is still untouched.  A pristine copy that
    fails verification is an error (it must never be used).  With ``save``
    a copy found elsewhere is kept in the pristine directory.
    """
    kept = target.pristine(rel)
    if kept.is_file():
        data = kept.read_bytes()
        record.expect(rel, data, kept)
        return data
    for candidate in ([stock_site / rel] if stock_site is not None else []) + [target.installed(rel)]:
        if candidate.is_file():
            data = candidate.read_bytes()
            if record.matches(rel, data):
                if save:
                    write_file(kept, data)
                return data
    return None


# ---------------------------------------------------------------------------
# build (patch phase)
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class BuildReport:
    """What a patch phase did, for printing and for tests."""

    up_to_date: bool = False
    patched: list[str] = dataclasses.field(default_factory=list)
    restored: list[str] = dataclasses.field(default_factory=list)
    installed: list[str] = dataclasses.field(default_factory=list)
    removed: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        if self.up_to_date:
            return ["up to date (inputs unchanged since the last build)"]
        out = [f"patched   {rel}" for rel in self.patched]
        out += [f"restored  {rel} (its patch was removed)" for rel in self.restored]
        out += [f"installed {rel}" for rel in self.installed]
        out += [f"removed   {rel} (deleted from the repo)" for rel in self.removed]
        return out or ["nothing to change (installed files already match the repo)"]


def apply_to_tree(sources: Sources, target: Target, force: bool = False) -> BuildReport:
    """Bring ``target`` in line with the repository's patches and modules.

    Every patch is applied to the verified pristine text (never on top of an
    earlier application); files whose patch disappeared are restored; new
    modules are copied in (refusing upstream paths) and deleted ones removed.
    Nothing is written until every patch has applied in memory, and files
    holding in-place edits that ``refresh`` has not captured are not
    overwritten unless ``force``.
    """
    record = load_record(target.site)
    stamp = input_stamp(sources, record)
    state = target.load_state()
    if state.stamp == stamp and not force:
        return BuildReport(up_to_date=True)

    patches = sources.patches()
    modules = sources.modules()
    clashes = sorted(rel for rel in modules if rel in record.listed)
    if clashes:
        listing = "\n  ".join(f"{sources.root / rel} -> {target.installed(rel)}" for rel in clashes)
        raise BuildError(
            "refusing to install new modules over upstream files listed in "
            f"{record.path}:\n  {listing}\nedit upstream files through patches/ instead"
        )
    for rel, path in sorted(patches.items()):
        if rel not in record.digests:
            raise BuildError(
                f"{path} patches {rel}, which is not a file of torch {record.version} (not in {record.path}); "
                "new files belong under torch/ in the repo"
            )

    desired: dict[str, bytes] = {}
    for rel in sorted(set(patches) | set(state.patched)):
        installed = target.installed(rel)
        original = pristine_bytes(target, record, rel)
        if original is None:
            if not installed.is_file():
                raise BuildError(f"upstream file {installed} is missing; reinstall torch (`make clean build`)")
            # No verified copy anywhere and the installed file differs from the wheel.
            found = record_digest(installed.read_bytes())
            raise BuildError(
                f"{installed} does not match torch {record.version}'s RECORD (sha256 expected "
                f"{record.digests[rel]}, found {found}) and there is no pristine copy to patch instead. "
                "If you edited it in place, run `make refresh` first (it takes the original from the stock "
                "venv); otherwise reinstall torch: `make clean build`"
            )
        write_pristine = not target.pristine(rel).is_file()
        if rel in patches:
            patch = sources.read_patch(rel, patches[rel])
            text = apply_patch(patch, decode_text(original, installed), str(installed))
            desired[rel] = text.encode("utf-8")
        else:
            desired[rel] = original
        if write_pristine:
            write_file(target.pristine(rel), original)

    module_data = {rel: path.read_bytes() for rel, path in modules.items()}
    conflicts: list[str] = []
    for rel, data in desired.items():
        current = target.installed(rel).read_bytes() if target.installed(rel).is_file() else b""
        ok = {record.digests[rel], record_digest(data), state.patched.get(rel)}
        if record_digest(current) not in ok:
            conflicts.append(str(target.installed(rel)))
    for rel, data in module_data.items():
        path = target.installed(rel)
        if path.is_file() and record_digest(path.read_bytes()) not in {record_digest(data), state.modules.get(rel)}:
            conflicts.append(str(path))
    stale_modules = sorted(set(state.modules) - set(module_data))
    for rel in stale_modules:
        path = target.installed(rel)
        if path.is_file() and record_digest(path.read_bytes()) != state.modules[rel]:
            conflicts.append(f"{path} (deleted from the repo, edited in place)")
    if conflicts and not force:
        listing = "\n  ".join(conflicts)
        raise BuildError(
            f"these files in {target.site} hold in-place edits that are not in the repo, and the build would "
            f"overwrite them:\n  {listing}\nrun `make refresh` to keep them, or pass --force to discard them"
        )

    report = BuildReport()
    state.stamp = None  # mark "in progress": an interrupted build re-runs fully
    target.save_state(state)
    for rel, data in sorted(desired.items()):
        path = target.installed(rel)
        if not path.is_file() or path.read_bytes() != data:
            write_file(path, data)
            (report.patched if rel in patches else report.restored).append(rel)
    for rel, data in sorted(module_data.items()):
        path = target.installed(rel)
        if not path.is_file() or path.read_bytes() != data:
            write_file(path, data)
            report.installed.append(rel)
    for rel in stale_modules:
        path = target.installed(rel)
        if path.exists():
            remove_file(path, target.site / "torch", record.upstream_dirs, target.site)
            report.removed.append(rel)
    state.patched = {rel: record_digest(desired[rel]) for rel in sorted(patches)}
    state.modules = {rel: record_digest(data) for rel, data in sorted(module_data.items())}
    state.stamp = stamp
    target.save_state(state)
    return report


# ---------------------------------------------------------------------------
# refresh / check-refreshed
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference between the installed tree and the repository.

    ``kind`` is one of: ``patch-add``, ``patch-update``, ``patch-remove``,
    ``module-add``, ``module-update``, ``module-missing``, ``no-pristine``.
    ``payload`` is what refresh writes (patch text or module bytes).
    """

    kind: str
    rel: str
    message: str
    payload: bytes | None = None


def _is_new_module_candidate(rel: str) -> bool:
    return rel.endswith(".py") and rel.startswith(NEW_MODULE_PREFIXES)


def scan_tree(sources: Sources, target: Target, stock_site: Path | None) -> list[Change]:
    """Compare the installed tree with the repository (read-only).

    Upstream ``.py`` files are compared with RECORD by sha256 (bytecode is
    skipped), which keeps this to a fraction of a second for the whole of
    torch.  For an edited file the pristine text comes from the kept copy
    or, for a file never patched, from ``stock_site`` (verified).
    """
    record = load_record(target.site)
    patches = sources.patches()
    repo_modules = sources.modules()
    edited: set[str] = set(patches)
    installed_new: set[str] = set()
    torch_dir = target.site / "torch"
    for root, dirs, files in os.walk(torch_dir):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel_root = Path(root).relative_to(target.site).as_posix()
        for name in files:
            if not name.endswith(".py"):
                continue
            rel = f"{rel_root}/{name}"
            digest = record.digests.get(rel)
            if digest is None:
                if rel not in record.listed and (rel in repo_modules or _is_new_module_candidate(rel)):
                    installed_new.add(rel)
                continue
            with open(os.path.join(root, name), "rb") as handle:
                if record_digest(handle.read()) != digest:
                    edited.add(rel)

    changes: list[Change] = []
    for rel in sorted(edited):
        installed = target.installed(rel)
        patch_file = sources.patch_path(rel)
        if rel not in record.digests:
            raise BuildError(f"{patch_file} patches {rel}, which is not a file of torch {record.version}")
        if not installed.is_file():
            raise BuildError(f"upstream file {installed} is missing; reinstall torch (`make clean build`)")
        current = installed.read_bytes()
        if record.matches(rel, current):
            changes.append(
                Change(
                    "patch-remove",
                    rel,
                    f"{rel} is unchanged from the wheel in {target.site} but {patch_file} exists "
                    "(refresh deletes the patch; `make build` applies a patch that is new)",
                )
            )
            continue
        original = pristine_bytes(target, record, rel, stock_site)
        if original is None:
            where = f" or {stock_site / rel}" if stock_site is not None else ""
            changes.append(
                Change(
                    "no-pristine",
                    rel,
                    f"{rel} is edited but no pristine copy verifies against RECORD (looked in "
                    f"{target.pristine(rel)}{where}); build the stock venv (`make build`)",
                )
            )
            continue
        current_text = decode_text(current, installed)
        original_text = decode_text(original, installed)
        if rel in patches:
            try:
                expected = apply_patch(sources.read_patch(rel, patches[rel]), original_text, str(installed))
            except BuildError:
                expected = None
            if expected == current_text:
                continue
        text = make_patch(rel, original_text, current_text).encode("utf-8")
        kind = "patch-update" if rel in patches else "patch-add"
        verb = "update" if rel in patches else "write"
        changes.append(Change(kind, rel, f"{rel} has in-place edits: {verb} {patch_file}", text))

    for rel in sorted(installed_new | set(repo_modules)):
        installed = target.installed(rel)
        repo_file = sources.root / rel
        if not installed.is_file():
            changes.append(
                Change(
                    "module-missing",
                    rel,
                    f"{repo_file} is not installed in {target.site} (run `make build`, or delete it from the repo)",
                )
            )
            continue
        data = installed.read_bytes()
        if rel not in repo_modules:
            changes.append(Change("module-add", rel, f"new module {rel} exists only in {target.site}: copy to {repo_file}", data))
        elif repo_modules[rel].read_bytes() != data:
            changes.append(Change("module-update", rel, f"{rel} differs from {repo_file}: copy the installed one", data))
    return changes


def refresh_tree(sources: Sources, target: Target, stock_site: Path | None, force: bool = False) -> list[Change]:
    """Write in-place edits of ``target`` back into the repository.

    Refuses when the repository changed since the last build (the build is
    not current): refreshing then would revert those repository changes.
    """
    record = load_record(target.site)
    state = target.load_state()
    if state.stamp != input_stamp(sources, record) and not force:
        raise BuildError(
            f"the repo's patches/, torch/ or build inputs changed since {target.site} was last built; "
            "refreshing now would revert them. Run `make build` first (or pass --force)"
        )
    changes = scan_tree(sources, target, stock_site)
    blocked = [c for c in changes if c.kind == "no-pristine"]
    if blocked:
        raise BuildError("cannot refresh:\n  " + "\n  ".join(c.message for c in blocked))
    for change in changes:
        if change.kind in ("patch-add", "patch-update"):
            assert_payload(change)
            pristine_bytes(target, record, change.rel, stock_site, save=True)
            write_file(sources.patch_path(change.rel), change.payload or b"")
        elif change.kind == "patch-remove":
            remove_file(sources.patch_path(change.rel), sources.patches_dir)
        elif change.kind in ("module-add", "module-update"):
            assert_payload(change)
            write_file(sources.root / change.rel, change.payload or b"")
    return changes


def assert_payload(change: Change) -> None:
    if change.payload is None:
        raise BuildError(f"internal error: change {change.kind} for {change.rel} carries no content")


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------


def _pristine_for_export(rel: str, targets: Sequence[Target], record: Record) -> bytes:
    for target in targets:
        data = pristine_bytes(target, record, rel)
        if data is not None:
            return data
    looked = ", ".join(str(p) for t in targets for p in (t.pristine(rel), t.installed(rel)))
    raise BuildError(f"no pristine copy of {rel} that verifies against RECORD (looked in {looked}); run `make build`")


def build_export_patch(sources: Sources, targets: Sequence[Target]) -> tuple[str, dict[str, bytes], dict[str, bytes]]:
    """Return (git patch text, pristine originals, expected results) for export.

    ``targets`` are installs to take pristine originals from (the first one
    with a usable RECORD provides the hashes).
    """
    usable = [t for t in targets if t.site.is_dir()]
    if not usable:
        raise BuildError("no venv to take pristine upstream files from; run `make build` first")
    record = load_record(usable[0].site)
    entries: dict[str, str] = {}
    originals: dict[str, bytes] = {}
    results: dict[str, bytes] = {}
    for rel, path in sorted(sources.patches().items()):
        original = _pristine_for_export(rel, usable, record)
        old = decode_text(original, rel)
        new = apply_patch(sources.read_patch(rel, path), old, rel)
        if new == old:
            raise BuildError(f"{path} changes nothing; delete it")
        entries[rel] = git_modified_entry(rel, old, new)
        originals[rel] = original
        results[rel] = new.encode("utf-8")
    modules = sources.modules()
    clashes = sorted(rel for rel in modules if rel in record.listed)
    if clashes:
        raise BuildError("new modules would overwrite upstream files listed in RECORD: " + ", ".join(clashes))
    for rel, path in list(modules.items()) + list(sources.tests().items()):
        data = path.read_bytes()
        entries[rel] = git_new_file_entry(rel, decode_text(data, path))
        results[rel] = data
    if not entries:
        raise BuildError("nothing to export: patches/, torch/ and test/ are empty")
    return "".join(entries[rel] for rel in sorted(entries)), originals, results


def verify_with_git(patch_file: Path, originals: dict[str, bytes], results: dict[str, bytes]) -> None:
    """``git apply --check`` the patch on a pristine tree, then apply and compare."""
    git = shutil.which("git")
    if git is None:
        raise BuildError("git is not installed; it is needed to verify the exported patch")
    with tempfile.TemporaryDirectory(prefix="dtensor-export-") as tmp:
        root = Path(tmp)
        env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
        subprocess.run([git, "init", "-q", str(root)], check=True, env=env)
        for rel, data in originals.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for args in (["--check"], []):
            proc = subprocess.run(
                [git, "apply", *args, "--whitespace=nowarn", str(patch_file.resolve())],
                cwd=root, env=env, capture_output=True, text=True,
            )
            if proc.returncode != 0:
                raise BuildError(
                    f"`git apply {' '.join(args)}` rejected {patch_file} on a pristine torch {TORCH_VERSION} tree:\n"
                    f"{proc.stderr.strip()}"
                )
        for rel, data in results.items():
            got = (root / rel).read_bytes() if (root / rel).is_file() else None
            if got != data:
                raise BuildError(f"applying {patch_file} with git gives a different {rel} than the build does")


def _audit_tables(report: Path) -> str:
    """The markdown tables of ``report``, each under its nearest heading."""
    if not report.is_file():
        return "no audit report found; run `make audit`\n"
    lines = report.read_text(encoding="utf-8").splitlines()
    blocks: list[str] = []
    heading: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            i += 1
            continue
        if line.lstrip().startswith("|"):
            table: list[str] = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                table.append(lines[i].strip())
                i += 1
            block = (f"### {heading}\n\n" if heading else "") + "\n".join(table) + "\n"
            blocks.append(block)
            heading = None
            continue
        i += 1
    if not blocks:
        return f"{report.as_posix()} holds no tables; run `make audit`\n"
    return "\n".join(blocks)


def render_pr(sources: Sources) -> str:
    """PR description: prose from ``tools/pr_template.md``, Results from the audit."""
    template = sources.pr_template
    if not template.is_file():
        raise BuildError(f"{template} is missing; it holds the PR prose (sections {', '.join(PR_SECTIONS)})")
    title = "[DTensor] Sharding strategy contract"
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in template.read_text(encoding="utf-8").splitlines():
        if line.startswith("# ") and not sections and current is None:
            title = line[2:].strip()
        elif line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    missing = [name for name in PR_SECTIONS if name not in sections]
    if missing:
        raise BuildError(f"{template} lacks the section(s) {', '.join('## ' + m for m in missing)}")
    parts = [f"# {title}\n"]
    for name in PR_SECTIONS:
        body = "\n".join(sections[name]).strip("\n")
        parts.append(f"## {name}\n\n{body}\n")
    parts.append(f"## Results\n\n{_audit_tables(sources.audit_report)}")
    return "\n".join(parts)


def export(sources: Sources, targets: Sequence[Target], out_dir: Path) -> list[Path]:
    """Write and verify ``dist/`` (the git patch and PR.md); return the files."""
    text, originals, results = build_export_patch(sources, targets)
    out_dir.mkdir(parents=True, exist_ok=True)
    patch_file = out_dir / EXPORT_PATCH_NAME
    write_file(patch_file, text.encode("utf-8"))
    verify_with_git(patch_file, originals, results)
    pr_file = out_dir / "PR.md"
    write_file(pr_file, render_pr(sources).encode("utf-8"))
    return [patch_file, pr_file]


# ---------------------------------------------------------------------------
# venv creation
# ---------------------------------------------------------------------------


def env_stamp(requirements: Path, pip_args: Sequence[str]) -> str:
    """Hash of what a venv's pip install depends on (not the patches)."""
    digest = hashlib.sha256()
    digest.update(sys.version.encode())
    digest.update(b"\0")
    digest.update(requirements.read_bytes())
    digest.update(b"\0")
    digest.update("\0".join(pip_args).encode())
    return digest.hexdigest()


def _venv_ready(venv: Path, stamp: str) -> bool:
    target = venv_target(venv)
    return (venv / "bin" / "python").exists() and target.load_state().env_stamp == stamp


def ensure_venvs(
    sources: Sources,
    venvs: Sequence[Path],
    pip_args: Sequence[str],
    log: Log,
    guard: Callable[[Path], None] | None = None,
    requirements: Mapping[Path, Path] | None = None,
) -> list[Path]:
    """(Re)create the venvs whose requirements stamp is stale, pip installs in parallel.

    A venv is recreated from scratch rather than upgraded in place, so it is
    always exactly the pins.  ``guard(venv)`` runs before an existing,
    complete venv is wiped (to protect in-place edits). ``requirements`` maps
    a venv to its own requirements file (default: ``sources.requirements``).
    """
    wanted = {venv: (requirements or {}).get(venv, sources.requirements) for venv in venvs}
    for path in sorted(set(wanted.values())):
        if not path.is_file():
            raise BuildError(f"{path} is missing")
    stamps = {venv: env_stamp(req, pip_args) for venv, req in wanted.items()}
    todo = [v for v in venvs if not _venv_ready(v, stamps[v])]
    if not todo:
        return []
    running: list[tuple[Path, subprocess.Popen[bytes], Path]] = []
    for venv in todo:
        if venv.exists():
            if guard is not None and venv_target(venv).load_state().env_stamp is not None:
                guard(venv)
            log(f"removing outdated {venv}")
            shutil.rmtree(venv)
        log(f"creating {venv} ({sys.executable} -m venv)")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip_log = venv / PIP_LOG_NAME
        cmd = [
            str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
            "-r", str(wanted[venv]), *pip_args,
        ]
        log(f"pip install -r {wanted[venv].relative_to(sources.root)} into {venv} (log: {pip_log})")
        with pip_log.open("wb") as handle:
            running.append((venv, subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT), pip_log))
    failures: list[str] = []
    for venv, proc, pip_log in running:
        if proc.wait() != 0:
            tail = pip_log.read_text(errors="replace").splitlines()[-25:]
            failures.append(
                f"pip install into {venv} failed (exit {proc.returncode}); last lines of {pip_log}:\n    "
                + "\n    ".join(tail)
            )
            continue
        target = venv_target(venv)
        find_record(target.site)
        state = BuildState(env_stamp=stamps[venv])
        target.save_state(state)
    if failures:
        raise BuildError("\n".join(failures))
    return todo


# ---------------------------------------------------------------------------
# The other releases (tools/rebase.py derives their trees from patches/)
# ---------------------------------------------------------------------------

#: Where a release's built venv keeps the diffs of its rebased files against that release.
REBASED_PATCHES_DIR_NAME = ".rebased-patches"


def parse_releases(text: str | None) -> list[str]:
    """``2.14.1,2.13.0`` -> the releases, checked against :data:`RELEASES` (default: TORCH_VERSION)."""
    releases = [r for r in (text or TORCH_VERSION).replace(" ", ",").split(",") if r]
    unknown = [r for r in releases if r not in RELEASES]
    if unknown:
        raise BuildError(f"unknown torch release(s) {', '.join(unknown)}; this change is built on {', '.join(RELEASES)}")
    return releases


def release_venvs(args: argparse.Namespace, version: str) -> tuple[Path, Path]:
    """(built venv, stock venv) of ``version``: ``--venv``/``--stock-venv`` for TORCH_VERSION, else
    ``.venv-<version>`` and ``.venv-<version>-stock``."""
    if version == TORCH_VERSION:
        return Path(args.venv).resolve(), Path(args.stock_venv).resolve()
    root = Path(args.repo).resolve()
    return root / f".venv-{version}", root / f".venv-{version}-stock"


def release_requirements(root: Path, version: str) -> Path:
    """``requirements/test.txt`` pins TORCH_VERSION; ``requirements/test-<version>.txt`` another release."""
    return Sources(root).requirements if version == TORCH_VERSION else root / "requirements" / f"test-{version}.txt"


def inplace_edits(target: Target) -> list[str]:
    """Files of ``target`` that differ from what its last build wrote."""
    state = target.load_state()
    edited = []
    for rel, digest in sorted({**state.patched, **state.modules}.items()):
        path = target.installed(rel)
        if path.is_file() and record_digest(path.read_bytes()) != digest:
            edited.append(str(path))
    return edited


def _overlay_stamp(stock: Path) -> str:
    return hashlib.sha256(f"overlay\0{STATE_FORMAT}\0{venv_target(stock).load_state().env_stamp}".encode()).hexdigest()


def build_release(ctx: Context, version: str, force: bool, log: Log) -> BuildReport:
    """Build ``version``'s built venv: an overlay of its stock venv holding the rebased change.

    The overlay (``tools/stack.py:overlay_venv``) links everything of the stock
    install but DTensor's two directories, which are real copies; the rebased
    files are applied to them as diffs against the release's own files, with
    the same RECORD check, pristine copies and stamps as the TORCH_VERSION build.
    """
    if ctx.venv is None or ctx.stock_venv is None:
        raise BuildError(f"building torch {version} needs the {TORCH_VERSION} venvs (the rebase reads their originals)")
    built = ctx.sources.root / f".venv-{version}"
    stock = ctx.sources.root / f".venv-{version}-stock"
    target = venv_target(built)
    stamp = _overlay_stamp(stock)
    if not (built / "bin" / "python").exists() or target.load_state().env_stamp != stamp:
        edited = inplace_edits(target) if built.exists() else []
        if edited and not force:
            raise BuildError(
                f"{built} must be recreated (its stock venv changed), but it holds in-place edits:\n  "
                + "\n  ".join(edited) + f"\nmove them into rebase/{version}/ (`tools/build.py rebase-resolve`) "
                "or pass --force to discard them"
            )
        log(f"creating {built} (an overlay of {stock})")
        _load_tool("stack").overlay_venv(stock, built)
        target.save_state(BuildState(env_stamp=stamp))
    rebase = _load_tool("rebase")
    files = rebase.rebased_files(ctx.sources, _export_targets(ctx), version, log)
    record = load_record(target.site)
    patches_root = built / REBASED_PATCHES_DIR_NAME
    shutil.rmtree(patches_root, ignore_errors=True)
    for rel, data in files.items():
        original = pristine_bytes(target, record, rel, venv_site_packages(stock))
        if original is None:
            raise BuildError(f"no copy of torch {version}'s {rel} verifies against {record.path}; recreate {stock}")
        patch = make_patch(rel, decode_text(original, rel), decode_text(data, rel))
        if patch:
            write_file(patches_root / f"{rel}.patch", patch.encode("utf-8"))
    sources = dataclasses.replace(ctx.sources, patches_root=patches_root, requirements_file=f"test-{version}.txt")
    return apply_to_tree(sources, target, force=force)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Context:
    sources: Sources
    target: Target
    stock_site: Path | None
    stock_venv: Path | None
    venv: Path | None


def _context(args: argparse.Namespace) -> Context:
    sources = Sources(Path(args.repo).resolve())
    if args.site_packages:
        site = Path(args.site_packages).resolve()
        state_dir = Path(args.state_dir).resolve() if args.state_dir else site.parent
        stock_site = Path(args.stock_site_packages).resolve() if args.stock_site_packages else None
        return Context(sources, Target(site, state_dir), stock_site, None, None)
    venv = Path(args.venv).resolve()
    stock_venv = Path(args.stock_venv).resolve()
    stock_site = Path(args.stock_site_packages).resolve() if args.stock_site_packages else venv_site_packages(stock_venv)
    return Context(sources, venv_target(venv), stock_site, stock_venv, venv)


def _print_changes(changes: list[Change], log: Log) -> None:
    for change in changes:
        log(f"  {change.kind:<15} {change.message}")


def cmd_build(args: argparse.Namespace, log: Log) -> int:
    """Create/refresh the venvs of each --releases entry as needed and apply the change."""
    started = time.monotonic()
    ctx = _context(args)
    others = [v for v in parse_releases(args.releases) if v != TORCH_VERSION]
    if others and ctx.venv is None:
        raise BuildError("--releases other than " + TORCH_VERSION + " build venvs; they cannot be used with --site-packages")
    if ctx.venv is not None and ctx.stock_venv is not None:
        pip_args = shlex.split(args.pip_args or "")

        def guard(venv: Path) -> None:
            if venv != ctx.venv or args.force:
                return
            changes = [c for c in scan_tree(ctx.sources, ctx.target, ctx.stock_site) if c.kind != "module-missing"]
            if changes:
                lines = "\n  ".join(c.message for c in changes)
                raise BuildError(
                    f"requirements changed, so {venv} must be recreated, but it holds edits not in the repo:\n  "
                    f"{lines}\nrun `make refresh` first, or pass --force to discard them"
                )

        stock_venvs = {release_venvs(args, v)[1]: release_requirements(ctx.sources.root, v) for v in others}
        ensure_venvs(ctx.sources, [ctx.venv, ctx.stock_venv, *stock_venvs], pip_args, log, guard, stock_venvs)
    report = apply_to_tree(ctx.sources, ctx.target, force=args.force)
    for line in report.lines():
        log(f"build: {line}")
    log(f"build: torch {TORCH_VERSION} done in {time.monotonic() - started:.1f}s ({ctx.target.site})")
    for version in others:
        report = build_release(ctx, version, args.force, log)
        for line in report.lines():
            log(f"build: torch {version}: {line}")
        log(f"build: torch {version} done in {time.monotonic() - started:.1f}s ({release_venvs(args, version)[0]})")
    return 0


def cmd_refresh(args: argparse.Namespace, log: Log) -> int:
    """Regenerate patches/ and repo modules from in-place edits in .venv."""
    ctx = _context(args)
    if any(v != TORCH_VERSION for v in parse_releases(args.releases)):
        raise BuildError(
            f"patches/ is written against torch {TORCH_VERSION}: refresh edits made in its .venv. An edit that "
            "only another release needs goes into rebase/<release>/ (`tools/build.py rebase-resolve`)"
        )
    changes = refresh_tree(ctx.sources, ctx.target, ctx.stock_site, force=args.force)
    if not changes:
        log("refresh: the repo already matches the installed tree")
        return 0
    log("refresh: changes written to the repo:")
    _print_changes(changes, log)
    if any(c.kind == "module-missing" for c in changes):
        log("refresh: (module-missing entries are not changed by refresh)")
    log("refresh: run `make build` to record the new state")
    return 0


def cmd_check_refreshed(args: argparse.Namespace, log: Log) -> int:
    """Exit non-zero when the installed tree holds edits the repo lacks."""
    ctx = _context(args)
    status = 0
    for version in parse_releases(args.releases):
        if version == TORCH_VERSION:
            continue
        edited = inplace_edits(venv_target(release_venvs(args, version)[0]))
        if edited:
            print(f"check-refreshed: torch {version}'s built venv holds in-place edits (move them into "
                  f"rebase/{version}/ with `tools/build.py rebase-resolve`):\n  " + "\n  ".join(edited), file=sys.stderr)
            status = EXIT_NOT_REFRESHED
    if TORCH_VERSION not in parse_releases(args.releases):
        return status
    changes = scan_tree(ctx.sources, ctx.target, ctx.stock_site)
    if not changes:
        log(f"check-refreshed: {ctx.target.site} matches the repo")
        return status
    print(f"check-refreshed: {ctx.target.site} and the repo differ (run `make refresh`, or `make build` if the repo is newer):",
          file=sys.stderr)
    for change in changes:
        print(f"  {change.kind:<15} {change.message}", file=sys.stderr)
    return EXIT_NOT_REFRESHED


def _load_tool(name: str) -> Any:
    """Import ``tools/<name>.py`` (the stack and rebase logic) by path, once."""
    module_name = f"dtensor_{name}_tool"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = SCRIPT_PATH.parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise BuildError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _export_targets(ctx: Context) -> list[Target]:
    targets = [ctx.target]
    if ctx.stock_site is not None:
        targets.append(Target(ctx.stock_site, ctx.stock_venv or ctx.stock_site.parent))
    return targets


def cmd_export(args: argparse.Namespace, log: Log) -> int:
    """Write dist/: the combined git patch, PR.md and the PR stack (or the stack rebased with --base)."""
    ctx = _context(args)
    targets = _export_targets(ctx)
    out_dir = Path(args.out).resolve() if args.out else ctx.sources.root / "dist"
    if args.base and args.base != TORCH_VERSION:
        rebase = _load_tool("rebase")
        for path in rebase.export_rebased_stack(ctx.sources, targets, args.base, out_dir / f"stack-{args.base}", log):
            log(f"export: wrote {path}")
        log(f"export: verified patch by patch with `git apply --check` against pristine torch {args.base} files")
        return 0
    for path in export(ctx.sources, targets, out_dir):
        log(f"export: wrote {path}")
    log(f"export: verified with `git apply --check` against pristine torch {TORCH_VERSION} files")
    if not args.no_stack:
        stack = _load_tool("stack")
        written = stack.export_stack(ctx.sources, targets, out_dir / "stack", log)
        log(f"export: wrote {len(written)} stacked patches to {out_dir / 'stack'} (applied one by one with git, "
            "ending at the combined patch)")
    return 0


def cmd_check_stack(args: argparse.Namespace, log: Log) -> int:
    """Apply the PR stack step by step to each release's stock torch and run each step's tests."""
    ctx = _context(args)
    if ctx.stock_site is None:
        raise BuildError("check-stack needs the stock venv (`make build`) or --stock-site-packages")
    stack = _load_tool("stack")
    only = [s for s in (args.steps or "").split(",") if s]
    manifest = Path(args.manifest).resolve() if args.manifest else None
    for version in parse_releases(args.releases):
        started = time.monotonic()
        steps = None
        if version == TORCH_VERSION:
            stock_site, stock_dir = ctx.stock_site, ctx.stock_venv or ctx.stock_site.parent
        else:
            if manifest is not None:
                raise BuildError("--manifest tries another layout of the patches/ stack; use it without other releases")
            stock_dir = release_venvs(args, version)[1]
            stock_site = venv_site_packages(stock_dir)
            steps = _load_tool("rebase").rebase_stack(ctx.sources, _export_targets(ctx), version, log).as_stack()
        python = Path(args.python).resolve() if args.python else stock_dir / "bin" / "python"
        if not python.exists():
            raise BuildError(f"{python} does not exist; build the stock venv (`make build`) or pass --python")
        report = None if args.no_report else stack.report_path(ctx.sources.root, stack.STACK_REPORT_NAME, version)
        if manifest is not None:
            report = None  # measurements of another stack layout are not this stack's results
        runs = stack.check_stack(ctx.sources, _export_targets(ctx), stock_site, python, log, only, args.timeout,
                                 report, manifest, args.skip_final_tests, steps, version)
        log(f"check-stack: torch {version}: {len(runs)} step(s) green on their own in "
            f"{time.monotonic() - started:.0f} s" + (f"; results in {report}" if report else ""))
    return 0


def cmd_rebase_resolve(args: argparse.Namespace, log: Log) -> int:
    """Write the three-way merge of one patched file onto --base to edit, or --record the edited file."""
    ctx = _context(args)
    rebase = _load_tool("rebase")
    if args.record:
        rebase.record_resolution(ctx.sources, _export_targets(ctx), args.base, args.file, Path(args.record),
                                 args.note or "", log)
    else:
        work = ctx.sources.root / ".build" / f"rebase-{args.base}"
        rebase.start_resolution(ctx.sources, _export_targets(ctx), args.base, args.file, work, log)
    return 0


def make_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo", default=str(REPO_ROOT), help="repository root (default: this checkout)")
    common.add_argument("--venv", default=os.environ.get("VENV", str(REPO_ROOT / ".venv")),
                        help="venv with the change applied (default: $VENV or .venv)")
    common.add_argument("--stock-venv", default=os.environ.get("STOCK_VENV", str(REPO_ROOT / ".venv-stock")),
                        help="venv with the same pins and no change (default: $STOCK_VENV or .venv-stock)")
    common.add_argument("--site-packages", help="operate on this site-packages tree instead of a venv (no pip)")
    common.add_argument("--state-dir", help="with --site-packages: where pristine copies and the stamp live "
                        "(default: its parent directory)")
    common.add_argument("--stock-site-packages", help="pristine site-packages to take originals from "
                        "(default: the stock venv's)")
    common.add_argument("--releases", default=os.environ.get("RELEASES", TORCH_VERSION),
                        help=f"comma-separated torch releases among {', '.join(RELEASES)} (default: $RELEASES or "
                        f"{TORCH_VERSION}); --venv/--stock-venv are {TORCH_VERSION}'s, another release's venvs are "
                        ".venv-<release> and .venv-<release>-stock")
    parser = argparse.ArgumentParser(prog="tools/build.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", parents=[common], help=cmd_build.__doc__)
    p_build.add_argument("--force", action="store_true", help="rebuild even if up to date and discard in-place edits")
    p_build.add_argument("--pip-args", default=os.environ.get("PIP_ARGS", ""), help="extra arguments for pip install")
    p_build.set_defaults(func=cmd_build)
    p_refresh = sub.add_parser("refresh", parents=[common], help=cmd_refresh.__doc__)
    p_refresh.add_argument("--force", action="store_true", help="refresh even if the repo changed since the last build")
    p_refresh.set_defaults(func=cmd_refresh)
    p_check = sub.add_parser("check-refreshed", parents=[common], help=cmd_check_refreshed.__doc__)
    p_check.set_defaults(func=cmd_check_refreshed)
    p_export = sub.add_parser("export", parents=[common], help=cmd_export.__doc__)
    p_export.add_argument("--out", help="output directory (default: dist/)")
    p_export.add_argument("--base", default=os.environ.get("BASE", ""),
                          help=f"write the stack rebased onto this torch release into <out>/stack-<BASE>/ "
                          f"(default: {TORCH_VERSION}, the full export)")
    p_export.add_argument("--no-stack", action="store_true", help="only the combined patch and PR.md")
    p_export.set_defaults(func=cmd_export)
    p_stack = sub.add_parser("check-stack", parents=[common], help=cmd_check_stack.__doc__)
    p_stack.add_argument("--python", help="interpreter to run the tests with (default: the stock venv's)")
    p_stack.add_argument("--steps", help="comma-separated step slugs to test (default: every step)")
    p_stack.add_argument("--timeout", type=float, default=3600.0,
                         help="seconds allowed per step (default 3600: the last step runs the whole contract suite)")
    p_stack.add_argument("--no-report", action="store_true", help="do not update reports/stack.json")
    p_stack.add_argument("--skip-final-tests", action="store_true",
                         help="last step: import check only (its tree is the combined change `make test` tests)")
    p_stack.add_argument("--manifest", help="try another stack layout (default: tools/stack.toml; not recorded)")
    p_stack.set_defaults(func=cmd_check_stack)
    p_resolve = sub.add_parser("rebase-resolve", parents=[common], help=cmd_rebase_resolve.__doc__)
    p_resolve.add_argument("--base", required=True, help="the newer torch release, e.g. 2.14.1")
    p_resolve.add_argument("--file", required=True, help="the patched upstream file, e.g. torch/distributed/tensor/_ops/utils.py")
    p_resolve.add_argument("--record", help="store this edited file as the resolution (rebase/<base>/<file>.patch)")
    p_resolve.add_argument("--note", help="with --record: why the resolution looks as it does (kept in its header)")
    p_resolve.set_defaults(func=cmd_rebase_resolve)
    return parser


def main(argv: Sequence[str] | None = None, log: Log = _print_log) -> int:
    args = make_parser().parse_args(argv)
    try:
        return int(args.func(args, log))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
