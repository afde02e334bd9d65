"""The change as a stack of reviewable patches, derived from the repo at export time.

``tools/stack.toml`` says which step each changed file belongs to (and, where a
patch must be split, which of its hunks); the contents always come from the
repo's current ``patches/``, ``torch/`` and ``test/``. Nothing here stores a
copy of a step: the stack is recomputed on every run, so engineers can keep
changing patches, and a file the manifest does not place fails the run by name.

``export_stack``
    ``dist/stack/NNNN-<slug>.patch``: one ``git format-patch`` style file per
    step (subject, description, diff), verified by ``git apply --check`` and
    ``git apply`` one after the other on a pristine tree; the tree at the end
    must equal what the combined patch gives.
``check_stack``
    Applies the steps one at a time on a scratch overlay of the stock venv's
    ``torch/distributed/tensor`` and ``torch/testing/_internal/distributed``
    (the rest of torch is symlinked from the stock install, never copied or
    reinstalled) and runs the tests each step adds or names; the measurements
    go to ``reports/stack.json`` and fill the ``{check_stack}`` placeholder of
    that step's description on the next export.

The build tool (``tools/build.py``) owns the diff machinery and the pristine
sources; this module is loaded by it (``load_build_tool`` returns the same
module object the caller uses, so ``BuildError`` is one class).
"""

from __future__ import annotations

import dataclasses
import datetime
import fnmatch
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType

BUILD_TOOL_MODULE = "dtensor_build_tool"
MANIFEST_NAME = "stack.toml"
STACK_REPORT_NAME = "stack.json"
STACK_REPORT_FORMAT = 1
#: Directories of the stock install a check-stack overlay holds as real copies.
OVERLAY_DIRS: tuple[str, ...] = ("torch/distributed/tensor", "torch/testing/_internal/distributed")
#: Placeholders a step's ``results`` text may use, filled at export time.
PLACEHOLDERS: tuple[str, ...] = ("check_stack", "audit", "bench")
DESCRIPTION_FIELDS: tuple[str, ...] = ("what", "why", "downstream", "test_plan", "results")
_SLUG_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_HUNKS_RE = re.compile(r"^(?P<path>[^#]+)#(?P<hunks>\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*)$")


def load_build_tool() -> ModuleType:
    """The build tool module, the one already imported if there is one.

    ``tools/build.py`` registers itself under :data:`BUILD_TOOL_MODULE`, so a
    caller that runs it as a script and this module share one ``BuildError``.
    """
    existing = sys.modules.get(BUILD_TOOL_MODULE)
    if existing is not None:
        return existing
    path = Path(__file__).resolve().parent / "build.py"
    spec = importlib.util.spec_from_file_location(BUILD_TOOL_MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the build tool from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[BUILD_TOOL_MODULE] = module
    spec.loader.exec_module(module)
    return module


bt = load_build_tool()
BuildError = bt.BuildError


# ---------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """One step as the manifest states it (paths, globs or hunk selections)."""

    slug: str
    title: str
    files: tuple[str, ...]
    run: tuple[str, ...]
    text: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: Path
    steps: tuple[StepSpec, ...]


def _parse_hunk_ranges(text: str, where: str) -> frozenset[int]:
    hunks: set[int] = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        first, last = int(low), int(high or low)
        if first < 1 or last < first:
            raise BuildError(f"{where}: bad hunk range {part!r} (hunks count from 1, low-high)")
        hunks.update(range(first, last + 1))
    return frozenset(hunks)


def load_manifest(path: Path) -> Manifest:
    """Parse and sanity-check ``tools/stack.toml``."""
    if not path.is_file():
        raise BuildError(f"{path} is missing: it defines the PR stack (see README, 'PR stack')")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise BuildError(f"{path}: not valid TOML ({exc})") from exc
    steps_raw = raw.get("step")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise BuildError(f"{path}: no [[step]] tables")
    steps: list[StepSpec] = []
    seen: set[str] = set()
    for number, entry in enumerate(steps_raw, 1):
        where = f"{path}: step {number}"
        unknown = set(entry) - {"slug", "title", "files", "run", *DESCRIPTION_FIELDS}
        if unknown:
            raise BuildError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        slug = entry.get("slug", "")
        if not isinstance(slug, str) or not _SLUG_RE.match(slug):
            raise BuildError(f"{where}: slug {slug!r} must be lower-case letters, digits and dashes")
        if slug in seen:
            raise BuildError(f"{where}: slug {slug!r} is used twice")
        seen.add(slug)
        title = entry.get("title")
        if not isinstance(title, str) or not title.strip() or "\n" in title:
            raise BuildError(f"{where} ({slug}): title must be one non-empty line")
        files = entry.get("files", [])
        run = entry.get("run", [])
        for name, value in (("files", files), ("run", run)):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise BuildError(f"{where} ({slug}): {name} must be a list of strings")
        if not files:
            raise BuildError(f"{where} ({slug}): files is empty")
        text: dict[str, str] = {}
        for field in DESCRIPTION_FIELDS:
            value = entry.get(field)
            if not isinstance(value, str) or not value.strip():
                raise BuildError(f"{where} ({slug}): `{field}` text is missing")
            for line in value.splitlines():
                if line.strip() == "---" or line.startswith("diff --git"):
                    raise BuildError(f"{where} ({slug}): `{field}` holds {line!r}, which would end a patch's message")
            text[field] = value.strip("\n")
        steps.append(StepSpec(slug, title.strip(), tuple(files), tuple(run), text))
    return Manifest(path, tuple(steps))


# ---------------------------------------------------------------------------
# Deriving the stack from the repo
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    """One derived step: which files it changes and the tree after it."""

    number: int
    spec: StepSpec
    changed: tuple[str, ...]
    tests: tuple[str, ...]
    before: Mapping[str, bytes | None]
    after: Mapping[str, bytes | None]

    @property
    def slug(self) -> str:
        return self.spec.slug

    @property
    def file_name(self) -> str:
        return f"{self.number:04d}-{self.slug}.patch"

    def digest(self) -> str:
        """Hash of the tree after this step and the tests it runs (staleness of a measurement)."""
        digest = hashlib.sha256()
        for rel in sorted(self.after):
            data = self.after[rel]
            digest.update(f"{rel}\0{'-' if data is None else len(data)}\0".encode())
            digest.update(data or b"")
        digest.update("\0".join(self.tests).encode())
        return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Stack:
    manifest: Manifest
    steps: tuple[Step, ...]
    originals: Mapping[str, bytes]
    results: Mapping[str, bytes]

    @property
    def total(self) -> int:
        return len(self.steps)


def _is_test(rel: str) -> bool:
    return rel.startswith("test/") and Path(rel).name.startswith("test_") and rel.endswith(".py")


def assign_files(
    manifest: Manifest, changed: Sequence[str], hunk_counts: Mapping[str, int]
) -> dict[str, dict[int, frozenset[int] | None]]:
    """Map each changed file to {step index: hunks (None = whole file)}.

    Exact paths win over globs; a file must be placed by exactly one exact
    entry, or by hunk selections covering each of its hunks once, or else by
    exactly one glob. Anything else is an error naming the file.
    """
    exact: dict[str, dict[int, frozenset[int] | None]] = {}
    globs: list[tuple[int, str]] = []
    problems: list[str] = []
    changed_set = set(changed)
    for index, spec in enumerate(manifest.steps):
        for entry in spec.files:
            match = _HUNKS_RE.match(entry)
            if match:
                rel = match.group("path")
                if rel not in hunk_counts:
                    problems.append(f"step {spec.slug}: {entry!r} selects hunks of {rel}, which has no patch in patches/")
                    continue
                hunks = _parse_hunk_ranges(match.group("hunks"), f"step {spec.slug}: {entry!r}")
                slot = exact.setdefault(rel, {})
                if None in slot.values() or index in slot:
                    problems.append(f"{rel} is placed twice (step {spec.slug})")
                slot[index] = hunks
            elif any(ch in entry for ch in "*?["):
                globs.append((index, entry))
            elif entry not in changed_set:
                problems.append(
                    f"step {spec.slug} names {entry}, which is neither patched (patches/{entry}.patch) nor a "
                    "new module or test in the repo: update tools/stack.toml"
                )
            else:
                slot = exact.setdefault(entry, {})
                if slot:
                    earlier = ", ".join(manifest.steps[i].slug for i in slot)
                    problems.append(f"{entry} is placed by two steps ({earlier} and {spec.slug})")
                slot[index] = None
    placed: dict[str, dict[int, frozenset[int] | None]] = {}
    unassigned: list[str] = []
    for rel in changed:
        if rel in exact:
            slot = exact[rel]
            if any(h is not None for h in slot.values()):
                count = hunk_counts[rel]
                covered: list[int] = sorted(h for hunks in slot.values() if hunks is not None for h in hunks)
                if covered != list(range(1, count + 1)):
                    problems.append(
                        f"{rel}: the hunk selections cover hunks {covered} but its patch has hunks 1-{count}; "
                        "each hunk must belong to exactly one step"
                    )
            placed[rel] = slot
            continue
        hits = [index for index, pattern in globs if fnmatch.fnmatchcase(rel, pattern)]
        if len(hits) > 1:
            problems.append(f"{rel} matches globs of several steps ({', '.join(manifest.steps[i].slug for i in hits)})")
        elif hits:
            placed[rel] = {hits[0]: None}
        else:
            unassigned.append(rel)
    if unassigned:
        problems.append(
            "not assigned to any step of tools/stack.toml (add each to the `files` of the step it belongs to):\n    "
            + "\n    ".join(unassigned)
        )
    if problems:
        raise BuildError(f"{manifest.path}: the stack does not cover the change:\n  " + "\n  ".join(problems))
    return placed


def derive_stack(sources: Any, targets: Sequence[Any], manifest_path: Path | None = None) -> Stack:
    """The stack for the repo as it is now (see the module docstring)."""
    manifest = load_manifest(manifest_path or sources.root / "tools" / MANIFEST_NAME)
    _, originals, results = bt.build_export_patch(sources, targets)
    patches = sources.patches()
    parsed = {rel: sources.read_patch(rel, path) for rel, path in patches.items()}
    hunk_counts = {rel: len(patch.hunks) for rel, patch in parsed.items()}
    changed = sorted(results)
    placed = assign_files(manifest, changed, hunk_counts)
    state: dict[str, bytes | None] = {rel: originals.get(rel) for rel in changed}
    applied: dict[str, set[int]] = {rel: set() for rel in changed}
    steps: list[Step] = []
    for index, spec in enumerate(manifest.steps):
        before = dict(state)
        touched: list[str] = []
        for rel in changed:
            if index not in placed[rel]:
                continue
            hunks = placed[rel][index]
            touched.append(rel)
            if hunks is None:
                state[rel] = results[rel]
                continue
            applied[rel].update(hunks)
            if applied[rel] == set(range(1, hunk_counts[rel] + 1)):
                state[rel] = results[rel]
                continue
            subset = dataclasses.replace(parsed[rel], hunks=tuple(h for h in parsed[rel].hunks if h.index in applied[rel]))
            text = bt.apply_patch(subset, bt.decode_text(originals[rel], rel), rel)
            state[rel] = text.encode("utf-8")
        if not touched:
            raise BuildError(f"step {spec.slug} of {manifest.path} changes no file: give it files or remove it")
        tests = [rel for rel in touched if _is_test(rel)]
        for entry in spec.run:
            hits = sorted(rel for rel in changed if fnmatch.fnmatchcase(rel, entry) and state[rel] is not None)
            if not hits and not any(ch in entry for ch in "*?["):
                raise BuildError(f"step {spec.slug} runs {entry}, which the stack has not added by then")
            tests.extend(h for h in hits if h not in tests)
        steps.append(Step(index + 1, spec, tuple(touched), tuple(tests), before, dict(state)))
    if any(state[rel] != results[rel] for rel in changed):
        raise BuildError("internal error: the stack's last step does not reproduce the combined change")
    return Stack(manifest, tuple(steps), originals, results)


# ---------------------------------------------------------------------------
# Rendering the patches
# ---------------------------------------------------------------------------


def step_diff(step: Step) -> str:
    """The ``diff --git`` entries that take ``step.before`` to ``step.after``."""
    entries: list[str] = []
    for rel in step.changed:
        old, new = step.before[rel], step.after[rel]
        if old == new:
            continue
        if new is None:
            raise BuildError(f"step {step.slug} would delete {rel}; the stack only adds and edits files")
        if old is None:
            entries.append(bt.git_new_file_entry(rel, bt.decode_text(new, rel)))
        else:
            entries.append(bt.git_modified_entry(rel, bt.decode_text(old, rel), bt.decode_text(new, rel)))
    return "".join(entries)


def _diffstat(step: Step) -> str:
    lines: list[str] = []
    total_add = total_del = 0
    for rel in step.changed:
        old = bt.split_lines(bt.decode_text(step.before[rel] or b"", rel))
        new = bt.split_lines(bt.decode_text(step.after[rel] or b"", rel))
        diff = bt.make_patch(rel, "".join(old), "".join(new))
        add = sum(1 for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
        rem = sum(1 for line in diff.splitlines() if line.startswith("-") and not line.startswith("---"))
        total_add, total_del = total_add + add, total_del + rem
        lines.append(f" {rel} | {add + rem} {'+' * min(add, 30)}{'-' * min(rem, 30)}")
    noun = "file" if len(step.changed) == 1 else "files"
    lines.append(f" {len(step.changed)} {noun} changed, {total_add} insertions(+), {total_del} deletions(-)")
    return "\n".join(lines)


def _fill(text: str, values: Mapping[str, str], where: str) -> str:
    def repl(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise BuildError(f"{where}: unknown placeholder {{{key}}} (known: {', '.join(PLACEHOLDERS)})")
        return values[key]

    return re.sub(r"\{([a-z_]+)\}", repl, text)


def check_stack_result(step: Step, report: Mapping[str, Any] | None) -> str:
    """What ``make check-stack`` measured for exactly this step's content, or why there is nothing."""
    entry = None if report is None else report.get("steps", {}).get(step.slug)  # type: ignore[union-attr]
    if not isinstance(entry, dict):
        return "Not measured yet: run `make check-stack`."
    if entry.get("digest") != step.digest():
        return (
            f"Not measured for this content: `make check-stack` last ran on {entry.get('date', '?')} "
            "before the step's files changed; run it again."
        )
    tests = entry.get("tests") or []
    base = report.get("torch", "?") if report else "?"
    ran = ", ".join(f"`{Path(t).name}`" for t in tests) if tests else "no test file (import check only)"
    return (
        f"`make check-stack` on {entry.get('date')}: steps 1-{step.number} applied to torch {base}; "
        f"{ran}: {entry.get('summary')} ({entry.get('seconds')} s wall)."
    )


def _bench_table(report: Path) -> str:
    if not report.is_file():
        return "no benchmark report found; run `make bench`"
    rows = ["| benchmark | stock | built | built/stock | target |", "|---|---|---|---|---|"]
    for entry in json.loads(report.read_text(encoding="utf-8")):
        rows.append(
            f"| `{entry['name']}` | {entry['stock_s']:.4g} s | {entry['built_s']:.4g} s | "
            f"{entry['ratio']:.3f} | <= {entry['target']} |"
        )
    return "\n".join(rows) + f"\n\n(measured with the whole stack applied; {report.as_posix()})"


def render_message(step: Step, total: int, values: Mapping[str, str]) -> str:
    """The PR description of one step: what, why, what downstream code gains, test plan, results."""
    where = f"step {step.slug}"
    sections = [
        ("What", "what"),
        ("Why", "why"),
        ("Downstream", "downstream"),
        ("Test plan", "test_plan"),
        ("Results", "results"),
    ]
    body = "\n\n".join(f"## {heading}\n\n{_fill(step.spec.text[key], values, where).strip()}" for heading, key in sections)
    return f"Stack: {step.number} of {total}\n\n{body}\n"


def render_step_patch(step: Step, total: int, values: Mapping[str, str], author: str, date: str, base: str) -> str:
    """One step as a ``git format-patch`` style file (``git am`` and ``git apply`` both take it)."""
    diff = step_diff(step)
    if not diff:
        raise BuildError(f"step {step.slug} changes nothing against torch {base}")
    return (
        f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
        f"From: {author}\n"
        f"Date: {date}\n"
        f"Subject: [PATCH {step.number}/{total}] {step.spec.title}\n\n"
        f"{render_message(step, total, values)}"
        f"---\n{_diffstat(step)}\n\n"
        f"{diff}"
        "-- \n"
        f"torch {base}\n"
    )


def _author_and_date(root: Path) -> tuple[str, str]:
    """Identity and date of the repo's HEAD commit, so an export is reproducible for one commit."""
    proc = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%an <%ae>%n%aD"],
        capture_output=True, text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and len(lines) == 2:
        return lines[0], lines[1]
    return "DTensor strategy contract <noreply@localhost>", "Thu, 1 Jan 1970 00:00:00 +0000"


def report_path(root: Path, name: str, version: str | None = None) -> Path:
    """``reports/<name>`` for ``bt.TORCH_VERSION``, ``reports/<stem>-<version><suffix>`` for another release."""
    path = root / "reports" / name
    if version is None or version == bt.TORCH_VERSION:
        return path
    return path.with_name(f"{path.stem}-{version}{path.suffix}")


def placeholder_values(sources: Any, step: Step, report: Mapping[str, Any] | None, version: str | None = None) -> dict[str, str]:
    return {
        "check_stack": check_stack_result(step, report),
        "audit": bt._audit_tables(report_path(sources.root, "audit.md", version)).strip(),
        "bench": _bench_table(report_path(sources.root, "bench.json", version)),
    }


def load_stack_report(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise BuildError(f"{path} is not JSON ({exc}); delete it and run `make check-stack`") from exc
    return doc if isinstance(doc, dict) and doc.get("format") == STACK_REPORT_FORMAT else None


# ---------------------------------------------------------------------------
# Verification with git
# ---------------------------------------------------------------------------


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def verify_series(
    patch_files: Sequence[Path],
    originals: Mapping[str, bytes],
    expected_after: Sequence[Mapping[str, bytes | None]],
    base: str,
) -> None:
    """``git apply --check`` then ``git apply`` each patch in order on a pristine tree.

    After patch k the tree must hold exactly ``expected_after[k]``.
    """
    git = shutil.which("git")
    if git is None:
        raise BuildError("git is not installed; it is needed to verify the stack")
    with tempfile.TemporaryDirectory(prefix="dtensor-stack-") as tmp:
        root = Path(tmp)
        subprocess.run([git, "init", "-q", str(root)], check=True, env=_git_env())
        for rel, data in originals.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        for patch_file, expected in zip(patch_files, expected_after, strict=True):
            for args in (["--check"], []):
                proc = subprocess.run(
                    [git, "apply", *args, "--whitespace=nowarn", str(patch_file.resolve())],
                    cwd=root, env=_git_env(), capture_output=True, text=True,
                )
                if proc.returncode != 0:
                    raise BuildError(
                        f"`git apply {' '.join(args)}` rejected {patch_file.name} on torch {base} with the earlier "
                        f"steps applied:\n{proc.stderr.strip()}"
                    )
            for rel, want in expected.items():
                path = root / rel
                got = path.read_bytes() if path.is_file() else None
                if got != want:
                    raise BuildError(f"after {patch_file.name}, git's {rel} differs from the stack's")


# ---------------------------------------------------------------------------
# export
# ---------------------------------------------------------------------------


def write_series(
    out_dir: Path,
    steps: Sequence[Step],
    messages: Sequence[Mapping[str, str]],
    author: str,
    date: str,
    base: str,
) -> list[Path]:
    """Write the numbered patches and ``series`` into ``out_dir`` (old patches removed)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("[0-9][0-9][0-9][0-9]-*.patch"):
        old.unlink()
    written: list[Path] = []
    for step, values in zip(steps, messages, strict=True):
        path = out_dir / step.file_name
        bt.write_file(path, render_step_patch(step, len(steps), values, author, date, base).encode("utf-8"))
        written.append(path)
    series = out_dir / "series"
    bt.write_file(series, "".join(f"{p.name}\n" for p in written).encode("utf-8"))
    return written


def export_stack(sources: Any, targets: Sequence[Any], out_dir: Path, log: Callable[[str], None]) -> list[Path]:
    """Write and verify ``out_dir`` (the numbered patches of torch's own version)."""
    stack = derive_stack(sources, targets)
    report = load_stack_report(sources.root / "reports" / STACK_REPORT_NAME)
    author, date = _author_and_date(sources.root)
    messages = [placeholder_values(sources, step, report) for step in stack.steps]
    written = write_series(out_dir, stack.steps, messages, author, date, bt.TORCH_VERSION)
    verify_series(written, stack.originals, [s.after for s in stack.steps], bt.TORCH_VERSION)
    for step, values in zip(stack.steps, messages, strict=True):
        if values["check_stack"].startswith("Not measured"):
            log(f"export: note: step {step.number} ({step.slug}) has no current check-stack measurement")
    return written


# ---------------------------------------------------------------------------
# check-stack
# ---------------------------------------------------------------------------


def build_overlay(stock_site: Path, overlay: Path, copied: Sequence[str] = OVERLAY_DIRS) -> None:
    """A site directory whose ``torch`` is the stock one but for real copies of ``copied``.

    Directories on the way down to a copied one are real; every other entry is
    a symlink into the stock install, so torch's binaries are never copied and
    the stock venv is never written to.
    """
    real_dirs = {"/".join(Path(d).parts[:i]) for d in copied for i in range(1, len(Path(d).parts))}
    for rel in sorted(real_dirs, key=lambda r: r.count("/")):
        src = stock_site / rel
        if not src.is_dir():
            raise BuildError(f"{src} is missing; build the stock venv first (`make build`)")
        (overlay / rel).mkdir(parents=True, exist_ok=True)
        for entry in sorted(src.iterdir()):
            child = f"{rel}/{entry.name}"
            if child in real_dirs or child in copied or entry.name == "__pycache__":
                continue
            (overlay / child).symlink_to(entry)
    for rel in copied:
        if not (stock_site / rel).is_dir():
            raise BuildError(f"{stock_site / rel} is missing; build the stock venv first (`make build`)")
        shutil.copytree(stock_site / rel, overlay / rel, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


#: The ``.pth`` file through which an overlay venv sees the rest of the stock install.
OVERLAY_PTH = "_dtensor_stock_site.pth"


def overlay_venv(stock_venv: Path, venv: Path) -> Path:
    """A venv at ``venv`` whose torch is ``stock_venv``'s but for real copies of DTensor's directories.

    Its site-packages holds the overlay of :func:`build_overlay` and torch's
    dist-info (linked, so RECORD verifies the copies), and a ``.pth`` puts the
    stock site-packages after it for every other package. It costs no pip
    install and no copy of torch's binaries, and no ``PYTHONPATH`` is needed,
    so a stock interpreter started from it sees stock torch. Returns the site.
    """
    stock_site = bt.venv_site_packages(stock_venv)
    dist_infos = sorted(stock_site.glob("torch-*.dist-info"))
    if len(dist_infos) != 1:
        raise BuildError(f"{stock_site} holds {len(dist_infos)} torch dist-info directories; build the stock venv first")
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = bt.venv_site_packages(venv)
    build_overlay(stock_site, site)
    (site / dist_infos[0].name).symlink_to(dist_infos[0])
    (site / OVERLAY_PTH).write_text(f"{stock_site}\n", encoding="utf-8")
    return site


_CONFTEST = '''\
"""Written by tools/stack.py: fail at once unless torch's DTensor comes from the overlay."""
import importlib
import torch.distributed.tensor

OVERLAY = {overlay!r}
if not torch.distributed.tensor.__file__.startswith(OVERLAY):
    raise RuntimeError(f"torch.distributed.tensor was imported from {{torch.distributed.tensor.__file__}}, not {{OVERLAY}}")
for name in {modules!r}:
    importlib.import_module(name)
'''


def _module_names(state: Mapping[str, bytes | None]) -> list[str]:
    return sorted(
        rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for rel, data in state.items()
        if data is not None and rel.startswith("torch/") and rel.endswith(".py")
    )


_SUMMARY_RE = re.compile(r"^=*\s*(?P<summary>\d+ [a-z][^\n]*?) in [\d.]+s\b", re.MULTILINE)


@dataclasses.dataclass
class StepRun:
    slug: str
    ok: bool
    summary: str
    seconds: float
    tests: list[str]
    output_tail: str
    skipped: list[str] = dataclasses.field(default_factory=list)  # pytest's "SKIPPED [n] where: reason" lines


def run_step(python: Path, overlay: Path, work: Path, step: Step, timeout: float, tests: bool = True) -> StepRun:
    """Install ``step.after`` into the overlay and run the step's tests with ``python``.

    Without ``tests`` only the import check runs. ``python`` (the stock
    interpreter) is also handed to tests that compare against stock torch in a
    subprocess, as ``DTENSOR_STOCK_PYTHON``; they start it without the overlay.
    """
    if not tests:
        step = dataclasses.replace(step, tests=())
    for rel, data in step.after.items():
        target = (overlay if rel.startswith("torch/") else work) / rel
        if data is None:
            target.unlink(missing_ok=True)
        else:
            bt.write_file(target, data)
    (work / "conftest.py").write_text(
        _CONFTEST.format(overlay=str(overlay), modules=_module_names(step.after)), encoding="utf-8"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(overlay),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "DTENSOR_STOCK_PYTHON": str(python),
    }
    if step.tests:
        cmd = [str(python), "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(work), *step.tests]
    else:
        cmd = [str(python), "-c", "import conftest; print('import check passed')"]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
        output, code = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        partial = [b.decode(errors="replace") if isinstance(b, bytes) else (b or "") for b in (exc.stdout, exc.stderr)]
        output, code = f"{''.join(partial)}\ntimed out after {timeout:.0f} s", -1
    seconds = round(time.monotonic() - started, 1)
    if step.tests:
        match = None
        for match in _SUMMARY_RE.finditer(output):
            pass
        summary = match.group("summary") if match else "no pytest summary"
    else:
        summary = "import check passed" if code == 0 else "import check failed"
    tail = "\n".join(output.strip().splitlines()[-40:])
    skipped = [line.strip() for line in output.splitlines() if line.startswith("SKIPPED ")]
    return StepRun(step.slug, code == 0, summary, seconds, list(step.tests), tail, skipped)


def check_stack(
    sources: Any,
    targets: Sequence[Any],
    stock_site: Path,
    python: Path,
    log: Callable[[str], None],
    only: Sequence[str] = (),
    timeout: float = 3600.0,
    report_path: Path | None = None,
    manifest_path: Path | None = None,
    skip_final_tests: bool = False,
    stack: Stack | None = None,
    version: str | None = None,
) -> list[StepRun]:
    """Run every step's tests on stock torch with steps 1..k applied (see the module docstring).

    ``stock_site`` is the stock install of the release the steps are for and
    ``python`` its interpreter; ``stack`` the steps (default: derived from ``patches/``, the
    ``bt.TORCH_VERSION`` stack; the rebased stack for another ``version``).
    ``only`` limits the test runs to some step slugs (the tree is still
    built up through every earlier step). ``skip_final_tests`` runs only the
    import check for the last step. Raises when any step fails.
    """
    stack = stack or derive_stack(sources, targets, manifest_path)
    version = version or bt.TORCH_VERSION
    unknown = sorted(set(only) - {s.slug for s in stack.steps})
    if unknown:
        raise BuildError(f"unknown step(s) {', '.join(unknown)}; the manifest has {', '.join(s.slug for s in stack.steps)}")
    runs: list[StepRun] = []
    with tempfile.TemporaryDirectory(prefix="dtensor-check-stack-") as tmp:
        overlay, work = Path(tmp) / "site", Path(tmp) / "work"
        work.mkdir()
        build_overlay(stock_site, overlay)
        for step in stack.steps:
            if only and step.slug not in only:
                for rel, data in step.after.items():
                    if data is not None:
                        bt.write_file((overlay if rel.startswith("torch/") else work) / rel, data)
                continue
            with_tests = not (skip_final_tests and step is stack.steps[-1])
            run = run_step(python, overlay, work, step, timeout, with_tests)
            if with_tests:
                runs.append(run)
            elif not run.ok:
                runs.append(run)
            else:
                run.summary += " (its tests are `make test`'s)"
            status = "ok  " if run.ok else "FAIL"
            log(f"check-stack: torch {version}: {status} {step.number}/{stack.total} {step.slug}: {run.summary} "
                f"({run.seconds} s)")
            if not run.ok:
                log("    " + run.output_tail.replace("\n", "\n    "))
            for line in run.skipped:
                log(f"    {line}")
        final = dict(stack.steps[-1].after)
        if final != dict(stack.results):
            raise BuildError("the stack's last step differs from dist's combined patch")
    if report_path is not None:
        _record_runs(report_path, stack, runs, version)
    failed = [r.slug for r in runs if not r.ok]
    if failed:
        raise BuildError(f"check-stack: step(s) failed on their own: {', '.join(failed)}")
    return runs


def _record_runs(path: Path, stack: Stack, runs: Sequence[StepRun], version: str) -> None:
    """Merge these runs into the release's stack report (only green runs count as results)."""
    report = load_stack_report(path) or {"format": STACK_REPORT_FORMAT, "steps": {}}
    report["torch"] = version
    steps = {s.slug: s for s in stack.steps}
    kept = {slug: entry for slug, entry in report.get("steps", {}).items() if slug in steps}
    date = datetime.date.today().isoformat()
    for run in runs:
        if not run.ok:
            kept.pop(run.slug, None)
            continue
        kept[run.slug] = {
            "digest": steps[run.slug].digest(),
            "date": date,
            "tests": run.tests,
            "summary": run.summary,
            "seconds": run.seconds,
        }
    report["steps"] = {s.slug: kept[s.slug] for s in stack.steps if s.slug in kept}
    path.parent.mkdir(parents=True, exist_ok=True)
    bt.write_file(path, (json.dumps(report, indent=1) + "\n").encode("utf-8"))
