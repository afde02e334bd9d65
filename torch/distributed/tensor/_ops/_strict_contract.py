# Copyright (c) Meta Platforms, Inc. and affiliates
"""
Strict mode for strategy authors.

The registries' exits complete what a strategy function may leave out (output
``tensor_meta``, ``input_specs``, ``redistribute_cost``; see
:mod:`torch.distributed.tensor._ops._finalize_strategy`) and overwrite what it got
wrong without a word: a wrong ``tensor_meta``, a spec where the op returns ``None``,
a cost row of the wrong length. That keeps DTensor running, but hides the bug from
the strategy's author. In strict mode every strategy is checked twice against the
contract of :mod:`torch.distributed.tensor._ops.strategy_contract`: what the
strategy function gave (anything it filled in must be right), and what the registry
hands out. The first violation raises :class:`StrictContractError` naming the op,
the strategy and the clause.

Strict mode is off unless the environment variable
``TORCH_DTENSOR_STRICT_STRATEGY_CONTRACT`` is set to a value other than ``0`` when
DTensor is imported, or inside ``torch.distributed.tensor.debug.strict_strategy_contract()``.
When off it costs one context-variable read per strategy computed (never on a
cached dispatch).
"""

import contextlib
import contextvars
import os
from collections.abc import Iterator

from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_contract import (
    _describe_meta,
    _describe_spec,
    _metas_equal,
    check_strategy_contract,
    element_output_metas,
    element_schema,
    OutputMetas,
    tensor_inputs,
)


__all__ = [
    "ENV_VAR",
    "StrictContractError",
    "check_strict",
    "strict_enabled",
    "strict_strategy_contract",
]

ENV_VAR = "TORCH_DTENSOR_STRICT_STRATEGY_CONTRACT"

# A context variable, so that a thread (or task) switching strict mode on does not
# switch it on for the others.
_STRICT_FROM_ENV = os.environ.get(ENV_VAR, "0") not in ("", "0")
_strict: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "_strict_strategy_contract", default=_STRICT_FROM_ENV
)


def strict_enabled() -> bool:
    """Whether strategies are checked against the contract as they are produced."""
    return _strict.get()


@contextlib.contextmanager
def strict_strategy_contract(enabled: bool = True) -> Iterator[None]:
    """Check every strategy computed inside the block (see the module docstring).

    DTensor's sharding-propagation caches are cleared on entry, so strategies
    computed before the block are computed (and checked) again.
    """
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    token = _strict.set(enabled)
    _clear_sharding_prop_cache()
    try:
        yield
    finally:
        _strict.reset(token)


class StrictContractError(RuntimeError):
    """A strategy violating the contract, found in strict mode."""

    def __init__(
        self,
        op: OpOverload,
        source: str,
        clause: str,
        index: int,
        position: str,
        expected: str,
        got: str,
    ) -> None:
        self.op = op
        self.source = source
        self.clause = clause
        super().__init__(
            f"{op}: strategy {source!r} violates {clause} in OpSpec {index} at "
            f"{position}: expected {expected}, got {got}"
        )


def _given_outputs(
    spec: OpSpec, metas: OutputMetas
) -> tuple[str, str, str, str] | None:
    """The first output the strategy gave wrongly: (clause, position, expected, got)."""
    out = spec.output_specs
    if metas is None:
        if out is not None:
            return ("C2", "output", "None (op returns no tensor)", _describe_spec(out))
        return None
    pairs: list[tuple[str, object, object]]
    if isinstance(metas, TensorMeta):
        pairs = [("output", out, metas)]
    elif isinstance(out, (tuple, list)) and len(out) == len(metas):
        pairs = [(f"output {i}", o, m) for i, (o, m) in enumerate(zip(out, metas))]
    else:
        # one spec for every output (a documented shorthand) or a wrong count,
        # which the finalizer rejects on its own
        return None
    for position, o, m in pairs:
        if m is None and o is not None:
            return ("C2", position, "None (result is None)", _describe_spec(o))
        if (
            isinstance(m, TensorMeta)
            and isinstance(o, DTensorSpec)
            and o.tensor_meta is not None
            and not _metas_equal(o.tensor_meta, m)
        ):
            return ("C1", position, _describe_meta(m), _describe_meta(o.tensor_meta))
    return None


def _given_inputs(
    spec: OpSpec, inputs: list[OpStrategy]
) -> tuple[str, str, str, str] | None:
    """The first input spec or cost row the strategy gave wrongly."""
    if spec.input_specs is not None and len(spec.input_specs) == len(inputs):
        for pos, (given, inp) in enumerate(zip(spec.input_specs, inputs)):
            expected = inp.strategies[0].output_spec.tensor_meta
            if (
                isinstance(given, DTensorSpec)
                and given.tensor_meta is not None
                and expected is not None
                and not _metas_equal(given.tensor_meta, expected)
            ):
                return (
                    "C3", f"input {pos}", _describe_meta(expected),
                    _describe_meta(given.tensor_meta),
                )
    costs = spec.redistribute_cost
    if costs is not None:
        if len(costs) != len(inputs):
            return ("C4", "redistribute_cost", f"{len(inputs)} rows", f"{len(costs)} rows")
        for pos, (row, inp) in enumerate(zip(costs, inputs)):
            if len(row) != len(inp.strategies):
                return (
                    "C4", f"redistribute_cost row {pos}",
                    f"{len(inp.strategies)} costs (one per candidate)", f"{len(row)} costs",
                )
    return None


def _check_given(
    op_schema: OpSchema, strategy: OpStrategy, metas: OutputMetas, source: str, child: str
) -> None:
    inputs = tensor_inputs(op_schema)
    for index, spec in enumerate(strategy.strategies):
        found = _given_outputs(spec, metas) or _given_inputs(spec, inputs)
        if found is not None:
            clause, position, expected, got = found
            if child:
                clause, position = f"C5/{clause}", f"{child} {position}"
            raise StrictContractError(
                op_schema.op, source, clause, index, position, expected, got
            )


def check_strict(
    op_schema: OpSchema,
    given: StrategyType,
    finalized: StrategyType,
    output_metas: OutputMetas,
    source: str,
) -> None:
    """Raise :class:`StrictContractError` for the first violation by ``given`` (what
    the strategy function returned, defaults aside) or by ``finalized`` (what the
    registry hands out)."""
    if isinstance(given, OpStrategy):
        _check_given(op_schema, given, output_metas, source, "")
    elif isinstance(given, TupleStrategy):
        for i, child in enumerate(given.children):
            if isinstance(child, OpStrategy):
                _check_given(
                    element_schema(op_schema, i),
                    child,
                    element_output_metas(op_schema.op, output_metas, i),
                    source,
                    f"child {i}",
                )
    violations = check_strategy_contract(op_schema, finalized, output_metas)
    if violations:
        v = violations[0]
        clause = v.clause if v.child_clause is None else f"{v.clause}/{v.child_clause}"
        raise StrictContractError(
            op_schema.op, source, clause, v.strategy_index, v.position, v.expected, v.got
        )
