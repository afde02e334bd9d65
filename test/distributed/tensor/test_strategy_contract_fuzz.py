# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Property-based fuzzing of DTensor's sharding strategies against the contract C1-C5.

The targeted tests pick their shapes and placements by hand; this file lets
hypothesis pick them: shapes with 0-size and size-1 dims, non-contiguous,
sliced and expanded (stride 0) strides, several dtypes, 1-D, 2-D and 3-D meshes
on the harness's fake process group, and candidate placements mixing
``Replicate``, ``Shard`` on every dim (uneven and empty shards included),
``Partial`` and ``_StridedShard``, over a representative op set (one test per
family: pointwise with broadcasting, in-place and ``out=``, the matmul family,
reductions, views, normalization forward and backward with output masks,
attention, embedding, convolution, foreach).

Every generated call is asked twice:

* a *planner* query through ``ShardingPropagator.get_op_strategy``, every tensor
  input offering several candidates (the all-``Replicate`` one always among
  them, at a drawn position);
* a *runtime* query, one placement per input, built and answered as DTensor's
  dispatch does (``runtime_schema``, ``_wrap_with_op_strategy``,
  ``query_strategy`` of the shared harness).

Each answer must be a strategy that ``check_strategy_contract`` finds no
violation in (expected metas from shape inference on the global inputs), or one
of the *named* outcomes below; anything else fails the test, and hypothesis
shrinks it to a minimal call (op, shapes, strides, dtypes, placements, mesh),
which it prints. A planner answer must also hold at least one ``OpSpec`` per
``OpStrategy`` (every input offers all-Replicate, which every op can run on); a
runtime answer may be empty (no spec keeps an ``out=`` tensor's ``Partial``:
vacuously within the contract, and dispatch then fails choosing a spec, as on
stock), which the report counts apart.

Named outcomes (see :func:`named_outcome`):

* ``not-implemented``: ``NotImplementedError`` whose message names the op
  (``str(op)``), e.g. ``get_op_strategy`` for an op no source can answer;
* ``refusal: <message or type>``, runtime queries only: a refusal the
  harness's ``runtime_refusal`` classifies (a ``RUNTIME_REFUSALS`` message or a
  data-dependent-size exception type) or a message of
  :data:`EXTRA_RUNTIME_REFUSALS` (DTensor deliberately refusing one input
  placement, as stock does); a planner query never refuses, it always offers
  all-Replicate;
* ``declined`` / ``unregistered``, runtime queries only: the decomposition
  answers ``None`` or raises (not ``StrategyContractError``), or no registry
  knows the op (``query_strategy`` raises ``ValueError`` naming it); dispatch
  turns all of these into ``NotImplementedError`` naming the op.

``StrategyContractError`` names the op too, but it is *not* an accepted outcome
here: every strategy the fuzzer reaches is DTensor's own, and the finalizer
rejecting one means DTensor fails an op it registers. Failures found that way
(and stock bugs the fuzzer reaches) are listed in :data:`KNOWN_FAILURES` /
:data:`KNOWN_HANGS`, each with its reason and a reproducer; they are counted as
known failures in the report, never as passes. A query running longer than
``DTENSOR_FUZZ_QUERY_TIMEOUT`` seconds (60) fails as a hang.

A generated call that shape inference itself rejects is not a DTensor question:
hypothesis discards it (``reject``); the generators keep that rare.

The examples run with a fixed seed (``derandomize`` profile and ``@seed``):
``DTENSOR_FUZZ_EXAMPLES`` (default 2000) is the total over all families,
``DTENSOR_FUZZ_SEED`` changes the seed, ``DTENSOR_FUZZ_REPORT=path`` writes the
outcome counts as JSON, and ``DTENSOR_FUZZ_BREAK=<variant>`` runs against a
deliberately broken DTensor (see :data:`BROKEN_VARIANTS`) to show the test
fails and shrinks.
"""

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from hypothesis import given, HealthCheck, Phase, reject, seed, settings, strategies as st
from torch._ops import OpOverload
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    format_violations,
    infer_output_metas,
    OutputMetas,
)
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import (
    _StridedShard,
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_common import (
    query_strategy,
    strategy_registry,
    strategy_schema,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    CapturedCall,
    runtime_refusal_key,
    runtime_schema,
)


# Strategy queries are tiny; more threads only fight the other jobs on CI's 2 cores.
torch.set_num_threads(1)

aten = torch.ops.aten

# ---------------------------------------------------------------------------
# Budget, seed and profile
# ---------------------------------------------------------------------------

TOTAL_EXAMPLES = int(os.environ.get("DTENSOR_FUZZ_EXAMPLES", "2000"))
FUZZ_SEED = int(os.environ.get("DTENSOR_FUZZ_SEED", "20261130"))

# Share of the examples per family (sums to 100): more where the op set and the
# argument space are larger.
FAMILY_WEIGHTS: dict[str, int] = {
    "pointwise": 15,
    "inplace_out": 10,
    "matmul": 11,
    "reductions": 12,
    "views": 15,
    "normalization": 10,
    "attention": 6,
    "embedding": 6,
    "convolution": 6,
    "foreach": 9,
}


def examples_for(family: str) -> int:
    """The family's share of ``TOTAL_EXAMPLES`` (rounded up, so the total is reached)."""
    return max(1, math.ceil(TOTAL_EXAMPLES * FAMILY_WEIGHTS[family] / 100))


settings.register_profile(
    "dtensor_fuzz",
    # Fixed seed, no example database: CI sees the same examples every run.
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=False,
    # no "explain" phase: it traces every line, which makes shrinking a slow
    # strategy take minutes; the shrunk case and the failure say enough
    phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    # Generation is cheap; a slow example is a slow strategy, not a test problem.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ_SETTINGS = settings.get_profile("dtensor_fuzz")


def fuzz_settings(family: str) -> settings:
    """The fixed-seed profile with the family's share of the examples."""
    return settings(FUZZ_SETTINGS, max_examples=examples_for(family))


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------

# Dim sizes: small, uneven for every mesh size, with size 1 and size 0 among them.
DIM_SIZES = (2, 4, 1, 3, 8, 6, 5, 0)
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.float16)
INT_DTYPES = (torch.int64, torch.int32)
ALL_DTYPES = FLOAT_DTYPES + INT_DTYPES + (torch.bool,)
# How a tensor's strides are laid out; "expanded" gives stride-0 dims.
LAYOUTS = ("contiguous", "permuted", "sliced", "expanded")
WRITABLE_LAYOUTS = ("contiguous", "permuted", "sliced")


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = []
    running = 1
    for size in reversed(shape):
        strides.append(running)
        running *= max(size, 1)
    return tuple(reversed(strides))


def dims(min_size: int = 0, max_size: int = 4, sizes: Sequence[int] = DIM_SIZES) -> st.SearchStrategy[list[int]]:
    return st.lists(st.sampled_from(sizes), min_size=min_size, max_size=max_size)


@st.composite
def tensor_meta(
    draw: st.DrawFn,
    shape: Sequence[int],
    dtype: torch.dtype,
    layouts: Sequence[str] = LAYOUTS,
) -> TensorMeta:
    """A global ``TensorMeta`` of ``shape`` with drawn strides."""
    shape = tuple(shape)
    n = len(shape)
    layout = draw(st.sampled_from(layouts)) if n > 0 else "contiguous"
    if layout == "permuted":
        # memory order: order[-1] is innermost
        order = draw(st.permutations(range(n)))
        stride = [0] * n
        running = 1
        for d in reversed(order):
            stride[d] = running
            running *= max(shape[d], 1)
        strides = tuple(stride)
    elif layout == "sliced":
        # x[::s0, ::s1, ...] of a contiguous base
        steps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
        base = contiguous_strides([s * k for s, k in zip(shape, steps)])
        strides = tuple(b * k for b, k in zip(base, steps))
    elif layout == "expanded":
        # some dims broadcast (stride 0), the rest contiguous among themselves
        zero = draw(st.lists(st.booleans(), min_size=n, max_size=n))
        kept = contiguous_strides([1 if z else s for s, z in zip(shape, zero)])
        strides = tuple(0 if z else k for k, z in zip(kept, zero))
    else:
        strides = contiguous_strides(shape)
    return TensorMeta(shape=torch.Size(shape), stride=strides, dtype=dtype)


@st.composite
def broadcast_shape(draw: st.DrawFn, shape: Sequence[int]) -> list[int]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    drop = draw(st.integers(0, len(shape)))
    kept = list(shape[drop:])
    ones = draw(st.lists(st.booleans(), min_size=len(kept), max_size=len(kept)))
    return [1 if o else s for s, o in zip(kept, ones)]


def promote(*dtypes: torch.dtype) -> torch.dtype:
    result = dtypes[0]
    for d in dtypes[1:]:
        result = torch.promote_types(result, d)
    return result


# ---------------------------------------------------------------------------
# Calls, one generator per family: (op, args, kwargs), tensors as TensorMeta
# ---------------------------------------------------------------------------

Call = tuple[OpOverload, tuple[Any, ...], dict[str, Any]]


@st.composite
def pointwise_calls(draw: st.DrawFn) -> Call:
    kind = draw(st.sampled_from(["binary", "unary", "scalar", "ternary", "convert"]))
    out = draw(dims(0, 4))
    if kind == "binary":
        op = draw(
            st.sampled_from(
                [aten.add.Tensor, aten.mul.Tensor, aten.sub.Tensor, aten.div.Tensor,
                 aten.maximum.default, aten.eq.Tensor, aten.pow.Tensor_Tensor]
            )
        )
        pool = ALL_DTYPES if op in (aten.add.Tensor, aten.mul.Tensor, aten.eq.Tensor) else FLOAT_DTYPES + INT_DTYPES
        a = draw(tensor_meta(draw(broadcast_shape(out)), draw(st.sampled_from(pool))))
        b = draw(tensor_meta(draw(broadcast_shape(out)), draw(st.sampled_from(pool))))
        kwargs: dict[str, Any] = {}
        if op in (aten.add.Tensor, aten.sub.Tensor) and draw(st.booleans()):
            kwargs["alpha"] = 2
        return op, (a, b), kwargs
    if kind == "unary":
        op = draw(
            st.sampled_from(
                [aten.relu.default, aten.gelu.default, aten.exp.default, aten.neg.default,
                 aten.sigmoid.default, aten.abs.default]
            )
        )
        pool = FLOAT_DTYPES + INT_DTYPES if op in (aten.neg.default, aten.abs.default, aten.relu.default) else FLOAT_DTYPES
        return op, (draw(tensor_meta(out, draw(st.sampled_from(pool)))),), {}
    if kind == "scalar":
        op = draw(st.sampled_from([aten.add.Scalar, aten.mul.Scalar]))
        x = draw(tensor_meta(out, draw(st.sampled_from(ALL_DTYPES[:-1]))))
        return op, (x, draw(st.sampled_from([2, 0.5]))), {}
    if kind == "ternary":
        op = draw(st.sampled_from([aten.where.self, aten.addcmul.default, aten.lerp.Scalar]))
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        metas = [draw(tensor_meta(draw(broadcast_shape(out)), dtype)) for _ in range(3)]
        if op == aten.where.self:
            cond = draw(tensor_meta(draw(broadcast_shape(out)), torch.bool))
            return op, (cond, metas[0], metas[1]), {}
        if op == aten.addcmul.default:
            return op, tuple(metas), {"value": 0.5}
        # lerp's self and end broadcast to the output, not past it
        return op, (draw(tensor_meta(out, dtype)), metas[0], 0.25), {}
    op = draw(st.sampled_from([aten._to_copy.default, aten.clone.default]))
    x = draw(tensor_meta(out, draw(st.sampled_from(ALL_DTYPES))))
    if op == aten._to_copy.default:
        return op, (x,), {"dtype": draw(st.sampled_from(ALL_DTYPES))}
    fmt = draw(st.sampled_from([torch.preserve_format, torch.contiguous_format]))
    return op, (x,), {"memory_format": fmt}


@st.composite
def inplace_out_calls(draw: st.DrawFn) -> Call:
    shape = draw(dims(0, 4))
    kind = draw(st.sampled_from(["inplace", "out"]))
    if kind == "inplace":
        op = draw(
            st.sampled_from(
                [aten.add_.Tensor, aten.mul_.Tensor, aten.div_.Tensor, aten.relu_.default,
                 aten.addcmul_.default, aten.copy_.default]
            )
        )
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        self_ = draw(tensor_meta(shape, dtype, WRITABLE_LAYOUTS))
        other_dtype = draw(st.sampled_from(ALL_DTYPES if op == aten.copy_.default else (dtype,) + INT_DTYPES))
        other = draw(tensor_meta(draw(broadcast_shape(shape)), other_dtype))
        if op == aten.relu_.default:
            return op, (self_,), {}
        if op == aten.addcmul_.default:
            t2 = draw(tensor_meta(draw(broadcast_shape(shape)), dtype))
            return op, (self_, other, t2), {"value": 2}
        return op, (self_, other), {}
    op = draw(st.sampled_from([aten.add.out, aten.mul.out, aten.exp.out, aten.mm.out]))
    if op == aten.mm.out:
        m, k, n = draw(dims(3, 3))
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        a = draw(tensor_meta([m, k], dtype))
        b = draw(tensor_meta([k, n], dtype))
        return op, (a, b), {"out": draw(tensor_meta([m, n], dtype, WRITABLE_LAYOUTS))}
    if op == aten.exp.out:
        dtype = draw(st.sampled_from(FLOAT_DTYPES))
        x = draw(tensor_meta(shape, dtype))
        return op, (x,), {"out": draw(tensor_meta(shape, dtype, WRITABLE_LAYOUTS))}
    a = draw(tensor_meta(draw(broadcast_shape(shape)), draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))))
    b = draw(tensor_meta(draw(broadcast_shape(shape)), draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))))
    result = list(torch.broadcast_shapes(a.shape, b.shape))
    out = draw(tensor_meta(result, promote(a.dtype, b.dtype), WRITABLE_LAYOUTS))
    return op, (a, b), {"out": out}


@st.composite
def matmul_calls(draw: st.DrawFn) -> Call:
    op = draw(st.sampled_from([aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default]))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    m, k, n = draw(dims(3, 3))
    batched = op in (aten.bmm.default, aten.baddbmm.default)
    lead = [draw(st.sampled_from(DIM_SIZES))] if batched else []
    a = draw(tensor_meta(lead + [m, k], dtype))
    b = draw(tensor_meta(lead + [k, n], dtype))
    if op in (aten.mm.default, aten.bmm.default):
        return op, (a, b), {}
    bias = draw(tensor_meta(draw(broadcast_shape(lead + [m, n])), dtype))
    kwargs = {}
    if draw(st.booleans()):
        kwargs = {"beta": draw(st.sampled_from([0.5, 0])), "alpha": 2}
    return op, (bias, a, b), kwargs


@st.composite
def reduction_calls(draw: st.DrawFn) -> Call:
    op = draw(
        st.sampled_from(
            [aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.max.dim,
             aten.var.correction, aten.sum.default, aten.argmax.default, aten.prod.dim_int,
             aten.any.dim, aten.min.dim, aten.logsumexp.default,
             aten.linalg_vector_norm.default, aten.cumsum.default]
        )
    )
    needs_float = op in (aten.mean.dim, aten.var.correction, aten.logsumexp.default, aten.linalg_vector_norm.default)
    # ops without an identity (max, argmax, ...) cannot reduce an empty dim
    no_empty = op in (aten.amax.default, aten.max.dim, aten.argmax.default, aten.min.dim)
    shape = draw(dims(0, 4, [s for s in DIM_SIZES if s > 0] if no_empty else DIM_SIZES))
    dtype = draw(st.sampled_from(FLOAT_DTYPES if needs_float else ALL_DTYPES[:-1] if op != aten.any.dim else ALL_DTYPES))
    x = draw(tensor_meta(shape, dtype))
    n = len(shape)
    keepdim = draw(st.booleans())
    one_dim = draw(st.integers(-n, n - 1)) if n > 0 else 0
    subset = sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))) if n > 0 else []
    if op == aten.sum.default:
        return op, (x,), {}
    if op in (aten.max.dim, aten.min.dim, aten.prod.dim_int, aten.any.dim):
        return op, (x, one_dim, keepdim), {}
    if op == aten.cumsum.default:
        return op, (x, one_dim), {}
    if op == aten.argmax.default:
        return op, (x, draw(st.sampled_from([None, one_dim])), keepdim), {}
    if op == aten.var.correction:
        return op, (x, subset or None), {"correction": draw(st.sampled_from([0, 1])), "keepdim": keepdim}
    if op == aten.linalg_vector_norm.default:
        return op, (x, draw(st.sampled_from([2, 1]))), {"dim": subset or None, "keepdim": keepdim}
    if op == aten.amax.default:
        return op, (x, subset, keepdim), {}
    return op, (x, subset, keepdim), {}


@st.composite
def reshaped(draw: st.DrawFn, shape: Sequence[int]) -> list[int]:
    """A shape with ``shape``'s number of elements: dims merged, split, 1s added or dropped."""
    target = list(shape)
    for _ in range(draw(st.integers(0, 3))):
        move = draw(st.sampled_from(["merge", "split", "insert1", "drop1"]))
        if move == "merge" and len(target) >= 2:
            i = draw(st.integers(0, len(target) - 2))
            target[i : i + 2] = [target[i] * target[i + 1]]
        elif move == "split" and target:
            i = draw(st.integers(0, len(target) - 1))
            factor = draw(st.sampled_from([2, 3]))
            if target[i] % factor == 0 and target[i] > 0:
                target[i : i + 1] = [factor, target[i] // factor]
        elif move == "insert1":
            target.insert(draw(st.integers(0, len(target))), 1)
        elif move == "drop1" and 1 in target:
            target.remove(1)
    if target and 0 not in target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return target


@st.composite
def view_calls(draw: st.DrawFn) -> Call:
    op = draw(
        st.sampled_from(
            [aten.view.default, aten._unsafe_view.default, aten.reshape.default,
             aten.transpose.int, aten.t.default, aten.permute.default, aten.expand.default,
             aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.select.int,
             aten.slice.Tensor, aten.split.Tensor, aten.unbind.int, aten.alias.default,
             aten.diagonal.default]
        )
    )
    min_dims = {aten.transpose.int: 1, aten.select.int: 1, aten.slice.Tensor: 1, aten.split.Tensor: 1,
                aten.unbind.int: 1, aten.diagonal.default: 2}.get(op, 0)
    max_dims = 2 if op == aten.t.default else 4
    shape = draw(dims(min_dims, max_dims))
    dtype = draw(st.sampled_from(ALL_DTYPES))
    # view needs strides compatible with the new shape; mostly give it contiguous ones
    layouts = ("contiguous", "contiguous") + LAYOUTS if op == aten.view.default else LAYOUTS
    x = draw(tensor_meta(shape, dtype, layouts))
    n = len(shape)

    def a_dim(allow_end: bool = False) -> int:
        return draw(st.integers(-n - int(allow_end), n - 1 + int(allow_end)))

    if op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return op, (x, draw(reshaped(shape))), {}
    if op == aten.transpose.int:
        return op, (x, a_dim(), a_dim()), {}
    if op in (aten.t.default, aten.alias.default):
        return op, (x,), {}
    if op == aten.permute.default:
        return op, (x, list(draw(st.permutations(range(n))))), {}
    if op == aten.expand.default:
        lead = draw(dims(0, 2, [s for s in DIM_SIZES if s > 0]))
        sizes = [draw(st.sampled_from([s, 3, -1])) if s == 1 else draw(st.sampled_from([s, -1])) for s in shape]
        return op, (x, lead + sizes), {}
    if op == aten.unsqueeze.default:
        return op, (x, a_dim(allow_end=True)), {}
    if op == aten.squeeze.dim:
        return op, (x, a_dim() if n > 0 else 0), {}
    if op == aten.squeeze.dims:
        return op, (x, sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))) if n > 0 else []), {}
    if op == aten.select.int:
        d = draw(st.integers(0, n - 1))
        if shape[d] == 0:
            reject()
        return op, (x, d, draw(st.integers(-shape[d], shape[d] - 1))), {}
    if op == aten.slice.Tensor:
        d = a_dim()
        start = draw(st.sampled_from([None, 0, 1, -2]))
        end = draw(st.sampled_from([None, 2, -1, 2**62]))
        return op, (x, d, start, end, draw(st.integers(1, 3))), {}
    if op == aten.split.Tensor:
        return op, (x, draw(st.integers(1, 4)), a_dim()), {}
    if op == aten.unbind.int:
        return op, (x, a_dim()), {}
    return op, (x, draw(st.integers(-2, 2)), 0, n - 1), {}


@st.composite
def normalization_calls(draw: st.DrawFn) -> Call:
    op = draw(
        st.sampled_from(
            [aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
             aten.native_batch_norm.default, aten.native_batch_norm_backward.default,
             aten.convolution_backward.default, aten._fused_rms_norm.default,
             aten._fused_rms_norm_backward.default]
        )
    )
    dtype = draw(st.sampled_from(FLOAT_DTYPES))

    def maybe(meta_shape: Sequence[int], dt: torch.dtype = dtype) -> TensorMeta | None:
        return draw(st.one_of(st.none(), tensor_meta(meta_shape, dt)))

    if op == aten.convolution_backward.default:
        conv = draw(conv_setup(dtype))
        mask = draw(st.lists(st.booleans(), min_size=3, max_size=3))
        bias_sizes = draw(st.sampled_from([None, [conv.out_channels]]))
        args = (conv.grad_output, conv.input, conv.weight, bias_sizes, conv.stride, conv.padding,
                conv.dilation, conv.transposed, conv.output_padding, conv.groups, mask)
        return op, args, {}
    if op in (aten.native_batch_norm.default, aten.native_batch_norm_backward.default):
        shape = draw(dims(2, 4, [s for s in DIM_SIZES if s > 0]))
        c = [shape[1]]
        x = draw(tensor_meta(shape, dtype))
        training = draw(st.booleans())
        # eval mode normalizes with the running statistics, so they must be there
        running = [draw(tensor_meta(c, dtype)), draw(tensor_meta(c, dtype))] if not training else [maybe(c), maybe(c)]
        if op == aten.native_batch_norm.default:
            return op, (x, maybe(c), maybe(c), *running, training, 0.1, 1e-5), {}
        grad = draw(tensor_meta(shape, dtype))
        saved = [maybe(c, torch.float32), maybe(c, torch.float32)] if not training else [
            draw(tensor_meta(c, torch.float32)), draw(tensor_meta(c, torch.float32))]
        mask = draw(st.lists(st.booleans(), min_size=3, max_size=3))
        return op, (grad, x, maybe(c), *running, *saved, training, 1e-5, mask), {}
    shape = draw(dims(1, 4))
    k = draw(st.integers(1, min(2, len(shape))))
    normalized = shape[-k:]
    stats_shape = shape[:-k] + [1] * k
    x = draw(tensor_meta(shape, dtype))
    if op == aten.native_layer_norm.default:
        return op, (x, normalized, maybe(normalized), maybe(normalized), 1e-5), {}
    if op == aten._fused_rms_norm.default:
        return op, (x, normalized, maybe(normalized), draw(st.sampled_from([None, 1e-6]))), {}
    grad = draw(tensor_meta(shape, dtype))
    stats_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype
    rstd = draw(tensor_meta(stats_shape, stats_dtype))
    if op == aten._fused_rms_norm_backward.default:
        mask = draw(st.lists(st.booleans(), min_size=2, max_size=2))
        return op, (grad, x, normalized, rstd, maybe(normalized), mask), {}
    mean = draw(tensor_meta(stats_shape, stats_dtype))
    mask = draw(st.lists(st.booleans(), min_size=3, max_size=3))
    return op, (grad, x, normalized, mean, rstd, maybe(normalized), maybe(normalized), mask), {}


@dataclass
class ConvSetup:
    input: TensorMeta
    weight: TensorMeta
    grad_output: TensorMeta
    out_channels: int
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    transposed: bool
    output_padding: list[int]
    groups: int


@st.composite
def conv_setup(draw: st.DrawFn, dtype: torch.dtype) -> ConvSetup:
    """A valid 1-D or 2-D (transposed) convolution and the shape of its output."""
    spatial = draw(st.integers(1, 2))
    groups = draw(st.sampled_from([1, 2]))
    c_in = groups * draw(st.integers(1, 3))
    c_out = groups * draw(st.integers(1, 3))
    batch = draw(st.sampled_from([2, 1, 0, 3]))
    transposed = draw(st.booleans())
    kernel = draw(st.lists(st.integers(1, 3), min_size=spatial, max_size=spatial))
    stride = draw(st.lists(st.integers(1, 2), min_size=spatial, max_size=spatial))
    padding = draw(st.lists(st.integers(0, 1), min_size=spatial, max_size=spatial))
    dilation = draw(st.lists(st.integers(1, 2), min_size=spatial, max_size=spatial))
    sizes = draw(st.lists(st.sampled_from([4, 5, 8, 3, 6, 1]), min_size=spatial, max_size=spatial))
    output_padding = [0] * spatial
    out_sizes = []
    for i in range(spatial):
        reach = dilation[i] * (kernel[i] - 1) + 1
        if transposed:
            if stride[i] > 1 or dilation[i] > 1:
                output_padding[i] = draw(st.integers(0, max(stride[i], dilation[i]) - 1))
            size = (sizes[i] - 1) * stride[i] - 2 * padding[i] + reach + output_padding[i]
            if size < 1:
                padding[i] = 0
                size = (sizes[i] - 1) * stride[i] + reach + output_padding[i]
        else:
            sizes[i] = max(sizes[i], reach - 2 * padding[i])
            size = (sizes[i] + 2 * padding[i] - reach) // stride[i] + 1
        out_sizes.append(size)
    x = draw(tensor_meta([batch, c_in, *sizes], dtype))
    if transposed:
        w_shape = [c_in, c_out // groups, *kernel]
    else:
        w_shape = [c_out, c_in // groups, *kernel]
    w = draw(tensor_meta(w_shape, dtype))
    g = draw(tensor_meta([batch, c_out, *out_sizes], dtype))
    return ConvSetup(x, w, g, c_out, stride, padding, dilation, transposed, output_padding, groups)


@st.composite
def convolution_calls(draw: st.DrawFn) -> Call:
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    conv = draw(conv_setup(dtype))
    bias = draw(st.one_of(st.none(), tensor_meta([conv.out_channels], dtype)))
    args = (conv.input, conv.weight, bias, conv.stride, conv.padding, conv.dilation,
            conv.transposed, conv.output_padding, conv.groups)
    return aten.convolution.default, args, {}


@st.composite
def attention_calls(draw: st.DrawFn) -> Call:
    op = draw(
        st.sampled_from(
            [aten._scaled_dot_product_efficient_attention.default,
             aten._scaled_dot_product_flash_attention.default,
             aten._scaled_dot_product_flash_attention_for_cpu.default,
             aten._scaled_dot_product_efficient_attention_backward.default,
             aten._scaled_dot_product_flash_attention_backward.default,
             aten._scaled_dot_product_flash_attention_for_cpu_backward.default]
        )
    )
    dtype = draw(st.sampled_from((torch.float32, torch.bfloat16, torch.float16)))
    positive = [s for s in DIM_SIZES if s > 0]
    b, h, lq, lk = draw(dims(4, 4, positive))
    e = draw(st.sampled_from([8, 4, 16]))
    q = draw(tensor_meta([b, h, lq, e], dtype))
    k = draw(tensor_meta([b, h, lk, e], dtype))
    v = draw(tensor_meta([b, h, lk, e], dtype))
    causal = draw(st.booleans())
    scale = draw(st.sampled_from([None, 0.125]))
    int0 = TensorMeta(shape=torch.Size([]), stride=(), dtype=torch.int64)
    if op == aten._scaled_dot_product_efficient_attention.default:
        bias = draw(st.one_of(st.none(), tensor_meta(draw(broadcast_shape([b, h, lq, lk])), dtype)))
        return op, (q, k, v, bias, draw(st.booleans()), 0.0, causal), {"scale": scale}
    if op == aten._scaled_dot_product_flash_attention.default:
        return op, (q, k, v, 0.0, causal, False), {"scale": scale}
    if op == aten._scaled_dot_product_flash_attention_for_cpu.default:
        return op, (q, k, v, 0.0, causal), {"scale": scale}
    grad = draw(tensor_meta([b, h, lq, e], dtype))
    out = draw(tensor_meta([b, h, lq, e], dtype))
    if op == aten._scaled_dot_product_efficient_attention_backward.default:
        lse = draw(tensor_meta([b, h, 32 * math.ceil(lq / 32)], torch.float32))
        bias = draw(st.one_of(st.none(), tensor_meta([b, h, lq, lk], dtype)))
        mask = draw(st.lists(st.booleans(), min_size=4, max_size=4))
        return op, (grad, q, k, v, bias, out, lse, int0, int0, 0.0, mask, causal), {"scale": scale}
    lse = draw(tensor_meta([b, h, lq], torch.float32))
    if op == aten._scaled_dot_product_flash_attention_backward.default:
        cum = TensorMeta(shape=torch.Size([0]), stride=(1,), dtype=torch.int64)
        return op, (grad, q, k, v, out, lse, cum, cum, lq, lk, 0.0, causal, int0, int0), {"scale": scale}
    return op, (grad, q, k, v, out, lse, 0.0, causal), {"scale": scale}


@st.composite
def embedding_calls(draw: st.DrawFn) -> Call:
    op = draw(st.sampled_from([aten.embedding.default, aten.embedding_dense_backward.default]))
    vocab = draw(st.sampled_from([8, 5, 1, 16]))
    dim = draw(st.sampled_from([4, 3, 1, 8]))
    indices = draw(tensor_meta(draw(dims(0, 3)), draw(st.sampled_from(INT_DTYPES))))
    padding_idx = draw(st.sampled_from([-1, 0]))
    if op == aten.embedding.default:
        weight = draw(tensor_meta([vocab, dim], draw(st.sampled_from(FLOAT_DTYPES))))
        return op, (weight, indices, padding_idx), {}
    grad = draw(tensor_meta([*indices.shape, dim], draw(st.sampled_from(FLOAT_DTYPES))))
    return op, (grad, indices, vocab, padding_idx, draw(st.booleans())), {}


@st.composite
def foreach_calls(draw: st.DrawFn) -> Call:
    op = draw(
        st.sampled_from(
            [aten._foreach_add.List, aten._foreach_mul.List, aten._foreach_div.List,
             aten._foreach_add.Scalar, aten._foreach_mul_.Scalar, aten._foreach_add_.List,
             aten._foreach_norm.Scalar, aten._foreach_addcmul.Scalar, aten._foreach_lerp.Scalar,
             aten._foreach_sqrt.default]
        )
    )
    n = draw(st.integers(1, 4))
    shapes = [draw(dims(0, 3)) for _ in range(n)]
    dtypes = [draw(st.sampled_from(FLOAT_DTYPES)) for _ in range(n)]
    inplace = op in (aten._foreach_mul_.Scalar, aten._foreach_add_.List)

    def tensor_list(writable: bool = False) -> list[TensorMeta]:
        layouts = WRITABLE_LAYOUTS if writable else LAYOUTS
        return [draw(tensor_meta(s, d, layouts)) for s, d in zip(shapes, dtypes)]

    xs = tensor_list(writable=inplace)
    if op in (aten._foreach_add.Scalar, aten._foreach_mul_.Scalar):
        return op, (xs, draw(st.sampled_from([2.0, 3]))), {}
    if op == aten._foreach_norm.Scalar:
        return op, (xs, draw(st.sampled_from([2, 1]))), {}
    if op == aten._foreach_sqrt.default:
        return op, (xs,), {}
    if op == aten._foreach_addcmul.Scalar:
        return op, (xs, tensor_list(), tensor_list(), 0.5), {}
    if op == aten._foreach_lerp.Scalar:
        return op, (xs, tensor_list(), 0.25), {}
    return op, (xs, tensor_list()), {}


FAMILIES: dict[str, st.SearchStrategy[Call]] = {
    "pointwise": pointwise_calls(),
    "inplace_out": inplace_out_calls(),
    "matmul": matmul_calls(),
    "reductions": reduction_calls(),
    "views": view_calls(),
    "normalization": normalization_calls(),
    "attention": attention_calls(),
    "embedding": embedding_calls(),
    "convolution": convolution_calls(),
    "foreach": foreach_calls(),
}

# ---------------------------------------------------------------------------
# Meshes and placements
# ---------------------------------------------------------------------------

# Simplest first (hypothesis shrinks towards the front); all fit the fake world of 8.
MESH_SHAPES: tuple[tuple[int, ...], ...] = (
    (2,), (4,), (2, 2), (2, 2, 2), (3,), (1,), (8,), (2, 4), (4, 2), (2, 3), (1, 4), (2, 1, 2),
)
# Candidates per planner input (the all-Replicate one added when not drawn).
MAX_CANDIDATES = 4
PARTIAL_OPS = ("sum", "avg", "max")


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


@st.composite
def placements_for(draw: st.DrawFn, mesh_shape: tuple[int, ...], meta: TensorMeta) -> tuple[Placement, ...]:
    """One placement per mesh dim for a tensor with ``meta``.

    ``Shard`` may pick any dim, so shards are uneven or empty as often as not;
    ``Partial`` only for floating dtypes; ``_StridedShard`` in the two forms
    DTensor produces: alone (what flattening a dim sharded behind another gives)
    or followed by ``Shard`` of the same dim on a later mesh dim (sharding order
    right to left), with sizes that divide evenly.
    """
    ndim = len(meta.shape)
    kinds = ["R"] + (["S"] if ndim else []) + (["P"] if is_float(meta.dtype) else [])
    result: list[Placement] = []
    for _ in mesh_shape:
        kind = draw(st.sampled_from(kinds))
        if kind == "S":
            result.append(Shard(draw(st.integers(0, ndim - 1))))
        elif kind == "P":
            result.append(Partial(draw(st.sampled_from(PARTIAL_OPS))))
        else:
            result.append(Replicate())
    if ndim and draw(st.integers(0, 5)) == 5:
        strided = strided_options(mesh_shape, meta)
        if strided:
            i, j, d, sf = draw(st.sampled_from(strided))
            result[i] = _StridedShard(d, split_factor=sf)
            if j is not None:
                result[j] = Shard(d)
    return tuple(result)


def strided_options(mesh_shape: tuple[int, ...], meta: TensorMeta) -> list[tuple[int, int | None, int, int]]:
    """(mesh dim, later mesh dim or None, tensor dim, split factor) for valid ``_StridedShard``s."""
    options: list[tuple[int, int | None, int, int]] = []
    for d, size in enumerate(meta.shape):
        if size <= 0:
            continue
        for i, mi in enumerate(mesh_shape):
            for sf in (2, 3):
                if mi > 1 and size % (sf * mi) == 0:
                    options.append((i, None, d, sf))
            for j in range(i + 1, len(mesh_shape)):
                mj = mesh_shape[j]
                if mi > 1 and mj > 1 and size % (mi * mj) == 0:
                    options.append((i, j, d, mj))
    return options


@st.composite
def candidates_for(draw: st.DrawFn, mesh_shape: tuple[int, ...], meta: TensorMeta) -> tuple[tuple[Placement, ...], ...]:
    """A planner's candidates: distinct drawn tuples, all-Replicate among them at a drawn position."""
    drawn = draw(st.lists(placements_for(mesh_shape, meta), min_size=1, max_size=MAX_CANDIDATES - 1, unique=True))
    replicate = (Replicate(),) * len(mesh_shape)
    if replicate not in drawn:
        drawn.insert(draw(st.integers(0, len(drawn))), replicate)
    return tuple(drawn)


def placement_text(placements: Sequence[Placement]) -> str:
    return "(" + ", ".join(str(p) for p in placements) + ")"


@dataclass
class FuzzCase:
    """One generated call with its mesh and the placements both queries offer."""

    family: str
    op: OpOverload
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    mesh_shape: tuple[int, ...]
    # per tensor input, in flattened argument order
    candidates: tuple[tuple[tuple[Placement, ...], ...], ...]
    runtime: tuple[tuple[Placement, ...], ...]

    @property
    def call(self) -> CapturedCall:
        return CapturedCall(self.op, self.args, self.kwargs, self.family)

    def __repr__(self) -> str:
        # What hypothesis prints for a falsifying example: every line readable.
        lines = [
            f"call: {self.call}",
            "  (tensors as T[shape]s[stride]:dtype)",
            f"mesh: {'x'.join(map(str, self.mesh_shape))}",
        ]
        for i, (cands, rt) in enumerate(zip(self.candidates, self.runtime)):
            lines.append(
                f"input {i}: planner candidates [{', '.join(placement_text(c) for c in cands)}]"
                f"; runtime {placement_text(rt)}"
            )
        return "FuzzCase(\n  " + "\n  ".join(lines) + "\n)"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # hypothesis pretty-prints dataclasses field by field; this reads better
        printer.text(repr(self))


@st.composite
def fuzz_cases(draw: st.DrawFn, family: str) -> FuzzCase:
    op, args, kwargs = draw(FAMILIES[family])
    mesh_shape = draw(st.sampled_from(MESH_SHAPES))
    metas = CapturedCall(op, args, kwargs, family).tensor_metas
    candidates = tuple(draw(candidates_for(mesh_shape, m)) for m in metas)
    runtime = tuple(draw(placements_for(mesh_shape, m)) for m in metas)
    return FuzzCase(family, op, args, kwargs, mesh_shape, candidates, runtime)


# ---------------------------------------------------------------------------
# Outcomes
# ---------------------------------------------------------------------------

# (query kind, outcome) -> count, over every example run in this process.
OUTCOMES: Counter[tuple[str, str]] = Counter()
# (query kind, outcome) -> the first call that had it, with the message
FIRST_SEEN: dict[tuple[str, str], str] = {}
EXAMPLES: Counter[str] = Counter()
REJECTED: Counter[str] = Counter()
STARTED = time.monotonic()


RESHAPE_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")

# A query taking longer than this is a hang: it fails with the case instead of
# stalling CI (DTENSOR_FUZZ_QUERY_TIMEOUT, seconds).
QUERY_TIMEOUT = float(os.environ.get("DTENSOR_FUZZ_QUERY_TIMEOUT", "60"))


class QueryTimeout(Exception):
    """A strategy query ran past its time limit."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise QueryTimeout in the block after ``seconds`` (main thread, POSIX only; else no limit)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise QueryTimeout(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass(frozen=True)
class KnownFailure:
    """A failure of the change the fuzzer found, excused until it is fixed."""

    # str(OpOverload) of every op it applies to
    ops: tuple[str, ...]
    # exception type names (a failure may surface differently across releases)
    # and a fragment of its message
    exception: tuple[str, ...]
    message: str
    reason: str
    reproducer: str
    # also fails on stock torch (not a bug of the change)
    stock: bool = False
    # narrows the entry to the cases it is about, when the message cannot
    applies: Callable[["FuzzCase", str], bool] | None = None


# Bugs of the change (stock behaves), matched by op and exception; each is still
# queried and counted as "known failure" in the report, never as a pass.
KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        ops=RESHAPE_OPS,
        exception=("ZeroDivisionError",),
        message="integer modulo by zero",
        reason=(
            "view_groups (the view/reshape rule) divides by a 0 dim size when a "
            "0-element tensor is reshaped with the 0 moving to another dim; stock too"
        ),
        reproducer=(
            "x = T[0, 2] float32 contiguous, mesh (2,), all Replicate: "
            "get_op_strategy(strategy_schema(mesh, aten.view.default, (x, [2, 0]))) "
            "raises ZeroDivisionError (torch.distributed.tensor._ops._view_ops"
            ".view_groups([0, 2], [2, 0]))"
        ),
        stock=True,
    ),
    KnownFailure(
        ops=RESHAPE_OPS,
        exception=("KeyError",),
        message="",
        reason=(
            "the view rule cannot map some _StridedShard inputs (it raises KeyError); "
            "a planner query drops such a candidate, a runtime query with that one "
            "placement raises the bare KeyError, on stock too"
        ),
        reproducer=(
            "x = T[2, 4] float32 contiguous, mesh (2,), runtime placement "
            "(_StridedShard(1, split_factor=2),): propagate_op_sharding_non_cached of "
            "aten.view.default(x, [8]) raises KeyError: 1 (stock and built)"
        ),
        stock=True,
        applies=lambda case, kind: kind == "runtime"
        and any(isinstance(p, _StridedShard) for p in case.runtime[0]),
    ),
    KnownFailure(
        ops=("aten.split.Tensor",),
        # 2.13.0's finalizer names the rule; 2.14.1's expansion checks the length first
        exception=("StrategyContractError", "AssertionError"),
        message="",
        reason=(
            "split of a 0-size dim returns one (empty) tensor, the split rule gives no "
            "output spec; stock fails the same calls at dispatch (2.13.0: 'output_specs "
            "has 0 outputs which does not equal the number of op outputs 1', 2.14.1: "
            "'Strategy length 1 != expected 2')"
        ),
        reproducer=(
            "x = T[0] float32, mesh (2,), all Replicate: get_op_strategy(strategy_schema("
            "mesh, aten.split.Tensor, (x, 1, 0))) raises; eager torch.split of such a "
            "DTensor raises on stock and built"
        ),
        stock=True,
        applies=lambda case, kind: case.args[0].shape[case.args[2]] == 0,  # (x, size, dim)
    ),
    KnownFailure(
        ops=("aten.reshape.default",),
        exception=("IndexError",),
        message="list index out of range",
        reason=(
            "reshape_strategy's normalize_sizes indexes the target shape, which is "
            "empty when a 0-d tensor is reshaped to []; stock too (view and "
            "_unsafe_view answer the same call)"
        ),
        reproducer=(
            "x = T[] float32, mesh (2,), all Replicate: get_op_strategy(strategy_schema("
            "mesh, aten.reshape.default, (x, []))) raises IndexError (stock's "
            "propagate_op_sharding_non_cached too)"
        ),
        stock=True,
        applies=lambda case, kind: len(case.args[0].shape) == 0,
    ),
)

# Calls whose query never returns, each with a cheap test whether a case is one
# (the fuzzer skips the query and counts the case as a known failure).
KNOWN_HANGS: dict[str, tuple[KnownFailure, Callable[["FuzzCase"], bool]]] = {}


def _reshape_hangs(case: "FuzzCase") -> bool:
    """Whether view_groups loops forever on this 0-element reshape (see KNOWN_HANGS)."""
    from torch.distributed.tensor._ops._view_ops import view_groups

    if str(case.op) not in RESHAPE_OPS or 0 not in case.args[0].shape:
        return False
    try:
        with time_limit(1.0):
            view_groups(list(case.args[0].shape), list(case.args[1]))
    except QueryTimeout:
        return True
    except Exception:
        return False
    return False


KNOWN_HANGS["reshape of 0 elements"] = (
    KnownFailure(
        ops=RESHAPE_OPS,
        exception=("QueryTimeout",),
        message="",
        reason=(
            "view_groups loops forever when a 0-element tensor is reshaped so that "
            "the 0 moves to an earlier dim followed by non-1 dims; stock too "
            "(DTensor eager view/reshape of such a tensor hangs)"
        ),
        reproducer=(
            "x = T[3, 0] float32 contiguous, mesh (2,), all Replicate: "
            "get_op_strategy(strategy_schema(mesh, aten.view.default, (x, [0, 3]))) "
            "never returns (view_groups([3, 0], [0, 3]))"
        ),
        stock=True,
    ),
    _reshape_hangs,
)


def known_failure(exc: BaseException, case: "FuzzCase", kind: str) -> KnownFailure | None:
    for known in KNOWN_FAILURES:
        if (
            str(case.op) in known.ops
            and type(exc).__name__ in known.exception
            and known.message in str(exc)
            and (known.applies is None or known.applies(case, kind))
        ):
            return known
    return None


# Refusals the fuzzer reaches that the harness's RUNTIME_REFUSALS does not list;
# stock refuses the same inputs with the same message.
EXTRA_RUNTIME_REFUSALS: dict[str, str] = {
    "would remove or reshape sharded dimension": (
        "a view that would merge, split or drop a sharded dim needs a "
        "redistribution, which a view cannot do (stock refuses even the identity "
        "view of a 0-size sharded tensor, T[0] -> [0], with this message)"
    ),
    "Cannot unflatten unevenly sharded tensor": (
        "the counterpart of flattening: a view splitting a sharded dim needs the "
        "split-off leading size to divide evenly over the mesh dim, and a view "
        "cannot redistribute its input"
    ),
    "no valid sharding strategy for the input placements": (
        "no spec keeps a placement that cannot be redistributed (an out= tensor "
        "sharded unevenly or Partial); where torch 2.13.0's expansion hands back "
        "an empty strategy (counted apart below), later releases raise this"
    ),
}


def named_outcome(exc: BaseException, op: OpOverload, runtime: bool) -> str | None:
    """The named outcome ``exc`` is (see the module docstring), or ``None``."""
    message = str(exc)
    if isinstance(exc, QueryTimeout):
        return None  # a query without an answer is a hang, whatever the registry
    if runtime and not isinstance(exc, StrategyContractError) and strategy_registry(op) == "decomposition":
        # DTensor's dispatch turns any failure of the decomposition into
        # NotImplementedError naming the op (as get_op_strategy does)
        return f"declined: decomposition raised {type(exc).__name__}"
    if isinstance(exc, NotImplementedError) and str(op) in message:
        return "not-implemented"
    if runtime:
        refusal = runtime_refusal_key(exc)
        if refusal is not None:
            return f"refusal: {refusal}"
        extra = next((p for p in EXTRA_RUNTIME_REFUSALS if p in message), None)
        if extra is not None:
            return f"refusal: {extra}"
        if isinstance(exc, ValueError) and message == f"DTensor has no sharding strategy for {op}":
            return "unregistered"
    return None


def empty_children(strategy: StrategyType) -> list[str]:
    """Where ``strategy`` holds an ``OpStrategy`` with no ``OpSpec``: an answer a consumer cannot use."""
    if isinstance(strategy, OpStrategy):
        return [] if strategy.strategies else ["the strategy"]
    if isinstance(strategy, TupleStrategy):
        return [f"child {i}" for i, c in enumerate(strategy.children) if isinstance(c, OpStrategy) and not c.strategies]
    return []


def count(kind: str, outcome: str, case: FuzzCase, detail: str = "") -> None:
    OUTCOMES[(kind, outcome)] += 1
    if (kind, outcome) not in FIRST_SEEN and outcome != "strategy checked":
        where = f"{case.call} on mesh {case.mesh_shape}"
        if kind == "runtime":
            where += f", placements {', '.join(placement_text(p) for p in case.runtime)}"
        FIRST_SEEN[(kind, outcome)] = where + (f": {detail}" if detail else "")


def short_traceback(exc: BaseException, frames: int = 8) -> str:
    return "".join(traceback.format_exception(exc)[-frames:])


# ---------------------------------------------------------------------------
# Deliberately broken variants: DTENSOR_FUZZ_BREAK=<name> shows the test fails
# ---------------------------------------------------------------------------


def _drop_meta_on_size1(strategy: StrategyType) -> StrategyType:
    def fix(spec: OpSpec) -> None:
        outs = spec.output_specs
        if isinstance(outs, DTensorSpec) and outs.tensor_meta is not None and 1 in outs.tensor_meta.shape:
            spec.output_specs = DTensorSpec(outs.mesh, outs.placements, tensor_meta=None)

    for child in strategy.children if isinstance(strategy, TupleStrategy) else [strategy]:
        if isinstance(child, OpStrategy) and child.mesh.ndim >= 2:
            for spec in child.strategies:
                fix(spec)
    return strategy


def _break_route(transform: Callable[[StrategyType], StrategyType]) -> Any:
    original = ShardingPropagator._route_op_strategy

    def route(self: ShardingPropagator, *args: Any, **kwargs: Any) -> Any:
        strategy, exc = original(self, *args, **kwargs)
        return (None if strategy is None else transform(strategy)), exc

    return mock.patch.object(ShardingPropagator, "_route_op_strategy", route)


def _copy_input_meta(strategy: StrategyType) -> StrategyType:
    for child in strategy.children if isinstance(strategy, TupleStrategy) else [strategy]:
        if not isinstance(child, OpStrategy):
            continue
        for spec in child.strategies:
            outs = spec.output_specs
            if isinstance(outs, DTensorSpec) and spec.input_specs:
                spec.output_specs = DTensorSpec(outs.mesh, outs.placements, tensor_meta=spec.input_specs[0].tensor_meta)
    return strategy


# name -> (what it breaks, patch context manager factory). Planner queries only
# (they go through ``_route_op_strategy``); the test must fail and print a shrunk case.
BROKEN_VARIANTS: dict[str, tuple[str, Callable[[], Any]]] = {
    "drop-meta-size1-dim": (
        "get_op_strategy drops the output tensor_meta of single-output specs whose "
        "shape has a size-1 dim, on meshes of 2 or more dims",
        lambda: _break_route(_drop_meta_on_size1),
    ),
    "copy-input-meta": (
        "get_op_strategy copies input 0's tensor_meta onto single outputs "
        "(the stock bug after _to_copy, t, reductions)",
        lambda: _break_route(_copy_input_meta),
    ),
}


# ---------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------


class TestStrategyContractFuzz(StrategyContractTestBase):
    """One hypothesis test per op family; see the module docstring."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls._break = None
        name = os.environ.get("DTENSOR_FUZZ_BREAK")
        if name:
            if name not in BROKEN_VARIANTS:
                raise ValueError(f"DTENSOR_FUZZ_BREAK={name!r}: not one of {sorted(BROKEN_VARIANTS)}")
            print(f"fuzzing a broken DTensor: {name}: {BROKEN_VARIANTS[name][0]}", file=sys.stderr)
            cls._break = BROKEN_VARIANTS[name][1]()
            cls._break.start()

    @classmethod
    def tearDownClass(cls) -> None:
        if cls._break is not None:
            cls._break.stop()
        report_outcomes()
        super().tearDownClass()

    def check_case(self, case: FuzzCase) -> None:
        """Ask ``case`` as a planner and as DTensor's runtime; judge both answers."""
        propagator = DTensor._op_dispatcher.sharding_propagator
        mesh = self.mesh(case.mesh_shape)
        per_input = iter(case.candidates)
        planner = strategy_schema(mesh, case.op, case.args, case.kwargs, lambda _m, _meta: next(per_input))
        try:
            expected = infer_output_metas(planner)
        except Exception as e:
            REJECTED[f"{case.op}: {type(e).__name__}"] += 1
            reject()
        EXAMPLES[case.family] += 1
        for name, (known, hangs) in KNOWN_HANGS.items():
            if hangs(case):
                for kind in ("planner", "runtime"):
                    count(kind, f"KNOWN FAILURE: {name} (query skipped, it hangs)", case)
                return
        self.judge(case, "planner", planner, lambda: propagator.get_op_strategy(planner), expected)

        runtime = runtime_schema(mesh, case.op, case.args, case.kwargs, case.runtime)
        wrapped = propagator._wrap_with_op_strategy(runtime)
        self.judge(case, "runtime", wrapped, lambda: query_strategy(wrapped, mesh, runtime), expected)

    def judge(
        self,
        case: FuzzCase,
        kind: str,
        schema: OpSchema,
        ask: Callable[[], StrategyType | None],
        expected: OutputMetas,
    ) -> None:
        is_runtime = kind == "runtime"
        try:
            with time_limit(QUERY_TIMEOUT):
                strategy = ask()
        except Exception as e:
            outcome = named_outcome(e, case.op, is_runtime)
            if outcome is None and known_failure(e, case, kind) is not None:
                outcome = f"KNOWN FAILURE: {case.op}"
            if outcome is None:
                OUTCOMES[(kind, "UNEXPLAINED")] += 1
                if isinstance(e, StrategyContractError):
                    # every strategy queried here is DTensor's own: the finalizer
                    # rejecting one means DTensor cannot answer an op it registers
                    self.fail(
                        f"{kind} query: DTensor's own strategy was rejected by the "
                        f"finalizer: {e}\n{case!r}\n{short_traceback(e)}"
                    )
                self.fail(
                    f"{kind} query raised an exception that is no named outcome: "
                    f"{type(e).__name__}: {e}\n{case!r}\n{short_traceback(e)}"
                )
            count(kind, outcome, case, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            return
        if strategy is None:
            if not is_runtime:
                OUTCOMES[(kind, "UNEXPLAINED")] += 1
                self.fail(f"get_op_strategy returned None instead of raising\n{case!r}")
            count(kind, "declined", case)
            return
        violations = check_strategy_contract(schema, strategy, expected)
        if violations:
            OUTCOMES[(kind, "VIOLATION")] += 1
            self.fail(
                f"{kind} strategy breaks the contract ({len(violations)} violation(s)):\n"
                f"{format_violations(violations[:10])}\n{case!r}"
            )
        empty = empty_children(strategy)
        if empty and not is_runtime:
            # every planner input offers all-Replicate, which every op can run on
            OUTCOMES[(kind, "EMPTY")] += 1
            self.fail(f"{kind} strategy has no OpSpec in {', '.join(empty)}\n{case!r}")
        if empty:
            # No spec keeps this runtime placement (an out= tensor that is Partial):
            # vacuously within the contract; dispatch then fails choosing a spec, as
            # on stock. Counted apart so the report shows how often.
            count(kind, "strategy checked, empty (no spec serves the placement)", case)
            return
        count(kind, "strategy checked", case)

    @seed(FUZZ_SEED)
    @fuzz_settings("pointwise")
    @given(case=fuzz_cases("pointwise"))
    def test_pointwise(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("inplace_out")
    @given(case=fuzz_cases("inplace_out"))
    def test_inplace_out(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("matmul")
    @given(case=fuzz_cases("matmul"))
    def test_matmul(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("reductions")
    @given(case=fuzz_cases("reductions"))
    def test_reductions(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("views")
    @given(case=fuzz_cases("views"))
    def test_views(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("normalization")
    @given(case=fuzz_cases("normalization"))
    def test_normalization(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("attention")
    @given(case=fuzz_cases("attention"))
    def test_attention(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("embedding")
    @given(case=fuzz_cases("embedding"))
    def test_embedding(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("convolution")
    @given(case=fuzz_cases("convolution"))
    def test_convolution(self, case: FuzzCase) -> None:
        self.check_case(case)

    @seed(FUZZ_SEED)
    @fuzz_settings("foreach")
    @given(case=fuzz_cases("foreach"))
    def test_foreach(self, case: FuzzCase) -> None:
        self.check_case(case)


def report_outcomes() -> None:
    """Print the outcome counts (and write them as JSON to ``DTENSOR_FUZZ_REPORT``)."""
    report = {
        "seed": FUZZ_SEED,
        "examples_requested": TOTAL_EXAMPLES,
        "examples_run": dict(EXAMPLES),
        "examples_run_total": sum(EXAMPLES.values()),
        "rejected_by_shape_inference": dict(REJECTED),
        "outcomes": {f"{k}: {o}": n for (k, o), n in sorted(OUTCOMES.items())},
        "first_seen": {f"{k}: {o}": text for (k, o), text in sorted(FIRST_SEEN.items())},
        "seconds": round(time.monotonic() - STARTED, 1),
        "broken_variant": os.environ.get("DTENSOR_FUZZ_BREAK"),
    }
    print("strategy-contract fuzz:", json.dumps(report, indent=1), file=sys.stderr)
    path = os.environ.get("DTENSOR_FUZZ_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    run_tests()
