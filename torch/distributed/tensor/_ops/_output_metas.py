# Copyright (c) Meta Platforms, Inc. and affiliates
"""
What a strategy query knows before any rule runs: who asks, the op's output metas,
and the call's full argument list.

Shape inference runs once per query, before the strategy function: DTensor's eager
dispatch passes the metas it computed, any other caller (a planner, a direct
registry call) gets them from a bounded cache keyed on the op, the input metas and
the typed non-tensor arguments (:func:`output_metas_for`, :func:`resolve_output_metas`).
While a query is answered (:func:`answering`), the spec builders a strategy calls
(``expand_to_full_mesh_op_strategy``) take its metas (:func:`metas_for_builder`), so
every spec is built complete. Strategies read arguments by position, so each registry
hands them the call with its omitted optional arguments filled in
(:func:`with_default_args`, :class:`DefaultFillingRule`). The finalizer
(``_finalize_strategy``) completes what is still missing.
"""

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, TupleStrategy
from torch.distributed.tensor._ops._bounded_cache import BoundedCache
from torch.distributed.tensor._ops._op_returns import (
    infer_output_metas,
    op_has_tensor_returns,
    OutputMetas,
    replicated_returns,
    tensor_inputs,
)
from torch.distributed.tensor.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Replicate
from torch.utils import _pytree as pytree


__all__ = [
    "answering",
    "DefaultFillingRule",
    "clear_meta_cache",
    "eager_dispatch",
    "fill_omitted_args",
    "meta_cache_size",
    "metas_for_builder",
    "output_metas_by_position",
    "output_metas_for",
    "placed_replicated_return",
    "replicated_spec",
    "resolve_output_metas",
    "with_default_args",
]

logger = logging.getLogger(__name__)


# Set while DTensor's eager dispatch computes a strategy (not for planner or direct
# registry queries): see ``_Finalizer.reject``.
_eager_dispatch: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "_eager_dispatch", default=False
)


@contextlib.contextmanager
def eager_dispatch() -> Iterator[None]:
    """Mark the strategies computed inside the block as DTensor's eager dispatch's."""
    token = _eager_dispatch.set(True)
    try:
        yield
    finally:
        _eager_dispatch.reset(token)


# Shape inference outside DTensor's runtime path (direct registry calls, planner
# queries) is cached on what determines its result: the op, the input metas and
# the non-tensor arguments. DTensor's runtime path passes the metas it computed.
_META_CACHE_SIZE = 4096
_meta_cache: BoundedCache[Any, OutputMetas] = BoundedCache(_META_CACHE_SIZE)


def _freeze(x: object) -> object:
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_freeze(e) for e in x))
    if isinstance(x, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in x.items()))
    if isinstance(x, (bool, int, float, complex)):
        # 2 == 2.0 == True in Python, but they promote differently
        return (type(x).__name__, x)
    return x


def _meta_cache_key(op_schema: OpSchema) -> Any:
    device = None
    for inp in tensor_inputs(op_schema):
        device = inp.mesh.device_type
        break
    return (
        op_schema.op,
        device,
        _freeze(op_schema.args_meta),
        _freeze(op_schema.kwargs_meta),
    )


def output_metas_for(op_schema: OpSchema) -> OutputMetas:
    """Shape inference for a strategy schema, run at most once per distinct key."""
    from torch.distributed._functional_collectives import _are_we_tracing

    if not op_has_tensor_returns(op_schema.op):
        return None

    if _are_we_tracing():
        return infer_output_metas(op_schema)
    # A data-dependent result has unbacked symbolic sizes, tied to the ShapeEnv of
    # its one inference: it is handed out but not kept.
    return _meta_cache.get_or_compute(
        _meta_cache_key(op_schema),
        infer_output_metas,
        op_schema,
        keep=_all_sizes_concrete,
    )


def _all_sizes_concrete(metas: OutputMetas) -> bool:
    leaves = pytree.tree_leaves(metas, is_leaf=lambda x: isinstance(x, TensorMeta))
    return all(
        isinstance(d, int)
        for m in leaves
        if isinstance(m, TensorMeta)
        for d in (*m.shape, *m.stride)
    )


def clear_meta_cache() -> None:
    """Forget every cached shape inference (``debug._clear_sharding_prop_cache`` calls this)."""
    _meta_cache.clear()


def meta_cache_size() -> int:
    """How many shape inferences are cached (at most ``_meta_cache.max_size``)."""
    return len(_meta_cache)


def _meta_fits(ret_type: str, meta: object) -> bool:
    """Whether one caller-supplied meta has the structure of a return of ``ret_type``."""
    if ret_type.startswith("List["):
        return isinstance(meta, (list, tuple)) and not isinstance(meta, TensorMeta)
    # A Tensor return may be None (an ``output_mask`` entry set to False).
    return meta is None or isinstance(meta, TensorMeta)


def _list_length(op_schema: OpSchema) -> int | None:
    for arg in (*op_schema.args_schema, *op_schema.kwargs_schema.values()):
        if isinstance(arg, TupleStrategy):
            return len(arg.children)
    return None


def _fits_returns(op_schema: OpSchema, metas: object) -> bool:
    returns = [str(ret.type) for ret in op_schema.op._schema.returns]
    if len(returns) == 1 and not returns[0].startswith("List["):
        return isinstance(metas, TensorMeta)
    if len(returns) == 1:
        fits = _meta_fits(returns[0], metas)
    else:
        fits = (
            isinstance(metas, (list, tuple))
            and not isinstance(metas, TensorMeta)
            and len(metas) == len(returns)
            and all(_meta_fits(r, m) for r, m in zip(returns, metas))
        )
    if not fits:
        return False
    # Every list result has one entry per element of the op's list arguments.
    n = _list_length(op_schema)
    lists = [metas] if len(returns) == 1 else [
        m for r, m in zip(returns, cast(Sequence[object], metas)) if r.startswith("List[")
    ]
    return n is None or all(len(m) == n for m in lists)  # type: ignore[arg-type]


def resolve_output_metas(op_schema: OpSchema, metas: object = None) -> OutputMetas:
    """The op's results for finalizing a strategy for ``op_schema``.

    ``metas`` are what a caller computed (DTensor's runtime path, a test, a planner
    passing ``output_tensor_meta``), in whatever structure it used. Used as given when
    they have the structure of the op's returns (a single-tensor op may get them as a
    one-element sequence); otherwise (``None``, metas for an in-place op's arguments,
    one meta for a list result, a list of the wrong length) shape inference decides,
    so a caller's meta is never indexed into the wrong output.
    """
    if not op_has_tensor_returns(op_schema.op):
        return None
    if (
        isinstance(metas, (list, tuple))
        and not isinstance(metas, TensorMeta)
        and len(metas) == 1
        and len(op_schema.op._schema.returns) == 1
        and isinstance(metas[0], TensorMeta)
        and not str(op_schema.op._schema.returns[0].type).startswith("List[")
    ):
        metas = metas[0]
    if metas is not None and _fits_returns(op_schema, metas):
        return metas  # type: ignore[return-value]
    return output_metas_for(op_schema)


def _is_element_schema(op_schema: OpSchema) -> bool:
    """A foreach-like op's per-element schema: the op takes tensor lists, the schema none."""
    takes_lists = any(
        str(arg.type).startswith("List[") and "Tensor" in str(arg.type)
        for arg in op_schema.op._schema.arguments
    )
    return takes_lists and not any(
        isinstance(arg, (TupleStrategy, list, tuple))
        for arg in (*op_schema.args_schema, *op_schema.kwargs_schema.values())
    )


# The output metas of the query being answered, for the spec builders a strategy
# function calls (``expand_to_full_mesh_op_strategy``): shape inference runs once
# per query, before the strategy function, and every spec is built with its result.
_query_metas: contextvars.ContextVar[tuple[OpSchema, OutputMetas] | None] = (
    contextvars.ContextVar("_query_metas", default=None)
)


@contextlib.contextmanager
def answering(op_schema: OpSchema, metas: OutputMetas) -> Iterator[None]:
    """Make ``metas`` the output metas of ``op_schema`` for the spec builders."""
    token = _query_metas.set((op_schema, metas))
    try:
        yield
    finally:
        _query_metas.reset(token)


@functools.cache
def _positional_defaults(op: OpOverload) -> tuple[tuple[str, bool, object], ...]:
    """(name, has a default, the default) of each positional argument of ``op``."""
    return tuple(
        (arg.name, arg.has_default_value(), arg.default_value)
        for arg in op._schema.arguments
        if not arg.kwarg_only
    )


def fill_omitted_args(
    op: OpOverload, args: Sequence[object], kwargs: Mapping[str, object]
) -> tuple[tuple[object, ...], dict[str, object]] | None:
    """``(args, kwargs)`` of a call of ``op`` with every positional argument in place.

    A positional argument passed by keyword moves to its position, one left out
    takes its default. ``None`` when nothing needs filling, or when the call
    lacks a required argument (for the op itself to reject).
    """
    positional = _positional_defaults(op)
    if len(args) >= len(positional):
        return None
    rest = dict(kwargs)
    filled = list(args)
    for name, has_default, default in positional[len(args):]:
        if name in rest:
            filled.append(rest.pop(name))
        elif has_default:
            filled.append(default)
        else:
            return None
    return tuple(filled), rest


def with_default_args(op_schema: OpSchema) -> OpSchema:
    """``op_schema`` with every positional argument the call left out filled in.

    A call may omit trailing optional arguments, and DTensor's dispatch sees them
    omitted whenever they hold their default. Strategies read arguments by
    position, so each registry hands its strategies the full argument list (see
    :func:`fill_omitted_args`). A call missing a required argument is returned
    unchanged for the op itself to reject.
    """
    filled = fill_omitted_args(op_schema.op, op_schema.args_schema, op_schema.kwargs_schema)
    if filled is None:
        return op_schema
    return OpSchema(op_schema.op, filled[0], filled[1], schema_info=op_schema.schema_info)


class DefaultFillingRule:
    """A single-dim rule that sees every positional argument, whoever calls it.

    DTensor's own entry points fill in omitted optional arguments before a rule
    runs, but the function in ``op_single_dim_strategy_funcs`` is also called
    directly (planners re-expanding the rules, upstream's ``strategy_validation``)
    with the arguments a graph node has, which may be the required ones only. A
    rule reading an optional argument by position would then raise
    ``IndexError``; wrapped in this it gets the defaults instead.
    """

    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __call__(
        self, op: OpOverload, args_schema: Sequence[object], kwargs_schema: Mapping[str, object]
    ) -> Any:
        filled = fill_omitted_args(op, args_schema, kwargs_schema)
        if filled is not None:
            args_schema, kwargs_schema = filled
        return self.func(op, args_schema, kwargs_schema)

    def __repr__(self) -> str:
        return f"DefaultFillingRule({self.func!r})"


def replicated_spec(mesh: DeviceMesh, meta: TensorMeta) -> DTensorSpec:
    """The spec of a result no rule shards (``REPLICATED_RETURNS``)."""
    return DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=meta)


def placed_replicated_return(
    op: OpOverload, position: int, meta: object, mesh: DeviceMesh
) -> DTensorSpec | None:
    """The spec a spec builder gives result ``position`` of ``op`` that a rule left
    ``None``: ``Replicate`` with its meta for a result of ``REPLICATED_RETURNS``,
    except in DTensor's eager dispatch, which hands it back as stock does (each
    rank's plain tensor); ``None`` otherwise."""
    if (
        isinstance(meta, TensorMeta)
        and position in replicated_returns(op)
        and not _eager_dispatch.get()
    ):
        return replicated_spec(mesh, meta)
    return None


_UNKNOWN: Any = object()


def metas_for_builder(op_schema: OpSchema, given: object) -> OutputMetas:
    """The output metas a spec builder attaches for ``op_schema``.

    ``given`` is what its caller passed (``output_tensor_meta``). Without it, the
    metas of the query being answered are used when the builder is called for that
    query's schema; otherwise (a planner's or a downstream rule's own call) shape
    inference runs, cached. Returns ``_UNKNOWN`` when inference cannot run: the op's
    results depend on the data, or the schema is not a valid call of the op (tests
    build such schemas around a stand-in op). The specs then carry no output meta,
    as before this change; the registry exits still complete or reject them.
    """
    if given is None:
        current = _query_metas.get()
        if current is not None and current[0] is op_schema:
            return current[1]
    if _is_element_schema(op_schema):
        # The op cannot run on one element: only its caller knows the element's result.
        return _UNKNOWN if given is None else given  # type: ignore[return-value]
    try:
        return resolve_output_metas(op_schema, given)
    except Exception:
        logger.debug("%s: no output metas for the specs built", op_schema.op, exc_info=True)
        return _UNKNOWN


def output_metas_by_position(
    metas: OutputMetas, n_outputs: int
) -> list[TensorMeta | None] | None:
    """Per output position of a rule, the meta its spec carries (``None``: the op
    returns ``None`` there, whatever placement the rule gave).

    ``None`` when the results are unknown (data-dependent) or do not line up with
    the rule's outputs; the specs then carry placements only and the finalizer
    reconciles them.
    """
    if metas is None or metas is _UNKNOWN:
        return None
    if isinstance(metas, TensorMeta):
        return [metas] if n_outputs == 1 else None
    if len(metas) == n_outputs and all(m is None or isinstance(m, TensorMeta) for m in metas):
        return cast(list[TensorMeta | None], list(metas))
    return None
