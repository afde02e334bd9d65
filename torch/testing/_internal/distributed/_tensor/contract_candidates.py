# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Input strategies and candidate placements for strategy queries.

A strategy function sees each tensor input as an ``OpStrategy`` of candidate
placements: one (eager dispatch) or many (a planner). The contract tests, the
contract mode of ``strategy_validation`` and the audit build those candidates
here, so every caller offers the same ones. Nothing here asks DTensor a
question; the module is loaded by path into an unpatched torch as well.
"""

import itertools
from collections.abc import Callable, Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSpec, OpStrategy
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)


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


def replicated_candidate(
    mesh: DeviceMesh, meta: TensorMeta
) -> list[tuple[Placement, ...]]:
    """The single candidate eager dispatch offers for a replicated input."""
    return [(Replicate(),) * mesh.ndim]


# Chooses the candidate placements of one tensor input of a strategy schema.
CandidateFunc = Callable[[DeviceMesh, TensorMeta], Sequence[Sequence[Placement]]]


def capped_candidates(limit: int) -> CandidateFunc:
    """Planner candidates, at most ``limit`` per tensor input (expansion cost grows
    with the product of the inputs' counts): all-``Replicate``, an even ``Shard``,
    ``Partial`` for floating dtypes, then tuples greedily adding (mesh dim,
    placement) pairs; non-empty shards only, deterministic for stable messages.
    """
    cache: dict[tuple[object, ...], list[tuple[Placement, ...]]] = {}

    def candidates(mesh: DeviceMesh, meta: TensorMeta) -> list[tuple[Placement, ...]]:
        key = (tuple(mesh.shape), tuple(meta.shape), meta.dtype)
        if key not in cache:
            cache[key] = _capped_candidates(mesh, meta, limit)
        return cache[key]

    return candidates


def _mesh_dim_options(
    mesh: DeviceMesh, meta: TensorMeta, partials: Sequence[str] = ("sum",)
) -> list[list[Placement]]:
    """Per mesh dim, the placements a candidate may take there: ``Replicate()``,
    ``Shard(d)`` for each tensor dim at least as long as the mesh dim, and
    ``Partial(k)`` for each kind of ``partials`` for floating and complex dtypes."""
    options: list[list[Placement]] = []
    for mesh_dim in range(mesh.ndim):
        opts: list[Placement] = [Replicate()]
        opts += [Shard(d) for d, n in enumerate(meta.shape) if n >= mesh.size(mesh_dim)]
        if meta.dtype.is_floating_point or meta.dtype.is_complex:
            opts += [Partial(k) for k in partials]
        options.append(opts)
    return options


def _capped_candidates(
    mesh: DeviceMesh, meta: TensorMeta, limit: int
) -> list[tuple[Placement, ...]]:
    options = _mesh_dim_options(mesh, meta)

    def pieces(combo: tuple[int, ...]) -> list[int]:
        n = [1] * len(meta.shape)
        for mesh_dim, i in enumerate(combo):
            p = options[mesh_dim][i]
            if isinstance(p, Shard):
                n[p.dim] *= mesh.size(mesh_dim)
        return n

    # Tuples of indices into options; fewest non-Replicate mesh dims first, then
    # leading mesh dims first.
    combos = sorted(
        (
            c
            for c in itertools.product(*(range(len(o)) for o in options))
            if all(k == 1 or k <= n for k, n in zip(pieces(c), meta.shape))
        ),
        key=lambda c: (sum(i != 0 for i in c), c[::-1]),
    )

    def even_shard(combo: tuple[int, ...]) -> bool:
        split = pieces(combo)
        return any(k > 1 for k in split) and all(
            n % k == 0 for n, k in zip(meta.shape, split)
        )

    def partial(combo: tuple[int, ...]) -> bool:
        return any(isinstance(options[d][i], Partial) for d, i in enumerate(combo))

    chosen = [combos[0]]
    for wanted in (even_shard, partial):
        hit = next((c for c in combos if wanted(c)), None)
        if hit is not None and hit not in chosen:
            chosen.append(hit)
    seen = {(d, i) for c in chosen for d, i in enumerate(c)}
    while len(chosen) < min(limit, len(combos)):
        best = max(
            (c for c in combos if c not in chosen),
            key=lambda c: sum((d, i) not in seen for d, i in enumerate(c)),
        )
        chosen.append(best)
        seen.update(enumerate(best))
    chosen = sorted(chosen[:limit], key=combos.index)
    return [tuple(options[d][i] for d, i in enumerate(c)) for c in chosen]


def first_candidates(limit: int, partials: Sequence[str] = ("sum",)) -> CandidateFunc:
    """Planner candidates in a fixed order, the first ``limit`` per tensor input.

    Per mesh dim: ``Replicate()``, ``Shard(d)`` per tensor dim at least as long,
    ``Partial(k)`` per kind of ``partials`` for floating and complex dtypes; fewer
    non-``Replicate`` mesh dims first. Uneven and empty shards stay in (a planner
    may offer them); large limits reach every single-dim placement.
    """
    if limit < 1:
        raise ValueError(f"first_candidates needs a limit of at least 1, got {limit}")

    def candidates(mesh: DeviceMesh, meta: TensorMeta) -> list[tuple[Placement, ...]]:
        options = _mesh_dim_options(mesh, meta, partials)
        combos = sorted(
            itertools.product(*(range(len(o)) for o in options)),
            key=lambda c: (sum(i != 0 for i in c), c),
        )
        return [tuple(options[d][i] for d, i in enumerate(c)) for c in combos[:limit]]

    return candidates
