"""The planner benchmark: enumerate strategies for every node of a traced graph.

An auto-sharding planner walks an aten graph in topological order. Each tensor
carries candidate placements; each op is asked for every way it can run given
its inputs' candidates (a strategy schema whose ``OpStrategy`` inputs hold one
``OpSpec`` per candidate), and the output placements of the answer become the
candidates of its result. What differs between the sides is how the answer is
obtained:

* ``built``: the registries asked directly, as the change lets a planner ask
  them (single-dim rules through ``_expand_single_dim_strategy_to_mesh`` with
  no output metas, ``op_strategy_funcs[op](schema)``, the decomposition path's
  ``propagate_strategy(schema)``), and the specs used as returned: the change
  makes them complete;
* ``stock``: stock's registries plus the repair pass planners run today
  (:class:`StockRepair`): stock's single-dim expansion refuses an input with
  several candidates, so the planner expands the rules itself over the full
  candidate lists; its specs lack metas, so the planner runs shape inference
  of the op on fake tensors and fills output and input metas, ``None`` where
  the op returns ``None``, and missing input specs and redistribute costs;
* ``bare``: stock's registries with no repair at all (:class:`BareQuery`): the
  single-dim rules expanded the same way but without output metas, every
  answer read as it comes. Its consume step takes what a planner can read from
  an incomplete spec (placements for candidates, costs where present) and
  counts what is missing instead of raising: the price of stock's plain
  answers, where stock can answer.

Nodes no registry answers get an all-Replicate strategy, on every side, and
are counted as fallbacks; on the bare side the fallback's metas are the graph's
own (``node.meta["val"]``), since that side runs no shape inference of its own.

:class:`FloorWalk` is the floor the built side is compared with: the same
answers, built from precomputed parts. Per node it does exactly one fake shape
inference (complete specs need output metas, and nothing but running the op
on fake tensors gives them), builds as many ``OpSpec``s as the built walk
received, from fresh ``DTensorSpec``s carrying the recorded placements and the
inferred metas and with the recorded cost rows, and consumes them with the same
consume step. Those are the parts no implementation of complete answers can
skip. Everything else the built walk spends (finding and running rules,
expanding them over the mesh, checking shardability, pricing redistributions)
is what an implementation can make cheaper, so built/floor measures how much
of it is left. Building the planner's query (its input ``OpStrategy``s) is not
in the floor: it is the planner's own cost, the same on every side.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

import torch
import torch.fx
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
    _ShardingPlaceholder,
)
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    generate_redistribute_costs,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils import _pytree as pytree

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from collections.abc import Callable, Sequence


Placements = tuple[Placement, ...]
# Output metas of a node: a TensorMeta, None, or a list/tuple of those.
Metas = Any


def meta_of(t: torch.Tensor) -> TensorMeta:
    """The global meta DTensor records for ``t``."""
    return TensorMeta(shape=t.shape, stride=t.stride(), dtype=t.dtype)


def metas_of(value: object) -> Metas:
    """TensorMeta per tensor of ``value`` (traced or fake), keeping its structure."""
    if isinstance(value, torch.Tensor):
        return meta_of(value)
    if isinstance(value, (list, tuple)):
        return type(value)(metas_of(v) for v in value)
    return None


def spread_cap(candidates: Sequence[Placements], cap: int) -> list[Placements]:
    """Unique candidates in order, at most ``cap`` of them, evenly picked (first kept).

    Every consumer of a tensor sees the same list, so a cap keeps the product of
    candidate counts (what expansion costs) bounded on both sides alike.
    """
    unique = list(dict.fromkeys(candidates))
    if len(unique) > cap:
        unique = [unique[i * len(unique) // cap] for i in range(cap)]
    return unique


def input_candidates(mesh: DeviceMesh, meta: TensorMeta, cap: int) -> list[Placements]:
    """The candidates a planner offers for a graph input, at most ``cap``.

    Per mesh dim ``Replicate()`` or ``Shard(d)`` for a tensor dim at least as
    long as the mesh dim; combinations cutting a dim into more pieces than it
    has elements are left out. All-Replicate comes first, then fewer sharded
    mesh dims before more, and :func:`spread_cap` picks from that order, so
    the choice is deterministic and the same on every side.
    """
    per_mesh_dim = [
        [Replicate(), *(Shard(d) for d, n in enumerate(meta.shape) if n >= mesh.size(m))]
        for m in range(mesh.ndim)
    ]

    def fits(combo: Placements) -> bool:
        pieces = [1] * len(meta.shape)
        for m, p in enumerate(combo):
            if isinstance(p, Shard):
                pieces[p.dim] *= mesh.size(m)
        return all(k <= n for k, n in zip(pieces, meta.shape))

    combos = [c for c in itertools.product(*per_mesh_dim) if fits(c)]
    combos.sort(key=lambda c: sum(not isinstance(p, Replicate) for p in c))
    return spread_cap(combos, cap)


def is_multi(metas: Metas) -> bool:
    """Whether ``metas`` is one entry per result (a TensorMeta is a NamedTuple too)."""
    return isinstance(metas, (list, tuple)) and not isinstance(metas, TensorMeta)


def output_list(specs: object) -> list[DTensorSpec | None]:
    """``output_specs`` as one entry per result, whether it is a tuple or one spec."""
    return list(specs) if isinstance(specs, (list, tuple)) else [specs]  # type: ignore[list-item]


@dataclass
class WalkStats:
    """What one walk did; the same counters on both sides."""

    nodes: int = 0  # aten call_function nodes visited
    queries: int = 0  # nodes a registry was asked about
    specs: int = 0  # OpSpecs the walk received (after repair on stock)
    candidates: int = 0  # output candidates handed to consumers
    registries: Counter[str] = field(default_factory=Counter)
    fallbacks: Counter[str] = field(default_factory=Counter)  # op -> all-Replicate count
    fallback_reasons: dict[str, str] = field(default_factory=dict)
    repairs: Counter[str] = field(default_factory=Counter)  # stock: what the pass filled
    expanded: Counter[str] = field(default_factory=Counter)  # bare: planner-side expansion
    missing: Counter[str] = field(default_factory=Counter)  # bare: what specs lacked
    cost_sum: float = 0.0  # finite redistribute costs read (proves they were consumed)

    def as_dict(self) -> dict[str, Any]:
        """The counters as the worker's info JSON holds them."""
        return {
            "nodes": self.nodes,
            "queries": self.queries,
            "specs": self.specs,
            "candidates": self.candidates,
            "registries": dict(self.registries),
            "fallback_nodes": sum(self.fallbacks.values()),
            "fallbacks": dict(self.fallbacks),
            "fallback_reasons": self.fallback_reasons,
            "repairs": dict(self.repairs),
            "expanded": dict(self.expanded),
            "missing": dict(self.missing),
        }


SIDES = ("stock", "bare", "built")


@dataclass(frozen=True)
class RecordedSpec:
    """One OpSpec of a built answer, taken apart: what the floor rebuilds it from."""

    outputs: tuple[Placements | None, ...]  # one entry per result position
    output_metas: tuple[TensorMeta | None, ...]
    inputs: tuple[tuple[Placements, TensorMeta | None], ...]
    costs: list[list[float]]


@dataclass(frozen=True)
class RecordedNode:
    """A node's whole answer as the built walk consumed it."""

    multi: bool  # the answer's output_specs is a tuple (one entry per result)
    specs: tuple[RecordedSpec, ...]
    n_candidates: tuple[int, ...]  # candidates per tensor input


class PlannerWalk:
    """One walk over ``graph``; ``side`` picks how strategies are obtained.

    ``record``, when given, receives every node's answer as consumed (the floor
    is built from it); recording is for an untimed walk.
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        graph: torch.fx.Graph,
        side: str,
        cap: int,
        record: dict[torch.fx.Node, RecordedNode] | None = None,
    ) -> None:
        if side not in SIDES:
            raise ValueError(f"side must be one of {', '.join(SIDES)}, got {side!r}")
        self.mesh = mesh
        self.graph = graph
        self.side = side
        self.cap = cap
        self.propagator = DTensor._op_dispatcher.sharding_propagator
        # Fresh per walk: a planner's own state is part of its cold cost.
        self.fake_mode = FakeTensorMode()
        self.replicate: Placements = (Replicate(),) * mesh.ndim
        self.candidates: dict[torch.fx.Node, list[list[Placements]]] = {}
        self.input_strategies: dict[torch.fx.Node, OpStrategy] = {}
        self.fakes: dict[torch.fx.Node, object] = {}
        self.stats = WalkStats()
        self.repair = StockRepair(self) if side == "stock" else None
        self.bare = BareQuery(self) if side == "bare" else None
        # The bare side reads incomplete specs; the others must get complete ones.
        self.lenient = side == "bare"
        self.record = record

    # ---- inputs ----

    def node_meta(self, node: torch.fx.Node) -> Metas:
        """The metas the trace recorded for ``node``: what its consumers' queries carry."""
        return metas_of(node.meta["val"])

    def input_strategy(self, node: torch.fx.Node) -> OpStrategy:
        """The producer's candidates as an OpStrategy (built once per tensor)."""
        strategy = self.input_strategies.get(node)
        if strategy is None:
            meta = self.node_meta(node)
            if not isinstance(meta, TensorMeta):
                raise TypeError(f"{node.name} feeds a tensor input but produced {meta!r}")
            cands = self.candidates[node][0] or [self.replicate]
            strategy = OpStrategy(
                [OpSpec(DTensorSpec(self.mesh, p, tensor_meta=meta)) for p in cands]
            )
            self.input_strategies[node] = strategy
        return strategy

    def schema_arg(self, arg: object) -> object:
        """An argument as a strategy schema holds it: tensors become their candidates."""
        if isinstance(arg, torch.fx.Node):
            return self.input_strategy(arg)
        if isinstance(arg, (list, tuple)) and any(isinstance(a, torch.fx.Node) for a in arg):
            if all(isinstance(a, torch.fx.Node) for a in arg):
                # A tensor list, wrapped as DTensor wraps one.
                children = [self.input_strategy(a) for a in arg]
                return TupleStrategy(tuple(children) if isinstance(arg, tuple) else children)
            return type(arg)([self.schema_arg(a) for a in arg])
        return arg

    def schema_for(self, node: torch.fx.Node) -> OpSchema:
        """The planner's query for ``node``, with the op's registered schema info."""
        op = node.target
        if not isinstance(op, OpOverload):
            raise TypeError(f"{node.format_node()}: target {op!r} is not an OpOverload")
        if self.registry(op) == "decomposition":
            self.propagator.decomp_strategy.ensure_schema_info(op)
        info = self.propagator.op_to_schema_info.get(
            op
        ) or self.propagator.op_to_schema_info_for_single_dim_strategy.get(op)
        return OpSchema(
            op,
            tuple(self.schema_arg(a) for a in node.args),
            {k: self.schema_arg(v) for k, v in node.kwargs.items()},
            schema_info=info,
        )

    def registry(self, op: OpOverload) -> str:
        """Which of DTensor's registries answers ``op`` (the one the runtime would ask)."""
        if op in self.propagator.op_single_dim_strategy_funcs:
            return "single_dim"
        if op in self.propagator.op_strategy_funcs:
            return "op_strategy"
        if DecompShardingStrategy.has_decomp(op):
            return "decomposition"
        return "none"

    def tensor_inputs(self, schema: OpSchema) -> list[OpStrategy]:
        """Tensor inputs in flattened argument order (args, then kwargs)."""
        leaves = pytree.tree_leaves(
            (list(schema.args_schema), dict(schema.kwargs_schema)),
            is_leaf=lambda x: isinstance(x, (OpStrategy, TupleStrategy)),
        )
        flat: list[OpStrategy] = []
        for leaf in leaves:
            if isinstance(leaf, OpStrategy):
                flat.append(leaf)
            elif isinstance(leaf, TupleStrategy):
                flat += [c for c in leaf.children if isinstance(c, OpStrategy)]
        return flat

    # ---- shape inference (stock's repair, and fallbacks on either side) ----

    def fake_value(self, node: torch.fx.Node) -> object:
        """A fake tensor with the producer's meta, made once per tensor."""
        if node not in self.fakes:
            meta = self.node_meta(node)
            with self.fake_mode:
                self.fakes[node] = torch.empty_strided(
                    meta.shape, meta.stride, dtype=meta.dtype
                )
        return self.fakes[node]

    def infer_metas(self, node: torch.fx.Node) -> Metas:
        """Re-run the op on fake tensors of its inputs' metas; its output metas."""
        args, kwargs = pytree.tree_map_only(
            torch.fx.Node, self.fake_value, (tuple(node.args), dict(node.kwargs))
        )
        with self.fake_mode:
            out = node.target(*args, **kwargs)  # type: ignore[operator]
        return metas_of(out)

    # ---- the walk ----

    def run(self) -> WalkStats:
        """Visit every node in order; the counters of what was done."""
        for node in self.graph.nodes:
            if node.op == "placeholder":
                meta = self.node_meta(node)
                self.candidates[node] = [input_candidates(self.mesh, meta, self.cap)]
            elif node.op == "output":
                continue
            elif node.op == "call_function" and node.target is operator.getitem:
                source, index = node.args
                self.candidates[node] = [self.candidates[source][index]]
            elif node.op == "call_function" and isinstance(node.target, OpOverload):
                self.visit(node)
            else:
                raise RuntimeError(f"planner walk: unexpected node {node.op} {node.target}")
        return self.stats

    def ask_registry(self, schema: OpSchema, registry: str) -> StrategyType | None:
        """The registry's own answer to a planner query, nothing added.

        With several candidates per input, only the change's torch answers
        single-dim ops this way (stock's expansion refuses them).
        """
        op = schema.op
        if hasattr(self.propagator, "enumerate_strategies"):
            return self.propagator.enumerate_strategies(schema)
        if registry == "single_dim":
            info = self.propagator.op_single_dim_strategy_funcs[op]
            expand = _expand_single_dim_strategy_to_mesh(self.mesh, schema, info, None)
            return expand(op, schema.args_meta, schema.kwargs_meta)
        if registry == "op_strategy":
            return self.propagator.op_strategy_funcs[op](schema)
        return self.propagator.decomp_strategy.propagate_strategy(schema)

    def visit(self, node: torch.fx.Node) -> None:
        """Ask for ``node``'s strategy as this side does, fall back if none, consume it."""
        op = node.target
        if not isinstance(op, OpOverload):
            raise TypeError(f"{node.format_node()}: target {op!r} is not an OpOverload")
        self.stats.nodes += 1
        schema = self.schema_for(node)
        inputs = self.tensor_inputs(schema)
        registry = self.registry(op)
        strategy: StrategyType | None = None
        reason = ""
        metas: Metas = None
        if registry == "none":
            reason = "no registered strategy or decomposition"
        else:
            self.stats.queries += 1
            self.stats.registries[registry] += 1
            try:
                if self.bare is not None:
                    strategy = self.bare.query(schema, registry, inputs)
                elif self.repair is None:
                    # the change: the registries answer, specs used as returned
                    strategy = self.ask_registry(schema, registry)
                else:
                    metas = self.infer_metas(node)
                    strategy = self.repair.query(schema, registry, inputs, metas)
            except Exception as e:  # the planner falls back; counted below
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
            else:
                if strategy is None:
                    reason = f"{registry} returned None"
                elif self.bare is not None:
                    unusable = self.bare.unusable(node, strategy)
                    if unusable:
                        self.stats.missing["unusable_answers"] += 1
                        reason, strategy = unusable, None
        if strategy is None:
            if metas is None:
                # bare: the graph's own metas; the others re-run the op, as planners do
                metas = self.node_meta(node) if self.bare is not None else self.infer_metas(node)
            strategy = self.all_replicate(inputs, metas)
            self.stats.fallbacks[str(op)] += 1
            self.stats.fallback_reasons.setdefault(str(op), reason)
        if not isinstance(strategy, OpStrategy):
            raise TypeError(
                f"{node.name} ({op}): expected an OpStrategy, got {type(strategy).__name__}"
            )
        n_candidates = [len(i.strategies) for i in inputs]
        if self.record is not None:
            self.record[node] = record_answer(strategy, n_candidates)
        self.consume(node, strategy, n_candidates)

    def all_replicate(self, inputs: list[OpStrategy], metas: Metas) -> OpStrategy:
        """What a planner does for an op DTensor cannot answer: run it replicated."""

        def out(meta: Metas) -> DTensorSpec | None:
            return None if meta is None else DTensorSpec(self.mesh, self.replicate, tensor_meta=meta)

        outputs = tuple(out(m) for m in metas) if is_multi(metas) else out(metas)
        input_specs = [
            DTensorSpec(self.mesh, self.replicate, tensor_meta=i.strategies[0].output_spec.tensor_meta)
            for i in inputs
        ]
        costs = [generate_redistribute_costs(i, s) for i, s in zip(inputs, input_specs)]
        return OpStrategy([OpSpec(outputs, input_specs, costs)])

    def consume(
        self, node: torch.fx.Node, strategy: OpStrategy, n_candidates: Sequence[int]
    ) -> None:
        """Read the specs as a planner's cost model does; derive the result's candidates.

        ``n_candidates`` holds each tensor input's candidate count (what a cost
        row must match). Raises if a spec is not consumable as returned (the
        built side promises it; the stock side's repair must have made it so),
        except on the lenient bare side, which counts each gap in
        ``stats.missing`` and reads what is there: a spec without costs is
        taken as reachable, an output without a meta still offers its placements.
        """
        n_inputs = len(n_candidates)
        n_outputs = len(output_list(strategy.strategies[0].output_specs))
        per_output: list[list[Placements]] = [[] for _ in range(n_outputs)]
        missing = self.stats.missing
        for index, spec in enumerate(strategy.strategies):
            rows = spec.redistribute_cost
            if spec.input_specs is None or len(spec.input_specs) != n_inputs:
                if not self.lenient:
                    raise RuntimeError(
                        f"{node.name} ({node.target}) spec {index}: input_specs "
                        f"{None if spec.input_specs is None else len(spec.input_specs)} for {n_inputs} inputs"
                    )
                missing["specs_without_input_specs" if spec.input_specs is None
                        else "specs_with_wrong_input_count"] += 1
            if rows is None or len(rows) != n_inputs or any(
                len(row) != n for row, n in zip(rows, n_candidates)
            ):
                if not self.lenient:
                    raise RuntimeError(
                        f"{node.name} ({node.target}) spec {index}: redistribute_cost does not "
                        f"match the inputs' candidates"
                    )
                missing["specs_without_costs" if rows is None else "specs_with_wrong_cost_rows"] += 1
                rows = []  # nothing to price it with: a planner takes it as reachable
            reachable = True
            for row in rows:
                finite = [float(c) for c in row if math.isfinite(float(c))]
                if not finite:
                    reachable = False
                    break
                self.stats.cost_sum += min(finite)
            if not reachable:
                continue
            outputs = output_list(spec.output_specs)
            if len(outputs) != n_outputs:
                if not self.lenient:
                    raise RuntimeError(
                        f"{node.name} ({node.target}) spec {index}: {len(outputs)} output specs, "
                        f"spec 0 has {n_outputs}"
                    )
                missing["specs_with_wrong_output_count"] += 1
                continue
            for pos, out in enumerate(outputs):
                if out is not None:
                    if out.tensor_meta is None:
                        if not self.lenient:
                            raise RuntimeError(
                                f"{node.name} ({node.target}) spec {index}: output {pos} has no tensor_meta"
                            )
                        missing["outputs_without_meta"] += 1
                    per_output[pos].append(out.placements)
        self.stats.specs += len(strategy.strategies)
        capped = [spread_cap(c, self.cap) for c in per_output]
        self.stats.candidates += sum(len(c) for c in capped)
        self.candidates[node] = capped


class StockRepair:
    """The pass planners run over stock's answers so that they can consume them."""

    def __init__(self, walk: PlannerWalk) -> None:
        self.walk = walk
        self.mesh = walk.mesh
        self.propagator = walk.propagator

    def query(
        self, schema: OpSchema, registry: str, inputs: list[OpStrategy], metas: Metas
    ) -> StrategyType | None:
        op = schema.op
        strategy: StrategyType | None
        if registry == "single_dim":
            strategy = self.expand_single_dim(schema, inputs, metas)
        elif registry == "op_strategy":
            strategy = self.propagator.op_strategy_funcs[op](schema)
        else:
            strategy = self.propagator.decomp_strategy.propagate_strategy(schema)
        if strategy is None:
            return None
        if not isinstance(strategy, OpStrategy):
            raise TypeError(f"repair handles OpStrategy answers, got {type(strategy).__name__}")
        return self.fill(strategy, inputs, metas)

    def expand_single_dim(
        self, schema: OpSchema, inputs: list[OpStrategy], metas: Metas
    ) -> OpStrategy:
        """Single-dim rules over the full candidate lists, as planners expand them."""
        out_metas = list(metas) if is_multi(metas) else [metas]
        return expand_single_dim(
            self.walk, schema, inputs, [m is None for m in out_metas], self.walk.stats.repairs
        )

    def fill(self, strategy: OpStrategy, inputs: list[OpStrategy], metas: Metas) -> OpStrategy:
        """New OpSpecs with metas, None outputs, input specs and costs filled in."""
        repairs = self.walk.stats.repairs
        multi = is_multi(metas)
        input_metas = [i.strategies[0].output_spec.tensor_meta for i in inputs]
        fixed: list[OpSpec] = []
        for spec in strategy.strategies:
            outputs: list[DTensorSpec | None] = output_list(spec.output_specs)
            wanted = list(metas) if multi else [metas]
            if len(outputs) == 1 and len(wanted) > 1 and outputs[0] is not None:
                # one spec for a multi-output op: every tensor result gets it
                outputs = outputs * len(wanted)
                repairs["outputs_broadcast"] += 1
            if len(outputs) != len(wanted):
                raise RuntimeError(
                    f"{len(outputs)} output specs for {len(wanted)} results of the op"
                )
            new_outputs: list[DTensorSpec | None] = []
            for out, meta in zip(outputs, wanted):
                if meta is None:
                    if out is not None:
                        repairs["output_set_none"] += 1
                    new_outputs.append(None)
                    continue
                if out is None:
                    repairs["output_spec_added"] += 1
                    out = DTensorSpec(self.mesh, self.walk.replicate)
                if out.tensor_meta != meta:
                    repairs["output_meta_filled"] += 1
                    out = out.shallow_copy_with_tensor_meta(meta)
                new_outputs.append(out)
            output_specs = tuple(new_outputs) if multi else new_outputs[0]

            input_specs = spec.input_specs
            if input_specs is None:
                repairs["input_specs_added"] += 1
                first = next((o for o in new_outputs if o is not None), None)
                default = first.placements if first is not None else self.walk.replicate
                input_specs = [DTensorSpec(self.mesh, default) for _ in inputs]
            if len(input_specs) != len(inputs):
                raise RuntimeError(f"{len(input_specs)} input specs for {len(inputs)} tensor inputs")
            new_inputs = []
            for s, meta in zip(input_specs, input_metas):
                if s.tensor_meta != meta:
                    repairs["input_meta_filled"] += 1
                    s = s.shallow_copy_with_tensor_meta(meta)
                new_inputs.append(s)

            costs = spec.redistribute_cost
            if costs is None or len(costs) != len(inputs) or any(
                len(row) != len(i.strategies) for row, i in zip(costs, inputs)
            ):
                repairs["costs_filled"] += 1
                costs = [generate_redistribute_costs(i, s) for i, s in zip(inputs, new_inputs)]
            fixed.append(OpSpec(output_specs, new_inputs, costs))
        return OpStrategy(fixed)


def expand_single_dim(
    walk: PlannerWalk,
    schema: OpSchema,
    inputs: list[OpStrategy],
    none_results: Sequence[bool] | None,
    counts: Counter[str],
) -> OpStrategy:
    """A single-dim rule expanded over the full candidate lists, as planners do it.

    Stock's own expansion raises as soon as an input offers several candidates,
    so planners resolve the placeholders to ``Shard``, add the all-Replicate
    rule if the rules lack one, and call ``expand_to_full_mesh_op_strategy``
    without output metas. ``none_results`` (per result position, from shape
    inference; ``None`` when the planner ran none) keeps the added rule from
    placing a result the op returns as ``None``. ``counts`` records what was done.
    """
    op = schema.op
    info = walk.propagator.op_single_dim_strategy_funcs[op]
    func: Callable[..., list[list[Any]]] = getattr(info, "func", info)
    rules = func(op, schema.args_meta, schema.kwargs_meta)
    nones = list(none_results) if none_results is not None else []
    n_outputs = len(rules[0]) - len(inputs) if rules else max(len(nones), 1)
    resolved = [
        [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in rule]
        for rule in rules
    ]
    if not any(all(p is None or isinstance(p, Replicate) for p in r) for r in resolved):
        replicate_rule: list[Placement | None] = [
            None if i < len(nones) and nones[i] else Replicate() for i in range(n_outputs)
        ]
        resolved.insert(0, replicate_rule + [Replicate()] * len(inputs))
        counts["replicate_rule_added"] += 1
    counts["single_dim_expanded"] += 1
    base = op._schema.name.split("::")[-1]
    return expand_to_full_mesh_op_strategy(
        walk.mesh,
        schema,
        resolved,  # type: ignore[arg-type]
        input_index=n_outputs,
        inplace_op=base.endswith("_"),
        allow_uneven_sharding=getattr(info, "allow_uneven_sharding", False),
    )


class BareQuery:
    """Stock's answers with no repair: what a planner gets when it skips the pass.

    Single-dim rules are expanded as the repair expands them (placeholders to
    ``Shard``, over the full candidate lists) but without output metas, since
    this side runs no shape inference; registered strategies and the
    decomposition path are asked directly. Nothing is filled in afterwards.
    """

    def __init__(self, walk: PlannerWalk) -> None:
        self.walk = walk
        self.propagator = walk.propagator

    def query(
        self, schema: OpSchema, registry: str, inputs: list[OpStrategy]
    ) -> StrategyType | None:
        if registry == "single_dim":
            return expand_single_dim(self.walk, schema, inputs, None, self.walk.stats.expanded)
        if registry == "op_strategy":
            return self.propagator.op_strategy_funcs[schema.op](schema)
        return self.propagator.decomp_strategy.propagate_strategy(schema)

    def unusable(self, node: torch.fx.Node, strategy: StrategyType) -> str:
        """Why a planner cannot read ``strategy`` for ``node`` at all ("" if it can).

        Only what no reading can get around: not an OpStrategy, no specs, or a
        first spec whose output count is not the node's result count (the
        consumers of result ``i`` would find no candidates). Gaps inside the
        specs are for :meth:`PlannerWalk.consume` to count.
        """
        if not isinstance(strategy, OpStrategy):
            return f"a {type(strategy).__name__} answer"
        if not strategy.strategies:
            return "an OpStrategy without specs"
        metas = self.walk.node_meta(node)
        wanted = len(metas) if is_multi(metas) else 1
        got = len(output_list(strategy.strategies[0].output_specs))
        if got != wanted:
            return f"{got} output spec(s) for {wanted} result(s)"
        return ""


def record_answer(strategy: OpStrategy, n_candidates: Sequence[int]) -> RecordedNode:
    """Take a consumed answer apart into what the floor rebuilds it from."""
    multi = isinstance(strategy.strategies[0].output_specs, (list, tuple))
    specs = []
    for spec in strategy.strategies:
        outputs = output_list(spec.output_specs)
        specs.append(
            RecordedSpec(
                outputs=tuple(None if o is None else o.placements for o in outputs),
                output_metas=tuple(None if o is None else o.tensor_meta for o in outputs),
                inputs=tuple((s.placements, s.tensor_meta) for s in spec.input_specs or ()),
                costs=[list(row) for row in spec.redistribute_cost or ()],
            )
        )
    return RecordedNode(multi=multi, specs=tuple(specs), n_candidates=tuple(n_candidates))


class FloorWalk(PlannerWalk):
    """The floor: what no implementation of the built walk's answers can avoid.

    It walks the same graph and, per node, does exactly one fake shape
    inference of the node (as :meth:`PlannerWalk.infer_metas` does; complete
    specs need their metas, and DTensor needs shape inference to get them),
    then builds as many ``OpSpec``s as the built walk received for that node,
    each from fresh ``DTensorSpec``s with the recorded placements (outputs
    with the metas just inferred, inputs with their producers' metas) and the
    recorded cost rows, and hands them to the same consume step. What it leaves
    out is everything an implementation may make cheaper or avoid: looking up
    and running rules, expanding them over the mesh, validating shardings,
    pricing redistributions, repairing, and building the planner's query schema
    (input ``OpStrategy``s; a cost of the planner, not of DTensor, the same on
    every side). The floor's consume reads the same specs the built walk read,
    so built/floor is how far the change is from answering for free.

    ``verify`` checks each inferred meta against the recorded one (an untimed
    run does it once; the timed runs leave it off).
    """

    def __init__(
        self,
        mesh: DeviceMesh,
        graph: torch.fx.Graph,
        cap: int,
        recorded: dict[torch.fx.Node, RecordedNode],
        verify: bool = False,
    ) -> None:
        super().__init__(mesh, graph, "built", cap)
        self.recorded = recorded
        self.verify = verify

    def visit(self, node: torch.fx.Node) -> None:
        rec = self.recorded.get(node)
        if rec is None:
            raise RuntimeError(f"floor walk: no recorded answer for {node.name} ({node.target})")
        self.stats.nodes += 1
        self.stats.queries += 1  # answered, from the record
        metas = self.infer_metas(node)
        out_metas = list(metas) if is_multi(metas) else [metas]
        mesh = self.mesh
        specs = []
        for r in rec.specs:
            if len(r.outputs) != len(out_metas):
                raise RuntimeError(
                    f"floor walk: {node.name} ({node.target}) recorded {len(r.outputs)} outputs, "
                    f"shape inference gives {len(out_metas)}"
                )
            if self.verify and tuple(out_metas) != r.output_metas:
                raise RuntimeError(
                    f"floor walk: {node.name} ({node.target}) inferred metas {out_metas} differ "
                    f"from the built answer's {list(r.output_metas)}"
                )
            outputs = tuple(
                None if p is None else DTensorSpec(mesh, p, tensor_meta=m)
                for p, m in zip(r.outputs, out_metas)
            )
            inputs = [DTensorSpec(mesh, p, tensor_meta=m) for p, m in r.inputs]
            specs.append(OpSpec(outputs if rec.multi else outputs[0], inputs, r.costs))
        self.consume(node, OpStrategy(specs), rec.n_candidates)


def record_walk(
    mesh: DeviceMesh, graph: torch.fx.Graph, cap: int
) -> tuple[WalkStats, dict[torch.fx.Node, RecordedNode]]:
    """One built walk that keeps every node's answer (untimed; the floor's input)."""
    recorded: dict[torch.fx.Node, RecordedNode] = {}
    stats = PlannerWalk(mesh, graph, "built", cap, record=recorded).run()
    return stats, recorded


def floor_once(
    mesh: DeviceMesh,
    graph: torch.fx.Graph,
    cap: int,
    recorded: dict[torch.fx.Node, RecordedNode],
    verify: bool = False,
) -> WalkStats:
    """One floor walk over the recorded answers (see :class:`FloorWalk`)."""
    return FloorWalk(mesh, graph, cap, recorded, verify).run()


def walk_once(
    mesh: DeviceMesh, graph: torch.fx.Graph, side: str, cap: int
) -> WalkStats:
    """One complete walk, as measured (the caller clears DTensor's caches first)."""
    return PlannerWalk(mesh, graph, side, cap).run()


def count_costs(
    mesh: DeviceMesh, graph: torch.fx.Graph, side: str, cap: int
) -> dict[str, Any]:
    """One untimed walk that counts every redistribution cost computed.

    ``redistribute_cost`` as the strategy utilities (and stock's repair, through
    ``generate_redistribute_costs``) call it, attributed to the query being
    answered: how many per query, and how many times each distinct (source spec,
    target spec) cost is computed within a query and within the walk.
    """
    from unittest import mock

    from torch.distributed.tensor._ops import utils

    walk = PlannerWalk(mesh, graph, side, cap)
    calls: list[tuple[int, tuple[DTensorSpec, DTensorSpec]]] = []
    real = utils.redistribute_cost

    def counted(src: DTensorSpec, dst: DTensorSpec, *args: Any, **kwargs: Any) -> float:
        calls.append((walk.stats.queries, (src, dst)))
        return real(src, dst, *args, **kwargs)

    with mock.patch.object(utils, "redistribute_cost", counted):
        stats = walk.run()
    in_query, in_walk = len(set(calls)), len({pair for _, pair in calls})
    return {
        "computed": len(calls),
        "per_query": round(len(calls) / max(stats.queries, 1), 2),
        "times_each_per_query": round(len(calls) / max(in_query, 1), 2),
        "times_each_per_walk": round(len(calls) / max(in_walk, 1), 2),
        "what": "redistribute_cost calls in one cold walk (caches cleared first): in all, "
        "per query, and per distinct (source, target) spec pair within a query and "
        "within the walk",
    }


def check_walk(stats: WalkStats, graph: torch.fx.Graph) -> None:
    """Fail loudly unless the walk visited every aten node and produced specs."""
    aten_nodes = sum(
        1 for n in graph.nodes if n.op == "call_function" and isinstance(n.target, OpOverload)
    )
    if stats.nodes != aten_nodes:
        raise RuntimeError(f"planner walk visited {stats.nodes} of {aten_nodes} aten nodes")
    if stats.queries + stats.fallbacks.total() < stats.nodes:
        raise RuntimeError(
            f"planner walk: {stats.queries} queries + {stats.fallbacks.total()} fallbacks "
            f"for {stats.nodes} nodes"
        )
    if stats.specs < stats.nodes:
        raise RuntimeError(f"planner walk produced {stats.specs} specs for {stats.nodes} nodes")
    if not math.isfinite(stats.cost_sum):
        raise RuntimeError(f"planner walk read a non-finite cost sum {stats.cost_sum}")
