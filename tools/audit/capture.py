"""
The audit's capture: the aten calls DTensor's registries answer, to check their
strategies with ``strategy_contract``: OpInfo samples run in every variant of
``VARIANTS``, and ops no sample calls run by hand, the CUDA-only ones on meta
tensors.
"""

import collections
import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_tensor, DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed._tensor.strategy_contract import (
    registry,
    runtime_candidate,
)
from torch.testing._internal.opinfo.core import ForeachFuncInfo
from torch.utils._python_dispatch import _disable_current_modes, TorchDispatchMode
from torch.utils._pytree import tree_any, tree_flatten, tree_map, tree_map_only


Call = tuple[str, OpOverload, tuple, dict]  # (the run that made it, op, args, kwargs)

# backward: the gradients of the inputs that need them; inference: composite ops
# reach dispatch as called, as with DTensor
VARIANTS = ("forward", "backward", "inplace", "out", "inference")


def _key(op: OpOverload, args: tuple, kwargs: dict) -> str:
    def meta(x: object) -> object:
        return (x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x

    return repr((op, tree_map(meta, (args, kwargs))))


class _Recorder(TorchDispatchMode):
    """Records each call on strided tensors that returns and has no key in
    ``seen``, with its tensors as they were at the call."""

    def __init__(self, seen: set[str]) -> None:
        super().__init__()
        self.calls: list[tuple[OpOverload, tuple, dict]] = []
        self.seen = seen

    def __torch_dispatch__(
        self, func: OpOverload, types: object, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        return self.call(func, *args, **(kwargs or {}))

    def call(self, func: OpOverload, *args: Any, **kwargs: Any) -> Any:
        """Runs and records ``func``, also where no dispatch mode would see it."""
        tensors = [x for x in tree_flatten((args, kwargs))[0] if torch.is_tensor(x)]
        key = _key(func, args, kwargs)
        if key in self.seen or any(t.layout != torch.strided for t in tensors):
            return func(*args, **kwargs)
        as_meta = lambda t: torch.empty_strided(  # noqa: E731
            t.shape, t.stride(), dtype=t.dtype, device="meta"
        )
        call = (func, *tree_map_only(torch.Tensor, as_meta, (args, kwargs)))
        out = func(*args, **kwargs)
        if key not in self.seen:  # a composite op records its parts first
            self.seen.add(key)
            self.calls.append(call)
        return out


@dataclasses.dataclass
class Capture:
    """The distinct aten calls with a tensor argument that a registry answers,
    at most ``per_op`` of an op (``composites``: also of the composite ops no
    registry holds, which dispatch decomposes), and the runs that raised:
    ``failures`` maps ``"<source> <variant> <sample>"`` to ``"Type: message"``;
    ``recorded`` holds every call recorded, answered or not."""

    per_op: int | None = None
    composites: bool = True
    calls: list[Call] = dataclasses.field(default_factory=list)
    opinfos: int = 0
    runs: int = 0
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    recorded: list[Call] = dataclasses.field(default_factory=list)
    _seen: set[str] = dataclasses.field(default_factory=set)
    _count: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def run(self, run: str, fn: Callable[[_Recorder], Any]) -> Any:
        """``fn(recorder)`` under the recorder; a failure keeps the calls made."""
        self.runs += 1
        recorder = _Recorder(self._seen)
        try:
            with recorder:
                return fn(recorder)
        except Exception as e:
            self.failures[run] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
            return None
        finally:
            source = run.rsplit(" ", 1)[0]
            composite = torch._C.DispatchKey.CompositeImplicitAutograd
            has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
            for op, args, kwargs in recorder.calls:
                self.recorded.append((source, op, args, kwargs))
                full = self.per_op is not None and self._count[op] >= self.per_op
                where = None if full else registry(op)
                decomposed = where == "decomposition" and not self.composites
                if decomposed and has_kernel(op.name(), composite):
                    continue
                if where and tree_any(torch.is_tensor, (args, kwargs)):
                    self._count[op] += 1
                    self.calls.append((source, op, args, kwargs))


def _backward(out: object, inputs: object) -> Callable[[Any], Any] | None:
    """The gradients of the results that need grad for the inputs that need it
    (None when there are none), as a run."""
    outs, ins = (
        [t for t in tree_flatten(x)[0] if torch.is_tensor(t) and t.requires_grad]
        for x in (out, inputs)
    )

    def run(_: object) -> Any:
        with _disable_current_modes():  # the seeds are not the op's calls
            seeds = [torch.ones_like(o) for o in outs]
        return torch.autograd.grad(outs, ins, seeds, allow_unused=True)

    return run if outs and ins else None


def capture_opinfo(
    capture: Capture, opinfo: Any, samples: int | None, variants: tuple[str, ...]
) -> None:
    """Runs the first ``samples`` samples of ``opinfo`` in each of ``variants``,
    in float32 (else an integer, complex or bool dtype) on CPU, or on meta
    tensors when the op has no CPU kernel."""
    name = f"{opinfo.name}.{opinfo.variant_test_name}".rstrip(".")
    capture.opinfos += 1
    preferred = (torch.float32, torch.int64, torch.complex64, torch.bool)
    where = [
        ("cpu" if device == "cpu" else "meta", dtype)
        for device in ("cpu", "cuda")
        for dtype in (*preferred, *sorted(opinfo.supported_dtypes(device), key=str))
        if dtype in opinfo.supported_dtypes(device)
    ]
    if not where:
        capture.failures[f"{name} samples 0"] = "no dtype on CPU or CUDA"
        return
    device, dtype = where[0]
    foreach = isinstance(opinfo, ForeachFuncInfo)
    # a foreach OpInfo without an out-of-place form runs its in-place one
    grad = "backward" in variants and opinfo.supports_autograd
    grad &= dtype.is_floating_point or dtype.is_complex
    grad &= opinfo.supports_out or not foreach
    kwargs = {"num_input_tensors": [2]} if foreach else {}
    out_variant = "out" in variants and opinfo.supports_out and not foreach
    torch.default_generator.manual_seed(0)  # the same samples in every run
    # the sample function itself: sample_inputs inspects the stack per sample
    make = functools.partial(opinfo.sample_inputs_func, opinfo, device, dtype, grad)
    found = capture.run(
        f"{name} samples 0", lambda _: list(itertools.islice(make(**kwargs), samples))
    )
    copy = functools.partial(tree_map_only, torch.Tensor, lambda t: t.detach().clone())
    for i, s in enumerate(found or ()):
        inputs = (s.input, s.args, s.kwargs)
        out = capture.run(
            f"{name} forward {i}", lambda _: opinfo.op(s.input, *s.args, **s.kwargs)
        )
        backward = _backward(out, inputs) if grad else None
        if backward is not None:
            capture.run(f"{name} backward {i}", backward)
        if "inplace" in variants and opinfo.inplace_variant is not None:
            x, args, kw = copy(inputs)
            call = lambda _: opinfo.inplace_variant(x, *args, **kw)  # noqa: E731
            capture.run(f"{name} inplace {i}", call)
        if out_variant and out is not None:
            x, args, kw = copy(inputs)
            out = tuple(out) if isinstance(out, tuple) else out
            res = tree_map_only(
                torch.Tensor, lambda t: torch.empty_like(t.detach()), out
            )
            capture.run(f"{name} out {i}", lambda _: opinfo.op(x, *args, **kw, out=res))
        for fn in (opinfo.op, *(a.op for a in opinfo.aliases)):
            if "inference" in variants:
                with torch.inference_mode():
                    call = lambda _: fn(s.input, *s.args, **s.kwargs)  # noqa: E731
                    capture.run(f"{name} inference {i}", call)


def _by_hand() -> dict[str, Callable[[_Recorder], Any]]:
    """Runs that record ops no OpInfo sample calls: the CUDA-only attention,
    grouped mm and fused RMS norm on meta tensors (their meta kernels give the
    metas), the fused optimizers and gradient unscaling on CPU; each records
    its op as called, and its backward."""
    aten = torch.ops.aten

    def t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        x = torch.randn(shape, device="meta").to(dtype)
        return x.requires_grad_(dtype.is_floating_point)

    def two() -> list[torch.Tensor]:
        return [torch.randn(4, 8), torch.randn(8)]

    def run(op: OpOverload, args: tuple, kwargs: dict, rec: _Recorder) -> Any:
        backward = _backward(rec.call(op, *args, **kwargs), args)
        return None if backward is None else backward(rec)

    q, x, bf16, steps = t(2, 4, 8, 16), t(4, 8), torch.bfloat16, torch.zeros(())
    offsets = torch.arange(4, 20, 4, device="meta", dtype=torch.int32)
    calls = [
        (aten._scaled_dot_product_flash_attention.default, (q, q, q)),
        (aten._scaled_dot_product_efficient_attention.default, (q, q, q, None, True)),
        (aten._scaled_dot_product_cudnn_attention.default, (q, q, q, None, True)),
        (
            aten._grouped_mm.default,
            (t(16, 8, dtype=bf16), t(4, 8, 16, dtype=bf16), offsets),
        ),
        (aten._fused_rms_norm.default, (x, [8], t(8), 1e-5)),
        (aten._fused_rms_norm_backward.default, (x, x, [8], t(4, 1), t(8), [True] * 2)),
        (
            aten._amp_foreach_non_finite_check_and_unscale_.default,
            (two(), torch.zeros(1), torch.ones(1)),
        ),
    ]
    runs: dict[str, Callable[[_Recorder], Any]] = {
        str(op): functools.partial(run, op, args, {}) for op, args in calls
    }
    for name, overload in itertools.product(
        ("_fused_adam", "_fused_adam_", "_fused_adamw", "_fused_adamw_"),
        ("default", "tensor_lr"),
    ):
        op = getattr(getattr(aten, name), overload)
        lr = 0.1 if overload == "default" else torch.tensor(0.1)
        steps_ = [steps.clone(), steps.clone()]
        args: tuple[Any, ...] = (two(), two(), two(), two(), [], steps_)
        kwargs = dict(lr=lr, beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8)
        kwargs |= dict(amsgrad=False, maximize=False)
        runs[str(op)] = functools.partial(run, op, args, kwargs)
    return runs


def opinfo_databases() -> list[tuple[Any, tuple[str, ...]]]:
    """The OpInfos the capture runs, each with its variants: ``op_db`` and the
    foreach databases in all, the Python references forward."""
    from torch.testing._internal import common_methods_invocations as db

    foreach = [
        *db.foreach_unary_op_db,
        *db.foreach_binary_op_db,
        *db.foreach_pointwise_op_db,
        *db.foreach_reduce_op_db,
        *db.foreach_other_op_db,
    ]
    return [
        *((o, VARIANTS) for o in (*db.op_db, *foreach)),
        *((o, ("forward",)) for o in db.python_ref_db),
    ]


def capture_calls(
    names: set[str] | None = None,
    samples: int = 1,
    per_op: int | None = None,
    composites: bool = True,
) -> Capture:
    """The distinct aten calls of the first ``samples`` samples of each OpInfo
    (a foreach one: all its samples) in its variants, and of the runs by hand;
    at most ``per_op`` calls of an op (``composites``: see :class:`Capture`).
    ``names`` keeps the OpInfos and runs by hand of those names."""
    capture = Capture(per_op, composites)
    for opinfo, variants in opinfo_databases():
        full = f"{opinfo.name}.{opinfo.variant_test_name}".rstrip(".")
        if names is None or names & {opinfo.name, full}:
            foreach = isinstance(opinfo, ForeachFuncInfo)
            capture_opinfo(capture, opinfo, None if foreach else samples, variants)
    for source, record in _by_hand().items():
        if names is None or source in names:
            capture.run(f"{source} by_hand 0", record)
    return capture


def eager_error(
    op: OpOverload,
    args: tuple,
    kwargs: dict,
    mesh: DeviceMesh,
    candidates: Callable[..., Any] = runtime_candidate,
    simulate: bool = True,
    compare: bool = False,
) -> str | None:
    """Why eager DTensor refuses ``op`` on DTensors placed as the first of
    ``candidates`` (in inference mode, where composite ops reach dispatch as
    called), or None when it runs the call: every rank in ``LocalTensorMode``
    (``simulate``), else this process's rank alone, as one process of a job.
    ``compare`` (simulated only): a run whose results, gathered, are not plain
    torch's on the same values counts as a refusal, ``WrongResult``."""
    from torch.distributed._local_tensor import LocalTensor, LocalTensorMode, maybe_disable_local_tensor_mode

    plain: list[torch.Tensor] = []

    def dtensor(x: torch.Tensor) -> DTensor:
        placements = candidates(x, mesh)[0]
        with maybe_disable_local_tensor_mode():
            data = torch.randn(x.shape).to(x.dtype)
            plain.append(data.clone())
            if any(p.is_partial() for p in placements):
                return distribute_tensor(data, mesh, placements)
            # each rank's piece cut here: LocalTensorMode cannot chunk a tensor into
            # lists whose length differs across ranks (nested uneven shards)
            pieces = {}
            for coord in itertools.product(*map(range, mesh.shape)):
                local = data
                for dim, p in enumerate(placements):
                    if isinstance(p, Shard | _StridedShard):
                        local = p._split_tensor(local, mesh.size(dim), with_padding=False)[0][coord[dim]]
                pieces[int(mesh.mesh[coord])] = local.clone()
        held = LocalTensor(pieces) if simulate else pieces[mesh.get_rank()]
        return DTensor.from_local(
            held, mesh, placements, run_check=False, shape=data.shape, stride=data.stride()
        )

    ranks = LocalTensorMode(frozenset(range(mesh.size()))) if simulate else contextlib.nullcontext()
    with ranks, torch.inference_mode():
        try:
            dargs, dkwargs = tree_map_only(torch.Tensor, dtensor, (args, kwargs))
            got = op(*dargs, **dkwargs)
        except Exception as e:
            return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
        if compare and simulate and torch.Tag.nondeterministic_seeded not in op.tags:
            return _wrong_result(op, args, kwargs, iter(plain), got)
    return None


def _wrong_result(op: OpOverload, args: tuple, kwargs: dict, plain: Any, got: Any) -> str | None:
    """How eager DTensor's results ``got`` differ from plain torch's on the values ``plain`` held (in
    ``LocalTensorMode``: every rank's gathered result), or None where they agree."""
    from torch.distributed._local_tensor import LocalTensor, maybe_disable_local_tensor_mode

    try:
        gathered = tree_map_only(DTensor, lambda d: d.full_tensor(), got)
        with maybe_disable_local_tensor_mode():
            pargs, pkwargs = tree_map_only(torch.Tensor, lambda _: next(plain), (args, kwargs))
            expected = op(*pargs, **pkwargs)
            for g, e in zip(tree_flatten(gathered)[0], tree_flatten(expected)[0]):
                if not torch.is_tensor(e):
                    continue
                for rank in g._local_tensors.values() if isinstance(g, LocalTensor) else [g]:
                    torch.testing.assert_close(rank, e, equal_nan=True)
    except Exception as e:
        return f"WrongResult: eager DTensor runs it, but its results are not plain torch's: {type(e).__name__}: " \
               f"{' '.join(str(e).split())[:200]}"
    return None


def refused_alike(error: Exception, eager: str | None) -> bool:
    """Whether ``eager_error`` reports ``error``'s type or one of its bases."""
    return any((eager or "").startswith(f"{t.__name__}:") for t in type(error).__mro__)
