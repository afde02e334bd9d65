# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
A downstream planner consuming DTensor's strategies as they come.

The test traces a small model's forward and backward into an aten graph and walks
it in topological order, as an auto-sharding planner does: every tensor carries a
set of candidate placements, each op is asked for its strategies given its inputs'
candidates, and the strategies' output specs become the candidates of the op's
result. The planner asks DTensor through its one entry point,
``ShardingPropagator.get_op_strategy``, and expands its own single-dim rules (for
an op DTensor cannot answer) with ``expand_to_full_mesh_op_strategy``, passing no
output metas. Nothing is post-processed: every strategy must satisfy the contract C1-C5
as returned, its output metas must be the traced ones, and its redistribute costs,
indexed by the producers' candidates, must let the planner pick a complete plan.
"""

import math
import operator
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops.strategy_contract import (
    infer_output_metas,
    OutputMetas,
)
from torch.distributed.tensor._ops.utils import (
    expand_to_full_mesh_op_strategy,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    meta_of,
    op_strategy,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    answered_by,
    strategy_registry,
)
from torch.utils import _pytree as pytree


aten = torch.ops.aten

# Candidate placements carried per tensor, at most; keeps queries small.
CANDIDATE_CAP = 12



@torch.library.custom_op("strategy_contract_planner_test::halve", mutates_args=())
def halve(x: torch.Tensor) -> torch.Tensor:
    """A user-defined pointwise op: no DTensor registry knows it."""
    return x * 0.5


@halve.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


# Ops of the traced graphs that DTensor cannot answer (a user-defined op: no
# registered strategy and no decomposition, so get_op_strategy raises
# NotImplementedError). The planner brings its own single-dim rules for them and
# expands them with expand_to_full_mesh_op_strategy, as a downstream rule author
# does: what comes back must satisfy the contract as well.
PLANNER_RULES: dict[OpOverload, str] = {
    torch.ops.strategy_contract_planner_test.halve.default: "pointwise",
}


def cap_candidates(
    candidates: Sequence[tuple[Placement, ...]],
    cap: int = CANDIDATE_CAP,
    keep: tuple[Placement, ...] | None = None,
) -> list[tuple[Placement, ...]]:
    """At most ``cap`` candidates, evenly spread over ``candidates`` in order.

    The first candidate is always kept, and so is ``keep`` (the placement the
    plan chose), so that consumers can find it.
    """
    unique: list[tuple[Placement, ...]] = []
    for c in candidates:
        if c not in unique:
            unique.append(c)
    if len(unique) > cap:
        unique = [unique[i * len(unique) // cap] for i in range(cap)]
    if keep is not None and keep not in unique:
        unique[-1] = keep
    return unique


def traced_metas(val: object) -> OutputMetas:
    """Output metas of a traced node, shaped like ``infer_output_metas``'s."""
    if isinstance(val, torch.Tensor):
        return meta_of(val)
    if isinstance(val, (list, tuple)):
        return type(val)(traced_metas(v) for v in val)
    return None


def is_meta(x: object) -> bool:
    return isinstance(x, TensorMeta)


def pointwise_rules(schema: OpSchema) -> list[list[Placement | None]]:
    """The planner's own single-dim rules for a pointwise op of same-shaped inputs."""
    n_inputs = sum(isinstance(a, OpStrategy) for a in schema.args_schema)
    ndim = len(schema.args_schema[0].shape)
    rules: list[list[Placement | None]] = [[Shard(d)] * (1 + n_inputs) for d in range(ndim)]
    rules.append([Replicate()] * (1 + n_inputs))
    return rules


@dataclass
class Produced:
    """What a node hands its consumers: per output, candidates and the plan's pick."""

    # One candidate list per output (a single entry for a one-tensor result).
    candidates: list[list[tuple[Placement, ...]]]
    chosen: list[tuple[Placement, ...] | None]


@dataclass
class WalkReport:
    registries: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    plan_cost: float = 0.0
    queried_nodes: int = 0


class PlannerWalk:
    """Walks an aten graph as a planner would; see the module docstring."""

    def __init__(
        self, test: StrategyContractTestBase, mesh: DeviceMesh, graph: torch.fx.Graph
    ) -> None:
        self.test = test
        self.mesh = mesh
        self.graph = graph
        self.propagator = DTensor._op_dispatcher.sharding_propagator
        self.produced: dict[torch.fx.Node, Produced] = {}
        self.report = WalkReport()
        self.replicate = (Replicate(),) * mesh.ndim

    # ---- inputs of a query ----

    def input_strategy(self, node: torch.fx.Node) -> OpStrategy:
        produced = self.produced[node]
        meta = meta_of(node.meta["val"])
        return op_strategy(self.mesh, meta, *produced.candidates[0])

    def to_schema_arg(self, arg: object) -> object:
        if isinstance(arg, torch.fx.Node):
            return self.input_strategy(arg)
        if isinstance(arg, (list, tuple)) and any(isinstance(a, torch.fx.Node) for a in arg):
            converted = [self.to_schema_arg(a) for a in arg]
            if all(isinstance(a, torch.fx.Node) for a in arg):
                # A tensor list, as DTensor wraps one.
                return TupleStrategy(tuple(converted) if isinstance(arg, tuple) else converted)
            return converted
        return arg

    def schema_for(self, node: torch.fx.Node) -> OpSchema:
        op = node.target
        info = self.propagator.op_to_schema_info.get(
            op
        ) or self.propagator.op_to_schema_info_for_single_dim_strategy.get(op)
        return OpSchema(
            op,
            tuple(self.to_schema_arg(a) for a in node.args),
            {k: self.to_schema_arg(v) for k, v in node.kwargs.items()},
            schema_info=info,
        )

    def tensor_input_nodes(self, node: torch.fx.Node) -> list[torch.fx.Node]:
        leaves = pytree.tree_leaves((list(node.args), list(node.kwargs.values())))
        return [leaf for leaf in leaves if isinstance(leaf, torch.fx.Node)]

    # ---- the walk ----

    def run(self) -> WalkReport:
        for node in self.graph.nodes:
            if node.op == "placeholder":
                meta = meta_of(node.meta["val"])
                candidates = cap_candidates(planner_candidates(self.mesh, meta))
                self.produced[node] = Produced([candidates], [candidates[0]])
            elif node.op == "output":
                continue
            elif node.op == "call_function" and node.target is operator.getitem:
                source, index = node.args
                produced = self.produced[source]
                self.produced[node] = Produced(
                    [produced.candidates[index]], [produced.chosen[index]]
                )
            elif node.op == "call_function" and isinstance(node.target, OpOverload):
                try:
                    self.visit_op(node)
                except Exception as e:  # a crash is as much a failure as a violation
                    self.report.failures.append(
                        f"{node.name} ({node.target}): {type(e).__name__}: {e}"
                    )
                    self.replicated_result(node)
            else:
                self.report.failures.append(
                    f"{node.name}: unexpected node {node.op} {node.target}"
                )
        return self.report

    def replicated_result(self, node: torch.fx.Node) -> None:
        """Hand consumers a replicated result (unsupported op, or a failed node)."""
        metas = traced_metas(node.meta["val"])
        if is_meta(metas) or metas is None:
            self.produced[node] = Produced([[self.replicate]], [self.replicate])
        else:
            n = len(metas)
            self.produced[node] = Produced([[self.replicate]] * n, [self.replicate] * n)

    def chosen_index(self, producer: torch.fx.Node) -> int:
        produced = self.produced[producer]
        return produced.candidates[0].index(produced.chosen[0])

    def visit_op(self, node: torch.fx.Node) -> None:
        op = node.target
        schema = self.schema_for(node)
        if op in PLANNER_RULES:
            with self.test.assertRaisesRegex(NotImplementedError, str(op)):
                self.propagator.get_op_strategy(schema)
            registry = "planner rules"
            strategy = expand_to_full_mesh_op_strategy(
                self.mesh, schema, pointwise_rules(schema), input_index=1
            )
        else:
            # The one entry point: whichever registry holds the op answers.
            registry = strategy_registry(op)
            strategy = self.propagator.get_op_strategy(schema)
        self.report.registries[registry] += 1
        self.report.queried_nodes += 1
        self.test.assertIsInstance(
            strategy, OpStrategy, "this walk handles ops with tensor (tuple) results"
        )
        expected = traced_metas(node.meta["val"])
        # C1-C5 against the traced metas: outputs carry what tracing recorded.
        self.test.assert_contract(schema, strategy, expected)
        # The contract's own reference agrees with the trace.
        self.test.assertEqual(infer_output_metas(schema), expected)
        self.plan(node, strategy, expected)

    def plan(self, node: torch.fx.Node, strategy: OpStrategy, metas: OutputMetas) -> None:
        """Pick the cheapest OpSpec given the producers' picks; carry candidates on."""
        producers = self.tensor_input_nodes(node)
        picks = [self.chosen_index(p) for p in producers]
        best: tuple[float, int] | None = None
        for index, spec in enumerate(strategy.strategies):
            rows = spec.redistribute_cost
            cost = sum(float(row[pick]) for row, pick in zip(rows, picks))
            if math.isfinite(cost) and (best is None or cost < best[0]):
                best = (cost, index)
        self.test.assertIsNotNone(
            best, "no OpSpec is reachable at finite cost from the producers' picks"
        )
        cost, index = best
        self.report.plan_cost += cost

        def outputs(spec: OpSpec) -> list[DTensorSpec | None]:
            out = spec.output_specs
            return [out] if isinstance(out, DTensorSpec) else list(out)

        n_outputs = 1 if is_meta(metas) else len(metas)
        chosen = outputs(strategy.strategies[index])
        candidates: list[list[tuple[Placement, ...]]] = []
        picked: list[tuple[Placement, ...] | None] = []
        for pos in range(n_outputs):
            if chosen[pos] is None:
                candidates.append([])
                picked.append(None)
                continue
            # Candidates of this output: placements of the OpSpecs any producer
            # candidate reaches at finite cost.
            reachable = [
                outputs(spec)[pos].placements
                for spec in strategy.strategies
                if all(
                    any(math.isfinite(float(c)) for c in row) for row in spec.redistribute_cost
                )
            ]
            candidates.append(cap_candidates(reachable, keep=chosen[pos].placements))
            picked.append(chosen[pos].placements)
        self.produced[node] = Produced(candidates, picked)


# ---- models ----


def mlp_loss_and_grads(
    activation: Callable[[torch.Tensor], torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[..., tuple[torch.Tensor, ...]]:
    """Linear -> LayerNorm -> activation -> Linear -> loss, and the parameters' grads."""

    def step(
        x: torch.Tensor,
        target: torch.Tensor,
        w1: torch.Tensor,
        b1: torch.Tensor,
        ln_w: torch.Tensor,
        ln_b: torch.Tensor,
        w2: torch.Tensor,
        b2: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        h = F.linear(x, w1, b1)
        h = F.layer_norm(h, (h.shape[-1],), ln_w, ln_b)
        h = activation(h)
        out = F.linear(h, w2, b2)
        if target.is_floating_point():
            target = halve(target)  # an op only the planner's own rules answer
        loss = loss_fn(out, target)
        params = (w1, b1, ln_w, ln_b, w2, b2)
        return (loss, *torch.autograd.grad(loss, params))

    return step


# name -> (activation, loss, target factory); batch 8, 8 features, hidden 16, 4 outputs.
MODELS: dict[str, tuple[Callable, Callable, Callable[[], torch.Tensor]]] = {
    "relu_cross_entropy": (
        F.relu,
        F.cross_entropy,
        lambda: torch.randint(0, 4, (8,)),
    ),
    # hardswish and mse_loss (forward and backward) only have decomposition-derived
    # strategies; hardswish_backward's decomposition creates a scalar tensor.
    "hardswish_mse": (F.hardswish, F.mse_loss, lambda: torch.randn(8, 4)),
}


def trace_model(name: str) -> torch.fx.GraphModule:
    activation, loss_fn, make_target = MODELS[name]
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    params = [
        torch.randn(16, 8),
        torch.randn(16),
        torch.ones(16),
        torch.zeros(16),
        torch.randn(4, 16),
        torch.randn(4),
    ]
    params = [p.requires_grad_() for p in params]
    return make_fx(mlp_loss_and_grads(activation, loss_fn), tracing_mode="fake")(
        x, make_target(), *params
    )


class TestPlannerConsumesStrategies(StrategyContractTestBase):
    def test_cap_candidates(self) -> None:
        R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()
        pool = [(a, b) for a in (R, S0, S1, P) for b in (R, S0, S1, P)]
        capped = cap_candidates(pool, cap=5)
        self.assertEqual(capped, [pool[0], pool[3], pool[6], pool[9], pool[12]])
        self.assertEqual(cap_candidates(pool, cap=5), capped)
        self.assertEqual(cap_candidates(pool, cap=5, keep=(P, P))[-1], (P, P))
        self.assertEqual(cap_candidates([(R, R), (R, R), (S0, R)]), [(R, R), (S0, R)])

    @parametrize("mesh_shape", [(2, 2), (2, 4)], name_fn=lambda s: "x".join(map(str, s)))
    @parametrize("model", list(MODELS))
    def test_planner_walk(self, model: str, mesh_shape: tuple[int, int]) -> None:
        gm = trace_model(model)
        report = PlannerWalk(self, self.mesh(mesh_shape), gm.graph).run()
        if report.failures:
            self.fail(
                f"{len(report.failures)} node(s) failed:\n" + "\n".join(report.failures)
            )
        ops = [n for n in gm.graph.nodes if isinstance(n.target, OpOverload)]
        self.assertEqual(report.queried_nodes, len(ops))
        self.assertTrue(math.isfinite(report.plan_cost))
        # The graphs keep exercising every registry a planner goes through.
        self.assertGreater(report.registries["single_dim"], 0)
        self.assertGreater(report.registries["op_strategy"], 0)
        if model == "hardswish_mse":
            self.assertGreaterEqual(report.registries["decomposition"], 4)
            self.assertEqual(report.registries["planner rules"], 1)

    def test_walk_detects_a_broken_strategy(self) -> None:
        """The walk fails a node whose strategy breaks the contract (C1 here)."""
        gm = trace_model("relu_cross_entropy")
        propagator = DTensor._op_dispatcher.sharding_propagator
        # The first op of the graph with one tensor result and a registered strategy.
        single_output = [
            n.target for n in gm.graph.nodes
            if isinstance(n.target, OpOverload) and [str(r.type) for r in n.target._schema.returns] == ["Tensor"]
        ]
        op = answered_by("op_strategy", list(dict.fromkeys(single_output)))
        func = propagator.op_strategy_funcs[op]

        def wrong_meta(schema: OpSchema, *args: Any) -> StrategyType:
            strategy = func(schema, *args)
            for spec in strategy.strategies:
                meta = spec.output_specs.tensor_meta
                spec.output_specs = spec.output_specs.shallow_copy_with_tensor_meta(
                    TensorMeta(meta.shape, meta.stride, torch.float64)
                )
            return strategy

        from unittest import mock

        with mock.patch.dict(propagator.op_strategy_funcs, {op: wrong_meta}):
            report = PlannerWalk(self, self.mesh((2, 2)), gm.graph).run()
        op_nodes = [n.name for n in gm.graph.nodes if n.target is op]
        self.assertEqual(
            [f.split(" ")[0] for f in report.failures], op_nodes, "\n".join(report.failures)
        )
        self.assertIn("C1", report.failures[0])


instantiate_parametrized_tests(TestPlannerConsumesStrategies)


if __name__ == "__main__":
    run_tests()
