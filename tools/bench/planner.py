"""The planner benchmark: enumerate strategies for every node of a traced graph.

An auto-sharding planner walks an aten graph in topological order. Each tensor
carries candidate placements; each op is asked for every way it can run given
its inputs' candidates, and the output placements of the answer become the
candidates of its result. What differs between the sides is how the answer is
obtained:

* ``built``: ``ShardingPropagator.get_op_strategy`` (the change's planner entry
  point) and the specs as returned (the change guarantees complete specs);
* ``stock``: stock's registries, plus the repair pass planners run today
  (:class:`StockRepair`): shape inference of the op on fake tensors, output and
  input metas filled in, ``None`` where the op returns ``None``, missing input
  specs and redistribute costs filled, and single-dim rules expanded over the
  full candidate lists (stock's own expansion raises with several candidates).

Nodes no registry answers get an all-Replicate strategy, on either side, and
are counted as fallbacks.
"""

from __future__ import annotations

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
from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
    generate_redistribute_costs,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils import _pytree as pytree

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from types import ModuleType
    from collections.abc import Callable, Sequence


Placements = tuple[Placement, ...]
# Output metas of a node: a TensorMeta, None, or a list/tuple of those.
Metas = Any


def meta_of(t: torch.Tensor) -> TensorMeta:
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


def is_multi(metas: Metas) -> bool:
    """Whether ``metas`` is one entry per result (a TensorMeta is a NamedTuple too)."""
    return isinstance(metas, (list, tuple)) and not isinstance(metas, TensorMeta)


def output_list(specs: object) -> list[DTensorSpec | None]:
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
    cost_sum: float = 0.0  # finite redistribute costs read (proves they were consumed)

    def as_dict(self) -> dict[str, Any]:
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
        }


class PlannerWalk:
    """One walk over ``graph``; ``side`` picks how strategies are obtained."""

    def __init__(
        self,
        mesh: DeviceMesh,
        graph: torch.fx.Graph,
        side: str,
        sweep: ModuleType,
        cap: int,
    ) -> None:
        if side not in ("stock", "built"):
            raise ValueError(f"side must be 'stock' or 'built', got {side!r}")
        self.mesh = mesh
        self.graph = graph
        self.side = side
        self.sweep = sweep
        self.cap = cap
        self.propagator = DTensor._op_dispatcher.sharding_propagator
        # Fresh per walk: a planner's own caches are part of its cold cost.
        self.candidate_func = sweep.capped_candidates(cap)
        self.fake_mode = FakeTensorMode()
        self.replicate: Placements = (Replicate(),) * mesh.ndim
        self.candidates: dict[torch.fx.Node, list[list[Placements]]] = {}
        self.input_strategies: dict[torch.fx.Node, OpStrategy] = {}
        self.fakes: dict[torch.fx.Node, object] = {}
        self.stats = WalkStats()
        self.repair = StockRepair(self) if side == "stock" else None

    # ---- inputs ----

    def node_meta(self, node: torch.fx.Node) -> Metas:
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
        for node in self.graph.nodes:
            if node.op == "placeholder":
                meta = self.node_meta(node)
                self.candidates[node] = [list(self.candidate_func(self.mesh, meta))]
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

    def visit(self, node: torch.fx.Node) -> None:
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
                if self.repair is None:
                    # the change's one planner entry point, specs used as returned
                    strategy = self.propagator.get_op_strategy(schema)
                else:
                    metas = self.infer_metas(node)
                    strategy = self.repair.query(schema, registry, inputs, metas)
            except Exception as e:  # the planner falls back, and we count it
                reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
            else:
                if strategy is None:
                    reason = f"{registry} returned None"
        if strategy is None:
            if metas is None:
                metas = self.infer_metas(node)
            strategy = self.all_replicate(inputs, metas)
            self.stats.fallbacks[str(op)] += 1
            self.stats.fallback_reasons.setdefault(str(op), reason)
        if not isinstance(strategy, OpStrategy):
            raise TypeError(
                f"{node.name} ({op}): expected an OpStrategy, got {type(strategy).__name__}"
            )
        self.consume(node, strategy, inputs)

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

    def consume(self, node: torch.fx.Node, strategy: OpStrategy, inputs: list[OpStrategy]) -> None:
        """Read the specs as a planner's cost model does; derive the result's candidates.

        Raises if a spec is not consumable as returned (the built side promises
        it; the stock side's repair must have made it so).
        """
        n_outputs = len(output_list(strategy.strategies[0].output_specs))
        per_output: list[list[Placements]] = [[] for _ in range(n_outputs)]
        for index, spec in enumerate(strategy.strategies):
            rows = spec.redistribute_cost
            if spec.input_specs is None or len(spec.input_specs) != len(inputs):
                raise RuntimeError(
                    f"{node.name} ({node.target}) spec {index}: input_specs "
                    f"{None if spec.input_specs is None else len(spec.input_specs)} for {len(inputs)} inputs"
                )
            if rows is None or len(rows) != len(inputs) or any(
                len(row) != len(i.strategies) for row, i in zip(rows, inputs)
            ):
                raise RuntimeError(
                    f"{node.name} ({node.target}) spec {index}: redistribute_cost does not "
                    f"match the inputs' candidates"
                )
            reachable = True
            for row in rows:
                finite = [float(c) for c in row if math.isfinite(float(c))]
                if not finite:
                    reachable = False
                    break
                self.stats.cost_sum += min(finite)
            if not reachable:
                continue
            for pos, out in enumerate(output_list(spec.output_specs)):
                if out is not None:
                    if out.tensor_meta is None:
                        raise RuntimeError(
                            f"{node.name} ({node.target}) spec {index}: output {pos} has no tensor_meta"
                        )
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
        op = schema.op
        info = self.propagator.op_single_dim_strategy_funcs[op]
        func: Callable[..., list[list[Any]]] = getattr(info, "func", info)
        rules = func(op, schema.args_meta, schema.kwargs_meta)
        out_metas = list(metas) if is_multi(metas) else [metas]
        n_outputs = len(rules[0]) - len(inputs) if rules else len(out_metas)
        resolved = [
            [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in rule]
            for rule in rules
        ]
        if not any(all(p is None or isinstance(p, Replicate) for p in r) for r in resolved):
            replicate_rule: list[Placement | None] = [
                None if i < len(out_metas) and out_metas[i] is None else Replicate()
                for i in range(n_outputs)
            ]
            resolved.insert(0, replicate_rule + [Replicate()] * len(inputs))
            self.walk.stats.repairs["replicate_rule_added"] += 1
        self.walk.stats.repairs["single_dim_expanded"] += 1
        base = op._schema.name.split("::")[-1]
        return expand_to_full_mesh_op_strategy(
            self.mesh,
            schema,
            resolved,  # type: ignore[arg-type]
            input_index=n_outputs,
            inplace_op=base.endswith("_"),
            allow_uneven_sharding=getattr(info, "allow_uneven_sharding", False),
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


def walk_once(
    mesh: DeviceMesh, graph: torch.fx.Graph, side: str, sweep: ModuleType, cap: int
) -> WalkStats:
    """One complete walk, as measured (the caller clears DTensor's caches first)."""
    return PlannerWalk(mesh, graph, side, sweep, cap).run()


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
