# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Shared harness for tests that hold DTensor sharding strategies to the strategy
contract (see ``torch.distributed.tensor._ops.strategy_contract``).

Strategy functions only need meshes and metadata, never real collectives, so the
tests run in a single process on a fake process group of 8 ranks, which is big
enough for every mesh in :data:`MESH_SHAPES`. Building schemas and querying
DTensor's registries lives in ``contract_sweep`` (which must not depend on the
contract checker) and is re-exported here.
"""

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._op_schema import OpSchema, StrategyType
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    format_violations,
    infer_output_metas,
    OutputMetas,
)
from torch.testing._internal.common_utils import TestCase
from torch.testing._internal.distributed._tensor.contract_sweep import (  # noqa: F401
    CandidateFunc,
    meta_of,
    op_strategy,
    planner_candidates,
    query_strategy,
    replicated_candidate,
    strategy_registry,
    strategy_schema,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


__all__ = [
    "MESH_SHAPES",
    "StrategyContractTestBase",
    "meta_of",
    "op_strategy",
    "planner_candidates",
    "query_strategy",
    "replicated_candidate",
    "strategy_registry",
    "strategy_schema",
]

# The fake world: large enough for the biggest mesh below.
WORLD_SIZE = 8

# Meshes the contract tests run on: 1-D, the two 2-D shapes (square and not, so a
# mix-up of mesh dims shows) and a 3-D mesh.
MESH_SHAPES: tuple[tuple[int, ...], ...] = ((4,), (2, 2), (2, 4), (2, 2, 2))


class StrategyContractTestBase(TestCase):
    """Base class for strategy contract tests.

    Creates one in-process fake process group per test class (unless the process
    already has one, which is then left alone) and hands out cached CPU meshes.
    """

    _owns_process_group: bool = False
    _meshes: dict[tuple[int, ...], DeviceMesh]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        if not dist.is_initialized():
            dist.init_process_group(
                "fake", store=FakeStore(), rank=0, world_size=WORLD_SIZE
            )
            cls._owns_process_group = True
        cls._meshes = {}

    @classmethod
    def tearDownClass(cls) -> None:
        # Meshes hold sub-groups of the default group: drop them with it.
        cls._meshes = {}
        if cls._owns_process_group and dist.is_initialized():
            dist.destroy_process_group()
        cls._owns_process_group = False
        super().tearDownClass()

    def mesh(self, shape: Sequence[int]) -> DeviceMesh:
        """A CPU mesh of ``shape`` over ranks ``0..n-1``, built once per class."""
        key = tuple(shape)
        if key not in self._meshes:
            n = math.prod(key)
            if n > WORLD_SIZE:
                raise ValueError(
                    f"mesh {key} needs {n} ranks, the fake world has {WORLD_SIZE}"
                )
            self._meshes[key] = DeviceMesh("cpu", torch.arange(n).reshape(key))
        return self._meshes[key]

    def assert_contract(
        self,
        op_schema: OpSchema,
        strategy: StrategyType,
        output_metas: OutputMetas = None,
    ) -> None:
        """Fail, listing every violation, unless ``strategy`` meets the contract.

        ``output_metas`` defaults to shape inference on ``op_schema``; pass it
        explicitly when inference cannot run (e.g. for a data-dependent op).
        """
        if output_metas is None:
            output_metas = infer_output_metas(op_schema)
        violations = check_strategy_contract(op_schema, strategy, output_metas)
        if violations:
            self.fail(
                f"{len(violations)} contract violation(s) for {op_schema.op}:\n"
                + format_violations(violations)
            )
