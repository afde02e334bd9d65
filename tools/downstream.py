#!/usr/bin/env python3
"""`make downstream`: autoparallel as it is on stock torch, and with the patches in
``downstream/autoparallel/`` on torch with the stack.

autoparallel (github.com/meta-pytorch/autoparallel) is a planner that reads every
strategy DTensor offers. ``downstream/autoparallel/NNNN-<slug>.patch`` are the PRs
it would merge once the stack lands, against the commit :data:`BASE_COMMIT`:
``0001`` deletes its spec repairs and asks ``ShardingPropagator.enumerate_strategies``;
each later one fixes one bug of autoparallel's own that the repairs hid, with the
test that reproduces it.

``run --autoparallel DIR`` (the make target) takes a clean copy of DIR (a checkout
or the git directory ``fetch github:meta-pytorch/autoparallel`` brings; its
``--rev``, default HEAD, by ``git archive``) into ``.build/downstream/trees/``:

* ``as-is``, ``0001`` and ``all`` (every patch), each made to run on the CPU: the
  test files' device strings switched to ``cpu`` (:func:`cpu_adjust`), and the
  cost model given a device name (:data:`DEVICE_NAME`, by this module's pytest
  plugin); ``pulp`` and ``filecheck`` (:data:`PINS`) are installed with
  ``pip install --target .build/downstream/site-packages``;
* the acceptance set (:data:`ACCEPTANCE`, less :data:`DESELECTED`), collected on
  ``as-is``, is run on stock torch with ``as-is``, and on torch with the stack with
  ``as-is``, ``0001`` and ``all``, one run at a time; the pass counts are printed
  side by side (an expected failure that passes counts as a pass: the code ran),
  and every test that does not pass in some run by name;
* reproducers: the tests each patch after ``0001`` adds, on the stack, with the
  patches before it and its tests only (they must fail) and with every patch (they
  must pass); ``0001``'s tests with every patch;
* the attention check (:func:`attention_main`): a small attention block calling
  the efficient and the cuDNN attention ops, traced on fake CPU tensors through
  autoparallel's planner to a plan, on the stack with every patch (no repair left
  in autoparallel's path: required to pass) and on stock torch as it is;
* the strategy-building time of autoparallel's transformer-block test
  (:func:`timing_main`): stock torch with autoparallel as it is (its repairs)
  and the stack with autoparallel as it is, against the stack with every patch
  (no repairs), run alternately in one run, with the peak memory one build
  allocates.

The exit status is 1 when a patch does not apply, a run cannot run, a test that
passes on stock torch with autoparallel as it is fails on the stack with every
patch, a reproducer does not fail without its fix or does not pass with it, or the
attention check fails on the stack; with ``--strict`` also when the stack's
strategy building is slower. Without ``--autoparallel`` it says how to get the
snapshot and exits 2.

``attention`` and ``timing`` are the workers ``run`` starts in a venv with a tree
on the path. Loaded as a pytest plugin (``-p downstream``), this module gives the
cost model its device name and records each test's outcome.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The autoparallel commit the patches are written against.
BASE_COMMIT = "a54c2529b1cb10b6b27a585b4a6fc2f84bc1d232"
FETCH_HINT = "fetch github:meta-pytorch/autoparallel"
#: What autoparallel needs besides torch (pinned; pulp ships the CBC solver).
PINS: tuple[str, ...] = ("pulp==3.3.2", "filecheck==1.0.6")
#: The device name the cost model reads on a CPU (autoparallel's tests fake an H100).
DEVICE_NAME = "H100"
#: autoparallel's CPU acceptance set: whole files and single tests...
ACCEPTANCE: tuple[str, ...] = (
    "tests/test_api.py",
    "tests/test_propagation_rules.py",
    "tests/test_optimize_placement.py",
    "tests/test_auto_parallel_simple.py",
    "tests/test_init_weights.py",
    "tests/test_correctness.py",
    "tests/test_replay_saves_partitioner.py::test_replay_saves_partitioner_reproduces_first_partitioner_saves",
)
#: ... less these (node id prefixes).
DESELECTED: tuple[str, ...] = (
    "tests/test_propagation_rules.py::test_iota",
    "tests/test_optimize_placement.py::test_local_map_placement_respected",
    "tests/test_optimize_placement.py::test_optimization_finds_fsdp_tp_2d[transformer_block-expected_param_placements1",
)
#: Outcomes that count as a pass.
PASSING = frozenset({"passed", "xpassed"})
#: The environment variables the plugin reads.
ENV_RESULTS, ENV_DEVICE = "DOWNSTREAM_RESULTS", "DOWNSTREAM_DEVICE_NAME"

_PATCH_RE = re.compile(r"^(\d{4})-([a-z0-9][a-z0-9-]*)\.patch$")
_DIFF_FILE_RE = re.compile(r"^\+\+\+ b/(\S+)")
_ADDED_TEST_RE = re.compile(r"^\+def (test_\w+)\(")

Log = Callable[[str], None]


class DownstreamError(Exception):
    """A problem with the checkout, the patches or the venvs; the message says which."""


# --- Patches -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Patch:
    number: str
    slug: str
    path: Path

    @property
    def name(self) -> str:
        return f"{self.number}-{self.slug}"


def find_patches(directory: Path) -> list[Patch]:
    """The patches in ``directory``, numbered 0001 on without gaps, each with its PR text."""
    patches = []
    for path in sorted(directory.glob("*.patch")):
        match = _PATCH_RE.match(path.name)
        if match is None:
            raise DownstreamError(f"{path}: not named NNNN-<slug>.patch")
        if not path.with_suffix(".md").is_file():
            raise DownstreamError(f"{path}: no PR text {path.with_suffix('.md').name}")
        patches.append(Patch(match.group(1), match.group(2), path))
    if not patches:
        raise DownstreamError(f"{directory}: no patches")
    for i, patch in enumerate(patches, 1):
        if int(patch.number) != i:
            raise DownstreamError(f"{patch.path}: expected number {i:04d}")
    return patches


def added_tests(patch_text: str) -> list[str]:
    """The node ids (``tests/<file>::<name>``) of the test functions a patch adds
    under ``tests/``; a parametrized one stands for all its cases."""
    tests, current = [], ""
    for line in patch_text.splitlines():
        file_match = _DIFF_FILE_RE.match(line)
        if file_match:
            current = file_match.group(1)
            continue
        test_match = _ADDED_TEST_RE.match(line)
        if test_match and current.startswith("tests/") and current.endswith(".py"):
            tests.append(f"{current}::{test_match.group(1)}")
    return tests


# --- Trees -------------------------------------------------------------------


def run_checked(cmd: Sequence[str], cwd: Path | None = None, what: str = "", stdin: bytes | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(list(cmd), cwd=cwd, input=stdin, env=env, capture_output=True, check=False)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).decode(errors="replace").strip()
        raise DownstreamError(f"{what or ' '.join(cmd)} failed: {detail}")
    return proc


def git_dir(checkout: Path) -> Path | None:
    """The git directory of ``checkout`` (a work tree or a bare snapshot), or None."""
    proc = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--absolute-git-dir"],
                          capture_output=True, text=True, check=False)
    return Path(proc.stdout.strip()) if proc.returncode == 0 else None


def resolve_commit(checkout: Path, rev: str) -> str | None:
    gd = git_dir(checkout)
    if gd is None:
        return None
    proc = run_checked(["git", f"--git-dir={gd}", "rev-parse", "--verify", f"{rev}^{{commit}}"],
                       what=f"git rev-parse {rev} in {checkout}")
    return proc.stdout.decode().strip()


def snapshot(checkout: Path, rev: str, dest: Path) -> str | None:
    """A clean copy of ``checkout`` at ``rev`` into ``dest`` (replaced); its commit,
    or None for a directory that is no git checkout (copied as it is, less ``.git``)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    gd = git_dir(checkout)
    if gd is None:
        shutil.copytree(checkout, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return None
    commit = resolve_commit(checkout, rev)
    archive = run_checked(["git", f"--git-dir={gd}", "archive", "--format=tar", str(commit)],
                          what=f"git archive {rev} of {checkout}")
    run_checked(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, what="tar -x")
    return commit


def apply_patch(tree: Path, patch: Path, include: str | None = None) -> None:
    """``git apply`` in ``tree``, which is no git work tree: inside another one (the
    work dir lies in this repo) git would apply only what lies under the current
    directory of that tree, and skip the rest without a word."""
    cmd = ["git", "apply", "--whitespace=nowarn"]
    if include:
        cmd.append(f"--include={include}")
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.resolve().parent))
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    run_checked([*cmd, str(patch.resolve())], cwd=tree, env=env, what=f"git apply {patch.name} in {tree}")


_CPU_REWRITES: tuple[tuple[str, str], ...] = (('"cuda"', '"cpu"'), (".cuda()", ".cpu()"))


def cpu_adjust(tree: Path) -> int:
    """Switch the device strings of ``tree``'s tests to the CPU; how many were
    switched (an error if none: then the tests changed and this needs a look)."""
    count = 0
    for path in sorted((tree / "tests").glob("*.py")):
        text = path.read_text()
        new = text
        for old, repl in _CPU_REWRITES:
            count += new.count(old)
            new = new.replace(old, repl)
        if new != text:
            path.write_text(new)
    if count == 0:
        raise DownstreamError(f"{tree}/tests: no CUDA device string to switch to the CPU")
    return count


def make_tree(checkout: Path, rev: str, dest: Path, patches: Sequence[Patch],
              tests_of: Patch | None = None) -> str | None:
    """A CPU-ready copy of the checkout with ``patches`` applied in order, then
    the test files alone of ``tests_of``; the copy's commit."""
    commit = snapshot(checkout, rev, dest)
    for patch in patches:
        apply_patch(dest, patch.path)
    if tests_of is not None:
        apply_patch(dest, tests_of.path, include="tests/*")
    cpu_adjust(dest)
    return commit


def install_pins(python: Path, target: Path, log: Log) -> None:
    """:data:`PINS` into ``target`` by pip (``--target``), unless already there."""
    stamp = target / ".pins"
    if stamp.is_file() and stamp.read_text() == "\n".join(PINS):
        return
    if target.exists():
        shutil.rmtree(target)
    log(f"installing {' '.join(PINS)} into {target}")
    run_checked([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-deps", "--target", str(target), *PINS], what="pip install --target")
    stamp.write_text("\n".join(PINS))


# --- pytest plugin (``-p downstream``) ----------------------------------------

_outcomes: dict[str, str] = {}


def set_device_name() -> None:
    """The cost model asks the device module for a name, which a CPU has not."""
    name = os.environ.get(ENV_DEVICE, DEVICE_NAME)
    torch = importlib.import_module("torch")
    torch.cuda.get_device_name = lambda *args, **kwargs: name


def pytest_configure(config: object) -> None:
    if os.environ.get(ENV_DEVICE):
        set_device_name()


def outcome_of(report: Any) -> str | None:
    """A test's outcome from one phase's report; None if that phase says nothing new."""
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    if report.failed:
        return "failed" if report.when == "call" else "error"
    if report.skipped:
        return "skipped"
    return "passed" if report.when == "call" else None


def pytest_runtest_logreport(report: Any) -> None:
    outcome = outcome_of(report)
    if outcome is not None and _outcomes.get(report.nodeid) not in ("failed", "error"):
        _outcomes[report.nodeid] = outcome


def pytest_sessionfinish(session: object, exitstatus: object) -> None:
    path = os.environ.get(ENV_RESULTS)
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))


# --- Running tests -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Env:
    """How to run a tree's code: a venv's python, the pinned packages, and a
    folder that holds this module alone (as ``downstream``, for ``-p`` and ``-m``)."""

    python: Path
    site: Path
    plugin: Path

    def vars(self, tree: Path, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        path = [str(tree), str(self.site), str(self.plugin)]
        env["PYTHONPATH"] = os.pathsep.join(path)
        env[ENV_DEVICE] = DEVICE_NAME
        env.update(extra)
        return env


def collect(env: Env, tree: Path, log_path: Path) -> list[str]:
    """The node ids of the acceptance set in ``tree``."""
    cmd = [str(env.python), "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
           "-p", "downstream", *ACCEPTANCE]
    for prefix in DESELECTED:
        cmd += ["--deselect", prefix]
    proc = subprocess.run(cmd, cwd=tree, env=env.vars(tree), capture_output=True, text=True, check=False)
    log_path.write_text(proc.stdout + proc.stderr)
    ids = [line.strip() for line in proc.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if proc.returncode != 0 or not ids:
        raise DownstreamError(f"collecting the acceptance set failed, see {log_path}")
    return ids


def run_tests(env: Env, tree: Path, ids: Sequence[str], work: Path, label: str,
              timeout: float) -> dict[str, str]:
    """Each node id's outcome (``missing`` where pytest reported none); a run
    that records nothing is an error. Its output is in ``work/<label>.log``."""
    results, log_path = work / f"{label}.json", work / f"{label}.log"
    results.unlink(missing_ok=True)
    cmd = [str(env.python), "-m", "pytest", "-q", "-rfEX", "--tb=short", "-p", "no:cacheprovider",
           "-p", "downstream", *ids]
    with log_path.open("w") as out:
        try:
            subprocess.run(cmd, cwd=tree, env=env.vars(tree, **{ENV_RESULTS: str(results)}),
                           stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise DownstreamError(f"{label}: timed out after {timeout:.0f} s, see {log_path}") from exc
    if not results.is_file():
        raise DownstreamError(f"{label}: pytest recorded no outcome, see {log_path}")
    recorded: dict[str, str] = json.loads(results.read_text())
    return {i: outcome_for(i, recorded) for i in ids}


def outcome_for(node_id: str, recorded: Mapping[str, str]) -> str:
    """The outcome of ``node_id``, or of all the cases it stands for: the worst."""
    if node_id in recorded:
        return recorded[node_id]
    cases = [o for i, o in recorded.items() if i.startswith(node_id + "[")]
    order = ("error", "failed", "missing", "skipped", "xfailed", "xpassed", "passed")
    return min(cases, key=order.index) if cases else "missing"


def passes(outcomes: Mapping[str, str]) -> int:
    return sum(o in PASSING for o in outcomes.values())


# --- Report ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Cell:
    """One run of the acceptance set: a torch and a tree."""

    torch: str  # "stock" or "stack"
    tree: str  # "as-is", "0001" or "all"
    outcomes: Mapping[str, str]


def acceptance_table(cells: Sequence[Cell], tree_names: Mapping[str, str], total: int) -> list[str]:
    """Pass counts, trees by row and torches by column, then the tests that do not
    pass in every run, with their outcome in each."""
    torches = {"stock": "stock torch", "stack": "torch + the stack"}
    by = {(c.torch, c.tree): c for c in cells}
    width = max(len(n) for n in tree_names.values())
    lines = [f"{'autoparallel':<{width}}  " + "  ".join(f"{t:>18}" for t in torches.values())]
    for tree, name in tree_names.items():
        row = []
        for torch_name in torches:
            cell = by.get((torch_name, tree))
            row.append(f"{passes(cell.outcomes)} of {total}" if cell else "-")
        lines.append(f"{name:<{width}}  " + "  ".join(f"{r:>18}" for r in row))
    failing = sorted({i for c in cells for i, o in c.outcomes.items() if o not in PASSING})
    if failing:
        heads = [f"{c.torch}/{c.tree}" for c in cells]
        lines += ["", "not passing in some run (" + ", ".join(heads) + "):"]
        lines += [f"  {i}: " + ", ".join(c.outcomes.get(i, "-") for c in cells) for i in failing]
    return lines


def regressions(reference: Cell, patched: Cell) -> list[str]:
    """Tests that pass in ``reference`` and not in ``patched``."""
    return sorted(i for i, o in reference.outcomes.items()
                  if o in PASSING and patched.outcomes.get(i) not in PASSING)


def timing_summary(sides: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Medians of each side's workers (``stock``, optionally ``stack + repairs``, then
    ``stack``, whose ratio to each earlier side ends its row)."""
    def med(runs: Sequence[Mapping[str, Any]], key: str) -> float:
        if key == "builds":
            return statistics.median(b for r in runs for b in r["builds"])
        return statistics.median(float(r[key]) for r in runs)

    names = {"stock": "stock + repairs", "stack + repairs": "stack + repairs", "stack": "stack, none"}
    order = [side for side in names if side in sides]
    ratios = [{"stock": "stack/stock", "stack + repairs": "none/repairs"}[side] for side in order[:-1]]
    rows = [("strategy building, caches cleared (s)", "builds", "{:.4f}"),
            ("first build in AutoParallel (s)", "first", "{:.4f}"),
            ("peak memory one build allocates (MiB)", "peak_mib", "{:.2f}"),
            ("strategies built", "strategies", "{:.0f}")]
    lines = [f"{'':<40}" + "".join(f"{names[side]:>17}" for side in order)
             + "".join(f"{r:>13}" for r in ratios)]
    for title, key, fmt in rows:
        values = [med(sides[side], key) for side in order]
        cells = "".join(f"{fmt.format(v):>17}" for v in values)
        cells += "".join(f"{values[-1] / v:>13.3f}" if v else f"{'-':>13}" for v in values[:-1])
        lines.append(f"{title:<40}{cells}")
    builds = sum(len(r["builds"]) for r in sides["stock"])
    lines.append(f"({len(sides['stock'])} processes a side, run alternately; {builds} timed builds a side)")
    return lines


# --- The attention check (worker) ---------------------------------------------

ATTENTION_KINDS = ("efficient", "cudnn")


def _fake_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
    torch = importlib.import_module("torch")
    fake_pg = importlib.import_module("torch.testing._internal.distributed.fake_pg")
    dist = importlib.import_module("torch.distributed")
    if not dist.is_initialized():
        size = 1
        for s in shape:
            size *= s
        dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=size)
    return torch.distributed.device_mesh.init_device_mesh("cpu", shape, mesh_dim_names=names)


def _attention_block(kind: str, dim: int, heads: int) -> Any:
    """A meta attention block whose core is ``aten._scaled_dot_product_<kind>_attention``."""
    torch = importlib.import_module("torch")
    nn, aten = torch.nn, torch.ops.aten
    module: Any = nn.Module

    class Block(module):
        def __init__(self) -> None:
            super().__init__()
            self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = (w(x).view(b, s, heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
            if kind == "efficient":
                o = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True)[0]
            else:
                o = aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)[0]
            return self.wo(o.transpose(1, 2).reshape(b, s, dim))

    with torch.device("meta"):
        return Block()


def _describe(spec: Any) -> str:
    return "None" if spec is None else "(" + ", ".join(str(p) for p in spec.placements) + ")"


def attention_kind(kind: str, log: Log) -> None:
    """Plan the block of ``kind`` on a 2x4 mesh, input and output sharded on batch,
    and build the parallel module; print the strategies autoparallel reads for the
    attention ops, and the plan. Raises where no plan is reached, where the plan
    replicates the attention, or where the module cannot be built."""
    torch = importlib.import_module("torch")
    api = importlib.import_module("autoparallel.api")
    placement = importlib.import_module("torch.distributed.tensor.placement_types")
    mesh = _fake_mesh((2, 4), ("dp", "tp"))
    batch, seq, dim, heads = 64, 256, 512, 8
    model = _attention_block(kind, dim, heads)

    def input_fn() -> Any:
        return torch.randn(batch, seq, dim, device="cpu", requires_grad=True)

    sharded = (placement.Shard(0), placement.Replicate())
    with api.AutoParallel(model, input_fn, mesh) as autop:
        optimizer = autop.sharding_optimizer
        nodes = [n for n in autop.gm.graph.nodes if "_attention" in str(n.target)]
        if len(nodes) != 2:
            raise DownstreamError(f"{kind}: expected a forward and a backward attention node, got {nodes}")
        for node in nodes:
            strategies = optimizer.strats[optimizer._normalize_node(node)].strategies
            local = getattr(strategies[0], "local_output_metas", None)
            rank_local = [i for i, m in enumerate(local or ()) if m is not None]
            log(f"  {node.target}: {len(strategies)} strategies; query placements offered: "
                + ", ".join(sorted({_describe(s.input_specs[0]) for s in strategies}))
                + f"; rank-local results at {rank_local or 'none'}")
        autop.add_input_constraints([sharded])
        autop.add_output_constraints([sharded])
        plan = autop.optimize_placement()
        for node in nodes:
            chosen = plan[node]
            outs = chosen.output_specs if isinstance(chosen.output_specs, tuple) else (chosen.output_specs,)
            log(f"  plan for {node.target}: inputs "
                + ", ".join(_describe(s) for s in chosen.input_specs[:4])
                + "; outputs " + ", ".join(_describe(s) for s in outs))
        if all(p.is_replicate() for p in plan[nodes[0]].input_specs[0].placements):
            raise DownstreamError(f"{kind}: the plan replicates the attention")
        autop.apply_placement(plan)
        log("  apply_placement built the parallel module")


#: autoparallel's spec repairs and hand walks of DTensor's registries, by module.
REPAIRS: dict[str, tuple[str, ...]] = {
    "autoparallel.shardings.placement_options": ("propagate_tensor_meta", "fill_missing_redistribute_cost"),
    "autoparallel.shardings.dtensor_sharding_helpers": ("_try_single_dim_strategy", "_try_decomp_sharding"),
}


def attention_main(kinds: Sequence[str], require_no_repair: bool, log: Log) -> int:
    """0 when every kind passes :func:`attention_kind` (and, if required,
    autoparallel has none of :data:`REPAIRS` left)."""
    set_device_name()
    repairs = [name for module, names in REPAIRS.items()
               for name in names if hasattr(importlib.import_module(module), name)]
    log(f"  autoparallel's spec repairs: {', '.join(repairs) if repairs else 'none'}")
    if require_no_repair and repairs:
        log("  FAIL: the check must run with no repair in autoparallel's path")
        return 1
    failed = 0
    for kind in kinds:
        try:
            attention_kind(kind, log)
            log(f"  {kind} attention: reached a plan that shards it, and built the module")
        except Exception as exc:  # report which kind, and go on with the next
            failed += 1
            log(f"  {kind} attention: FAILED, {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    return 1 if failed else 0


# --- Strategy-building time (worker) -------------------------------------------


#: The meshes of autoparallel's tests (conftest.py): 256 ranks, 1-D and 32x8.
MESHES: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "1d": ((256,), ("dp",)), "2d": ((32, 8), ("dp", "tp"))}


def timing_main(mesh_name: str, builds: int, log: Log) -> int:
    """The transformer block of autoparallel's ``test_optimize_placement.py`` on one
    of its test meshes: the first strategy building (in ``AutoParallel``), then
    ``builds`` more, each with autoparallel's and DTensor's caches cleared, and the
    peak memory one of them allocates (tracemalloc); one JSON line."""
    import tracemalloc

    set_device_name()
    torch = importlib.import_module("torch")
    sys.path.insert(0, str(Path.cwd() / "tests"))
    tests = importlib.import_module("test_optimize_placement")
    api = importlib.import_module("autoparallel.api")
    optimize = importlib.import_module("autoparallel.optimize_sharding")
    options = importlib.import_module("autoparallel.shardings.placement_options")
    debug = importlib.import_module("torch.distributed.tensor.debug")
    clear_names = ("_clear_sharding_prop_cache", "_clear_python_sharding_prop_cache",
                   "_clear_fast_path_sharding_prop_cache")
    clearers = [getattr(debug, n) for n in clear_names if hasattr(debug, n)]

    def clear() -> None:
        options.reset_placement_options_cache()
        for fn in clearers:
            fn()

    original = optimize.ShardingOptimizer.build_sharding_metadata
    first: list[float] = []

    def timed_first(self: Any) -> Any:
        started = time.perf_counter()
        result = original(self)
        first.append(time.perf_counter() - started)
        return result

    mesh = _fake_mesh(*MESHES[mesh_name])
    model_fn, input_fn = tests._make_model_and_input_fn(mesh, "transformer_block", "cpu")
    with torch.device("meta"):
        model = model_fn()
    optimize.ShardingOptimizer.build_sharding_metadata = timed_first
    try:
        autop = api.AutoParallel(model, input_fn, mesh)
        autop.__enter__()
    finally:
        optimize.ShardingOptimizer.build_sharding_metadata = original
    try:
        optimizer, times = autop.sharding_optimizer, []
        strats = optimizer.strats
        for _ in range(builds):
            clear()
            started = time.perf_counter()
            strats = original(optimizer)
            times.append(time.perf_counter() - started)
        clear()
        tracemalloc.start()
        original(optimizer)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    finally:
        autop.__exit__(None, None, None)
    count = sum(len(s.strategies) for s in strats.values() if hasattr(s, "strategies"))
    log(json.dumps({"first": first[0], "builds": times, "peak_mib": peak / 2**20, "strategies": count}))
    return 0


# --- run ---------------------------------------------------------------------


def plugin_dir(work: Path) -> Path:
    """A folder holding this module alone, as ``downstream.py``."""
    folder = work / "plugin"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "downstream.py"
    if not (link.is_symlink() and link.resolve() == Path(__file__).resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(Path(__file__).resolve())
    return folder


def worker(env: Env, tree: Path, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = [str(env.python), "-m", "downstream", *args]
    try:
        return subprocess.run(cmd, cwd=tree, env=env.vars(tree), capture_output=True, text=True,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise DownstreamError(f"{' '.join(args)} in {tree}: timed out after {timeout:.0f} s") from exc


def run(checkout: Path, rev: str, stock: Env, stack: Env, patch_dir: Path, work: Path,
        checks: Iterable[str], timeout: float, rounds: int, builds: int, strict: bool, log: Log) -> int:
    checks = set(checks)
    patches = find_patches(patch_dir)
    commit = resolve_commit(checkout, rev)
    log(f"autoparallel {commit or checkout} (patches written against {BASE_COMMIT[:12]}); "
        f"{len(patches)} patches: " + ", ".join(p.name for p in patches))
    if commit is not None and commit != BASE_COMMIT:
        log(f"note: {rev} is not {BASE_COMMIT[:12]}; the patches may not apply")
    install_pins(stock.python, stock.site, log)
    trees, logs = work / "trees", work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    layouts: dict[str, tuple[list[Patch], Patch | None]] = {
        "as-is": ([], None), "0001": (patches[:1], None), "all": (list(patches), None)}
    for k, patch in enumerate(patches[1:], 1):
        layouts[f"tests-of-{patch.number}"] = (patches[:k], patch)
    for name, (applied, tests_of) in layouts.items():
        make_tree(checkout, rev, trees / name, applied, tests_of)
    log("trees: " + ", ".join(sorted(layouts)) + f" in {trees}")
    status = 0

    if "tests" in checks:
        ids = collect(stock, trees / "as-is", logs / "collect.log")
        log(f"\nacceptance set: {len(ids)} tests (logs in {logs})")
        cells = []
        for torch_name, env, tree in (("stock", stock, "as-is"), ("stack", stack, "as-is"),
                                      ("stack", stack, "0001"), ("stack", stack, "all")):
            started = time.monotonic()
            outcomes = run_tests(env, trees / tree, ids, logs, f"{torch_name}-{tree}", timeout)
            cells.append(Cell(torch_name, tree, outcomes))
            log(f"  {torch_name} torch, {tree}: {passes(outcomes)} of {len(ids)} pass "
                f"({time.monotonic() - started:.0f} s)")
        names = {"as-is": "as it is", "0001": f"with {patches[0].name}",
                 "all": f"with 0001..{patches[-1].number}"}
        log("")
        for line in acceptance_table(cells, names, len(ids)):
            log(line)
        lost = regressions(cells[0], cells[-1])
        if lost:
            status = 1
            log("FAIL: pass on stock torch as it is, not on the stack with every patch: " + ", ".join(lost))

    if "reproducers" in checks:
        log("\nreproducers (torch + the stack): the tests a patch adds, without its fix and with every patch")
        for k, patch in enumerate(patches):
            tests = added_tests(patch.path.read_text())
            if not tests:
                log(f"  {patch.name}: adds no test")
                continue
            label = f"repro-{patch.number}"
            with_all = run_tests(stack, trees / "all", tests, logs, f"{label}-all", timeout)
            line = f"  {patch.name}: with every patch {passes(with_all)} of {len(tests)} pass"
            bad = [t for t, o in with_all.items() if o not in PASSING]
            if k > 0:
                without = run_tests(stack, trees / f"tests-of-{patch.number}", tests, logs, f"{label}-without",
                                    timeout)
                line += f"; without its fix {len(tests) - passes(without)} of {len(tests)} fail"
                bad += [f"{t} (passes without the fix)" for t, o in without.items() if o in PASSING]
            log(line)
            for test in tests:
                log(f"    {test}")
            if bad:
                status = 1
                log("  FAIL: " + ", ".join(bad))

    if "attention" in checks:
        log("\nattention check (efficient and cuDNN attention, fake CPU inputs, 2x4 mesh)")
        for title, env, tree, required in (("torch + the stack, every patch", stack, "all", True),
                                           (f"torch + the stack, {patches[0].name} only", stack, "0001", False),
                                           ("stock torch, autoparallel as it is", stock, "as-is", False)):
            args = ["attention", *(["--require-no-repair"] if required else [])]
            proc = worker(env, trees / tree, args, timeout)
            log(f" {title}: " + ("passes" if proc.returncode == 0 else "FAILS"))
            for line in proc.stdout.splitlines():
                log(line)
            if proc.returncode != 0:
                (logs / f"attention-{tree}.log").write_text(proc.stdout + proc.stderr)
                log(f"  (output in {logs / f'attention-{tree}.log'})")
                if required:
                    status = 1

    if "timing" in checks:
        for mesh_name, (shape, _) in MESHES.items():
            mesh_text = "x".join(map(str, shape))
            log(f"\nstrategy building: the transformer block of test_optimize_placement.py, mesh {mesh_text}")
            sides: dict[str, list[dict[str, Any]]] = {"stock": [], "stack + repairs": [], "stack": []}
            for _ in range(rounds):
                for side, env, tree in (("stock", stock, "as-is"), ("stack + repairs", stack, "as-is"),
                                        ("stack", stack, "all")):
                    args = ["timing", "--mesh", mesh_name, "--builds", str(builds)]
                    proc = worker(env, trees / tree, args, timeout)
                    lines = proc.stdout.strip().splitlines()
                    if proc.returncode != 0 or not lines:
                        log_path = logs / f"timing-{side.replace(' + ', '-')}.log"
                        log_path.write_text(proc.stdout + proc.stderr)
                        raise DownstreamError(f"timing on {side} failed, see {log_path}")
                    sides[side].append(json.loads(lines[-1]))
            for line in timing_summary(sides):
                log(line)
            ratio = (statistics.median(b for r in sides["stack"] for b in r["builds"])
                     / statistics.median(b for r in sides["stock"] for b in r["builds"]))
            if strict and ratio > 1.0:
                status = 1
                log(f"FAIL (--strict): on mesh {mesh_text} the stack's strategy building takes {ratio:.3f} of stock's")
    return status


CHECKS = ("tests", "reproducers", "attention", "timing")


def main(argv: Sequence[str] | None = None, log: Log = lambda m: print(m, flush=True)) -> int:
    parser = argparse.ArgumentParser(prog="tools/downstream.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    p_run = sub.add_parser("run", help="the make target: trees, acceptance runs, reproducers, checks")
    p_run.add_argument("--autoparallel", type=Path, default=None,
                       help=f"an autoparallel checkout or git directory ({FETCH_HINT} brings one)")
    p_run.add_argument("--rev", default="HEAD", help="the revision of --autoparallel to copy (default: HEAD)")
    p_run.add_argument("--venv", type=Path, default=REPO_ROOT / ".venv", help="torch with the stack")
    p_run.add_argument("--stock-venv", type=Path, default=REPO_ROOT / ".venv-stock", help="stock torch")
    p_run.add_argument("--patches", type=Path, default=REPO_ROOT / "downstream" / "autoparallel")
    p_run.add_argument("--work-dir", type=Path, default=REPO_ROOT / ".build" / "downstream")
    p_run.add_argument("--checks", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)}")
    p_run.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (default: 3600)")
    p_run.add_argument("--rounds", type=int, default=3, help="timing: worker processes a side (default: 3)")
    p_run.add_argument("--builds", type=int, default=15, help="timing: timed builds a process (default: 15)")
    p_run.add_argument("--strict", action="store_true", help="also fail when the stack builds strategies slower")
    p_att = sub.add_parser("attention", help="worker: the attention check in the current tree")
    p_att.add_argument("--kinds", default=",".join(ATTENTION_KINDS))
    p_att.add_argument("--require-no-repair", action="store_true")
    p_time = sub.add_parser("timing", help="worker: strategy-building time in the current tree")
    p_time.add_argument("--builds", type=int, default=15)
    p_time.add_argument("--mesh", choices=sorted(MESHES), default="1d")
    args = parser.parse_args(argv)
    if args.command == "attention":
        return attention_main([k for k in args.kinds.split(",") if k], args.require_no_repair, log)
    if args.command == "timing":
        if args.builds < 1:
            parser.error("--builds must be at least 1")
        return timing_main(args.mesh, args.builds, log)
    if args.command != "run":
        parser.print_help()
        return 2
    if args.autoparallel is None:
        print("make downstream needs AUTOPARALLEL=<autoparallel checkout>. Bring the snapshot with\n"
              f"  {FETCH_HINT}\nthen pass the git directory it returns: "
              "make downstream AUTOPARALLEL=<that directory>", file=sys.stderr)
        return 2
    if args.rounds < 1 or args.builds < 1:
        parser.error("--rounds and --builds must be at least 1")
    checks = [c for c in args.checks.split(",") if c]
    unknown = sorted(set(checks) - set(CHECKS))
    try:
        if unknown:
            raise DownstreamError(f"unknown checks: {', '.join(unknown)}")
        if not args.autoparallel.is_dir():
            raise DownstreamError(f"{args.autoparallel}: no such directory ({FETCH_HINT} brings the snapshot)")
        work = args.work_dir.absolute()
        site = work / "site-packages"
        envs = []
        for venv in (args.stock_venv, args.venv):
            python = venv.absolute() / "bin" / "python"
            if not python.exists():
                raise DownstreamError(f"{python} does not exist; run `make build`")
            envs.append(Env(python, site, plugin_dir(work)))
        return run(args.autoparallel.resolve(), args.rev, envs[0], envs[1], args.patches.resolve(), work,
                   checks, args.timeout, args.rounds, args.builds, args.strict, log)
    except DownstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
