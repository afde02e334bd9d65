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

What is known before the strategy runs (the query's output metas, who asks, the
call's full argument list) lives in ``_output_metas``.
"""

import functools
import logging
from collections.abc import Callable, Sequence
from typing import cast, TypeVar

from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._output_metas import (
    _eager_dispatch,
    _query_metas,
    _UNKNOWN,
    answering,
    metas_for_builder,
    replicated_spec,
    resolve_output_metas,
    with_default_args,
)
from torch.distributed.tensor._ops._strict_contract import check_strict, strict_enabled
from torch.distributed.tensor._ops._op_returns import (
    element_output_metas,
    element_schema,
    OutputMetas,
    replicated_returns,
    tensor_inputs,
    without_unplaced,
)
from torch.distributed.tensor.device_mesh import DeviceMesh
from torch.utils import _pytree as pytree


__all__ = [
    "FinalizedStrategyFunc",
    "StrategyContractError",
    "complete_for_caller",
    "finalize_strategy",
    "strategy_name",
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


# (op, strategy, kind of problem) already logged as used as given by eager dispatch.
_used_as_given: set[tuple[str, str, str]] = set()


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
