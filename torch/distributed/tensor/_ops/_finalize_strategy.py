# Copyright (c) Meta Platforms, Inc. and affiliates
"""
Completes the strategies DTensor's strategy machinery hands out.

Strategy functions are free to leave out what the machinery can derive: output
``tensor_meta``, ``input_specs`` (defaulting to the output placements, DTensor's
long-standing convention), ``redistribute_cost``, one spec broadcast to all
outputs of a multi-output op. :func:`finalize_strategy` fills those in once, on
the way out of the registry, so that every consumer (DTensor's own dispatch and
planners alike) reads specs satisfying the contract in
:mod:`torch.distributed.tensor._ops.strategy_contract`. What cannot be derived
(a ``None`` where the op returns a tensor, a wrong number of outputs or inputs,
a mesh mismatch) is a bug in the strategy and raises :class:`StrategyContractError`,
except in DTensor's eager dispatch (:func:`eager_dispatch`) where stock DTensor runs
with such a spec: there it is used as given (see :meth:`_Finalizer.reject`).
"""

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast, TypeVar

from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._bounded_cache import BoundedCache
from torch.distributed.tensor._ops._strict_contract import check_strict, strict_enabled
from torch.distributed.tensor._ops.strategy_contract import (
    element_output_metas,
    element_schema,
    infer_output_metas,
    op_has_tensor_returns,
    OutputMetas,
    replicated_returns,
    tensor_inputs,
    without_unplaced,
)
from torch.distributed.tensor.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Replicate
from torch.utils import _pytree as pytree


__all__ = [
    "FinalizedStrategyFunc",
    "StrategyContractError",
    "answering",
    "DefaultFillingRule",
    "clear_meta_cache",
    "complete_for_caller",
    "eager_dispatch",
    "fill_omitted_args",
    "finalize_strategy",
    "meta_cache_size",
    "metas_for_builder",
    "output_metas_by_position",
    "output_metas_for",
    "placed_replicated_return",
    "replicated_spec",
    "resolve_output_metas",
    "specs_per_candidate",
    "strategy_name",
    "with_default_args",
]

logger = logging.getLogger(__name__)


class StrategyContractError(RuntimeError):
    """A strategy that cannot be reconciled with the op it was produced for."""

    def __init__(
        self, op: OpOverload, source: str, index: int, position: str, problem: str
    ) -> None:
        super().__init__(
            f"{op}: strategy {source!r} returned an OpSpec (index {index}) that "
            f"cannot be reconciled with the op at {position}: {problem}"
        )


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


# (op, strategy, kind of problem) already logged as used as given by eager dispatch.
_used_as_given: set[tuple[str, str, str]] = set()


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


_StrategyT = TypeVar("_StrategyT", bound=StrategyType)


def complete_for_caller(
    op_schema: OpSchema, strategy: _StrategyT, source: str
) -> _StrategyT:
    """``strategy`` completed, when a helper that built it is called directly.

    Strategy helpers shared across ops (``propagate_single_input_strategy``, the
    mm-like builders, ...) leave output metas to the registry exit when a registered
    strategy calls them for the query being answered. Called by anyone else (a
    downstream rule), they finalize here, with cached shape inference.
    """
    current = _query_metas.get()
    if current is not None and current[0] is op_schema:
        return strategy
    metas = metas_for_builder(op_schema, None)
    if metas is _UNKNOWN:
        return strategy
    return cast(_StrategyT, finalize_strategy(op_schema, strategy, metas, source))


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


def _out_tensor_positions(op_schema: OpSchema) -> list[int]:
    """Positions of ``out=`` tensors among the op's flattened tensor inputs."""
    out_names = {a.name for a in op_schema.op._schema.arguments if a.is_out}
    if not out_names:
        return []

    def count(x: object) -> int:
        return sum(isinstance(leaf, OpStrategy) for leaf in pytree.tree_leaves(x))

    position = count(op_schema.args_schema)
    positions: list[int] = []
    for name, value in op_schema.kwargs_schema.items():
        n = count(value)
        if name in out_names and n == 1:
            positions.append(position)
        position += n
    return positions


def _insert_out_specs(
    input_specs: Sequence[DTensorSpec | None], out_positions: list[int], output_specs: object
) -> list[DTensorSpec | None]:
    # One spec for a multi-output op holds for each output, so for each out= tensor.
    outs = (
        output_specs
        if isinstance(output_specs, (tuple, list))
        else (output_specs,) * len(out_positions)
    )
    result: list[DTensorSpec | None] = list(input_specs)
    for i, position in enumerate(out_positions):
        out = outs[i] if i < len(outs) else None
        result.insert(position, out if isinstance(out, DTensorSpec) else None)
    return result


def _with_meta(spec: DTensorSpec, meta: TensorMeta) -> DTensorSpec:
    if spec.tensor_meta is not None and spec.tensor_meta == meta:
        return spec
    return spec.shallow_copy_with_tensor_meta(meta)


def _output_with_meta(spec: DTensorSpec, meta: TensorMeta) -> DTensorSpec:
    # Always a fresh spec: strategies may hand out an input's spec as the output
    # (the runtime input DTensor's own), which the output must not share.
    return spec.shallow_copy_with_tensor_meta(meta)


def _is_complete(
    spec: OpSpec,
    input_metas: list[TensorMeta | None],
    candidates: list[int],
    metas: OutputMetas,
) -> bool:
    """Whether ``spec`` was built complete (by ``expand_to_full_mesh_op_strategy``).

    Checked by identity, which is cheap: the builder attaches the very meta objects
    the finalizer is given (``input_metas``: each input's; ``candidates``: how many
    each input offers). Anything else takes the full path.
    """
    input_specs, costs = spec.input_specs, spec.redistribute_cost
    if (
        input_specs is None
        or costs is None
        or len(input_specs) != len(input_metas)
        or len(costs) != len(input_metas)
    ):
        return False
    for s, row, meta, n in zip(input_specs, costs, input_metas, candidates):
        if not isinstance(s, DTensorSpec) or s.tensor_meta is not meta or len(row) != n:
            return False
    out = spec.output_specs
    if metas is None or isinstance(metas, TensorMeta):
        pairs: Sequence[tuple[object, object]] = ((out, metas),)
    elif isinstance(out, tuple) and len(out) == len(metas):
        pairs = tuple(zip(out, metas))
    else:
        return False
    for o, m in pairs:
        if m is None:
            if o is not None:
                return False
        elif (
            not isinstance(o, DTensorSpec)
            or o.tensor_meta is not m
            or any(o is s for s in input_specs)
            or (input_specs and o.mesh is not input_specs[0].mesh)
        ):
            return False
    return True


class _Finalizer:
    """Finalizes the OpSpecs of one strategy for one (element) schema."""

    def __init__(self, op_schema: OpSchema, source: str) -> None:
        self.op_schema = op_schema
        self.op = op_schema.op
        self.source = source
        self.lenient = _eager_dispatch.get() and not strict_enabled()

    def error(self, index: int, position: str, problem: str) -> StrategyContractError:
        return StrategyContractError(self.op, self.source, index, position, problem)

    def reject(self, index: int, position: str, problem: str, kind: str) -> None:
        """Raise for a spec the contract cannot hold, unless stock DTensor's eager
        dispatch runs with it (``kind`` says how) and this is that dispatch.

        Eager dispatch must never fail where stock's answer was usable: a ``None``
        for a tensor result (DTensor hands back the kernel's ``None`` or 0-d
        tensor, and fails as stock does on any other tensor), input specs beyond
        the op's tensor inputs (stock ignores them), a keyword tensor left out
        (stock never moves it) and an output on another mesh (stock hands back a
        DTensor on that mesh). Each is logged once per op, strategy and kind; planners,
        direct registry calls and strict mode still get the error.
        """
        if not self.lenient:
            raise self.error(index, position, problem)
        key = (str(self.op), self.source, kind)
        if key not in _used_as_given:
            _used_as_given.add(key)
            logger.debug(
                "%s: eager dispatch uses strategy %r as given (%s); a planner query "
                "raises: OpSpec %d at %s: %s",
                self.op, self.source, kind, index, position, problem,
            )

    def outputs(
        self, index: int, out: object, metas: OutputMetas
    ) -> DTensorSpec | tuple[DTensorSpec | None, ...] | None:
        if metas is None:
            # The op has no tensor result: whatever the strategy put there is moot.
            return None
        if isinstance(metas, TensorMeta):
            if isinstance(out, (tuple, list)) and len(out) == 1:
                out = out[0]
            if not isinstance(out, DTensorSpec):
                problem = f"the op returns a tensor but the spec is {out!r}"
                if out is not None:
                    raise self.error(index, "output", problem)
                self.reject(index, "output", problem, "None for a tensor result")
                return None
            return _output_with_meta(out, metas)
        if isinstance(out, DTensorSpec):
            # One spec for a multi-output op: every tensor output takes its placements.
            out = tuple(out if m is not None else None for m in metas)
        if not isinstance(out, (tuple, list)) or len(out) != len(metas):
            raise self.error(
                index,
                "output",
                f"the op has {len(metas)} results but the spec is {out!r}",
            )
        finalized: list[DTensorSpec | None] = []
        for pos, (spec, meta) in enumerate(zip(out, metas)):
            if meta is None:
                finalized.append(None)
            elif not isinstance(meta, TensorMeta):
                raise self.error(
                    index,
                    f"output {pos}",
                    "a list result needs a TupleStrategy with one child per element",
                )
            elif spec is None and pos in replicated_returns(self.op):
                # a result no rule shards: each rank holds all of it (eager
                # dispatch hands it back as each rank's plain tensor, as stock)
                finalized.append(
                    None if _eager_dispatch.get() else replicated_spec(self.mesh(), meta)
                )
            elif not isinstance(spec, DTensorSpec):
                problem = f"the result is a tensor but the spec is {spec!r}"
                if spec is not None:
                    raise self.error(index, f"output {pos}", problem)
                self.reject(index, f"output {pos}", problem, "None for a tensor result")
                finalized.append(None)
            else:
                finalized.append(_output_with_meta(spec, meta))
        return tuple(finalized)

    def inputs(
        self, index: int, spec: OpSpec, inputs: list[OpStrategy]
    ) -> list[DTensorSpec]:
        input_specs = spec.input_specs
        if input_specs is None:
            # DTensor's convention: no input_specs means inputs follow the output.
            out = spec.output_specs
            if not isinstance(out, DTensorSpec):
                raise self.error(
                    index,
                    "input_specs",
                    "input_specs are missing and cannot be derived from a "
                    f"non-single output spec {out!r}",
                )
            return [
                DTensorSpec(
                    out.mesh,
                    out.placements,
                    tensor_meta=inp.strategies[0].output_spec.tensor_meta,
                    use_strided_shard_as_shard_order=out.use_strided_shard_as_shard_order,
                )
                for inp in inputs
            ]
        out_positions = _out_tensor_positions(self.op_schema)
        given: list[DTensorSpec | None] = list(input_specs)
        if out_positions and len(given) == len(inputs) - len(out_positions):
            # ``out=`` tensors are written with the output's placements.
            given = _insert_out_specs(given, out_positions, spec.output_specs)
        if len(given) != len(inputs):
            problem = f"the op has {len(inputs)} tensor inputs but the spec lists {len(given)}"
            if len(given) < self.n_positional_inputs():
                raise self.error(index, "input_specs", problem)
            self.reject(index, "input_specs", problem, "input specs not one per tensor input")
            given = given[: len(inputs)] + [None] * (len(inputs) - len(given))
        finalized: list[DTensorSpec] = []
        for pos, (s, inp) in enumerate(zip(given, inputs)):
            if not isinstance(s, DTensorSpec):
                problem = f"expected a DTensorSpec, got {s!r}"
                if pos < self.n_positional_inputs():
                    raise self.error(index, f"input {pos}", problem)
                self.reject(index, f"input {pos}", problem, "no spec for a keyword tensor")
                # stock's dispatch leaves a keyword tensor where it is
                s = inp.strategies[0].output_spec
            meta = inp.strategies[0].output_spec.tensor_meta
            finalized.append(s if meta is None else _with_meta(s, meta))
        return finalized

    def mesh(self) -> DeviceMesh:
        """The mesh the op runs on: its first tensor input's."""
        inputs = tensor_inputs(self.op_schema)
        if not inputs:
            raise self.error(-1, "output", "no tensor input to take the mesh from")
        return inputs[0].mesh

    def n_positional_inputs(self) -> int:
        """The positional tensor inputs: the ones stock's dispatch reads a spec for."""
        return sum(
            isinstance(leaf, OpStrategy)
            for leaf in pytree.tree_leaves(self.op_schema.args_schema)
        )

    def costs(
        self,
        spec: OpSpec,
        input_specs: list[DTensorSpec],
        inputs: list[OpStrategy],
    ) -> list[list[float]]:
        from torch.distributed.tensor._ops.utils import generate_redistribute_costs

        given = spec.redistribute_cost
        rows: list[list[float]] = []
        for pos, (inp, target) in enumerate(zip(inputs, input_specs)):
            row = given[pos] if given is not None and pos < len(given) else None
            if row is None or len(row) != len(inp.strategies) or (
                given is not None and len(given) != len(inputs)
            ):
                row = generate_redistribute_costs(inp, target)
            rows.append(row)
        return rows

    def check_mesh(
        self, index: int, output_specs: object, input_specs: list[DTensorSpec]
    ) -> None:
        if not input_specs:
            return
        mesh = input_specs[0].mesh
        outs = output_specs if isinstance(output_specs, tuple) else (output_specs,)
        for pos, out in enumerate(outs):
            if isinstance(out, DTensorSpec) and out.mesh != mesh:
                self.reject(
                    index,
                    f"output {pos}",
                    f"the output is on mesh {out.mesh} but input 0 is on {mesh}",
                    "output on another mesh",
                )

    def op_strategy(
        self, strategy: OpStrategy, inputs: list[OpStrategy], metas: OutputMetas
    ) -> OpStrategy:
        finalized: list[OpSpec] = []
        input_metas = [inp.strategies[0].output_spec.tensor_meta for inp in inputs]
        candidates = [len(inp.strategies) for inp in inputs]
        metas = without_unplaced(self.op_schema, strategy, metas, _eager_dispatch.get())
        for index, spec in enumerate(strategy.strategies):
            if _is_complete(spec, input_metas, candidates, metas):
                finalized.append(spec)
                continue
            input_specs = self.inputs(index, spec, inputs)
            output_specs = self.outputs(index, spec.output_specs, metas)
            self.check_mesh(index, output_specs, input_specs)
            costs = self.costs(spec, input_specs, inputs)
            finalized.append(
                OpSpec(
                    output_specs=output_specs,
                    input_specs=input_specs,
                    redistribute_cost=costs,
                )
            )
        result = OpStrategy(finalized)
        # Keep search annotations attached by the single-dim expansion.
        for attr, value in vars(strategy).items():
            if attr != "strategies":
                setattr(result, attr, value)
        return result


def finalize_strategy(
    op_schema: OpSchema,
    strategy: StrategyType,
    output_metas: OutputMetas,
    source: str = "<strategy>",
) -> StrategyType:
    """Return ``strategy`` with every OpSpec completed to satisfy the contract.

    Args:
        op_schema: the strategy schema the strategy was produced for.
        strategy: what the strategy function (or expansion) returned.
        output_metas: the op's results as shape inference gives them (see
            :func:`output_metas_for`).
        source: the strategy's name, for error messages.
    """
    if strict_enabled():
        finalized = _finalize(op_schema, strategy, output_metas, source)
        check_strict(
            op_schema, strategy, finalized, output_metas, source, _eager_dispatch.get()
        )
        return finalized
    return _finalize(op_schema, strategy, output_metas, source)


def _finalize(
    op_schema: OpSchema, strategy: StrategyType, output_metas: OutputMetas, source: str
) -> StrategyType:
    finalizer = _Finalizer(op_schema, source)
    if isinstance(strategy, OpStrategy):
        return finalizer.op_strategy(strategy, tensor_inputs(op_schema), output_metas)
    if isinstance(strategy, TupleStrategy):
        children: list[StrategyType] = []
        for i, child in enumerate(strategy.children):
            if not isinstance(child, OpStrategy):
                raise finalizer.error(
                    -1, f"child {i}", f"expected an OpStrategy, got {type(child).__name__}"
                )
            element = element_schema(op_schema, i)
            child_finalizer = _Finalizer(element, f"{source} (child {i})")
            children.append(
                child_finalizer.op_strategy(
                    child,
                    tensor_inputs(element),
                    element_output_metas(op_schema.op, output_metas, i),
                )
            )
        return TupleStrategy(
            tuple(children) if isinstance(strategy.children, tuple) else children
        )
    raise StrategyContractError(
        op_schema.op, source, -1, "strategy", f"unsupported strategy type {type(strategy).__name__}"
    )


def specs_per_candidate(
    strategy: OpStrategy, build: Callable[[OpSpec], OpSpec]
) -> list[OpSpec]:
    """Build one OpSpec per candidate of ``strategy`` (an input's OpStrategy).

    Some strategies refuse an input placement by raising (a view that would need
    a redistribution, an unbind along a sharded dim). At runtime the input has one
    placement and the refusal is the answer; a planner's query offers several, and a
    refused candidate must only drop out. If every candidate is refused, the first
    refusal is raised.
    """
    specs: list[OpSpec] = []
    first_refusal: Exception | None = None
    for candidate in strategy.strategies:
        try:
            specs.append(build(candidate))
        except (RuntimeError, ValueError, KeyError, IndexError) as refusal:
            # (KeyError/IndexError: view rules cannot map some _StridedShard inputs)
            if first_refusal is None:
                first_refusal = refusal
    if not specs and first_refusal is not None:
        raise first_refusal
    return specs


def strategy_name(strategy: object) -> str:
    """A strategy function's name for error messages (through registration wrappers)."""
    func = getattr(strategy, "func", strategy)
    return getattr(func, "__name__", repr(func))


class FinalizedStrategyFunc:
    """A registered strategy function whose results always satisfy the contract.

    ``ShardingPropagator.register_op_strategy`` stores these, so code that calls
    ``propagator.op_strategy_funcs[op](op_schema)`` gets complete specs. DTensor's
    runtime path passes the output metas it already computed, so shape inference
    runs once per query.
    """

    def __init__(self, func: Callable[[OpSchema], StrategyType]) -> None:
        self.func = func
        functools.update_wrapper(self, func)

    def __call__(
        self, op_schema: OpSchema, output_metas: OutputMetas = None
    ) -> StrategyType:
        op_schema = with_default_args(op_schema)
        metas = resolve_output_metas(op_schema, output_metas)
        with answering(op_schema, metas):
            strategy = self.func(op_schema)
        return finalize_strategy(op_schema, strategy, metas, strategy_name(self.func))

    def __repr__(self) -> str:
        return f"FinalizedStrategyFunc({self.func!r})"
