"""The change rebased onto another torch release (2.14.1, the PR's base), from that release's sources.

The release's sources are its ``torch/distributed/tensor/`` and
``torch/testing/_internal/distributed/`` files, each checked against RECORD: read
from the repo's stock venv of that release (``.venv-<release>-stock``, which
``make build`` installs) when it exists, else from its wheel, which ``pip download
--no-deps`` fetches once into a cache outside the repo (``$DTENSOR_WHEEL_CACHE`` or
``~/.cache/dtensor-wheels``). ``rebased_files`` gives the patched files of the whole
change on that release, which ``tools/build.py build`` installs into the release's
built venv; ``export_rebased_stack`` writes the stack step by step.

Each patched file is rebased by a three-way merge (``git merge-file``): the
2.13.0 original is the base, the newer release's file is theirs, the 2.13.0 file
with the change is ours. A conflict fails loudly unless the repo holds a
resolution, ``rebase/<version>/<upstream path>.patch``: the resolved file as a
diff against the newer release's file, headed by the sha256 of the three inputs it
was made from. A resolution whose inputs changed is stale and fails, naming the
file; ``tools/build.py rebase-resolve`` writes the conflicted merge to edit and
records the edited file. New modules and tests are carried over unchanged (a
release that already has such a file fails the rebase).
"""

from __future__ import annotations

import ast
import base64
import csv
import dataclasses
import hashlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from types import ModuleType

#: Members of the newer wheel the rebase reads.
SOURCE_PREFIXES: tuple[str, ...] = ("torch/distributed/tensor/", "torch/testing/_internal/distributed/")
RESOLUTIONS_DIR_NAME = "rebase"
_HASH_KEYS: tuple[str, ...] = ("base", "ours", "theirs")
#: A resolution holding this line and no diff keeps the release's file as it is.
TAKE_THEIRS = "take: theirs (the release already holds what the change did to this file)"


def _load_stack() -> ModuleType:
    """tools/stack.py, the copy already imported by the build tool if there is one."""
    existing = sys.modules.get("dtensor_stack_tool")
    if existing is not None:
        return existing
    path = Path(__file__).resolve().parent / "stack.py"
    spec = importlib.util.spec_from_file_location("dtensor_stack_tool", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["dtensor_stack_tool"] = module
    spec.loader.exec_module(module)
    return module


st = _load_stack()
bt = st.bt
BuildError = bt.BuildError
Log = Callable[[str], None]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------
# The newer release's sources
# ---------------------------------------------------------------------------


def wheel_cache() -> Path:
    """Where downloaded wheels and their extracted sources are kept (outside the repo)."""
    return Path(os.environ.get("DTENSOR_WHEEL_CACHE", Path.home() / ".cache" / "dtensor-wheels"))


def find_wheel(version: str, cache: Path, log: Log, download: bool = True) -> Path:
    """The cached ``torch-<version>`` wheel for this Python; downloaded once with pip if missing."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    pattern = f"torch-{version}-{tag}-{tag}-*.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[-1]
    if not download:
        raise BuildError(f"no {pattern} in {cache}")
    cache.mkdir(parents=True, exist_ok=True)
    log(f"rebase: downloading the torch=={version} wheel (for its sources; no stock venv of it) into {cache}")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"torch=={version}", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(cache.glob(pattern))
    if proc.returncode != 0 or not found:
        tail = "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BuildError(f"`{' '.join(cmd)}` did not give a {pattern} (exit {proc.returncode}):\n    {tail}")
    return found[-1]


def read_wheel_sources(wheel: Path, prefixes: Sequence[str] = SOURCE_PREFIXES) -> dict[str, bytes]:
    """The wheel's members under ``prefixes``, each verified against its RECORD."""
    try:
        archive = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as exc:
        raise BuildError(f"{wheel} is not a wheel ({exc}); delete it and run again") from exc
    with archive:
        records = [n for n in archive.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            raise BuildError(f"{wheel}: expected one *.dist-info/RECORD, found {len(records)}")
        digests: dict[str, str] = {}
        for row in csv.reader(io.StringIO(archive.read(records[0]).decode("utf-8"))):
            if len(row) > 1 and row[1].startswith("sha256="):
                digests[row[0]] = row[1][len("sha256="):]
        files: dict[str, bytes] = {}
        for name in archive.namelist():
            if not name.startswith(tuple(prefixes)) or name.endswith("/") or "__pycache__" in name:
                continue
            data = archive.read(name)
            expected = digests.get(name)
            got = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")
            if expected != got:
                raise BuildError(f"{wheel}: {name} does not match the wheel's RECORD (expected {expected}, got {got})")
            files[name] = data
    if not files:
        raise BuildError(f"{wheel} holds nothing under {', '.join(prefixes)}")
    return files


def stock_site(root: Path, version: str) -> Path | None:
    """The site-packages of the repo's stock venv of ``version``, if it is installed."""
    site = bt.venv_site_packages(root / f".venv-{version}-stock")
    return site if any(site.glob(f"torch-{version}*.dist-info")) else None


def installed_sources(site: Path, prefixes: Sequence[str] = SOURCE_PREFIXES) -> dict[str, bytes]:
    """The installed release's files under ``prefixes``, each verified against its RECORD."""
    record = bt.load_record(site)
    files: dict[str, bytes] = {}
    for rel in sorted(record.digests):
        if rel.startswith(tuple(prefixes)) and "__pycache__" not in rel:
            data = (site / rel).read_bytes()
            record.expect(rel, data, site / rel)
            files[rel] = data
    if not files:
        raise BuildError(f"{record.path} lists nothing under {', '.join(prefixes)}")
    return files


def release_sources(version: str, log: Log, cache: Path | None = None, root: Path | None = None) -> dict[str, bytes]:
    """``torch/distributed/tensor`` and ``torch/testing/_internal/distributed`` of release ``version``.

    From the repo's stock venv of ``version`` when ``root`` has one; else from the
    wheel, extracted once into ``<cache>/torch-<version>-sources/`` (the members
    the rebase reads and nothing else), which later runs read.
    """
    site = stock_site(root, version) if root is not None else None
    if site is not None:
        return installed_sources(site)
    cache = cache or wheel_cache()
    wheel = find_wheel(version, cache, log)
    extracted = cache / f"torch-{version}-sources"
    stamp = extracted / ".from-wheel"
    wanted = f"{wheel.name} {wheel.stat().st_size}\n"
    if stamp.is_file() and stamp.read_text() == wanted:
        return {p.relative_to(extracted).as_posix(): p.read_bytes() for p in bt.walk_files(extracted)}
    files = read_wheel_sources(wheel)
    tmp = Path(tempfile.mkdtemp(prefix=f".torch-{version}-", dir=cache))
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    (tmp / ".from-wheel").write_text(wanted)
    shutil.rmtree(extracted, ignore_errors=True)
    os.replace(tmp, extracted)
    log(f"rebase: extracted {len(files)} files of {wheel.name} into {extracted}")
    return files


# ---------------------------------------------------------------------------
# Three-way merge and stored resolutions
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Merge:
    text: str
    conflicts: int


def merge3(rel: str, base: bytes, ours: bytes, theirs: bytes, version: str) -> Merge:
    """``git merge-file`` of ``rel``: our change and ``version``'s, both against 2.13.0."""
    git = shutil.which("git")
    if git is None:
        raise BuildError("git is not installed; the rebase merges with `git merge-file`")
    with tempfile.TemporaryDirectory(prefix="dtensor-merge-") as tmp:
        paths = []
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            path = Path(tmp) / name
            path.write_bytes(data)
            paths.append(str(path))
        labels = [f"{rel} (the change, on {bt.TORCH_VERSION})", f"{rel} ({bt.TORCH_VERSION})", f"{rel} ({version})"]
        cmd = [git, "merge-file", "-p", "-L", labels[0], "-L", labels[1], "-L", labels[2], *paths]
        proc = subprocess.run(cmd, capture_output=True)
    if proc.returncode < 0 or proc.returncode > 127:
        raise BuildError(f"`git merge-file` failed on {rel}: {proc.stderr.decode(errors='replace').strip()}")
    return Merge(bt.decode_text(proc.stdout, rel), proc.returncode)


def resolution_path(root: Path, version: str, rel: str) -> Path:
    return root / RESOLUTIONS_DIR_NAME / version / f"{rel}.patch"


def resolution_header(rel: str, version: str, hashes: Mapping[str, str], note: str) -> str:
    lines = [
        f"Resolution of {rel} for the stack rebased onto torch {version}: the resolved file as a diff",
        f"against torch {version}'s {rel}. Made from (sha256):",
        *(f"{key}: {hashes[key]}" for key in _HASH_KEYS),
        "",
        *textwrap.wrap(" ".join(note.split()), width=88, break_on_hyphens=False),
        "",
    ]
    return "\n".join(lines) + "\n"


def resolution_note(path: Path) -> str:
    """The free text of a resolution's header (why it looks as it does)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    body: list[str] = []
    for line in lines[2 + len(_HASH_KEYS):]:
        if line.startswith("--- a/") or line == TAKE_THEIRS:
            break
        body.append(line)
    return " ".join(" ".join(body).split())


def _read_hashes(text: str, path: Path) -> dict[str, str]:
    hashes: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("--- "):
            break
        key, sep, value = line.partition(": ")
        if sep and key in _HASH_KEYS:
            hashes[key] = value.strip()
    missing = [k for k in _HASH_KEYS if k not in hashes]
    if missing:
        raise BuildError(f"{path}: header lacks the {', '.join(missing)} sha256 line(s)")
    return hashes


def apply_resolution(path: Path, rel: str, version: str, inputs: Mapping[str, bytes]) -> bytes:
    """The resolved file, after checking the resolution was made from exactly ``inputs``."""
    text = bt.decode_text(path.read_bytes(), path)
    hashes = _read_hashes(text, path)
    stale = [k for k in _HASH_KEYS if hashes[k] != sha256(inputs[k])]
    if stale:
        raise BuildError(
            f"{path} is stale: it was made from a different {' and '.join(stale)} ({', '.join(stale)} changed since). "
            f"Re-resolve: `python3.11 tools/build.py rebase-resolve --base {version} --file {rel}`, edit the file it "
            "writes, then run it again with --record"
        )
    if TAKE_THEIRS in text.splitlines() and not any(line.startswith("--- a/") for line in text.splitlines()):
        return inputs["theirs"]
    patch = bt.parse_patch(text, str(path))
    if patch.old_path != rel or patch.new_path != rel:
        raise BuildError(f"{path}: headers name a/{patch.old_path} and b/{patch.new_path}, expected {rel}")
    resolved = bt.apply_patch(patch, bt.decode_text(inputs["theirs"], rel), f"torch {version}'s {rel}")
    if any(line.startswith(("<<<<<<< ", ">>>>>>> ")) for line in resolved.splitlines()):
        raise BuildError(f"{path} leaves conflict markers in {rel}")
    return resolved.encode("utf-8")


def rebase_file(root: Path, rel: str, version: str, base: bytes, ours: bytes, theirs: bytes, final: bool) -> tuple[bytes, str]:
    """(rebased ``rel``, how: 'clean', 'resolved' or 'theirs') or a loud failure.

    A stored resolution is used whenever it exists and is current (also over a
    clean merge: a merge can be clean and still wrong). ``final`` is whether
    ``ours`` is the file with the whole change; resolutions are only for that.
    """
    if ours == base:
        return theirs, "theirs"
    path = resolution_path(root, version, rel)
    if path.is_file() and final:
        return apply_resolution(path, rel, version, {"base": base, "ours": ours, "theirs": theirs}), "resolved"
    merged = merge3(rel, base, ours, theirs, version)
    if merged.conflicts:
        where = f"{path} is missing" if final else "the file is split across steps, and only whole files take resolutions"
        raise BuildError(
            f"rebasing {rel} onto torch {version}: {merged.conflicts} conflict(s) in the three-way merge, and "
            f"{where}. Resolve: `python3.11 tools/build.py rebase-resolve --base {version} --file {rel}`"
        )
    return merged.text.encode("utf-8"), "clean"


# ---------------------------------------------------------------------------
# The rebased stack
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Rebased:
    steps: tuple[Any, ...]
    originals: Mapping[str, bytes]
    how: Mapping[str, str]
    manifest: Any = None

    def as_stack(self) -> Any:
        """The rebased steps as a ``tools/stack.py`` stack (what check-stack runs)."""
        return st.Stack(self.manifest, self.steps, self.originals, dict(self.steps[-1].after))


def rebase_stack(sources: Any, targets: Sequence[Any], version: str, log: Log) -> Rebased:
    """Every step of the current stack, its before/after trees rebased onto ``version``."""
    stack = st.derive_stack(sources, targets)
    upstream = release_sources(version, log, root=sources.root)
    patched = set(sources.patches())
    originals: dict[str, bytes] = {}
    for rel in stack.results:
        if rel in patched:
            if rel not in upstream:
                raise BuildError(f"{rel} is patched but torch {version} has no such file; the rebase needs a new plan")
            originals[rel] = upstream[rel]
        elif rel in upstream:
            raise BuildError(f"{rel} is a new file of the change, but torch {version} already has one")
    how: dict[str, str] = {}
    state: dict[str, bytes | None] = {rel: originals.get(rel) for rel in stack.results}
    steps = []
    for step in stack.steps:
        before = dict(state)
        for rel in step.changed:
            after = step.after[rel]
            if rel in patched and after is not None:
                final = after == stack.results[rel]
                state[rel], how[rel] = rebase_file(
                    sources.root, rel, version, stack.originals[rel], after, upstream[rel], final
                )
            else:
                state[rel] = after
        steps.append(st.Step(step.number, step.spec, step.changed, step.tests, before, dict(state)))
    root = sources.root / RESOLUTIONS_DIR_NAME / version
    if root.is_dir():
        unused = sorted(
            p.relative_to(root).as_posix()[: -len(".patch")]
            for p in bt.walk_files(root)
            if p.relative_to(root).as_posix()[: -len(".patch")] not in patched
        )
        if unused:
            raise BuildError(f"{root} holds resolutions for files the change no longer patches: {', '.join(unused)}")
    return Rebased(tuple(steps), originals, how, stack.manifest)


def rebased_files(sources: Any, targets: Sequence[Any], version: str, log: Log) -> dict[str, bytes]:
    """Every file ``patches/`` edits, as the whole change leaves it on ``version``.

    The same merge (and the same stored resolutions) as the last step of the
    rebased stack, without deriving the steps.
    """
    _, originals, results = bt.build_export_patch(sources, targets)
    upstream = release_sources(version, log, root=sources.root)
    files: dict[str, bytes] = {}
    for rel in sorted(sources.patches()):
        if rel not in upstream:
            raise BuildError(f"{rel} is patched but torch {version} has no such file; the rebase needs a new plan")
        files[rel], _ = rebase_file(sources.root, rel, version, originals[rel], results[rel], upstream[rel], True)
    return files


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets: list[ast.AST] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.If, ast.Try)):
            names |= _top_level_names(ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[]))
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def unresolved_imports(tree: Mapping[str, bytes], files: Sequence[str], packages: Sequence[str] = SOURCE_PREFIXES) -> list[str]:
    """``from <module> import name`` in ``files`` that ``tree`` cannot satisfy.

    Only modules under ``packages`` are looked at (the part of torch the tree
    holds). It is the one check of the rebased code that needs no install: a
    name the change imports that the release renamed or removed shows here.
    """
    problems: list[str] = []
    parsed: dict[str, set[str]] = {}
    for rel in files:
        if not rel.endswith(".py") or tree.get(rel) is None:
            continue
        module_tree = ast.parse(tree[rel], filename=rel)
        for node in ast.walk(module_tree):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            base = node.module.replace(".", "/")
            if not (base + "/").startswith(tuple(packages)) and not base.startswith(tuple(p.rstrip("/") for p in packages)):
                continue
            source = next((c for c in (f"{base}.py", f"{base}/__init__.py") if c in tree), None)
            if source is None:
                problems.append(f"{rel}:{node.lineno}: module {node.module} does not exist")
                continue
            if source not in parsed:
                parsed[source] = _top_level_names(ast.parse(tree[source], filename=source))
            for alias in node.names:
                if alias.name == "*" or alias.name in parsed[source]:
                    continue
                if f"{base}/{alias.name}.py" in tree or f"{base}/{alias.name}/__init__.py" in tree:
                    continue
                problems.append(f"{rel}:{node.lineno}: {node.module} has no {alias.name}")
    return problems


def export_rebased_stack(sources: Any, targets: Sequence[Any], version: str, out_dir: Path, log: Log) -> list[Path]:
    """Write ``out_dir`` (the stack on ``version``) and check it with git patch by patch."""
    rebased = rebase_stack(sources, targets, version, log)
    kept = []
    for step in rebased.steps:
        if st.step_diff(step):
            kept.append(step)
        else:
            log(f"rebase: step {step.number} ({step.slug}) changes nothing on torch {version}; left out")
    renumbered = [dataclasses.replace(step, number=i) for i, step in enumerate(kept, 1)]
    author, date = st._author_and_date(sources.root)
    report = st.load_stack_report(st.report_path(sources.root, st.STACK_REPORT_NAME, version))
    messages = []
    for step in renumbered:
        values = st.placeholder_values(sources, step, report, version)
        values["check_stack"] = rebase_results(sources.root, step, version, rebased.how) + "\n\n" + values["check_stack"]
        messages.append(values)
    final = renumbered[-1].after
    tree = {**release_sources(version, log, root=sources.root), **{rel: data for rel, data in final.items() if data is not None}}
    problems = unresolved_imports(tree, sorted(rel for rel, data in final.items() if data is not None))
    if problems:
        raise BuildError(f"the stack rebased onto torch {version} imports names the release lacks:\n  " + "\n  ".join(problems))
    written = st.write_series(out_dir, renumbered, messages, author, date, version)
    st.verify_series(written, rebased.originals, [s.after for s in renumbered], version)
    for rel in sorted(rebased.how):
        log(f"rebase: {rel}: {rebased.how[rel]}")
    return written


def rebase_results(root: Path, step: Any, version: str, how: Mapping[str, str]) -> str:
    """The rebased step's Results: that it is untested there, and what the rebase changed in its files."""
    lines = [rebase_note(version)]
    for rel in step.changed:
        if how.get(rel) == "resolved":
            note = resolution_note(resolution_path(root, version, rel))
            lines.append(f"* `{rel}` (conflicts resolved by hand, `rebase/{version}/{rel}.patch`): {note}")
        elif how.get(rel) == "clean":
            lines.append(f"* `{rel}`: three-way merge without conflicts.")
    return "\n".join(lines)


def rebase_note(version: str) -> str:
    return (
        f"Rebased onto torch {version} from the {bt.TORCH_VERSION} patches by a three-way merge and the "
        f"resolutions in `rebase/{version}/` (see the README's \"Two releases\")."
    )


# ---------------------------------------------------------------------------
# Making a resolution
# ---------------------------------------------------------------------------


def _inputs_for(sources: Any, targets: Sequence[Any], version: str, rel: str, log: Log) -> dict[str, bytes]:
    stack = st.derive_stack(sources, targets)
    if rel not in sources.patches():
        raise BuildError(f"{rel} is not patched by the change (patches/{rel}.patch); only patched files are merged")
    upstream = release_sources(version, log, root=sources.root)
    if rel not in upstream:
        raise BuildError(f"torch {version} has no {rel}")
    return {"base": stack.originals[rel], "ours": stack.results[rel], "theirs": upstream[rel]}


def start_resolution(sources: Any, targets: Sequence[Any], version: str, rel: str, work: Path, log: Log) -> Path:
    """Write the conflicted (or clean) merge of ``rel`` to ``work`` for an engineer to edit."""
    inputs = _inputs_for(sources, targets, version, rel, log)
    merged = merge3(rel, inputs["base"], inputs["ours"], inputs["theirs"], version)
    path = work / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(merged.text, encoding="utf-8")
    log(f"rebase-resolve: {merged.conflicts} conflict(s); edit {path}, then run again with --record {path}")
    return path


def record_resolution(
    sources: Any, targets: Sequence[Any], version: str, rel: str, edited: Path, note: str, log: Log
) -> Path:
    """Store ``edited`` as the resolution of ``rel`` (a diff against ``version``'s file)."""
    inputs = _inputs_for(sources, targets, version, rel, log)
    text = bt.decode_text(edited.read_bytes(), edited)
    if any(line.startswith(("<<<<<<< ", ">>>>>>> ", "||||||| ")) for line in text.splitlines()):
        raise BuildError(f"{edited} still holds conflict markers")
    diff = bt.make_patch(rel, bt.decode_text(inputs["theirs"], rel), text)
    if not diff:
        # the release already does what the change did to this file
        diff = TAKE_THEIRS + "\n"
        log(f"rebase-resolve: {edited} equals torch {version}'s {rel}: the change drops out of this file")
    hashes = {key: sha256(inputs[key]) for key in _HASH_KEYS}
    path = resolution_path(sources.root, version, rel)
    bt.write_file(path, (resolution_header(rel, version, hashes, note) + diff).encode("utf-8"))
    log(f"rebase-resolve: wrote {path}")
    return path
