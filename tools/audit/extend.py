"""What the audit asks beyond its capture (``tools/audit/capture.py``), to reach
every op DTensor registers: every overload that takes a captured call's arguments
(in-place, ``out=``, Python-number and functional forms), run on the call's metas,
and runs by hand of the ops no OpInfo sample or derived overload calls."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map_only

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType

    from torch._ops import OpOverload


def registered_ops() -> set[OpOverload]:
    """The ops DTensor registers a strategy for (the decomposition path aside)."""
    prop = DTensor._op_dispatcher.sharding_propagator
    return {*prop.op_strategy_funcs, *prop.op_single_dim_strategy_funcs}


_NUMBER_FORMS = {("Tensor", "number"), ("Optional[Tensor]", "Optional[number]")}


@functools.cache
def _derived(op: OpOverload) -> tuple[tuple[OpOverload, tuple, tuple], ...]:
    """The overloads a registry answers that take ``op``'s arguments (with
    tensors possibly as numbers): its in-place and ``out=`` forms, and a
    mutating op's functional form. Each with its ``out`` argument names and the
    positions of the tensors it takes as numbers."""
    name = op._schema.name.split("::")[-1]
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    ours = [a for a in op._schema.arguments if not a.is_out]
    registered, found = registered_ops(), []
    for packet_name in (base, f"{base}_", f"{base}_functional"):
        packet = getattr(getattr(torch.ops, op.namespace), packet_name, None)
        overloads = [getattr(packet, o) for o in packet.overloads()] if packet else []
        for other in overloads:
            theirs = [a for a in other._schema.arguments if not a.is_out]
            types = [(str(a.type), str(b.type)) for a, b in zip(ours, theirs)]
            numbers = tuple(i for i, t in enumerate(types) if t in _NUMBER_FORMS)
            outs = tuple(a.name for a in other._schema.arguments if a.is_out)
            functional = op._schema.is_mutable and not other._schema.is_mutable
            if (
                other != op
                and [a.name for a in ours] == [b.name for b in theirs]
                and all(a == b for i, (a, b) in enumerate(types) if i not in numbers)
                and not (numbers and op._schema.is_mutable)
                and not (outs and len(ours) != len(op._schema.arguments))
                and (other in registered or functional and registered & {*overloads})
            ):
                found.append((other, outs, numbers))
    return tuple(found)


def _run_derived(
    op: OpOverload, other: OpOverload, outs: tuple[str, ...], numbers: tuple[int, ...], args: tuple, kwargs: dict
) -> Any:
    """``other`` on the arguments of a call of ``op``: on new meta tensors, or
    on CPU zeros where ``other`` has no meta kernel."""
    schema = [a for a in op._schema.arguments if not a.is_out]
    names = [a.name for a in schema]

    def zeros(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(t.shape, dtype=t.dtype).as_strided(t.shape, t.stride())

    for fresh in (torch.empty_like, zeros):
        try:
            with _disable_current_modes():  # making the arguments calls nothing
                a, kw = tree_map_only(torch.Tensor, fresh, (args, kwargs))
                # op's own out= arguments are not other's; nor, maybe, its defaults
                a, kw = list(a[: len(names)]), {k: kw[k] for k in kw if k in names}
                for d in schema[len(a) :]:
                    if d.name not in kw and d.has_default_value() and not d.kwarg_only:
                        kw[d.name] = d.default_value
                if outs:
                    results = op(*a, **kw)
                    results = (results,) if torch.is_tensor(results) else results
                    kw.update({n: torch.empty_like(r) for n, r in zip(outs, results)})
                for i in numbers:
                    x = a[i] if i < len(a) else kw.get(names[i])
                    if torch.is_tensor(x):
                        number = True if x.dtype == torch.bool else 2
                        if i < len(a):
                            a[i] = number
                        else:
                            kw[names[i]] = number
            with torch.inference_mode():  # a composite op reaches dispatch as called
                return other(*a, **kw)
        except Exception:
            if fresh is zeros:
                raise


def _extra_runs(cap: ModuleType) -> dict[str, Callable[[Any], Any]]:
    """Runs by hand of ops no sample or derived overload calls, on CPU."""
    aten = torch.ops.aten

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(shape).requires_grad_()

    def call(
        op: OpOverload, *args: Any, grad: bool = False, **kwargs: Any
    ) -> Callable[[Any], Any]:
        def run(rec: Any) -> Any:
            out = rec.call(op, *args, **kwargs)
            backward = cap._backward(out, args) if grad else None
            return out if backward is None else backward(rec)

        return run

    def two() -> list[torch.Tensor]:
        return [torch.randn(4, 8), torch.randn(8)]

    x, image = torch.randn(4, 8), t(2, 3, 4, 4)
    ints, double = torch.arange(8).reshape(2, 4), torch.ones(4, dtype=torch.float64)
    size = [6, 6]
    runs = {
        "native dropout": call(
            aten.native_dropout.default, t(4, 8), 0.5, True, grad=True
        ),
        "bicubic aa": call(
            aten._upsample_bicubic2d_aa.default, image, size, False, grad=True
        ),
        "lanczos": call(
            aten._upsample_lanczos2d_aa.default, image, size, False, grad=True
        ),
        "nearest exact 2d": call(
            aten._upsample_nearest_exact2d.default, image, size, grad=True
        ),
        "nearest exact 3d": call(
            aten._upsample_nearest_exact3d.default, image[None], [3, *size], grad=True
        ),
        "nearest 3d": call(
            aten.upsample_nearest3d.default, image[None], [3, *size], grad=True
        ),
        "batch norm without stats": call(
            aten._native_batch_norm_legit.no_stats, image, None, None, True, 0.1, 1e-5
        ),
        "batch norm in eval": call(
            aten._native_batch_norm_legit_no_training.default,
            *(image, None, None, torch.zeros(3), torch.ones(3), 0.1, 1e-5),
        ),
        # float32 cannot hold the float64 result
        "float power Scalar": call(aten.float_power_.Scalar, double.clone(), 2),
        "float power Tensor": call(aten.float_power_.Tensor, double, torch.ones(4)),
        "randint like": call(
            aten.randint_like.low_dtype_out, ints, 0, 4, out=ints.clone()
        ),
        "index put": call(
            aten._index_put_impl_.default,
            torch.zeros(4, 8),
            [ints[0]],
            torch.ones(8),
            True,
        ),
        "norm": call(aten.norm.Scalar, torch.randn(4, 8), 3),
        "powsum": call(aten.linalg__powsum.default, torch.randn(4, 8), 3),
        "foreach powsum": call(aten._foreach_powsum.Scalar, two(), 3),
        "foreach pow": call(aten._foreach_pow.ScalarAndTensor, 2.0, two()),
        "foreach addcmul": call(
            aten._foreach_addcmul_.Tensor, two(), two(), two(), torch.ones(2)
        ),
        "foreach addcdiv": call(
            aten._foreach_addcdiv_.Tensor, two(), two(), two(), torch.ones(2)
        ),
        "same size": call(aten.is_same_size.default, x, x),
        "contiguous": call(aten.contiguous.default, torch.randn(4, 8).t()),
        "view as dtype": call(aten.view.dtype, torch.randn(4, 8), torch.int32),
    }
    for name in ("lshift", "rshift", "xor", "ilshift", "irshift", "ixor"):
        packet = getattr(aten, f"__{name}__")
        runs[f"{name} Tensor"] = call(packet.Tensor, ints.clone(), ints[0])
        runs[f"{name} Scalar"] = call(packet.Scalar, ints.clone(), 1)
    return runs


def extend(capture: Any, cap: ModuleType, names: set[str] | None = None) -> None:
    """Adds to ``capture`` (a ``capture.Capture``) the extra runs by hand (those of
    ``names`` only, if given), then the derived overloads of every call recorded, and of the
    calls those make."""
    for source, record in _extra_runs(cap).items():
        if names is None or source in names:
            capture.run(f"{source} by_hand 0", record)
    done = 0
    while done < len(capture.recorded):
        source, op, args, kwargs = capture.recorded[done]
        done += 1
        for other, outs, numbers in _derived(op):
            if capture.per_op is None or capture._count[other] < capture.per_op:
                run = functools.partial(
                    _run_derived, op, other, outs, numbers, args, kwargs
                )
                capture.run(f"{source}, {other} derived 0", lambda _, run=run: run())


def unreached(capture: Any) -> dict[OpOverload, str]:
    """The registered ops no call of ``capture`` asks, each with why: the failure
    of a run that would have called it, or that none calls it."""
    asked = {op for _, op, _, _ in capture.calls}
    found = {}
    for op in sorted(registered_ops() - asked, key=str):
        failed = [f"{r}: {m}" for r, m in capture.failures.items() if f" {op} " in r]
        found[op] = (
            failed[0]
            if failed
            else "no sample, derived overload or run by hand calls it"
        )
    return found
