# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The strategy contract across DTensor's registries, for every op OpInfo samples reach.

The calls are captured once from ``op_db`` and the foreach OpInfo lists (see
``contract_sweep``); each test then asks DTensor for the strategy of every
captured call of a registered op, on one mesh in one query mode, with the code
``strategy_validation --contract`` runs (``_contract_validation``), and fails
listing every op that broke a clause or raised, with an example of each.

The budget keeps the file to about two minutes of one core:

* the first three samples of each OpInfo, in float32, or in int64 or bool for
  OpInfos without float32 (integer-only ops); three samples reach 33 more
  registered ops than one for a few seconds of capture, while other dtypes
  reach none;
* backward and the in-place variant of each sample, which reach the backward
  and in-place ops many strategies are registered for;
* one captured call per aten op, and foreach lists of two tensors;
* runtime queries with every input replicated and with input 0 sharded;
  planner queries with at most 6 candidates per input, among them
  ``Replicate``, an even ``Shard`` and ``Partial``; utility queries (the
  single-dim rules expanded by ``expand_to_full_mesh_op_strategy`` as a
  downstream rule author calls it, without output metas) with the same
  candidates.

Most of the time goes to a few ops whose strategies come from tracing their
decomposition once per combination of input placements.
"""

from collections.abc import Iterable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._ops._contract_mode import format_ops, format_summary
from torch.distributed.tensor._ops._contract_validation import ContractValidation
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    infer_output_metas,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
)
from torch.testing._internal.distributed._tensor.contract_capture import (
    capture_calls,
    CapturedCall,
    opinfo_db,
    select_calls,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    MODES,
    REGISTRIES,
    RUNTIME_REFUSALS,
    strategy_registry,
)


SWEEP_MESHES = ((4,), (2, 2), (2, 2, 2))
SAMPLES_PER_OPINFO = 3
CALLS_PER_OP = 1
CANDIDATES_PER_INPUT = 6
FOREACH_TENSORS = 2

# The share of each registry's ops the capture reaches at least, so that a
# capture that silently stopped working fails. Torch 2.13.0 and 2.14.1 hold very
# different registries (151 and 19 op strategies), yet the capture reaches about
# the same share: 48% of single-dim rules, 77% and 95% of op strategies, 24% and
# 25% of the explicit decompositions no other registry answers.
MIN_REACHED_SHARE = {"single_dim": 0.4, "op_strategy": 0.6, "decomposition": 0.2}


def mesh_name(shape: tuple[int, ...]) -> str:
    return "mesh_" + "x".join(map(str, shape))



def registry_coverage(ops: Iterable[OpOverload]) -> dict[str, tuple[int, int]]:
    """Per registry: how many of ``ops`` it answers for, and how many it holds
    (for the decomposition, the explicit decompositions no other registry answers)."""
    from torch._decomp import decomposition_table

    propagator = DTensor._op_dispatcher.sharding_propagator
    single_dim = set(propagator.op_single_dim_strategy_funcs)
    strategies = set(propagator.op_strategy_funcs) - single_dim
    registered = {
        "single_dim": len(single_dim),
        "op_strategy": len(strategies),
        "decomposition": len(set(decomposition_table) - single_dim - strategies),
    }
    reached = dict.fromkeys(REGISTRIES, 0)
    for op in ops:
        registry = strategy_registry(op)
        if registry is not None:
            reached[registry] += 1
    return {r: (reached[r], registered[r]) for r in REGISTRIES}

class TestStrategyContractRegistry(StrategyContractTestBase):
    calls: dict[OpOverload, list[CapturedCall]]
    capture_counts: dict[str, int]
    metas: dict[str, Any]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        recorder, cls.capture_counts = capture_calls(
            opinfo_db(),
            dtypes=(torch.float32, torch.int64, torch.bool),
            samples=SAMPLES_PER_OPINFO,
            backward=True,
            foreach_tensors=FOREACH_TENSORS,
        )
        cls.calls = select_calls(recorder, CALLS_PER_OP)
        cls.metas = {}  # shape inference of each call, shared by the tests

    @parametrize("shape", SWEEP_MESHES, name_fn=mesh_name)
    @parametrize("mode", MODES)
    def test_contract(self, shape: tuple[int, ...], mode: str) -> None:
        validation = ContractValidation(
            self.calls,
            check_strategy_contract,
            infer_output_metas,
            {mesh_name(shape): self.mesh(shape)},
            [mode],
            capped_candidates(CANDIDATES_PER_INPUT),
            metas=self.metas,
        )
        validation.run()
        print(format_summary(validation, per_op_table=False))
        # utility mode expands the single-dim rules, so it reaches those ops only
        expected = [
            op for op in self.calls if mode != "utility" or strategy_registry(op) == "single_dim"
        ]
        (ops,) = validation.results.values()
        self.assertEqual(len(ops), len(expected))
        failures = [op for op, c in ops.items() if c.failed]
        if failures:
            self.fail(
                f"{len(failures)} of {len(ops)} ops break the strategy "
                f"contract or raise in {mode} queries on mesh {shape}:\n"
                + format_ops(validation, only_failed=True, limit=40)
            )

    def test_coverage(self) -> None:
        coverage = registry_coverage(self.calls)
        print(f"capture: {self.capture_counts}")
        for registry, (reached, registered) in coverage.items():
            print(f"{registry}: {reached} of {registered} registered ops reached by OpInfo samples")
            self.assertGreaterEqual(reached, MIN_REACHED_SHARE[registry] * registered, registry)

    def test_refusals_are_reasoned(self) -> None:
        print(f"RUNTIME_REFUSALS ({len(RUNTIME_REFUSALS)}):")
        for pattern, reason in RUNTIME_REFUSALS.items():
            print(f"  {pattern!r}: {reason}")
            self.assertTrue(pattern.strip() and reason.strip())


instantiate_parametrized_tests(TestStrategyContractRegistry)


if __name__ == "__main__":
    run_tests()
