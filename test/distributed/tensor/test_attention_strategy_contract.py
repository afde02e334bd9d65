# Owner(s): ["oncall: distributed"]
"""The attention ops' strategies, asked on CPU with meta inputs, meet the
strategy contract: every tensor result, RNG state included, has a spec with
its meta. Dispatch still returns the rank-local RNG state as plain tensors."""

from collections.abc import Callable

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dispatch import _RANK_LOCAL_RESULTS
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import Placement
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed._tensor.common_dtensor import (
    LocalDTensorTestBase,
    with_comms,
)


aten = torch.ops.aten
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
FLASH = aten._scaled_dot_product_flash_attention.default
CUDNN = aten._scaled_dot_product_cudnn_attention.default

# The RNG-state results of each forward op, and those dispatch returns as the
# rank's local tensor (as stock DTensor does): the rest are DTensors.
RNG_STATE = {EFFICIENT: (2, 3), FLASH: (6, 7), CUDNN: (6, 7)}
RANK_LOCAL = {EFFICIENT: {2, 3}, FLASH: {7}, CUDNN: {6, 7}}

Candidates = Callable[[torch.Tensor, DeviceMesh], list[tuple[Placement, ...]]]


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta", dtype=torch.float16)


def _like(spec: DTensorSpec) -> torch.Tensor:
    """A meta tensor with the global meta ``spec`` carries."""
    meta = spec.tensor_meta
    if meta is None:
        raise AssertionError(f"{spec} carries no tensor_meta")
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="meta")


def _forward_calls() -> list[tuple[OpOverload, tuple]]:
    q, bias = _meta(8, 8, 16, 16), _meta(8, 8, 16, 16)
    return [
        (EFFICIENT, (q, q, q, None, True, 0.1)),
        (EFFICIENT, (q, q, q, bias, False, 0.0, True)),
        (FLASH, (q, q, q, 0.1)),
        (FLASH, (q, q, q, 0.0, True, True)),
        (CUDNN, (q, q, q, None, True, 0.1)),
        (CUDNN, (q, q, q, bias, True, 0.0, False, True)),
    ]


def _backward_call(
    op: OpOverload, args: tuple, outs: list[torch.Tensor | None]
) -> tuple[OpOverload, tuple]:
    """The backward call of the forward call ``op(*args)`` whose results are
    ``outs``."""
    q, k, v = args[:3]
    grad = torch.empty_like(q)
    if op is FLASH:
        return aten._scaled_dot_product_flash_attention_backward.default, (
            *(grad, q, k, v, *outs[:2], None, None, 16, 16),
            *(args[3], False, *outs[6:8]),
        )
    bias, dropout = args[3], args[5]
    if op is EFFICIENT:
        mask = [True, True, True, bias is not None]
        return aten._scaled_dot_product_efficient_attention_backward.default, (
            *(grad, q, k, v, bias, *outs[:4], dropout, mask),
        )
    return aten._scaled_dot_product_cudnn_attention_backward.default, (
        *(grad, q, k, v, *outs[:2], *outs[6:8], bias, None, None),
        *(16, 16, dropout, False),
    )


class TestAttentionStrategyContract(LocalDTensorTestBase):
    def _meshes(self) -> dict[str, DeviceMesh]:
        ranks = torch.arange(self.world_size)
        return {
            "4": DeviceMesh(self.device_type, ranks),
            "2x2": DeviceMesh(self.device_type, ranks.reshape(2, 2)),
        }

    def _answer(
        self,
        op: OpOverload,
        args: tuple,
        mesh: DeviceMesh,
        candidates: Candidates,
        runtime: bool,
    ) -> tuple[OpSchema, OpStrategy]:
        """The strategy for ``op(*args)`` asked as dispatch (``runtime``) or a
        planner asks it, after checking that it meets the contract."""
        schema = sc.strategy_schema(op, args, {}, mesh, candidates)
        strategy = sc.query_strategy(schema, mesh, runtime)
        local = _RANK_LOCAL_RESULTS.get(op, frozenset())
        expected = sc.expected_output_metas(schema)
        found = sc.contract_violations(schema, strategy, expected, local)
        self.assertEqual(found, [], f"{op} on mesh {tuple(mesh.shape)}")
        self.assertIsInstance(strategy, OpStrategy)
        return schema, strategy

    def _check_family(self, family: OpOverload) -> None:
        """Forward calls of ``family`` and their backward calls, on each mesh,
        asked as dispatch and as a planner asks."""
        for mesh in self._meshes().values():
            for op, args in _forward_calls():
                if op is not family:
                    continue
                for runtime in (True, False):
                    self._check_call(op, args, mesh, runtime)

    def _check_call(
        self, op: OpOverload, args: tuple, mesh: DeviceMesh, runtime: bool
    ) -> None:
        candidates = sc.runtime_candidate if runtime else sc.planner_candidates
        schema, forward = self._answer(op, args, mesh, candidates, runtime)
        want = sc.expected_output_metas(schema)
        for spec in forward.strategies:
            for i in RNG_STATE[op]:
                # The RNG state has a replicated spec with its meta.
                out = spec.output_specs[i]
                self.assertIsInstance(out, DTensorSpec)
                self.assertEqual(out.tensor_meta, want[i])
                self.assertTrue(out.is_replicated())
        # The backward op takes the forward's results as a planner hands them
        # on: as the forward's answer describes them, without rerunning it.
        outs = [
            _like(s) if s is not None else None
            for s in forward.strategies[0].output_specs
        ]
        placed = {
            id(t): [s.output_specs[i].placements for s in forward.strategies]
            for i, t in enumerate(outs)
            if t is not None
        }

        def from_forward(
            t: torch.Tensor, mesh: DeviceMesh
        ) -> list[tuple[Placement, ...]]:
            if id(t) not in placed:
                return candidates(t, mesh)
            return list(dict.fromkeys(placed[id(t)]))[: 1 if runtime else 6]

        backward, backward_args = _backward_call(op, args, outs)
        self._answer(backward, backward_args, mesh, from_forward, runtime)

    @with_comms
    def test_efficient_attention(self) -> None:
        self._check_family(EFFICIENT)

    @with_comms
    def test_flash_attention(self) -> None:
        self._check_family(FLASH)

    @with_comms
    def test_cudnn_attention(self) -> None:
        self._check_family(CUDNN)

    @with_comms
    def test_dispatch_returns_rank_local_results_unwrapped(self) -> None:
        self.assertEqual(
            {op: set(positions) for op, positions in _RANK_LOCAL_RESULTS.items()},
            RANK_LOCAL,
        )
        for mesh in self._meshes().values():
            for placement in (Shard(0), Shard(1), Replicate()):
                placements = (placement,) * mesh.ndim

                def local_shape(t: torch.Tensor) -> list[int]:
                    shape = list(t.shape)
                    if isinstance(placement, Shard):
                        shape[placement.dim] //= mesh.size()
                    return shape

                for op, args in _forward_calls():
                    dist_args = tuple(
                        DTensor.from_local(
                            _meta(*local_shape(a)), mesh, placements, run_check=False
                        )
                        if isinstance(a, torch.Tensor)
                        else a
                        for a in args
                    )
                    results = op(*dist_args)
                    _, answer = self._answer(
                        op, args, mesh, lambda t, mesh: [placements], True
                    )
                    # The spec dispatch chose: the one its inputs need no
                    # redistribution for.
                    (chosen,) = [
                        s
                        for s in answer.strategies
                        if all(i.placements == placements for i in s.input_specs)
                    ]
                    for i, result in enumerate(results):
                        spec = chosen.output_specs[i]
                        if i in RANK_LOCAL[op]:
                            self.assertIs(type(result), torch.Tensor)
                            self.assertTrue(spec.is_replicated())
                            self.assertEqual(
                                spec.tensor_meta,
                                TensorMeta(result.shape, result.stride(), result.dtype),
                            )
                        elif isinstance(result, torch.Tensor):
                            self.assertIsInstance(result, DTensor)
                            self.assertEqual(result.placements, spec.placements)
                    # The backward takes the plain tensors back, as on stock.
                    backward, backward_args = _backward_call(op, dist_args, results)
                    grads = backward(*backward_args)
                    for grad in grads[:3]:
                        self.assertIsInstance(grad, DTensor)

    @with_comms
    def test_contract_check_requires_replicate_rank_local_results(self) -> None:
        mesh = self._meshes()["2x2"]
        op, args = _forward_calls()[0]
        schema = sc.strategy_schema(op, args, {}, mesh)
        expected = sc.expected_output_metas(schema)
        local = _RANK_LOCAL_RESULTS[op]
        spec = sc.query_strategy(schema, mesh, True).strategies[0]
        outs = list(spec.output_specs)
        meta = outs[2].tensor_meta
        for broken, clause in (
            (DTensorSpec(mesh, (Partial(), Replicate()), tensor_meta=meta), "C1"),
            (None, "C2"),
        ):
            outs[2] = broken
            strategy = OpStrategy(
                [OpSpec(tuple(outs), spec.input_specs, spec.redistribute_cost)]
            )
            found = sc.contract_violations(schema, strategy, expected, local)
            self.assertEqual(len(found), 1, found)
            self.assertIn(f"output 2: {clause}", found[0])


if __name__ == "__main__":
    run_tests()
