# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Shared harness for tests that hold DTensor sharding strategies to the strategy
contract (see ``torch.distributed.tensor._ops.strategy_contract``).

Strategy functions only need meshes and metadata, never real collectives, so the
tests run in a single process on a fake process group of 8 ranks, which is big
enough for every mesh in :data:`MESH_SHAPES`.
"""

import itertools
import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    format_violations,
    infer_output_metas,
    OutputMetas,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import TestCase
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


def meta_of(tensor: torch.Tensor) -> TensorMeta:
    """The global ``TensorMeta`` of ``tensor``, as DTensor records it on a spec."""
    return TensorMeta(shape=tensor.shape, stride=tensor.stride(), dtype=tensor.dtype)


def op_strategy(
    mesh: DeviceMesh, meta: TensorMeta, *placements: Sequence[Placement]
) -> OpStrategy:
    """An input strategy: one candidate ``OpSpec`` per placement tuple.

    Candidates carry only an output spec, like the input strategies DTensor puts in
    a strategy schema. With no placements the input has a single, replicated
    candidate, which is what eager dispatch hands a strategy function.
    """
    if not placements:
        placements = ((Replicate(),) * mesh.ndim,)
    specs = []
    for p in placements:
        if len(p) != mesh.ndim:
            raise ValueError(f"placements {p} do not match a {mesh.ndim}-D mesh")
        specs.append(OpSpec(DTensorSpec(mesh, tuple(p), tensor_meta=meta)))
    return OpStrategy(specs)


def planner_candidates(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """Every placement tuple a planner would consider for a tensor with ``meta``.

    Per mesh dim: ``Replicate()``, ``Shard(d)`` for each tensor dim, and
    ``Partial()`` for floating dtypes; tuples are taken in ``itertools.product``
    order. A tuple is dropped when a tensor dim is split into more pieces than it
    has elements, so that every rank holds a non-empty shard. The order is fixed,
    which keeps strategy indices in failure messages stable.
    """
    per_dim: list[Placement] = [Replicate()]
    per_dim += [Shard(d) for d in range(len(meta.shape))]
    if meta.dtype.is_floating_point:
        per_dim.append(Partial())
    candidates = []
    for combo in itertools.product(per_dim, repeat=mesh.ndim):
        pieces = [1] * len(meta.shape)
        for mesh_dim, p in enumerate(combo):
            if isinstance(p, Shard):
                pieces[p.dim] *= mesh.size(mesh_dim)
        if all(n <= size for n, size in zip(pieces, meta.shape)):
            candidates.append(combo)
    return candidates


def replicated_candidate(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """The single candidate eager dispatch offers for a replicated input."""
    return [(Replicate(),) * mesh.ndim]


# Chooses the candidate placements of one tensor input of a strategy schema.
CandidateFunc = Callable[[DeviceMesh, TensorMeta], Sequence[Sequence[Placement]]]


def strategy_schema(
    mesh: DeviceMesh,
    op: OpOverload,
    args: Sequence[object],
    kwargs: dict[str, object] | None = None,
    candidates: CandidateFunc = replicated_candidate,
) -> OpSchema:
    """A strategy schema for ``op(*args, **kwargs)`` as DTensor builds one.

    Every tensor (or ``TensorMeta``) in ``args``/``kwargs`` becomes an
    :class:`OpStrategy` whose candidates are ``candidates(mesh, meta)``; a list
    made only of tensors becomes a :class:`TupleStrategy`, and a list mixing
    tensors and ``None`` stays a list, as in DTensor's own wrapping. The schema
    carries the op's registered ``RuntimeSchemaInfo``, as eager dispatch sets it.
    """

    def wrap(x: object) -> object:
        if isinstance(x, (torch.Tensor, TensorMeta)):
            meta = meta_of(x) if isinstance(x, torch.Tensor) else x
            return op_strategy(mesh, meta, *candidates(mesh, meta))
        if isinstance(x, (list, tuple)) and len(x) > 0:
            is_tensor = [isinstance(e, (torch.Tensor, TensorMeta)) for e in x]
            if all(is_tensor):
                children = [wrap(e) for e in x]
                return TupleStrategy(
                    tuple(children) if isinstance(x, tuple) else children
                )
            if any(is_tensor):
                return [wrap(e) for e in x]
        return x

    propagator = _sharding_propagator()
    schema_info = propagator.op_to_schema_info.get(
        op
    ) or propagator.op_to_schema_info_for_single_dim_strategy.get(op)
    return OpSchema(
        op,
        tuple(wrap(a) for a in args),
        {k: wrap(v) for k, v in (kwargs or {}).items()},
        schema_info=schema_info,
    )


def _sharding_propagator():  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def strategy_registry(op: OpOverload) -> str | None:
    """Which registry DTensor's runtime asks for ``op``'s strategies, or ``None``.

    The order is the runtime's: single-dim strategies, then registered op
    strategies, then the decomposition-derived strategy.
    """
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    propagator = _sharding_propagator()
    if op in propagator.op_single_dim_strategy_funcs:
        return "single_dim"
    if op in propagator.op_strategy_funcs:
        return "op_strategy"
    if DecompShardingStrategy.has_decomp(op):
        return "decomposition"
    return None


def query_strategy(
    op_schema: OpSchema, mesh: DeviceMesh | None = None
) -> StrategyType | None:
    """Ask DTensor's strategy machinery for ``op_schema``'s strategy, as a planner does.

    ``op_schema`` is a strategy schema (see :func:`strategy_schema`). Output metas
    are left for the machinery to infer. Returns ``None`` when the registry
    declines the query (the decomposition path may), and raises ``ValueError``
    for an op no registry knows.
    """
    from torch.distributed.tensor._ops.single_dim_strategy import (
        _expand_single_dim_strategy_to_mesh,
    )

    op = op_schema.op
    propagator = _sharding_propagator()
    registry = strategy_registry(op)
    if registry == "single_dim":
        if mesh is None:
            mesh = op_schema.get_mesh_from_args(validate=False)
        expand = _expand_single_dim_strategy_to_mesh(
            mesh, op_schema, propagator.op_single_dim_strategy_funcs[op], None
        )
        return expand(op, op_schema.args_meta, op_schema.kwargs_meta)
    if registry == "op_strategy":
        return propagator.op_strategy_funcs[op](op_schema)
    if registry == "decomposition":
        propagator.decomp_strategy.ensure_schema_info(op)
        return propagator.decomp_strategy.propagate_strategy(op_schema)
    raise ValueError(f"DTensor has no sharding strategy for {op}")


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
