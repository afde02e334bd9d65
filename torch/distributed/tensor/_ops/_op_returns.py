# Copyright (c) Meta Platforms, Inc. and affiliates
"""
What an op returns, as the strategy contract reads it.

The contract (``strategy_contract.py``) judges a strategy against the op's results:
their metadata on the global inputs (:func:`infer_output_metas`), which of them the
call leaves out (:func:`masked_off_returns`) and which no rule shards
(:data:`REPLICATED_RETURNS`), and, for foreach-like ops, each element's share
(:func:`element_schema`, :func:`element_output_metas`). The checker, the finalizer
and the planner queries all need the same answers, so they live here, apart from
any of them. Everything here reads only the op's schema and DTensor's public data
structures.
"""

import functools
from collections.abc import Sequence
from typing import Any, cast, TypeAlias

import torch
from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpStrategy, TupleStrategy
from torch.utils import _pytree as pytree


__all__ = [
    "OutputMetas",
    "REPLICATED_RETURNS",
    "element_output_metas",
    "element_schema",
    "infer_output_metas",
    "masked_off_returns",
    "op_has_tensor_returns",
    "replicated_returns",
    "tensor_inputs",
    "without_unplaced",
]

# Output metadata as shape inference gives it: ``TensorMeta`` for a tensor, ``None``
# for a ``None`` or non-tensor result, and tuples/lists mirroring the op's returns.
OutputMetas: TypeAlias = TensorMeta | Sequence[Any] | None


def op_has_tensor_returns(op: OpOverload) -> bool:
    """Whether any declared return of ``op`` can hold a tensor."""
    return any("Tensor" in str(ret.type) for ret in op._schema.returns)


def _is_tensor_input(x: object) -> bool:
    return isinstance(x, OpStrategy)


def tensor_inputs(op_schema: OpSchema) -> list[OpStrategy]:
    """The tensor inputs of a strategy schema, flattened in argument order.

    Lists of tensors (``TupleStrategy`` or plain lists, possibly with ``None``
    holes) contribute their elements; kwargs (e.g. ``out=``) come after args.
    """
    leaves = pytree.tree_leaves(
        (op_schema.args_schema, list(op_schema.kwargs_schema.values()))
    )
    return [leaf for leaf in leaves if _is_tensor_input(leaf)]


def element_schema(op_schema: OpSchema, index: int) -> OpSchema:
    """The per-element schema of a foreach-like op: list args reduced to element ``index``."""

    def pick(x: object) -> object:
        if isinstance(x, TupleStrategy):
            return x.children[index]
        return x

    args = tuple(pick(a) for a in op_schema.args_schema)
    kwargs = {k: pick(v) for k, v in op_schema.kwargs_schema.items()}
    return OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info)


def element_output_metas(op: OpOverload, output_metas: OutputMetas, index: int) -> OutputMetas:
    """The results of element ``index`` of a foreach-like op."""
    if output_metas is None or isinstance(output_metas, TensorMeta):
        # In-place foreach ops return nothing; a per-element result is None.
        return None if output_metas is None else output_metas
    returns = op._schema.returns
    if len(returns) == 1:
        # A single List[Tensor] return: element i is the i-th tensor.
        return cast(OutputMetas, output_metas[index])
    # Several list returns (e.g. functional fused optimizers): one entry per return.
    # (a TensorMeta is a NamedTuple: a tensor return is taken whole, not indexed)
    return tuple(
        m[index] if isinstance(m, (list, tuple)) and not isinstance(m, TensorMeta) else m
        for m in output_metas
    )


# Op results no sharding rule places, by return name, each with why it is
# ``Replicate``: every rank holds the whole (small) tensor, and no placement of the
# inputs changes it. Rules leave them ``None``; specs handed out replicate them.
_RNG_STATE = (
    "the RNG state the kernel drew its dropout mask from; each rank holds all of "
    "it, and the backward kernel reads it whole"
)
_DENSE_UNUSED = (
    "an offset buffer only nested (jagged) inputs use; for the dense inputs "
    "DTensor runs, each rank holds the same empty or unused tensor"
)
REPLICATED_RETURNS: dict[str, str] = {
    "philox_seed": _RNG_STATE,
    "philox_offset": _RNG_STATE,
    "rng_state": _RNG_STATE,
    "unused": (
        "a placeholder the flash kernel returns beside its RNG state (and its "
        "backward takes as philox_offset); each rank holds the same 0-d tensor"
    ),
    "cum_seq_q": _DENSE_UNUSED,
    "cum_seq_k": _DENSE_UNUSED,
}


@functools.cache
def replicated_returns(op: OpOverload) -> frozenset[int]:
    """Positions of ``op``'s tensor returns named in :data:`REPLICATED_RETURNS`."""
    return frozenset(
        pos
        for pos, ret in enumerate(op._schema.returns)
        if ret.name in REPLICATED_RETURNS and "Tensor" in str(ret.type)
    )


@functools.cache
def _mask_argument(op: OpOverload) -> tuple[int, str] | None:
    """(position, name) of ``op``'s ``bool[]`` argument masking its results, if any."""
    returns = op._schema.returns
    if len(returns) < 2 or not all(str(ret.type) == "Tensor" for ret in returns):
        return None
    for position, arg in enumerate(op._schema.arguments):
        if str(arg.type) == "List[bool]" and arg.name.endswith("mask"):
            return position, arg.name
    return None


def masked_off_returns(op_schema: OpSchema) -> frozenset[int]:
    """The return positions ``op_schema``'s call masks off.

    An op with several tensor returns and a ``bool[]`` argument named ``*mask``
    (``output_mask``, ``grad_input_mask``) with one entry per return asks, with a
    False entry, not to compute that return. Whether the result then is ``None``
    is the kernel's call (see C2); where shape inference gives ``None`` it is
    ``None`` (CPU convolution on its mkldnn path still computes ``grad_weight``
    along with a requested ``grad_bias``; DTensor fails on that result, as it
    always has).
    """
    found = _mask_argument(op_schema.op)
    if found is None:
        return frozenset()
    position, name = found
    if position < len(op_schema.args_schema):
        mask = op_schema.args_schema[position]
    else:
        mask = op_schema.kwargs_schema.get(name)
    if not isinstance(mask, (list, tuple)) or len(mask) != len(op_schema.op._schema.returns):
        return frozenset()
    return frozenset(pos for pos, wanted in enumerate(mask) if not wanted)


def without_unplaced(
    op_schema: OpSchema,
    strategy: OpStrategy,
    output_metas: OutputMetas,
    eager_dispatch: bool = False,
) -> OutputMetas:
    """``output_metas`` with ``None`` at the results ``strategy`` may leave unplaced.

    A masked-off result (:func:`masked_off_returns`) that no ``OpSpec`` of the
    strategy gives a spec is not computed, or DTensor hands back the kernel's
    ``None``. With ``eager_dispatch`` (DTensor's own dispatch, whose strategy no one
    else sees) a result named in :data:`REPLICATED_RETURNS` that every ``OpSpec``
    leaves ``None`` is too: eager hands it back as each rank's plain tensor, as
    stock DTensor does. Everywhere else such a result holds a spec (C2).
    """
    if output_metas is None or isinstance(output_metas, TensorMeta) or not strategy.strategies:
        return output_metas
    outs = [spec.output_specs for spec in strategy.strategies]
    returns = op_schema.op._schema.returns
    if len(returns) != len(output_metas) or not all(
        isinstance(o, tuple) and len(o) == len(output_metas) for o in outs
    ):
        return output_metas
    may_be_unplaced = masked_off_returns(op_schema)
    if eager_dispatch:
        may_be_unplaced |= replicated_returns(op_schema.op)
    unplaced = [
        isinstance(m, TensorMeta)
        and pos in may_be_unplaced
        and all(o[pos] is None for o in outs)  # type: ignore[index]
        for pos, m in enumerate(output_metas)
    ]
    if not any(unplaced):
        return output_metas
    return tuple(None if is_unplaced else m for m, is_unplaced in zip(output_metas, unplaced))


def _spec_to_fake(spec: object, device: str) -> object:
    meta = spec.tensor_meta  # type: ignore[attr-defined]
    if meta is None:
        raise ValueError("shape inference needs every tensor input to carry tensor_meta")
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)


def _to_meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return TensorMeta(shape=x.shape, stride=x.stride(), dtype=x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(e) for e in x)
    return None


def infer_output_metas(op_schema: OpSchema, data_dependent: bool = True) -> OutputMetas:
    """Run shape inference of ``op_schema.op`` on fake tensors built from the global input metas.

    Accepts runtime schemas (``DTensorSpec`` args) and strategy schemas
    (``OpStrategy``/``TupleStrategy`` args). Returns ``None`` for ops without tensor
    returns, without running them (data-dependent ops such as ``aten.equal``).
    A result whose size depends on the data gets unbacked symbolic sizes; with
    ``data_dependent=False`` (eager DTensor, whose global shapes must be concrete)
    shape inference raises for it instead.
    """
    if not op_has_tensor_returns(op_schema.op):
        return None
    from torch._guards import detect_fake_mode
    from torch._subclasses import FakeTensorMode
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    device = "cpu"
    for leaf in pytree.tree_leaves((op_schema.args_schema, op_schema.kwargs_schema)):
        if isinstance(leaf, (OpStrategy, DTensorSpec)):
            device = leaf.mesh.device_type
            break

    def convert(x: object) -> object:
        if isinstance(x, TupleStrategy):
            # A list argument: the op takes a list of tensors, not the strategy.
            return [convert(child) for child in x.children]
        if isinstance(x, OpStrategy):
            return _spec_to_fake(x.strategies[0].output_spec, device)
        if isinstance(x, DTensorSpec):
            return _spec_to_fake(x, device)
        return x

    def run(fake_mode: FakeTensorMode) -> object:
        # Under make_fx, this global-shape computation must not be recorded into
        # the traced graph: it only derives metadata for the (local) computation.
        with fake_mode, disable_proxy_modes_tracing():
            args, kwargs = pytree.tree_map(
                convert,
                (op_schema.args_schema, op_schema.kwargs_schema),
                is_leaf=lambda x: isinstance(x, (OpStrategy, TupleStrategy, DTensorSpec)),
            )
            return op_schema.op(*args, **kwargs)

    ambient = detect_fake_mode()
    if ambient is not None:
        out = run(ambient)
    else:
        try:
            out = run(FakeTensorMode())
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not data_dependent:
                raise
            # The result's size depends on the data (nonzero, masked_select, ...):
            # with a ShapeEnv it comes out as an unbacked symbolic size.
            out = run(FakeTensorMode(shape_env=ShapeEnv()))
    return cast(OutputMetas, _to_meta(out))
