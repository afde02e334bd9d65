# Owner: tools/bench. Run: python tools/test/test_bench.py  (or: python -m pytest tools/test/test_bench.py)
"""Tests of ``make bench`` (tools/bench).

The end-to-end test runs ``python -m tools.bench --quick`` for one benchmark with
the running interpreter as both sides (two worker processes, about 15 s), which
exercises the orchestration, pyperf's worker mode and the JSON report whichever
torch runs the tests; the real stock-vs-built numbers come from ``make bench``.
"""

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import pyperf
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import run_tests, TestCase

from tools.bench import cache_sizing, common, model, planner, scaling
from tools.bench.__main__ import floor_summary, main as bench_main, SideResult
from tools.bench.worker import BENCHES, Benchmark, PLANNER_BENCHES, Stopwatch


ENTRY_KEYS = {"name", "stock_s", "built_s", "ratio", "spread", "target", "pass", "repeats"}


class TestBench(TestCase):
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
        self.assertIsInstance(entries, list)
        self.assertEqual(len(entries), 1)
        entry = entries[0]
        self.assertLessEqual(ENTRY_KEYS, set(entry), f"missing keys in {sorted(entry)}")
        self.assertEqual(entry["name"], "eager_dispatch_warm")
        self.assertEqual(entry["target"], BENCHES["eager_dispatch_warm"].target)
        self.assertEqual(entry["repeats"], 1)
        for key in ("stock_s", "built_s"):
            self.assertGreater(entry[key], 0.0)
        self.assertAlmostEqual(entry["ratio"], entry["built_s"] / entry["stock_s"])
        self.assertEqual(entry["pass"], entry["ratio"] <= entry["target"])
        for side in ("stock", "built"):
            spread = entry["spread"][side]
            self.assertEqual(set(spread), {"rel_stdev", "min_s", "max_s"})
            self.assertLessEqual(spread["min_s"], spread["max_s"])
        self.assertIn("eager_dispatch_warm", proc.stdout)
        self.assertRegex(proc.stdout, r"(PASS|FAIL)")
        self.assertEqual(suites, ["built.pyperf.json", "stock.pyperf.json"])
        # pyperf's values are on the default clock, and both clocks' ratios are kept
        self.assertEqual(entry["clock"], "cpu")
        self.assertEqual(set(entry["ratio_by_clock"]), {"cpu", "wall"})
        self.assertAlmostEqual(entry["ratio_by_clock"]["cpu"], entry["ratio"])
        self.assertRegex(proc.stdout, r"wall \d+\.\d{3}")

    def test_a_value_keeps_both_clocks_and_returns_the_chosen_one(self) -> None:
        bench = Benchmark()
        watch = Stopwatch()
        with watch:
            deadline = time.process_time() + 0.05
            while time.process_time() < deadline:
                pass
        with watch:
            time.sleep(0.05)  # waiting: wall time, no CPU time
        self.assertGreaterEqual(watch.seconds["wall"], 0.1)
        self.assertLess(watch.seconds["cpu"], watch.seconds["wall"] - 0.03)
        self.assertEqual(bench.timed(watch), watch.seconds["cpu"])
        bench.clock = "wall"
        self.assertEqual(bench.timed(watch), watch.seconds["wall"])
        self.assertEqual(bench.clock_values, [watch.seconds, watch.seconds])

    def test_unknown_benchmark_is_named(self) -> None:
        with self.assertRaisesRegex(SystemExit, "unknown benchmark.*nope"):
            bench_main(["--bench", "nope"])

    def test_walk_check_fails_loudly(self) -> None:
        """A walk that skipped a node is an error, not a fast benchmark."""
        gm = make_fx(lambda x: (x + 1).sum())(torch.randn(4))
        stats = planner.WalkStats(nodes=1, queries=1, specs=1)
        with self.assertRaisesRegex(RuntimeError, "visited 1 of 2 aten nodes"):
            planner.check_walk(stats, gm.graph)


def small_step(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mm, a pointwise op, a multi-output reduction and a sum: every walk path, tiny."""
    y = torch.mm(x, w) + 1
    values, _ = torch.max(y, dim=1)
    return y.sum(), values


def small_graph() -> torch.fx.Graph:
    return make_fx(small_step, tracing_mode="fake")(torch.randn(8, 16), torch.randn(16, 8)).graph


def with_mesh(shape: tuple[int, ...]) -> DeviceMesh:
    """A CPU mesh of ``shape`` over a fake world of as many ranks."""
    common.init_fake_process_group(common.mesh_world_size(shape))
    return common.cpu_mesh(shape)


class TestPlannerWalks(TestCase):
    """The bare walk, the floor and the graph prefix, on a 4-node graph (seconds)."""

    def setUp(self) -> None:
        self.mesh = with_mesh((2, 4))
        self.sweep = common.load_contract_candidates()
        self.graph = small_graph()
        self.node = next(n for n in self.graph.nodes if n.target is torch.ops.aten.add.Tensor)

    def incomplete_strategy(self) -> OpStrategy:
        """Three specs: no input specs and no costs; an output without meta; complete."""
        meta = planner.metas_of(self.node.meta["val"])
        rep, shard = (Replicate(), Replicate()), (Shard(0), Replicate())
        return OpStrategy([
            OpSpec(DTensorSpec(self.mesh, rep, tensor_meta=meta)),
            OpSpec(DTensorSpec(self.mesh, shard), [DTensorSpec(self.mesh, shard, tensor_meta=meta)],
                   [[0.0, 1.0]]),
            OpSpec(DTensorSpec(self.mesh, rep, tensor_meta=meta),
                   [DTensorSpec(self.mesh, rep, tensor_meta=meta)], [[0.0, 2.0]]),
        ])

    def test_bare_consume_counts_what_is_missing(self) -> None:
        walk = planner.PlannerWalk(self.mesh, self.graph, "bare", self.sweep, 4)
        walk.consume(self.node, self.incomplete_strategy(), [2])
        self.assertEqual(
            dict(walk.stats.missing),
            {"specs_without_input_specs": 1, "specs_without_costs": 1, "outputs_without_meta": 1},
        )
        # every spec offers its placements, the meta-less one too
        self.assertEqual(walk.candidates[self.node], [[(Replicate(), Replicate()), (Shard(0), Replicate())]])
        self.assertEqual(walk.stats.specs, 3)

    def test_strict_consume_raises_on_the_same_specs(self) -> None:
        for side in ("stock", "built"):
            walk = planner.PlannerWalk(self.mesh, self.graph, side, self.sweep, 4)
            with self.assertRaisesRegex(RuntimeError, "spec 0: input_specs None for 1 inputs"):
                walk.consume(self.node, self.incomplete_strategy(), [2])

    def test_bare_rejects_unusable_answers(self) -> None:
        walk = planner.PlannerWalk(self.mesh, self.graph, "bare", self.sweep, 4)
        bare = walk.bare
        if bare is None:
            self.fail("a bare walk has no BareQuery")
        max_node = next(n for n in self.graph.nodes if n.target is torch.ops.aten.max.dim)
        one_spec = OpStrategy([OpSpec(DTensorSpec(self.mesh, (Replicate(), Replicate())))])
        self.assertEqual(bare.unusable(max_node, one_spec), "1 output spec(s) for 2 result(s)")
        self.assertEqual(bare.unusable(self.node, one_spec), "")
        self.assertEqual(bare.unusable(self.node, OpStrategy([])), "an OpStrategy without specs")
        self.assertEqual(bare.unusable(self.node, TupleStrategy([one_spec])), "a TupleStrategy answer")

    def test_bare_walk_visits_every_node(self) -> None:
        stats = planner.walk_once(self.mesh, self.graph, "bare", self.sweep, 4)
        planner.check_walk(stats, self.graph)
        self.assertEqual(stats.expanded["single_dim_expanded"], stats.registries["single_dim"])
        self.assertEqual(dict(stats.repairs), {})
        with self.assertRaisesRegex(ValueError, "side must be one of stock, bare, built"):
            planner.PlannerWalk(self.mesh, self.graph, "repaired", self.sweep, 4)

    def test_floor_builds_the_built_walks_specs(self) -> None:
        if not common.has_contract_change():
            self.skipTest("the floor is recorded from the built walk (get_op_strategy)")
        stats, recorded = planner.record_walk(self.mesh, self.graph, self.sweep, 4)
        floor = planner.floor_once(self.mesh, self.graph, self.sweep, 4, recorded, verify=True)
        planner.check_walk(floor, self.graph)
        self.assertEqual((floor.nodes, floor.specs), (stats.nodes, stats.specs))
        self.assertEqual(sum(len(r.specs) for r in recorded.values()), stats.specs)
        # a missing record is named, not skipped
        recorded.pop(self.node)
        with self.assertRaisesRegex(RuntimeError, "no recorded answer for add"):
            planner.floor_once(self.mesh, self.graph, self.sweep, 4, recorded)

    def test_graph_prefix(self) -> None:
        prefix = model.graph_prefix(self.graph, 3)
        kept = [str(n.target) for n in prefix.nodes if n.op == "call_function"]
        self.assertEqual(kept, ["aten.mm.default", "aten.add.Tensor", "aten.max.dim",
                                "<built-in function getitem>", "<built-in function getitem>"])
        stats = planner.walk_once(self.mesh, prefix, "bare", self.sweep, 4)
        planner.check_walk(stats, prefix)
        self.assertEqual(stats.nodes, 3)
        with self.assertRaisesRegex(ValueError, "has 4 aten nodes; cannot keep the first 5"):
            model.graph_prefix(self.graph, 5)


class TestScalingAndWorld(TestCase):
    def test_config_parsing(self) -> None:
        c = scaling.ScalingConfig.parse("2x2x2x2@1:40")
        self.assertEqual((c.mesh, c.blocks, c.nodes, c.world_size), ((2, 2, 2, 2), 1, 40, 16))
        self.assertEqual(c.label, "2x2x2x2@1:40")
        self.assertEqual(scaling.ScalingConfig.parse("8@2").world_size, 8)
        self.assertEqual([x.label for x in scaling.parse_configs(scaling.DEFAULT_CONFIGS)],
                         scaling.DEFAULT_CONFIGS.split(","))
        for bad, msg in (("2x4", "expected <mesh>@<blocks>"), ("2xa@1", "positive integers"),
                         ("2x4@0", "blocks must be"), ("2x4@1:0", "nodes must be")):
            with self.assertRaisesRegex(ValueError, msg):
                scaling.ScalingConfig.parse(bad)
        with self.assertRaisesRegex(ValueError, "given twice: 2x4@2"):
            scaling.parse_configs("2x4@2,8@1,2x4@2")

    def test_world_size_follows_the_mesh(self) -> None:
        try:
            mesh = with_mesh((2, 2, 2, 2))
            self.assertEqual(dist.get_world_size(), 16)
            self.assertEqual(mesh.size(), 16)
            with self.assertRaisesRegex(ValueError, r"spans 8 ranks but the fake world has 16"):
                common.cpu_mesh((2, 4))
        finally:
            with_mesh((2, 4))
        self.assertEqual(dist.get_world_size(), 8)
        self.assertEqual(common.parse_mesh("2x2x2"), (2, 2, 2))
        with self.assertRaisesRegex(ValueError, "every dim must be a positive size"):
            common.parse_mesh("2x0")

    def test_summary_pairs_sides_per_repeat(self) -> None:
        docs = {
            walk: [{"results": [{"config": "8@1", "times_s": [t], "nodes": 10, "specs": 40,
                                 "fallback_nodes": 0, "fallbacks": {}, "fallback_reasons": {},
                                 "missing": {}, "peak_mib": 1.0, "peak_per_spec_kib": 25.6}]}
                   for t in times]
            for walk, times in (("stock", [2.0, 4.0, 3.0]), ("bare", [1.0, 1.0, 1.0]),
                                ("built", [1.0, 1.0, 3.0]))
        }
        (entry,) = scaling.summarize([scaling.ScalingConfig((8,), 1)], docs)
        # per repeat: 0.5, 0.25, 1.0 -> median 0.5 (the ratio of medians would be 1/3)
        self.assertEqual(entry["built_over_stock"], {"median": 0.5, "min": 0.25, "max": 1.0})
        self.assertEqual(entry["built_over_bare"]["median"], 1.0)
        self.assertAlmostEqual(entry["sides"]["stock"]["per_node_ms"], 300.0)
        self.assertEqual(entry["sides"]["built"]["specs_per_node"], 4.0)
        self.assertIn("| `8@1` | 1 | 10 |", scaling.markdown([entry], ["stock", "bare", "built"]))


class TestBenchReport(TestCase):
    def test_bare_benchmark_is_registered(self) -> None:
        self.assertIn("planner_enumeration_bare", BENCHES)
        self.assertEqual(BENCHES["planner_enumeration_bare"].target, 1.0)
        self.assertEqual(set(PLANNER_BENCHES) & set(BENCHES), set(PLANNER_BENCHES))

    def test_floor_ratio_pairs_each_built_worker_with_its_floor(self) -> None:
        def bench(value: float) -> pyperf.Benchmark:
            run = pyperf.Run([value], metadata={"name": "planner_enumeration", "loops": 1},
                             collect_metadata=False)
            return pyperf.Benchmark([run])

        built = SideResult([bench(2.0), bench(3.0), bench(8.0)],
                           [{"floor_s": 1.0}, {"floor_s": 1.0}, {"floor_s": 2.0}])
        got = floor_summary(built)
        self.assertEqual(got["built_over_floor"], 3.0)
        self.assertEqual(got["built_over_floor_per_repeat"], {"min": 2.0, "max": 4.0})
        self.assertEqual(got["floor_s"], 1.0)
        self.assertEqual(floor_summary(SideResult([bench(2.0)], [{}])), {})


class TestCacheSizing(TestCase):
    def test_fifo_replay(self) -> None:
        log = cache_sizing.KeyLog()
        event = log.add_source(0)
        for target in (0, 1, 2, 0, 1, 2):
            log.add_row(event, target)
        self.assertEqual(cache_sizing.replay(log, 2).row_hits, 0)  # FIFO: each evicted before reuse
        self.assertEqual(cache_sizing.replay(log, 3).row_hits, 3)
        self.assertEqual(log.counts()["distinct_rows"], 3)

    def test_evicted_source_misses_its_rows(self) -> None:
        log = cache_sizing.KeyLog()
        for source in (0, 1, 0):
            log.add_row(log.add_source(source), 0)
        small, large = cache_sizing.replay(log, 1), cache_sizing.replay(log, 2)
        self.assertEqual((small.source_hits, small.row_hits), (0, 0))
        self.assertEqual((large.source_hits, large.row_hits), (1, 1))
        with self.assertRaisesRegex(ValueError, "not a source interning"):
            log.add_row(1, 0)
        self.assertEqual(cache_sizing.parse_sizes("8-10"), [256, 512, 1024])
        with self.assertRaisesRegex(ValueError, "every size must be positive"):
            cache_sizing.parse_sizes("0,4")

    def test_recording_wraps_the_built_cache(self) -> None:
        if not common.has_contract_change():
            self.skipTest("the redistribute-cost cache is the change's")
        from torch.distributed.tensor._ops import _redistribute_cost_cache as cache

        mesh = with_mesh((2, 4))
        meta = TensorMeta(torch.Size([8, 8]), (8, 1), torch.float32)
        sources = [DTensorSpec(mesh, (Replicate(), Replicate()), tensor_meta=meta),
                   DTensorSpec(mesh, (Shard(0), Replicate()), tensor_meta=meta)]
        target = DTensorSpec(mesh, (Shard(0), Replicate()), tensor_meta=meta)
        saved = cache._costs
        log = cache_sizing.KeyLog()
        with cache_sizing.recording(log):
            first = cache.CostRows(sources).row(target)
            again = cache.CostRows(sources).row(target)
        self.assertIs(cache._costs, saved)
        self.assertEqual(first, again)
        self.assertEqual(log.counts()["row_lookups"], 2)
        self.assertEqual(log.counts()["distinct_rows"], 1)
        replayed = cache_sizing.replay(log, 4)
        self.assertEqual((replayed.source_hits, replayed.row_hits), (1, 1))


if __name__ == "__main__":
    run_tests()
