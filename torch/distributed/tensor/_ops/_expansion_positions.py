# Copyright (c) Meta Platforms, Inc. and affiliates
"""
Per-position work of expanding single-dim rules to the full mesh, done once.

``expand_to_full_mesh_op_strategy`` combines ``len(rules) ** mesh.ndim`` rule
choices, but at one position (an output or an input) the combinations repeat
few placements: a combination's placements there are one of the position's
distinct placements per mesh dim. Giving each distinct placement of a position
a small integer id keys a position's placements across the mesh dims by a tuple
of ints, which hashes without calling into ``Placement``. The spec built for a
key, its shardability and its cost row are then worked out once per key, and
the combinations share them.

Specs are shared between the ``OpSpec``s of one answer; each ``OpSpec`` still
gets its own cost-row list, as a planner may edit costs it is handed.
"""

from collections.abc import Callable, Sequence

from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpStrategy, PlacementList
from torch.distributed.tensor._ops._redistribute_cost_cache import CostRows
from torch.distributed.tensor.placement_types import Partial, Placement


__all__ = [
    "ExpandedPosition",
    "mixes_partials",
    "partial_kinds_by_id",
    "placement_ids",
]


def placement_ids(
    rules: Sequence[PlacementList],
) -> tuple[list[tuple[int, ...]], list[list[Placement | None]]]:
    """Each rule as a tuple of per-position placement ids, and each position's
    placements by id.

    Placements are told apart by type as well as by equality, so that a subclass
    comparing equal to its base (``_StridedShard`` and ``Shard``, ``_MaskPartial``
    and ``Partial``) keeps its own id.
    """
    ids_by_position: list[dict[tuple[type, Placement | None], int]] = []
    rule_ids: list[tuple[int, ...]] = []
    for rule in rules:
        ids = []
        for position, placement in enumerate(rule):
            if position == len(ids_by_position):
                ids_by_position.append({})
            seen = ids_by_position[position]
            ids.append(seen.setdefault((type(placement), placement), len(seen)))
        rule_ids.append(tuple(ids))
    return rule_ids, [[p for _, p in seen] for seen in ids_by_position]


def partial_kinds_by_id(rules: Sequence[PlacementList]) -> dict[int, tuple[type, str]]:
    """The partial kind of each ``Partial`` the rules hold, by identity: the specs
    an expansion builds hold the rules' own placement objects."""
    return {
        id(p): (type(p), p.reduce_op)
        for rule in rules
        for p in rule
        if isinstance(p, Partial)
    }


def mixes_partials(
    spec: DTensorSpec | None, kinds_by_id: dict[int, tuple[type, str]]
) -> bool:
    """Whether ``spec`` holds partial kinds that cannot be reduced in either order.

    Kinds are (type, reduce_op) pairs, so a ``Partial`` subclass with its own
    reduction differs from ``Partial`` with the same reduce_op; ``sum`` and
    ``avg`` of one type commute.
    """
    if spec is None:
        return False
    kinds = {kinds_by_id[id(p)] for p in spec.placements if id(p) in kinds_by_id}
    if len(kinds) <= 1:
        return False
    types = {t for t, _ in kinds}
    reduce_ops = {r for _, r in kinds}
    return not (len(types) == 1 and reduce_ops == {"sum", "avg"})


class ExpandedPosition:
    """The spec at one position for one key, and what the expansion asks of it.

    ``input_index`` is the index, among the op's strategy inputs, of the input
    this position was built for (the count of input specs before it), and
    ``next_input_index`` the count after it; an entry is reused only by a
    combination that reaches the position with the same count.
    """

    __slots__ = (
        "spec",
        "input_index",
        "next_input_index",
        "mixes_partials",
        "_shardable",
        "_cost_row",
    )

    def __init__(
        self,
        spec: DTensorSpec | None,
        input_index: int,
        next_input_index: int,
        mixes_partials: bool,
    ) -> None:
        self.spec = spec
        self.input_index = input_index
        self.next_input_index = next_input_index
        self.mixes_partials = mixes_partials
        self._shardable: bool | None = None
        self._cost_row: list[float] | None = None

    def is_shardable(
        self,
        inputs: Sequence[OpStrategy],
        check: Callable[[OpStrategy, DTensorSpec], bool],
    ) -> bool:
        """``check`` of this input spec against its input, asked once."""
        if self._shardable is None:
            if self.spec is None:
                raise ValueError(
                    f"input position {self.input_index} has no spec to check"
                )
            self._shardable = check(inputs[self.input_index], self.spec)
        return self._shardable

    def cost_row(self, cost_rows: Sequence[CostRows]) -> list[float]:
        """This input spec's redistribute-cost row, as a list the caller owns."""
        if self._cost_row is None:
            if self.spec is None:
                raise ValueError(
                    f"input position {self.input_index} has no spec to price"
                )
            self._cost_row = cost_rows[self.input_index].row(self.spec)
        return list(self._cost_row)
