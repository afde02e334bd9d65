"""Runtime parity worker: DTensor eager vs plain torch over the OpInfo db, in one venv.

Run from the repository root, once per torch (the orchestrator does this, stock then
built, never in parallel, so that the wall times compare)::

    .venv/bin/python -m tools.audit.parity --role built --out /tmp/p.json --ops add,mm,softmax

Why: a change to DTensor's strategy machinery must not make an eager call hang, raise
or compute something else where stock torch did not. So, as PyTorch's own
``test_dtensor_ops.py`` does, every OpInfo sample (float32, first ``--max-samples``)
runs on plain torch and through DTensor, and the results are compared. All ranks are
simulated in this process by ``LocalTensorMode`` on a fake process group, so the
collectives DTensor issues run on real data. Inputs are distributed by one fixed rule
(:func:`placements_for`), so both torches see identical DTensor calls.

Per OpInfo (name + variant) the JSON holds the outcome (``same``, ``wrong``,
``raised``, ``skipped``; the worst sample decides), the message of the sample that
decided it, every sample's details and the wall time of the DTensor runs. A run that
exceeds ``--op-timeout`` is interrupted (wall-clock timer) and recorded as raised ``Timeout``
with the frame it was in, so a hang never blocks the sweep.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, TYPE_CHECKING

from tools._modules import write_json_atomically
from tools.audit.worker import load_mode, load_validation, opinfo_label

if TYPE_CHECKING:
    from collections.abc import Callable


OUTCOMES = ("same", "wrong", "raised", "skipped")
# Worse is bigger. A skipped sample (reference raised, nondeterministic op) ranks with
# "same": it only decides the op's outcome when every sample was skipped.
SEVERITY = {"same": 0, "skipped": 0, "wrong": 1, "raised": 2}
# float32 tolerances when the OpInfo has none of its own: sharding changes the order of
# reductions, so results may differ in the last bits from plain torch.
DEFAULT_RTOL = 1e-5
DEFAULT_ATOL = 1e-5
# How many of an OpInfo's first samples are looked at to find ones that get sharded.
SAMPLE_SEARCH = 12
MESSAGE_CHARS = 300


def _progress(role: str, done: int, total: int) -> None:
    # the orchestrator's progress regex reads "[audit <role>] <phase> <n>/<total>"
    print(f"[audit {role}] parity {done}/{total}", file=sys.stderr, flush=True)


def _one_line(text: str, limit: int = MESSAGE_CHARS) -> str:
    """Messages are stored on one line so the reports stay tables."""
    text = " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return _one_line(first)


# --------------------------------------------------------------------------------------
# Time limit
# --------------------------------------------------------------------------------------


class Deadline:
    """Wall-clock budget of one op's DTensor runs (``--op-timeout``).

    Each run gets what is left, under the contract mode's ``time_limit``; its
    ``QueryTimeout`` is recorded as raised ``Timeout``.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spent = 0.0
        self.expired = False

    def run(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` with the remaining budget armed; the time it took counts against it."""
        cv = load_validation()
        remaining = self.seconds - self.spent
        if self.seconds > 0 and remaining <= 0:
            self.expired = True
            raise cv.QueryTimeout(f"no time left of {self.seconds:g}s (--op-timeout)")
        t0 = time.perf_counter()
        try:
            with cv.time_limit(max(remaining, 1e-3) if self.seconds > 0 else 0, wall=True,
                               message=f"exceeded {self.seconds:g}s (--op-timeout)"):
                return fn()
        except cv.QueryTimeout:
            self.expired = True
            raise
        finally:
            self.spent += time.perf_counter() - t0


# --------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------


def placements_for(shape: tuple[int, ...] | list[int], mesh_shape: tuple[int, ...]) -> list[Any]:
    """The placements a tensor of ``shape`` is distributed with on a mesh of ``mesh_shape``.

    One fixed rule, so both torches run the same DTensor calls: per mesh dim, Shard the
    first tensor dim that can be cut into that many more pieces with every rank holding
    at least one element (``torch.chunk`` pieces, as DTensor cuts them: 10 over 4 is
    3,3,3,1; 5 over 4 would leave a rank empty), else Replicate. Empty shards would only
    exercise DTensor's corner cases, not the op. 0-d tensors are replicated.
    """
    from torch.distributed.tensor import Replicate, Shard

    pieces = [1] * len(shape)
    out: list[Any] = []
    for n in mesh_shape:
        for d, size in enumerate(shape):
            k = pieces[d] * n
            per_rank = -(-size // k)  # ceil
            if size > 0 and per_rank * (k - 1) < size:
                pieces[d] = k
                out.append(Shard(d))
                break
        else:
            out.append(Replicate())
    return out


def _tensors(tree: Any) -> list[Any]:
    import torch
    from torch.utils import _pytree as pytree

    return [x for x in pytree.tree_leaves(tree) if isinstance(x, torch.Tensor)]


def _clone(sample_parts: Any) -> Any:
    import torch
    from torch.utils import _pytree as pytree

    return pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), sample_parts)


def pick_samples(info: Any, max_samples: int, mesh_shapes: list[tuple[int, ...]], foreach_tensors: int) -> list[tuple[int, Any]]:
    """``(index, sample)``: first the samples with a tensor that gets sharded, then others.

    OpInfo's first samples are often 0-d or tiny, which would leave every input
    replicated and test nothing DTensor-specific.
    """
    import torch
    from torch.distributed.tensor import Shard
    from torch.testing._internal.common_utils import set_rng_seed
    from torch.testing._internal.opinfo.core import ForeachFuncInfo

    kwargs = {}
    if isinstance(info, ForeachFuncInfo) and foreach_tensors:
        kwargs["num_input_tensors"] = [foreach_tensors]
    # same seed per OpInfo in both processes: identical random samples
    set_rng_seed(0)
    found = list(itertools.islice(info.sample_inputs_func(info, "cpu", torch.float32, False, **kwargs), SAMPLE_SEARCH))

    def sharded(sample: Any) -> bool:
        return any(
            isinstance(p, Shard)
            for t in _tensors((sample.input, sample.args, sample.kwargs))
            for m in mesh_shapes
            for p in placements_for(tuple(t.shape), m)
        )

    order = [i for i, s in enumerate(found) if sharded(s)]
    order += [i for i in range(len(found)) if i not in order]
    return [(i, found[i]) for i in sorted(order[:max_samples])]


def opinfo_tolerance(info: Any) -> tuple[float, float]:
    """(rtol, atol) for float32: the loosest ``toleranceOverride`` the OpInfo declares, if looser."""
    import torch
    from torch.testing._internal.common_device_type import toleranceOverride

    rtol, atol = DEFAULT_RTOL, DEFAULT_ATOL
    for deco in getattr(info, "decorators", ()) or ():
        for d in getattr(deco, "decorators", (deco,)) or ():
            if isinstance(d, toleranceOverride) and torch.float32 in d.d:
                t = d.d[torch.float32]
                rtol, atol = max(rtol, t.rtol), max(atol, t.atol)
    return rtol, atol


# --------------------------------------------------------------------------------------
# One sample
# --------------------------------------------------------------------------------------


def _rank_values(x: Any) -> list[Any]:
    """Every rank's full value of one DTensor output leaf (one entry for plain values)."""
    from torch.distributed._local_tensor import LocalTensor
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        x = x.full_tensor()
    if isinstance(x, LocalTensor):
        return [x._local_tensors[r] for r in sorted(x._local_tensors)]
    return [x]


def run_dtensor(info: Any, parts: tuple[Any, tuple, dict], mesh: Any, mesh_shape: tuple[int, ...]) -> tuple[list[list[Any]], str]:
    """The OpInfo on DTensors of ``parts``; each output leaf as its per-rank full values."""
    import torch
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import distribute_tensor
    from torch.utils import _pytree as pytree

    described: list[str] = []

    with LocalTensorMode(frozenset(range(mesh.size()))):

        def distribute(t: torch.Tensor) -> Any:
            placements = placements_for(tuple(t.shape), mesh_shape)
            described.append("".join(_short_placement(p) for p in placements))
            return distribute_tensor(t, mesh, placements)

        inp, args, kwargs = pytree.tree_map_only(torch.Tensor, distribute, parts)
        out = info(inp, *args, **kwargs)
        leaves = [_rank_values(leaf) for leaf in pytree.tree_leaves(out)]
    return leaves, ",".join(described)


def _short_placement(p: Any) -> str:
    from torch.distributed.tensor import Shard

    return f"S{p.dim}" if isinstance(p, Shard) else "R"


def compare(expected: Any, got: list[list[Any]], rtol: float, atol: float, values: bool = True) -> str | None:
    """None when every rank's value of every output leaf matches plain torch, else why not."""
    import torch
    from torch.utils import _pytree as pytree

    want = pytree.tree_leaves(expected)
    if len(want) != len(got):
        return f"{len(got)} output leaves, plain torch has {len(want)}"
    for leaf, (w, per_rank) in enumerate(zip(want, got)):
        for rank, g in enumerate(per_rank):
            where = f"output {leaf}" + (f" rank {rank}" if len(per_rank) > 1 else "")
            if isinstance(w, torch.Tensor) != isinstance(g, torch.Tensor):
                return f"{where}: {type(g).__name__}, plain torch {type(w).__name__}"
            if not values:
                if isinstance(w, torch.Tensor) and (w.shape != g.shape or w.dtype != g.dtype):
                    return f"{where}: {tuple(g.shape)} {g.dtype}, plain torch {tuple(w.shape)} {w.dtype}"
                continue
            try:
                torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)
            except AssertionError as e:
                return f"{where}: {_one_line(str(e))}"
            except Exception as e:  # e.g. types assert_close cannot compare
                if g != w:
                    return f"{where}: {g!r} != {w!r} ({type(e).__name__})"
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two plain-torch results are identical, nan == nan: detects random ops."""
    from torch.utils import _pytree as pytree

    return compare(a, [[x] for x in pytree.tree_leaves(b)], 0.0, 0.0) is None


def _call_plain_filled(info: Any, parts: tuple[Any, tuple, dict]) -> Any:
    """The OpInfo with uninitialized memory filled (NaN, max int), as deterministic mode does.

    Ops returning uninitialized memory (``empty``, ``new_empty_strided``) often give the
    same garbage twice, so a second plain run alone would not show that their values
    mean nothing; with the fill, such a run differs from the first.
    """
    import torch

    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    # a module property that torch's stubs do not declare
    fill = torch.utils.deterministic.fill_uninitialized_memory  # type: ignore[attr-defined]
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        return _call_plain(info, parts)
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = fill  # type: ignore[attr-defined]


def run_sample(info: Any, label: str, index: int, sample: Any, mesh_name: str, mesh: Any,
               mesh_shape: tuple[int, ...], deadline: Deadline, tol: tuple[float, float]) -> dict:
    """One sample on one mesh: plain torch twice (reference; random or uninitialized values?), then DTensor (timed)."""
    parts = (sample.input, tuple(sample.args), dict(sample.kwargs))
    rec: dict[str, Any] = {"sample": index, "mesh": mesh_name}
    try:
        expected = _call_plain(info, parts)
        again = _call_plain_filled(info, parts)
    except Exception as e:
        rec.update(outcome="skipped", message=f"plain torch raised {type(e).__name__}: {_first_line(e)}")
        return rec
    deterministic = _same(expected, again)

    t0 = time.perf_counter()
    try:
        got, inputs = deadline.run(lambda: run_dtensor(info, _clone(parts), mesh, mesh_shape))
    except load_validation().QueryTimeout as e:
        rec.update(outcome="raised", type="Timeout", where=e.where, dtensor_s=round(time.perf_counter() - t0, 4),
                   message=f"{label} sample {index} mesh {mesh_name}: Timeout: {e} in {e.where}")
        return rec
    except Exception as e:
        rec.update(outcome="raised", type=type(e).__name__, where=load_validation()._raised_at(e),
                   dtensor_s=round(time.perf_counter() - t0, 4),
                   message=f"{label} sample {index} mesh {mesh_name}: {type(e).__name__}: {_first_line(e)}")
        return rec
    rec["dtensor_s"] = round(time.perf_counter() - t0, 4)
    rec["inputs"] = inputs
    why = compare(expected, got, *tol, values=deterministic)
    if why is not None:
        rec.update(outcome="wrong", message=f"{label} sample {index} mesh {mesh_name} ({inputs}): {why}")
    elif not deterministic:
        rec.update(outcome="skipped", message="nondeterministic: plain torch run twice differs (random or "
                   "uninitialized values); DTensor's shapes and dtypes match")
    else:
        rec["outcome"] = "same"
    return rec


def _call_plain(info: Any, parts: tuple[Any, tuple, dict]) -> Any:
    """The OpInfo on fresh copies of the sample (in-place ops must not touch the sample)."""
    inp, args, kwargs = _clone(parts)
    return info(inp, *args, **kwargs)


# --------------------------------------------------------------------------------------
# One op
# --------------------------------------------------------------------------------------


def aggregate(label: str, samples: list[dict], skipped_reason: str | None = None) -> dict:
    """The op's outcome: its worst sample's (all samples skipped: skipped)."""
    rec: dict[str, Any] = {"op": label, "samples": samples,
                           "dtensor_s": round(sum(s.get("dtensor_s", 0.0) for s in samples), 4)}
    if skipped_reason is not None or not samples:
        rec.update(outcome="skipped", message=skipped_reason or "no samples")
        return rec
    ran = [s for s in samples if s["outcome"] != "skipped"]
    if not ran:
        rec.update(outcome="skipped", message=samples[0]["message"])
        return rec
    worst = max(ran, key=lambda s: SEVERITY[s["outcome"]])  # first of the worst kind
    rec["outcome"] = worst["outcome"]
    if worst["outcome"] != "same":
        rec["message"] = worst["message"]
        rec["sample"] = f"{worst['sample']}@{worst['mesh']}"
        if "type" in worst:
            rec["type"] = worst["type"]
            rec["where"] = worst.get("where", "")
    return rec


def run_op(info: Any, meshes: list[tuple[str, Any, tuple[int, ...]]], args: argparse.Namespace) -> dict:
    """Every picked sample of one OpInfo on every mesh, under one --op-timeout budget."""
    import torch

    label = opinfo_label(info)
    if torch.float32 not in info.supported_dtypes("cpu"):
        return aggregate(label, [], "no float32 on cpu")
    try:
        picked = pick_samples(info, args.max_samples, [m[2] for m in meshes], args.foreach_tensors)
    except Exception as e:
        return aggregate(label, [], f"sample_inputs raised {type(e).__name__}: {_first_line(e)}")
    deadline = Deadline(args.op_timeout)
    tol = opinfo_tolerance(info)
    samples = []
    for index, sample in picked:
        for mesh_name, mesh, shape in meshes:
            if deadline.expired:
                samples.append({"sample": index, "mesh": mesh_name, "outcome": "skipped",
                                "message": "op timed out on an earlier sample"})
                continue
            torch.manual_seed(index)
            try:
                samples.append(run_sample(info, label, index, sample, mesh_name, mesh, shape, deadline, tol))
            except Exception as e:  # the audit's own comparison failed: visible, but not DTensor's fault
                samples.append({"sample": index, "mesh": mesh_name, "outcome": "skipped",
                                "message": f"harness error {type(e).__name__}: {_first_line(e)}"})
    rec = aggregate(label, samples)
    rec["tolerance"] = {"rtol": tol[0], "atol": tol[1]}
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="torch", help="label used in progress lines and the JSON (stock/built)")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--ops", default=None, help="comma-separated OpInfo names, globs allowed (others are ignored)")
    ap.add_argument("--meshes", default="4", help="comma-separated mesh shapes: 4, 2x2, 8, 2x4")
    ap.add_argument("--max-samples", type=int, default=3, help="samples per OpInfo")
    ap.add_argument("--foreach-tensors", type=int, default=8, help="tensors per list in foreach samples (0: OpInfo's)")
    ap.add_argument("--op-timeout", type=float, default=120.0,
                    help="wall seconds of DTensor runs per OpInfo before it is recorded as raised Timeout (0: none)")
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")
    t_start = time.monotonic()
    load_start = os.getloadavg()
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    cv = load_validation()
    meshes = [(name, mesh, tuple(mesh.shape)) for name, mesh in cv.make_meshes(args.meshes).items()]
    # the contract mode's choice of OpInfos (aten op names choose none here)
    picked, _ = load_mode().select_opinfos([p.strip() for p in (args.ops or "").split(",") if p.strip()])
    chosen = [info for info, named in picked if named]
    t_setup = time.monotonic()

    ops: dict[str, dict] = {}
    last = 0.0
    for n, info in enumerate(chosen, 1):
        label = opinfo_label(info)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rec = run_op(info, meshes, args)
        rec["total_s"] = round(time.perf_counter() - t0, 4)
        if label in ops:  # two OpInfos with one name+variant: keep both apart
            label = f"{label}#{n}"
            rec["op"] = label
        ops[label] = rec
        now = time.monotonic()
        if now - last > 0.5 or n == len(chosen):
            _progress(args.role, n, len(chosen))
            last = now

    counts = Counter(r["outcome"] for r in ops.values())
    doc = {
        "torch": args.role,
        "torch_version": torch.__version__,
        "torch_file": torch.__file__,
        "python": sys.executable,
        "config": {"ops": args.ops, "meshes": args.meshes,
                   "max_samples": args.max_samples, "foreach_tensors": args.foreach_tensors,
                   "op_timeout": args.op_timeout, "dtype": "float32",
                   "default_tolerance": {"rtol": DEFAULT_RTOL, "atol": DEFAULT_ATOL}},
        "counts": {k: counts.get(k, 0) for k in OUTCOMES},
        "ops": ops,
        "timing": {"setup_s": round(t_setup - t_start, 1), "total_s": round(time.monotonic() - t_start, 1),
                   "dtensor_s": round(sum(r["dtensor_s"] for r in ops.values()), 1),
                   "cpu_s": round(time.process_time(), 1),
                   # other jobs on the machine make wall times noisy: keep the load seen
                   "loadavg_start": [round(x, 2) for x in load_start],
                   "loadavg_end": [round(x, 2) for x in os.getloadavg()]},
    }
    out = Path(args.out)
    write_json_atomically(out, doc)
    print(f"[audit {args.role}] parity done in {doc['timing']['total_s']}s -> {out}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
