# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Property-based fuzzing of DTensor's sharding strategies against the contract C1-C5,
for every op family but pointwise: in-place and ``out=``, the matmul family,
reductions, views, normalization forward and backward with output masks,
convolution, attention, embedding and foreach. The machinery (what is
generated, how each call is asked and judged, the named outcomes, the environment
variables) is test_strategy_contract_fuzz.py's, whose docstring describes it; the
failures these families reach on stock torch as well are listed here, each with its
reason and a reproducer, and counted apart.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from hypothesis import reject, strategies as st
from test_strategy_contract_fuzz import (
    broadcast_shape,
    Call,
    DIM_SIZES,
    dims,
    family_test,
    FLOAT_DTYPES,
    FuzzCase,
    FuzzTestBase,
    INT_DTYPES,
    KnownFailure,
    LAYOUTS,
    promote,
    ALL_DTYPES,
    QueryTimeout,
    tensor_meta,
    WRITABLE_LAYOUTS,
    time_limit,
)
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.common_utils import run_tests


aten = torch.ops.aten

# ---------------------------------------------------------------------------
# Calls, one generator per family: (op, args, kwargs), tensors as TensorMeta
# ---------------------------------------------------------------------------


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


# family -> (its calls, its share of the examples in percent; see FAMILIES there)
FAMILIES: dict[str, tuple[st.SearchStrategy[Call], int]] = {
    "inplace_out": (inplace_out_calls(), 10),
    "matmul": (matmul_calls(), 11),
    "reductions": (reduction_calls(), 12),
    "views": (view_calls(), 15),
    "normalization": (normalization_calls(), 10),
    "attention": (attention_calls(), 6),
    "embedding": (embedding_calls(), 6),
    "convolution": (convolution_calls(), 6),
    "foreach": (foreach_calls(), 9),
}

# ---------------------------------------------------------------------------
# Known failures (all of them stock's as well)
# ---------------------------------------------------------------------------

RESHAPE_OPS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")

# Failures the fuzzer reaches in these families, matched by op and exception; each
# is still queried and counted as "known failure" in the report, never as a pass.
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


class TestStrategyContractFuzzOps(FuzzTestBase):
    """One hypothesis test per family of this file."""

    known_failures = KNOWN_FAILURES
    known_hangs = KNOWN_HANGS


for _family, (_calls, _weight) in FAMILIES.items():
    setattr(TestStrategyContractFuzzOps, f"test_{_family}", family_test(_family, _calls, _weight))


if __name__ == "__main__":
    run_tests()
