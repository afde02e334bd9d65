# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The test base of the per-op strategy tests: one op, three meshes, three ways of
asking (``contract_candidates.QUERY_MODES``), the answer held to the contract.
"""

from collections.abc import Sequence

import torch
from torch.distributed.tensor._op_schema import OpSchema, StrategyType
from torch.testing._internal.distributed._tensor.contract_candidates import (
    mode_candidates,
    QUERY_MODES,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    describe,
    OP_MESHES,
    output_tuple,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    query_strategy,
    strategy_registry,
    strategy_schema,
)


class StrategyOpsTestBase(StrategyContractTestBase):
    """Base class for per-op tests: query an op in a mode, hold the answer to the
    contract, and tabulate its output metas."""

    def query(
        self,
        shape: tuple[int, ...],
        mode: str,
        op: torch._ops.OpOverload,
        args: Sequence[object],
        kwargs: dict[str, object] | None = None,
        avoid: Sequence[int] = (),
    ) -> tuple[OpSchema, StrategyType]:
        """Query ``op``'s strategy in ``mode`` and assert the contract on it."""
        mesh = self.mesh(shape)
        schema = strategy_schema(mesh, op, args, kwargs, mode_candidates(mode, avoid))
        strategy = query_strategy(schema, mesh)
        self.assertIsNotNone(
            strategy,
            f"{op} ({strategy_registry(op)}) gave no strategy for a {mode} query",
        )
        self.assert_contract(schema, strategy)
        return schema, strategy

    def output_table(
        self, cases: Sequence[tuple[str, torch._ops.OpOverload, tuple, dict]]
    ) -> str:
        """Query every case on every mesh in every mode (asserting the contract)
        and tabulate, per case and output position, the distinct output metas
        found across all OpSpecs; one entry per cell means every spec agrees."""
        rows = []
        for label, op, args, kwargs in cases:
            cells: list[list[str]] = []
            for shape in OP_MESHES:
                for mode in QUERY_MODES:
                    with self.subTest(case=label, mesh=shape, mode=mode):
                        _, strategy = self.query(shape, mode, op, args, kwargs)
                        for spec in self.specs_of(strategy):
                            for pos, out in enumerate(output_tuple(spec)):
                                while len(cells) <= pos:
                                    cells.append([])
                                text = describe(out)
                                if text not in cells[pos]:
                                    cells[pos].append(text)
            rows.append(f"{label}: " + " | ".join(" / ".join(c) for c in cells))
        return "\n".join(rows)
