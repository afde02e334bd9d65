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
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import run_tests, TestCase

from tools.bench import planner
from tools.bench.__main__ import main as bench_main
from tools.bench.worker import BENCHES


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

    def test_unknown_benchmark_is_named(self) -> None:
        with self.assertRaisesRegex(SystemExit, "unknown benchmark.*nope"):
            bench_main(["--bench", "nope"])

    def test_walk_check_fails_loudly(self) -> None:
        """A walk that skipped a node is an error, not a fast benchmark."""
        gm = make_fx(lambda x: (x + 1).sum())(torch.randn(4))
        stats = planner.WalkStats(nodes=1, queries=1, specs=1)
        with self.assertRaisesRegex(RuntimeError, "visited 1 of 2 aten nodes"):
            planner.check_walk(stats, gm.graph)


if __name__ == "__main__":
    run_tests()
