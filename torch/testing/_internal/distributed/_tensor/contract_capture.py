# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The aten calls strategy queries are about, captured from OpInfo samples.

Upstream's ``strategy_validation`` records the forward call of ``op_db``
samples after it ran. Strategies are also registered for backward, in-place and
foreach ops, so :func:`capture_calls` also runs backward, the in-place variant
and the foreach OpInfo lists, and :class:`CallRecorder` takes an in-place call's
inputs as they were before it ran. :func:`attention_calls` makes the fused
attention calls no CPU sample reaches.
"""

import warnings
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_registry
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode


def _describe(x: object) -> str:
    if isinstance(x, TensorMeta):
        dtype = str(x.dtype).removeprefix("torch.")
        return f"T{list(x.shape)}s{list(x.stride)}:{dtype}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(_describe(e) for e in x)
        return f"[{inner}]" if isinstance(x, list) else f"({inner})"
    text = repr(x)
    # Objects without a value repr (generators) would make every call distinct.
    return f"<{type(x).__name__}>" if " at 0x" in text else text


def _tensor_leaves(x: object) -> list[TensorMeta]:
    if isinstance(x, TensorMeta):
        return [x]
    if isinstance(x, (list, tuple)):
        return [m for e in x for m in _tensor_leaves(e)]
    if isinstance(x, dict):
        return [m for e in x.values() for m in _tensor_leaves(e)]
    return []


@dataclass
class CapturedCall:
    """One aten call, each tensor argument replaced by its ``TensorMeta``; ``str()``
    is the same in any process (a key), ``source`` the OpInfo and pass that made it."""

    op: OpOverload
    args: tuple[object, ...]
    kwargs: dict[str, object]
    source: str

    @property
    def tensor_metas(self) -> list[TensorMeta]:
        """Tensor arguments in flattened order (args, then kwargs), as schemas list them."""
        return _tensor_leaves((self.args, self.kwargs))

    def __str__(self) -> str:
        args = [_describe(a) for a in self.args]
        args += [f"{k}={_describe(v)}" for k, v in self.kwargs.items()]
        return f"{self.op}({', '.join(args)})"


class _NotDense(Exception):
    pass


def _to_metas(x: object) -> object:
    # What a DTensorSpec cannot describe (sparse, other devices, subclasses) is
    # no call a strategy query could be about.
    if isinstance(x, torch.Tensor):
        if (
            type(x) not in (torch.Tensor, torch.nn.Parameter)
            or x.layout != torch.strided
            or x.device.type != "cpu"
        ):
            raise _NotDense
        return meta_of(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_metas(e) for e in x)
    return x


class CallRecorder(TorchDispatchMode):
    """Records, per op, up to ``pool_size`` distinct aten calls with tensor arguments.

    A call is kept once it returned (a call eager mode rejects is no query), with
    its metas taken before it ran (an in-place op may change its self); ``keep``
    chooses the ops. Calls without tensors never reach DTensor: ``tensorless``
    counts them, and ``not_dense`` those with a tensor a spec cannot describe.
    """

    def __init__(
        self, pool_size: int = 8, keep: Callable[[OpOverload], bool] | None = None
    ) -> None:
        super().__init__()
        self.pool_size = pool_size
        self.keep = keep
        self.source = ""
        self.calls: dict[OpOverload, dict[str, CapturedCall]] = defaultdict(dict)
        self.tensorless: dict[OpOverload, int] = defaultdict(int)
        self.seen = 0
        self.not_dense = 0

    def __torch_dispatch__(  # type: ignore[no-untyped-def]
        self, func, types, args=(), kwargs=None
    ):
        kwargs = kwargs or {}
        call = None
        if func.namespace == "aten" and (self.keep is None or self.keep(func)):
            self.seen += 1
            try:
                call = CapturedCall(
                    func,
                    _to_metas(tuple(args)),  # type: ignore[arg-type]
                    {k: _to_metas(v) for k, v in kwargs.items()},
                    self.source,
                )
            except _NotDense:
                self.not_dense += 1
        out = func(*args, **kwargs)
        if call is not None:
            if not call.tensor_metas:
                self.tensorless[func] += 1
                return out
            pool = self.calls[func]
            key = str(call)
            if key not in pool and len(pool) < self.pool_size:
                pool[key] = call
        return out


def opinfo_db() -> list[Any]:
    """``op_db`` and the foreach OpInfo lists."""
    import torch.testing._internal.common_methods_invocations as cmi

    infos = list(cmi.op_db)
    for name in (
        "foreach_unary_op_db",
        "foreach_binary_op_db",
        "foreach_pointwise_op_db",
        "foreach_reduce_op_db",
        "foreach_other_op_db",
    ):
        infos += getattr(cmi, name, [])
    return infos


def capture_calls(
    opinfos: Iterable[Any],
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.int64, torch.bool),
    extra_dtypes: Sequence[torch.dtype] = (),
    samples: int = 1,
    backward: bool = True,
    foreach_tensors: int | None = 2,
    pool_size: int = 8,
    backward_dtypes: Collection[torch.dtype] | None = None,
    recorder: CallRecorder | None = None,
) -> tuple[CallRecorder, dict[str, int]]:
    """Run OpInfo samples under a :class:`CallRecorder`; return it and counters.

    The first ``samples`` samples, in the first of ``dtypes`` and each of
    ``extra_dtypes`` the OpInfo supports, run forward, backward (``backward_dtypes``,
    default floating) and in-place on a copy; taken from ``sample_inputs_func``
    directly (``sample_inputs`` walks the stack for the running test), seeded.
    """
    from torch.testing._internal.opinfo.core import ForeachFuncInfo

    if recorder is None:
        recorder = CallRecorder(pool_size)
    counts: dict[str, int] = defaultdict(int)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in opinfos:
            counts["opinfos"] += 1
            supported = info.supported_dtypes("cpu")
            run_in = [d for d in dtypes if d in supported][:1]
            run_in += [d for d in extra_dtypes if d in supported and d not in run_in]
            kwargs = {}
            if foreach_tensors is not None and isinstance(info, ForeachFuncInfo):
                kwargs["num_input_tensors"] = [foreach_tensors]
            for dtype in run_in:
                grad = (
                    backward
                    and info.supports_autograd
                    and (
                        dtype.is_floating_point
                        if backward_dtypes is None
                        else dtype in backward_dtypes
                    )
                )
                try:
                    batch = _first_samples(info, dtype, grad, samples, kwargs)
                except Exception:
                    counts["sample_inputs failed"] += 1
                    continue
                for sample in batch:
                    counts["samples"] += 1
                    _run_sample(recorder, info, sample, grad, counts)
    return recorder, dict(counts)


def _first_samples(
    info: Any, dtype: torch.dtype, grad: bool, n: int, kwargs: dict[str, Any]
) -> list[Any]:
    """The first ``n`` samples of ``info``, the RNG reset to ``SEED`` before each
    (as ``OpInfo.sample_inputs`` does outside a test) and before the sample
    function runs (some make their whole list at once)."""
    from torch.testing._internal.common_utils import SEED, set_rng_seed

    set_rng_seed(SEED)
    sample_iter = iter(info.sample_inputs_func(info, "cpu", dtype, grad, **kwargs))
    batch = []
    for _ in range(n):
        set_rng_seed(SEED)
        try:
            batch.append(next(sample_iter))
        except StopIteration:
            break
    return batch


def _run_sample(
    recorder: CallRecorder, info: Any, sample: Any, grad: bool, counts: dict[str, int]
) -> None:
    name = (
        f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name
    )
    try:
        with recorder:
            recorder.source = f"{name} forward"
            out = info(sample.input, *sample.args, **sample.kwargs)
            if grad:
                recorder.source = f"{name} backward"
                if _backward(out):
                    counts["backward runs"] += 1
    except Exception:
        counts["samples failed"] += 1
    inplace = info.get_inplace()
    if inplace is None:
        return
    inp, args, kwargs = pytree.tree_map_only(
        torch.Tensor,
        lambda t: t.detach().clone(),
        (sample.input, sample.args, sample.kwargs),
    )
    try:
        with recorder:
            recorder.source = f"{name} inplace"
            inplace(inp, *args, **kwargs)
        counts["in-place runs"] += 1
    except Exception:
        counts["in-place samples failed"] += 1


def _backward(out: object) -> bool:
    """Backward from the first differentiable result (a complex one through
    ``abs()``, to reach complex backward ops); whether there was one."""
    for t in pytree.tree_leaves(out):
        if (
            isinstance(t, torch.Tensor)
            and t.requires_grad
            and (t.is_floating_point() or t.is_complex())
        ):
            loss = t.abs().sum() if t.is_complex() else t.sum()
            loss.backward()
            return True
    return False


def select_calls(
    recorder: CallRecorder, per_op: int
) -> dict[OpOverload, list[CapturedCall]]:
    """Up to ``per_op`` calls of every op a registry knows, sorted by op name; calls
    with dtypes, then passes, not picked yet first (likeliest to take another path)."""
    selected: dict[OpOverload, list[CapturedCall]] = {}
    for op in sorted(recorder.calls, key=str):
        if strategy_registry(op) is None:
            continue
        remaining = list(recorder.calls[op].values())
        picked: list[CapturedCall] = []
        while remaining and len(picked) < per_op:
            dtypes = {tuple(m.dtype for m in c.tensor_metas) for c in picked}
            passes = {c.source.rsplit(" ", 1)[-1] for c in picked}
            best = min(
                remaining,
                key=lambda c: (
                    tuple(m.dtype for m in c.tensor_metas) in dtypes,
                    c.source.rsplit(" ", 1)[-1] in passes,
                ),
            )
            remaining.remove(best)
            picked.append(best)
        selected[op] = picked
    return selected
