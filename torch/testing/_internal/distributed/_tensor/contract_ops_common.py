# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The test base of the per-op strategy tests: one op, three meshes, three ways of
asking (:data:`QUERY_MODES`), the answer held to the contract.
"""

import random
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, StrategyType
from torch.distributed.tensor.placement_types import Placement
from torch.testing._internal.distributed._tensor.contract_candidates import (
    CandidateFunc,
    replicated_candidate,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    describe,
    OP_MESHES,
    output_tuple,
    planner_candidates,
    sharded_candidate,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    query_strategy,
    strategy_registry,
    strategy_schema,
)


# ``replicate``: every tensor input offers one replicated candidate (eager dispatch
# of replicated DTensors); ``sharded``: one sharded candidate each (eager dispatch
# of sharded DTensors); ``planner``: many candidates at once.
QUERY_MODES = ("replicate", "sharded", "planner")

# A planner query offers at most this many candidates per tensor input. All of
# them would make 3-D queries of multi-input ops take seconds each; a fixed
# sample still mixes Replicate, every Shard(d) and Partial across mesh dims.
PLANNER_CANDIDATE_LIMIT = 12


def sampled_planner_candidates(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """``planner_candidates``, cut to a fixed sample of at most the limit.

    The replicated candidate and an evenly sharded one are always kept, so a
    planner query offers what both runtime queries offer (unless they avoid dims).
    """
    everything = planner_candidates(mesh, meta)
    if len(everything) <= PLANNER_CANDIDATE_LIMIT:
        return everything
    keep = {everything[0], *map(tuple, sharded_candidate()(mesh, meta))}
    rest = [c for c in everything if c not in keep]
    picked = set(
        random.Random(len(everything)).sample(rest, PLANNER_CANDIDATE_LIMIT - len(keep))
    )
    return [c for c in everything if c in keep or c in picked]


def mode_candidates(mode: str, avoid: Sequence[int] = ()) -> CandidateFunc:
    """The candidates of ``mode``. ``avoid`` lists tensor dims the ``sharded``
    mode leaves alone, because the op refuses them at runtime (e.g. the dim
    ``unbind`` removes); a planner query offers them anyway and the strategy
    must drop them, not fail."""
    if mode == "replicate":
        return replicated_candidate
    if mode == "sharded":
        return sharded_candidate(avoid)
    if mode == "planner":
        return sampled_planner_candidates
    raise ValueError(mode)


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
