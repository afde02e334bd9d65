# Owner: tools/bench. Run: python -m pytest tools/test/test_bench.py
"""Tests of ``make bench`` (tools/bench).

The pure parts (formatting, the per-repeat pairing of ratios, the floor ratio,
candidate choice, the consume step's strictness) are tested on small inputs
made here; the planner walks on a four-op graph under whichever torch runs the
tests (the built side only where the change is installed); one end-to-end run
of ``python -m tools.bench --quick`` on the eager warm benchmark, with the
running interpreter as both sides, checks the orchestration, pyperf's worker
mode and the report (about 15 s). The real stock-vs-built numbers come from
``make bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
import unittest
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pyperf
import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    OutputSharding,
    TupleStrategy,
)
from torch.distributed.tensor._ops import utils as dtensor_utils
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.fx.experimental.proxy_tensor import make_fx

from tools.bench import common, planner
from tools.bench.__main__ import (
    floor_summary,
    fmt_s,
    main as bench_main,
    parse_benches,
    SideResult,
    summarize,
    table,
)
from tools.bench.worker import BENCHES, Benchmark, PLANNER_BENCHES, Stopwatch


RR = (Replicate(), Replicate())
S0R = (Shard(0), Replicate())


def pyperf_bench(values: list[float]) -> pyperf.Benchmark:
    """A one-run pyperf Benchmark holding ``values``."""
    run = pyperf.Run(values, metadata={"name": "b", "loops": 1}, collect_metadata=False)
    return pyperf.Benchmark([run])


def side(medians: list[float], **info: Any) -> SideResult:
    """A side whose repeats have these medians, with the info fields summarize reads."""
    infos = [
        {"values_by_clock": {"cpu": [m], "wall": [2 * m]}, "plan": {"loops": 1},
         "torch": "2.14.1", "has_change": False, "max_rss_mib": 1.0, **info}
        for m in medians
    ]
    return SideResult([pyperf_bench([m]) for m in medians], infos)


def strings(doc: object) -> list[str]:
    """Every string value anywhere in a JSON document."""
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for v in doc.values() for s in strings(v)]
    if isinstance(doc, list):
        return [s for v in doc for s in strings(v)]
    return []


class TestReport(unittest.TestCase):
    def test_ratio_pairs_each_repeats_workers(self) -> None:
        stock, built = side([2.0, 4.0, 3.0]), side([1.0, 1.0, 3.0])
        entry = summarize("planner_enumeration_bare", {"stock": stock, "built": built}, 3,
                          "python -m tools.bench", "cpu")
        # per repeat 0.5, 0.25, 1.0: median 0.5 (the ratio of the medians would be 1/3)
        self.assertEqual(entry["ratio"], 0.5)
        self.assertEqual(entry["spread"]["ratio_per_repeat"], {"min": 0.25, "max": 1.0})
        self.assertEqual((entry["stock_s"], entry["built_s"]), (3.0, 1.0))
        self.assertEqual(entry["target"], 1.0)
        self.assertTrue(entry["pass"])
        self.assertEqual(entry["ratio_by_clock"], {"cpu": 0.5, "wall": 0.5})
        self.assertEqual(set(entry["walk"]), {"stock", "built"})

    def test_a_missed_target_fails_and_the_table_says_so(self) -> None:
        entry = summarize("eager_dispatch_cold", {"stock": side([1.0]), "built": side([1.1])}, 1,
                          "python -m tools.bench", "cpu")
        self.assertFalse(entry["pass"])
        self.assertNotIn("walk", entry)
        text = table([entry])
        self.assertRegex(text, r"eager_dispatch_cold .*1\.100 .*<= 1\.00 +FAIL")
        self.assertIn("wall 1.100", text)

    def test_report_holds_no_paths_or_timestamps(self) -> None:
        entry = summarize("planner_enumeration", {"stock": side([2.0]), "built": side([1.0])}, 1,
                          "python -m tools.bench --repeats 1", "cpu")
        for text in strings(json.loads(json.dumps(entry))):
            self.assertFalse(text.startswith("/") or str(REPO_ROOT) in text, text)
        self.assertFalse({"date", "time", "timestamp", "started"} & set(entry))

    def test_floor_ratio_pairs_each_built_worker_with_its_floor(self) -> None:
        built = SideResult([pyperf_bench([2.0]), pyperf_bench([3.0]), pyperf_bench([8.0])],
                           [{"floor_s": 1.0}, {"floor_s": 1.0}, {"floor_s": 2.0}])
        got = floor_summary(built)
        self.assertEqual(got["built_over_floor"], 3.0)
        self.assertEqual(got["built_over_floor_per_repeat"], {"min": 2.0, "max": 4.0})
        self.assertEqual(got["floor_s"], 1.0)
        # a worker without a floor (a stock torch) means no floor ratio at all
        self.assertEqual(floor_summary(SideResult([pyperf_bench([2.0])], [{}])), {})

    def test_formatting_and_names(self) -> None:
        self.assertEqual([fmt_s(2.5), fmt_s(0.0123), fmt_s(4.2e-5)], ["2.500 s", "12.30 ms", "42.0 us"])
        self.assertEqual(parse_benches(None), list(BENCHES))
        self.assertEqual(parse_benches(" eager_dispatch_cold ,"), ["eager_dispatch_cold"])
        with self.assertRaisesRegex(SystemExit, "unknown benchmark.*nope"):
            bench_main(["--bench", "nope"])

    def test_targets(self) -> None:
        self.assertEqual({n: b.target for n, b in BENCHES.items()}, {
            "eager_dispatch_warm": 1.02, "eager_dispatch_cold": 1.0,
            "planner_enumeration": 0.5, "planner_enumeration_bare": 1.0})
        self.assertEqual(set(PLANNER_BENCHES) & set(BENCHES), set(PLANNER_BENCHES))

    def test_a_value_keeps_both_clocks_and_returns_the_chosen_one(self) -> None:
        bench = Benchmark()
        watch = Stopwatch()
        with watch:
            deadline = time.thread_time() + 0.05  # this thread's: at most wall time
            while time.thread_time() < deadline:
                pass
        with watch:
            time.sleep(0.05)  # waiting: wall time, no CPU time
        self.assertGreaterEqual(watch.seconds["wall"], 0.1)
        self.assertLess(watch.seconds["cpu"], watch.seconds["wall"] - 0.03)
        self.assertEqual(bench.timed(watch), watch.seconds["cpu"])
        bench.clock = "wall"
        self.assertEqual(bench.timed(watch), watch.seconds["wall"])
        self.assertEqual(bench.clock_values, [watch.seconds, watch.seconds])


def small_step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mm, a pointwise op, a multi-output reduction and a sum: every walk path, tiny."""
    y = torch.mm(x, w) + 1
    values, _ = torch.max(y, dim=1)
    return y.sum(), values


def small_graph() -> torch.fx.Graph:
    return make_fx(small_step, tracing_mode="fake")(torch.randn(8, 16), torch.randn(16, 8)).graph


class TestCandidates(unittest.TestCase):
    def setUp(self) -> None:
        self.mesh = common.cpu_mesh((2, 4))

    def test_spread_cap_keeps_the_first_and_spreads_the_rest(self) -> None:
        items = [(Shard(i),) for i in range(8)]
        self.assertEqual(planner.spread_cap(items + items[:2], 4), [items[0], items[2], items[4], items[6]])
        self.assertEqual(planner.spread_cap(items[:3], 4), items[:3])

    def test_input_candidates(self) -> None:
        meta = TensorMeta(torch.Size([2, 16, 64]), (1024, 64, 1), torch.float32)
        got = planner.input_candidates(self.mesh, meta, 8)
        self.assertEqual(got[0], RR)
        self.assertEqual(len(got), 8)
        self.assertEqual(len(set(got)), 8)
        # dim 0 has 2 elements: never cut into 8 pieces, nor sharded on the 4-way mesh dim
        self.assertNotIn((Shard(0), Shard(0)), got)
        self.assertTrue(all(c[1] != Shard(0) for c in got))
        short = TensorMeta(torch.Size([3]), (1,), torch.float32)
        self.assertEqual(planner.input_candidates(self.mesh, short, 8), [RR, S0R])
        self.assertEqual(planner.input_candidates(self.mesh, meta, 1), [RR])

    def test_result_shapes(self) -> None:
        meta = TensorMeta(torch.Size([2]), (1,), torch.float32)
        self.assertFalse(planner.is_multi(meta))
        self.assertTrue(planner.is_multi((meta, None)))
        spec = DTensorSpec(self.mesh, RR)
        self.assertEqual(planner.output_list(spec), [spec])
        self.assertEqual(planner.output_list((spec, None)), [spec, None])


class TestPlannerWalks(unittest.TestCase):
    """The walks and the floor on a 4-node graph (seconds)."""

    def setUp(self) -> None:
        self.mesh = common.cpu_mesh((2, 4))
        self.graph = small_graph()
        self.node = next(n for n in self.graph.nodes if n.target is torch.ops.aten.add.Tensor)

    def incomplete_strategy(self) -> OpStrategy:
        """Three specs: no input specs and no costs; an output without meta; complete."""
        meta = planner.metas_of(self.node.meta["val"])
        return OpStrategy([
            OpSpec(DTensorSpec(self.mesh, RR, tensor_meta=meta)),
            OpSpec(DTensorSpec(self.mesh, S0R), [DTensorSpec(self.mesh, S0R, tensor_meta=meta)],
                   [[0.0, 1.0]]),
            OpSpec(DTensorSpec(self.mesh, RR, tensor_meta=meta),
                   [DTensorSpec(self.mesh, RR, tensor_meta=meta)], [[0.0, 2.0]]),
        ])

    def test_bare_consume_counts_what_is_missing(self) -> None:
        walk = planner.PlannerWalk(self.mesh, self.graph, "bare", 4)
        walk.consume(self.node, self.incomplete_strategy(), [2])
        self.assertEqual(
            dict(walk.stats.missing),
            {"specs_without_input_specs": 1, "specs_without_costs": 1, "outputs_without_meta": 1},
        )
        # every spec offers its placements, the meta-less one too
        self.assertEqual(walk.candidates[self.node], [[RR, S0R]])
        self.assertEqual(walk.stats.specs, 3)

    def test_strict_consume_raises_on_the_same_specs(self) -> None:
        for name in ("stock", "built"):
            walk = planner.PlannerWalk(self.mesh, self.graph, name, 4)
            with self.assertRaisesRegex(RuntimeError, "spec 0: input_specs None for 1 inputs"):
                walk.consume(self.node, self.incomplete_strategy(), [2])
        with self.assertRaisesRegex(ValueError, "side must be one of stock, bare, built"):
            planner.PlannerWalk(self.mesh, self.graph, "repaired", 4)

    def test_bare_rejects_unusable_answers(self) -> None:
        walk = planner.PlannerWalk(self.mesh, self.graph, "bare", 4)
        bare = walk.bare
        if bare is None:
            self.fail("a bare walk has no BareQuery")
        max_node = next(n for n in self.graph.nodes if n.target is torch.ops.aten.max.dim)
        one_spec = OpStrategy([OpSpec(DTensorSpec(self.mesh, RR))])
        self.assertEqual(bare.unusable(max_node, one_spec), "1 output spec(s) for 2 result(s)")
        self.assertEqual(bare.unusable(self.node, one_spec), "")
        self.assertEqual(bare.unusable(self.node, OpStrategy([])), "an OpStrategy without specs")
        self.assertEqual(bare.unusable(self.node, TupleStrategy([one_spec])), "a TupleStrategy answer")

    def test_bare_and_repaired_walks_visit_every_node(self) -> None:
        bare = planner.walk_once(self.mesh, self.graph, "bare", 4)
        planner.check_walk(bare, self.graph)
        self.assertEqual(bare.expanded["single_dim_expanded"], bare.registries["single_dim"])
        self.assertEqual(dict(bare.repairs), {})
        repaired = planner.walk_once(self.mesh, self.graph, "stock", 4)
        planner.check_walk(repaired, self.graph)
        self.assertEqual(repaired.repairs["single_dim_expanded"], repaired.registries["single_dim"])
        self.assertEqual(dict(repaired.missing), {})

    def test_walk_check_fails_loudly(self) -> None:
        """A walk that skipped a node is an error, not a fast benchmark."""
        gm = make_fx(lambda x: (x + 1).sum())(torch.randn(4))
        stats = planner.WalkStats(nodes=1, queries=1, specs=1)
        with self.assertRaisesRegex(RuntimeError, "visited 1 of 2 aten nodes"):
            planner.check_walk(stats, gm.graph)

    @unittest.skipUnless(common.has_contract_change(), "the registries answer complete specs with the change only")
    def test_built_walk_uses_the_registries_answers_as_returned(self) -> None:
        stats = planner.walk_once(self.mesh, self.graph, "built", 4)
        planner.check_walk(stats, self.graph)  # the strict consume raised on no spec
        self.assertEqual(stats.fallbacks.total(), 0)
        self.assertEqual((dict(stats.repairs), dict(stats.missing)), ({}, {}))

    @unittest.skipUnless(common.has_contract_change(), "the floor is recorded from the built walk")
    def test_floor_builds_the_built_walks_specs(self) -> None:
        stats, recorded = planner.record_walk(self.mesh, self.graph, 4)
        floor = planner.floor_once(self.mesh, self.graph, 4, recorded, verify=True)
        planner.check_walk(floor, self.graph)
        self.assertEqual((floor.nodes, floor.specs), (stats.nodes, stats.specs))
        self.assertEqual(sum(len(r.specs) for r in recorded.values()), stats.specs)
        recorded.pop(self.node)
        with self.assertRaisesRegex(RuntimeError, "no recorded answer for add"):
            planner.floor_once(self.mesh, self.graph, 4, recorded)


class TestCommon(unittest.TestCase):
    def test_clearing_makes_the_next_call_cold(self) -> None:
        mesh = common.cpu_mesh((2, 4))
        x = distribute_tensor(torch.randn(8, 8), mesh, S0R)
        propagator = DTensor._op_dispatcher.sharding_propagator
        calls: list[OpSchema] = []
        real = propagator.propagate_op_sharding_non_cached

        def counting(op_schema: OpSchema) -> OutputSharding:
            calls.append(op_schema)
            return real(op_schema)

        common.clear_dtensor_caches()
        propagator.propagate_op_sharding_non_cached = counting  # type: ignore[method-assign]
        try:
            for _ in range(2):
                _ = x + x
            self.assertEqual(len(calls), 1)  # the second call hit a propagation cache
            cleared = common.clear_dtensor_caches()
            self.assertEqual(cleared, ["sharding_prop", "tensor_meta"])
            self.assertEqual(dtensor_utils._cost_row.cache_info().currsize, 0)
            _ = x + x
            self.assertEqual(len(calls), 2)
        finally:
            del propagator.propagate_op_sharding_non_cached
        meta = TensorMeta(torch.Size([8, 8]), (8, 1), torch.float32)
        spec = DTensorSpec(mesh, S0R, tensor_meta=meta)
        propagator._propagate_tensor_meta(OpSchema(torch.ops.aten.mul.Tensor, (spec, spec), {}))
        cached = ShardingPropagator._propagate_tensor_meta_cached
        self.assertGreater(cached.cache_info().currsize, 0)
        common.clear_dtensor_caches()
        self.assertEqual(cached.cache_info().currsize, 0)

    def test_mesh_world_size(self) -> None:
        self.assertEqual(common.mesh_world_size((2, 4)), 8)
        with self.assertRaisesRegex(ValueError, "positive dims"):
            common.mesh_world_size((2, 0))


class TestEndToEnd(unittest.TestCase):
    def test_quick_run_writes_report(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "bench.json"
            proc = subprocess.run(
                [
                    sys.executable, "-m", "tools.bench", "--quick",
                    "--bench", "eager_dispatch_warm", "--repeats", "1",
                    "--stock-python", sys.executable, "--built-python", sys.executable,
                    "--out", str(out), "--work-dir", str(Path(tmp) / "work"),
                ],
                cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            entries = json.loads(out.read_text())
            suites = sorted(p.name for p in (Path(tmp) / "work").glob("*.pyperf.json"))
        self.assertEqual([e["name"] for e in entries], ["eager_dispatch_warm"])
        entry = entries[0]
        self.assertEqual((entry["target"], entry["repeats"], entry["clock"]), (1.02, 1, "cpu"))
        self.assertGreater(entry["stock_s"], 0.0)
        self.assertAlmostEqual(entry["ratio"], entry["built_s"] / entry["stock_s"])
        self.assertEqual(entry["pass"], entry["ratio"] <= entry["target"])
        self.assertAlmostEqual(entry["ratio_by_clock"]["cpu"], entry["ratio"])
        self.assertEqual(suites, ["built.pyperf.json", "stock.pyperf.json"])
        self.assertRegex(proc.stdout, r"eager_dispatch_warm .*(PASS|FAIL)")
        self.assertRegex(proc.stdout, r"wall \d+\.\d{3}")
        self.assertIn("the ratio compares a torch with itself", proc.stderr)


if __name__ == "__main__":
    unittest.main()
