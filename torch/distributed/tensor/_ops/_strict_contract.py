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
from torch.distributed.tensor._op_schema import OpSchema, StrategyType
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    OutputMetas,
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


def check_strict(
    op_schema: OpSchema,
    given: StrategyType,
    finalized: StrategyType,
    output_metas: OutputMetas,
    source: str,
    eager_dispatch: bool = False,
) -> None:
    """Raise :class:`StrictContractError` for the first violation by ``given`` (what
    the strategy function returned, judged only on the fields it filled in) or by
    ``finalized`` (what the registry hands out; ``eager_dispatch``: to DTensor's own
    dispatch, see C2)."""
    for strategy, filled_only in ((given, True), (finalized, False)):
        violations = check_strategy_contract(
            op_schema, strategy, output_metas, filled_only, eager_dispatch
        )
        if violations:
            v = violations[0]
            clause = v.clause if v.child_clause is None else f"{v.clause}/{v.child_clause}"
            raise StrictContractError(
                op_schema.op, source, clause, v.strategy_index, v.position, v.expected, v.got
            )
