# Owner: tools/audit. Run: python tools/test/test_audit.py  (or: python -m pytest tools/test/test_audit.py)
"""Tests of the strategy-contract audit (tools/audit).

Strategies are planted in DTensor's registries by hand, so every assertion holds
whichever torch runs the tests (stock or built): a planted bad strategy must be
counted under the clause it breaks, a planted exception must be reported with op
and message, and ``--strict`` must fail on them.
"""

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn
from unittest import mock


REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch
import torch.distributed as dist
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore

from tools.audit import worker


aten = torch.ops.aten
CLAUSES = ("C1", "C2", "C3", "C4", "C5")

# Planted into the worker subprocess with --preload: aten.t.default answers with
# OpSpecs whose output has no tensor_meta (C1); aten.split.Tensor raises.
PRELOAD = textwrap.dedent(
    """
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._op_schema import OpSpec, OpStrategy

    aten = torch.ops.aten
    p = DTensor._op_dispatcher.sharding_propagator

    def bad_t(op_schema):
        inp = op_schema.args_schema[0]
        n = len(inp.strategies)
        return OpStrategy([
            OpSpec(
                output_specs=DTensorSpec(c.output_spec.mesh, c.output_spec.placements),
                input_specs=(c.output_spec,),
                redistribute_cost=[[0.0] * n],
            )
            for c in inp.strategies
        ])

    def boom(op_schema):
        raise RuntimeError("planted by test_audit")

    for op, fn in ((aten.t.default, bad_t), (aten.split.Tensor, boom)):
        p.op_single_dim_strategy_funcs.pop(op, None)
        p.op_strategy_funcs[op] = fn
    """
)


def _meta(*shape: int, dtype: torch.dtype = torch.float32) -> TensorMeta:
    t = torch.empty(shape, dtype=dtype)
    return TensorMeta(shape=t.shape, stride=t.stride(), dtype=dtype)


def _call(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Any:
    """A captured call as contract_sweep's recorder makes it (tensors as TensorMeta)."""
    return worker.load_validation().capture.CapturedCall(op, args, kwargs or {}, "test forward")


@contextlib.contextmanager
def planted(op: OpOverload, strategy_fn: Callable[..., Any]) -> Iterator[None]:
    """Make ``op`` answer through ``strategy_fn`` (an op strategy) only."""
    p = DTensor._op_dispatcher.sharding_propagator
    saved: dict[str, Any] = {
        "single": p.op_single_dim_strategy_funcs.pop(op, None),
        "strategy": p.op_strategy_funcs.pop(op, None),
    }
    p.op_strategy_funcs[op] = strategy_fn
    try:
        yield
    finally:
        p.op_strategy_funcs.pop(op, None)
        if saved["single"] is not None:
            p.op_single_dim_strategy_funcs[op] = saved["single"]
        if saved["strategy"] is not None:
            p.op_strategy_funcs[op] = saved["strategy"]


def _first_input(op_schema: OpSchema) -> OpStrategy:
    inp = op_schema.args_schema[0]
    if not isinstance(inp, OpStrategy):
        raise TypeError(f"{op_schema.op}: expected an OpStrategy input, got {type(inp).__name__}")
    return inp


def _no_meta_strategy(op_schema: OpSchema) -> OpStrategy:
    """One OpSpec per input candidate; outputs lack tensor_meta (C1), costs negative (C4)."""
    inp = _first_input(op_schema)
    n = len(inp.strategies)
    return OpStrategy(
        [
            OpSpec(
                output_specs=DTensorSpec(c.output_spec.mesh, c.output_spec.placements),
                input_specs=(c.output_spec,),
                redistribute_cost=[[-1.0] * n],
            )
            for c in inp.strategies
        ]
    )


def _raising_strategy(op_schema: OpSchema) -> NoReturn:
    raise ValueError("planted failure\nsecond line is dropped")


class _Audit:
    """What the worker runs in process: the contract mode's validation, selections recorded."""

    def __init__(self, checker: ModuleType, meshes: str, modes: str) -> None:
        cv = worker.load_validation()
        self.sweep = cv.sweep
        self.selections: dict[str, dict[str, Any]] = {}
        self.validation = cv.ContractValidation(
            {}, checker.check_strategy_contract, checker.infer_output_metas, cv.make_meshes(meshes),
            modes.split(","), worker.load_mode().first_candidates(16), 60.0,
            worker.selection_recorder(cv, self.selections, 60.0),
        )

    def audit_call(self, call: Any) -> None:
        self.validation.validate_call(call)

    def results(self) -> list[dict[str, Any]]:
        return worker.results_json(worker.load_validation(), self.validation)


class TestAuditInProcess(TestCase):
    own_pg: bool
    checker: ModuleType

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.own_pg = not dist.is_initialized()
        if cls.own_pg:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        cls.checker = worker.load_checker(worker.DEFAULT_CHECKER)

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.own_pg and dist.is_initialized():
            dist.destroy_process_group()
        super().tearDownClass()

    def auditor(self, meshes: str = "4", modes: str = "runtime,planner") -> "_Audit":
        return _Audit(self.checker, meshes, modes)

    def result(self, auditor: "_Audit", mode: str, mesh: str) -> dict[str, Any]:
        return next(r for r in auditor.results() if r["mode"] == mode and r["mesh"] == mesh)

    def test_violation_counted_under_its_clause(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))
        a = self.auditor()
        with planted(aten.t.default, _no_meta_strategy):
            self.assertEqual(a.sweep.strategy_registry(aten.t.default), "op_strategy")
            a.audit_call(call)
        # runtime: all-Replicate and Shard(0) (4 >= mesh size 4): one OpSpec each
        rt = self.result(a, "runtime", "4")
        self.assertEqual(rt["ops_sampled"], 1)
        self.assertEqual(rt["ops_with_violations"], 1)
        self.assertEqual(rt["violations"], {"C1": 2, "C2": 0, "C3": 0, "C4": 2, "C5": 0})
        self.assertEqual((rt["errors"], rt["refused"]), (0, 0))
        # planner: candidates R, S(0), S(1), P -> one OpSpec each
        pl = self.result(a, "planner", "4")
        self.assertEqual(pl["violations"], {"C1": 4, "C2": 0, "C3": 0, "C4": 4, "C5": 0})
        (entry,) = pl["violating_ops"]
        self.assertEqual(entry["op"], "aten.t.default")
        self.assertEqual(entry["registry"], "op_strategy")
        self.assertIn("got no tensor_meta", entry["examples"]["C1"]["violation"])
        self.assertIn("-1.0", entry["examples"]["C4"]["violation"])
        self.assertEqual(pl["by_registry"]["op_strategy"]["violations"]["C1"], 4)
        # the runtime selection was recorded for both inputs
        self.assertEqual(
            sorted(k.split("|", 1)[1] for k in a.selections), ["4|all Replicate", "4|input 0 Shard(0)"]
        )

    def test_exception_reported_with_op_and_message(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))
        a = self.auditor(meshes="2x2")
        with planted(aten.t.default, _raising_strategy):
            a.audit_call(call)
        for mode in ("runtime", "planner"):
            r = self.result(a, mode, "2x2")
            self.assertGreater(r["errors"], 0)
            self.assertEqual(r["ops_with_errors"], 1)
            self.assertEqual(r["refused"], 0)
            self.assertEqual(sum(r["violations"].values()), 0)
            (err,) = r["error_details"]
            self.assertEqual(err["op"], "aten.t.default")
            self.assertEqual(err["registry"], "op_strategy")
            self.assertEqual(err["type"], "ValueError")
            self.assertEqual(err["message"], "planted failure")
            self.assertEqual(err["mesh"], "2x2")
            self.assertEqual(err["source"], "test forward")
            self.assertIn("_raising_strategy", err["raised_at"])
        # the selection raised too, and is recorded as such
        self.assertTrue(all("error" in v for v in a.selections.values()))

    def test_runtime_refusal_counted_apart_from_errors(self) -> None:
        """A runtime query DTensor deliberately refuses is counted as refused, per
        query and with its reason; the same exception from a planner query is an error."""
        sweep = worker.load_contract_sweep()
        pattern = next(iter(sweep.RUNTIME_REFUSALS))
        call = _call(aten.t.default, (_meta(4, 6),))

        def refuse_sharded(op_schema: OpSchema) -> OpStrategy:
            inp = op_schema.args_schema[0]
            if not isinstance(inp, OpStrategy):
                raise TypeError(f"{op_schema.op}: expected an OpStrategy input, got {type(inp).__name__}")
            if any(not c.output_spec.is_replicated() for c in inp.strategies):
                raise RuntimeError(f"{op_schema.op}: {pattern}")
            return _no_meta_strategy(op_schema)

        a = self.auditor()
        with planted(aten.t.default, refuse_sharded):
            a.audit_call(call)
        rt = self.result(a, "runtime", "4")
        # all-Replicate answered (and judged), Shard(0) refused
        self.assertEqual((rt["queries"], rt["refused"], rt["errors"]), (2, 1, 0))
        self.assertEqual(rt["violations"]["C1"], 1)
        (ref,) = rt["refusal_details"]
        self.assertEqual((ref["op"], ref["refusal"]), ("aten.t.default", pattern))
        self.assertEqual(ref["reason"], sweep.RUNTIME_REFUSALS[pattern])
        self.assertIn("input 0 Shard(0)", ref["query"])
        self.assertEqual(rt["error_details"], [])
        pl = self.result(a, "planner", "4")
        self.assertEqual((pl["refused"], pl["errors"]), (0, 1))
        self.assertIn(pattern, pl["error_details"][0]["message"])

    def test_hanging_query_reported_as_timeout(self) -> None:
        call = _call(aten.t.default, (_meta(4, 6),))

        def spin(op_schema: OpSchema) -> NoReturn:
            while True:
                pass

        a = self.auditor(modes="planner")
        a.validation.query_timeout = 0.3
        with planted(aten.t.default, spin):
            a.audit_call(call)
        r = self.result(a, "planner", "4")
        self.assertEqual(r["errors"], 1)
        (err,) = r["error_details"]
        self.assertEqual((err["op"], err["type"]), ("aten.t.default", "QueryTimeout"))
        self.assertIn("spin", err["raised_at"])

    def test_tuple_strategy_child_counted_as_c5(self) -> None:
        metas = [_meta(4, 3), _meta(5)]
        call = _call(aten._foreach_neg.default, (metas,))

        def tuple_strategy(op_schema: OpSchema) -> TupleStrategy:
            (lst,) = op_schema.args_schema
            if not isinstance(lst, TupleStrategy):
                self.fail(f"expected a TupleStrategy, got {type(lst).__name__}")
            children = []
            for child in lst.children:
                if not isinstance(child, OpStrategy):
                    self.fail(f"expected OpStrategy children, got {type(child).__name__}")
                children.append(child)
            return TupleStrategy(
                [
                    OpStrategy(
                        [
                            OpSpec(
                                output_specs=DTensorSpec(c.output_spec.mesh, c.output_spec.placements),
                                input_specs=(c.output_spec,),
                                redistribute_cost=[[0.0] * len(child.strategies)],
                            )
                            for c in child.strategies
                        ]
                    )
                    for child in children
                ]
            )

        a = self.auditor(modes="runtime")
        with planted(aten._foreach_neg.default, tuple_strategy):
            a.audit_call(call)
        r = self.result(a, "runtime", "4")
        # R config: 2 children x 1 OpSpec; S0 config (first tensor 4 >= 4): 2 more
        self.assertEqual(r["violations"]["C5"], 4)
        self.assertEqual(r["c5_by_child_clause"], {"C1": 4})
        self.assertEqual(r["violations"]["C1"], 0)

    def test_unregistered_op_named(self) -> None:
        a = self.auditor()
        with mock.patch.object(a.sweep, "strategy_registry", lambda op: None):
            with self.assertRaisesRegex(ValueError, "aten.t.default"):
                a.audit_call(_call(aten.t.default, (_meta(4, 6),)))

    def test_planner_candidates(self) -> None:
        a = self.auditor(meshes="4,2x2")
        candidates = a.validation.candidates
        mesh4 = a.validation.meshes["4"]
        cands = candidates(mesh4, _meta(4, 3))
        self.assertEqual([str(c) for c in cands[:1]], ["(Replicate(),)"])
        self.assertEqual(len(cands), 3)  # R, S(0), P: dim 1 (3) < 4 cannot be sharded
        self.assertEqual(len(candidates(mesh4, _meta(4, 3, dtype=torch.int64))), 2)  # no Partial
        mesh22 = a.validation.meshes["2x2"]
        cands = candidates(mesh22, _meta(4, 3, 2))
        self.assertEqual(len(cands), 16)  # 5 x 5 combinations, capped
        self.assertEqual(str(cands[0]), "(Replicate(), Replicate())")


class TestStrictRule(TestCase):
    def test_violations_errors_refusals_and_selection_mismatches(self) -> None:
        import importlib

        orchestrator = importlib.import_module("tools.audit.__main__")
        rec: dict[str, Any] = {
            "torch": "built", "mode": "runtime", "mesh": "4",
            "violating_ops": [{"op": "aten.a.default", "specs_by_clause": {"C1": 2, "C4": 1}}],
            "error_details": [{"op": "aten.b.default", "count": 3}],
            "refusal_details": [{"op": "aten.c.default", "refusal": "x", "count": 5}],
        }
        stock = dict(rec, torch="stock")
        merged: dict[str, Any] = {"results": [stock, rec], "selections": {"mismatches": []}}
        reasons = orchestrator.strict_failures(merged)
        self.assertEqual(len(reasons), 2)
        self.assertIn("3 OpSpec violations in 1 ops", reasons[0])
        self.assertIn("3 errors", reasons[1])
        # built's refusals never fail --strict (nor does anything of stock's)
        rec["violating_ops"] = []
        self.assertEqual(len(orchestrator.strict_failures(merged)), 1)
        rec["error_details"] = []
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["selections"]["mismatches"] = [{"key": "k", "kind": "newly_supported"}]
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["selections"]["mismatches"].append({"key": "k2", "kind": "changed"})
        self.assertEqual(
            orchestrator.strict_failures(merged), ["1 runtime selections differ stock vs built (1 changed)"]
        )

    def test_full_space_missing_strategies_fail_strict(self) -> None:
        import importlib

        orchestrator = importlib.import_module("tools.audit.__main__")
        fs = {"ops_compared": 2, "schemas_compared": 3, "missing": 0, "ops_missing": [],
              "invalid_with_reason": {"not valid for the op: x": 4}, "errors": {}}
        merged: dict[str, Any] = {
            "results": [], "selections": {"mismatches": []},
            "full_space": {"stock": {"skipped": "no planner entry point"}, "built": {"audit": dict(fs)}},
        }
        # strategies the expansion must drop (with their reason) never fail --strict
        self.assertEqual(orchestrator.strict_failures(merged), [])
        merged["full_space"]["built"]["audit"].update(missing=5, ops_missing=["aten.a.default"])
        (reason,) = orchestrator.strict_failures(merged)
        self.assertIn("full space (audit candidates): 5 strategies missing in 1 ops", reason)
        stock_row, built_row = orchestrator.full_space_rows(merged)
        self.assertIn("skipped: no planner entry point", stock_row[-1])
        self.assertEqual(built_row[:5], ["built", "audit", 2, 3, 5])
        self.assertIn("a.default", built_row[5])  # the op list drops the aten. prefix
        self.assertEqual(built_row[6], 4)

    def test_selection_kinds(self) -> None:
        import importlib

        orchestrator = importlib.import_module("tools.audit.__main__")
        ok = {"op": "aten.x", "output": "(Replicate(),)", "needs_redistribute": False}
        other = {"op": "aten.x", "output": "(Shard(dim=0),)", "needs_redistribute": False}
        err = {"op": "aten.x", "error": "RuntimeError: no"}
        err2 = {"op": "aten.x", "error": "ValueError: no"}
        stock = {"a|4|R": ok, "b|4|R": ok, "c|4|R": err, "d|4|R": err, "e|4|R": ok}
        built = {"a|4|R": other, "b|4|R": err, "c|4|R": ok, "d|4|R": err2, "e|4|R": ok}
        sel = orchestrator.compare_selections({"stock": {"selections": stock}, "built": {"selections": built}})
        self.assertEqual(sel["compared"], 5)
        self.assertEqual(
            sel["by_kind"], {"changed": 1, "regressed": 1, "newly_supported": 1, "error_changed": 1}
        )
        self.assertEqual([m["key"] for m in sel["mismatches"]][:2], ["a|4|R", "b|4|R"])


def _orchestrator() -> ModuleType:
    import importlib

    return importlib.import_module("tools.audit.__main__")


def _parity_op(outcome: str, seconds: float, message: str = "", type_: str | None = None) -> dict[str, Any]:
    """One op's record as tools/audit/parity.py writes it."""
    rec: dict[str, Any] = {"outcome": outcome, "dtensor_s": seconds, "samples": []}
    if message:
        rec["message"] = message
    if type_:
        rec["type"] = type_
    return rec


def _parity_doc(role: str, ops: dict[str, dict[str, Any]]) -> dict[str, Any]:
    counts = {k: sum(1 for r in ops.values() if r["outcome"] == k) for k in ("same", "wrong", "raised", "skipped")}
    return {"torch": role, "config": {"max_samples": 3, "meshes": "4", "op_timeout": 120.0, "ops": None},
            "counts": counts, "ops": {k: dict(v, op=k) for k, v in ops.items()},
            "timing": {"total_s": 1.0, "dtensor_s": 1.0, "wall_s": 2.0}}


# (stock, built) per op: every kind of change the comparison knows, and the time rules.
PARITY_STOCK = {
    "same_to_wrong": _parity_op("same", 0.01),
    "same_to_raised": _parity_op("same", 0.01),
    "wrong_to_raised": _parity_op("wrong", 0.01, "w"),
    "raised_to_same": _parity_op("raised", 0.01, "no strategy", "NotImplementedError"),
    "wrong_to_same": _parity_op("wrong", 0.01, "w"),
    "raised_to_wrong": _parity_op("raised", 0.01, "no strategy", "NotImplementedError"),
    "raised_other_message": _parity_op("raised", 0.01, "A", "RuntimeError"),
    "unchanged": _parity_op("raised", 0.01, "A", "RuntimeError"),
    "skipped_to_raised": _parity_op("skipped", 0.01, "nondeterministic"),
    "slow_2x": _parity_op("same", 0.3),        # 0.6s built: listed, not strict
    "slow_3_5x": _parity_op("same", 0.2),      # 0.7s built: strict
    "tiny_4x": _parity_op("same", 0.1),        # 0.4s built: under the floor, noise
    "floor_by_stock": _parity_op("same", 0.5),  # 0.8s built: 1.6x, listed
    "strict_below_floor": _parity_op("same", 0.12),  # 0.48s built, 4x: listed? no (both < 0.5)
    "faster": _parity_op("same", 2.0),
}
PARITY_BUILT = {
    "same_to_wrong": _parity_op("wrong", 0.01, "add sample 1 mesh 4: output 0: not close"),
    "same_to_raised": _parity_op("raised", 0.01, "x sample 0 mesh 4: Timeout", "Timeout"),
    "wrong_to_raised": _parity_op("raised", 0.01, "boom", "RuntimeError"),
    "raised_to_same": _parity_op("same", 0.01),
    "wrong_to_same": _parity_op("same", 0.01),
    "raised_to_wrong": _parity_op("wrong", 0.01, "w"),
    "raised_other_message": _parity_op("raised", 0.01, "B", "RuntimeError"),
    "unchanged": _parity_op("raised", 0.01, "A", "RuntimeError"),
    "skipped_to_raised": _parity_op("raised", 0.01, "bad", "RuntimeError"),
    "slow_2x": _parity_op("same", 0.6),
    "slow_3_5x": _parity_op("same", 0.7),
    "tiny_4x": _parity_op("same", 0.4),
    "floor_by_stock": _parity_op("same", 0.8),
    "strict_below_floor": _parity_op("same", 0.48),
    "faster": _parity_op("same", 0.5),
}


class TestParityComparison(TestCase):
    def compared(
        self, stock: dict[str, dict[str, Any]] = PARITY_STOCK, built: dict[str, dict[str, Any]] = PARITY_BUILT
    ) -> dict[str, Any]:
        return _orchestrator().compare_parity({"stock": _parity_doc("stock", stock),
                                               "built": _parity_doc("built", built)})

    def test_outcome_changes_classified(self) -> None:
        p = self.compared()
        self.assertEqual(p["compared"], len(PARITY_STOCK))
        self.assertEqual(sorted(e["op"] for e in p["worse"]),
                         ["same_to_raised", "same_to_wrong", "skipped_to_raised", "wrong_to_raised"])
        self.assertEqual(sorted(e["op"] for e in p["newly_works"]), ["raised_to_same", "wrong_to_same"])
        self.assertEqual([e["op"] for e in p["better"]], ["raised_to_wrong"])
        self.assertEqual([e["op"] for e in p["notes"]], ["raised_other_message"])
        worse = {e["op"]: e for e in p["worse"]}
        self.assertEqual((worse["same_to_raised"]["stock"], worse["same_to_raised"]["built"]),
                         ("same", "raised: Timeout"))
        self.assertEqual(worse["same_to_wrong"]["built_message"], "add sample 1 mesh 4: output 0: not close")

    def test_slower_uses_ratio_and_floor(self) -> None:
        p = self.compared()
        slower = {e["op"]: e for e in p["slower"]}
        # tiny_4x and strict_below_floor: 4x, but both times under 0.5s
        self.assertEqual(sorted(slower), ["floor_by_stock", "slow_2x", "slow_3_5x"])
        self.assertEqual(slower["slow_3_5x"]["ratio"], 3.5)
        self.assertEqual([e["op"] for e in p["slower"]], ["slow_3_5x", "slow_2x", "floor_by_stock"])
        orch = _orchestrator()
        self.assertEqual([e["op"] for e in orch.parity_strict_slower(p)], ["slow_3_5x"])
        self.assertEqual(p["totals"]["strict_slower"], 1)
        # the strict floor is on the built time: 3.5x of a 0.1s stock run (0.35s) does not fail
        q = self.compared({"x": _parity_op("same", 0.1)}, {"x": _parity_op("same", 0.55)})
        self.assertEqual([e["op"] for e in orch.parity_strict_slower(q)], ["x"])
        q = self.compared({"x": _parity_op("same", 0.5)}, {"x": _parity_op("same", 0.45)})
        self.assertEqual(q["slower"], [])

    def test_strict_fails_on_worse_and_on_3x(self) -> None:
        orch = _orchestrator()
        reasons = orch.parity_strict_failures(self.compared())
        self.assertEqual(len(reasons), 2)
        self.assertIn("4 ops got worse", reasons[0])
        self.assertIn("same_to_wrong", reasons[0])
        self.assertIn("slow_3_5x 3.5x", reasons[1])
        # only improvements, notes and sub-3x slowdowns: passes
        ok = ("raised_to_same", "raised_other_message", "slow_2x", "tiny_4x", "floor_by_stock", "unchanged")
        p = self.compared({k: PARITY_STOCK[k] for k in ok}, {k: PARITY_BUILT[k] for k in ok})
        self.assertEqual(orch.parity_strict_failures(p), [])
        # the full --strict rule includes parity next to the contract
        merged = {"results": [], "selections": {"mismatches": []}, "parity": self.compared()}
        self.assertEqual(len(orch.strict_failures(merged)), 2)
        del merged["parity"]
        self.assertEqual(orch.strict_failures(merged), [])

    def test_retime_keeps_fastest_and_drops_noise(self) -> None:
        """Ops flagged slower are measured again; each side keeps its fastest time."""
        orch = _orchestrator()
        stock = {"noisy": _parity_op("same", 0.2), "real": _parity_op("same", 0.2), "bad": _parity_op("same", 0.2)}
        built = {"noisy": _parity_op("same", 1.0), "real": _parity_op("same", 1.0),
                 "bad": _parity_op("raised", 9.0, "b", "Timeout")}
        pdocs = {"stock": _parity_doc("stock", stock), "built": _parity_doc("built", built)}
        second = {"stock": {"noisy": 0.25, "real": 0.3}, "built": {"noisy": 0.21, "real": 0.95}}
        asked: list[tuple[str | None, str, str]] = []

        def fake_run(
            args: argparse.Namespace, roles: list[str], build_dir: Path, kind: str, prefix: str
        ) -> dict[str, dict[str, Any]]:
            asked.append((args.ops, kind, prefix))
            return {r: {"ops": {op: {"dtensor_s": t} for op, t in second[r].items()}} for r in roles}

        args = argparse.Namespace(ops=None, parity_retime=1)
        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(orch, "run_workers", fake_run):
            p = orch.retime_parity(args, ["stock", "built"], Path(tmp), pdocs)
            written = json.loads((Path(tmp) / "parity-built.json").read_text())
        # the worse op is not re-run (it may hang); the two slow ones are
        self.assertEqual(asked, [("noisy,real", "parity", "parity-retime1-")])
        self.assertEqual(pdocs["built"]["ops"]["noisy"]["timings_s"], [1.0, 0.21])
        self.assertEqual(pdocs["built"]["ops"]["noisy"]["dtensor_s"], 0.21)
        self.assertEqual(written["ops"]["real"]["dtensor_s"], 0.95)
        self.assertEqual(sorted(e["op"] for e in p["slower"]), ["bad", "real"])
        self.assertEqual(p["config"]["retime"], 1)

    def test_report_section(self) -> None:
        md = _orchestrator().render_parity(self.compared(), md=True, top=10)
        self.assertIn("### Runtime parity", md)
        self.assertIn("| stock | 15 | 8 | 2 | 4 | 1 | 1.0 | 2.0 | - |", md)
        self.assertIn("| built | 15 | 8 | 2 | 5 | 0 |", md)
        self.assertIn("`add sample 1 mesh 4: output 0: not close`", md)
        self.assertIn("| slow_3_5x | 0.2 | 0.7 | 3.5 |", md)
        self.assertIn("Improvements: newly work (2) and better (1)", md)


class TestParityWorker(TestCase):
    """The parity worker's pieces on the running torch, in this process."""

    own_pg: bool
    mesh: DeviceMesh

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.own_pg = not dist.is_initialized()
        if cls.own_pg:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        cls.mesh = DeviceMesh("cpu", torch.arange(4))

    @classmethod
    def tearDownClass(cls) -> None:
        if cls.own_pg and dist.is_initialized():
            dist.destroy_process_group()
        super().tearDownClass()

    def sample(self, fn: Callable[..., object], *inputs: torch.Tensor, timeout: float = 30.0) -> dict[str, Any]:
        from torch.testing._internal.opinfo.core import SampleInput

        from tools.audit import parity

        deadline = parity.Deadline(timeout)
        return parity.run_sample(fn, "myop", 2, SampleInput(inputs[0], args=inputs[1:]), "4", self.mesh, (4,),
                                 deadline, (1e-5, 1e-5))

    def test_placements(self) -> None:
        from torch.distributed.tensor import Replicate as R, Shard as S

        from tools.audit.parity import placements_for

        self.assertEqual(placements_for((8, 6), (4,)), [S(0)])
        self.assertEqual(placements_for((5, 7), (4,)), [S(1)])  # 5 over 4 leaves a rank empty
        self.assertEqual(placements_for((5, 6), (2, 2)), [S(0), S(1)])
        self.assertEqual(placements_for((8,), (2, 2)), [S(0), S(0)])
        self.assertEqual(placements_for((3,), (4,)), [R()])
        self.assertEqual(placements_for((), (4,)), [R()])

    def test_same_wrong_raised_nondeterministic(self) -> None:
        x, y = torch.randn(8, 3), torch.randn(8, 3)
        rec = self.sample(torch.add, x, y)
        self.assertEqual(rec["outcome"], "same", str(rec))
        self.assertEqual(rec["inputs"], "S0,S0")
        self.assertGreater(rec["dtensor_s"], 0)

        def local_only(t: torch.Tensor) -> torch.Tensor:  # on a DTensor: each rank's shard, not the whole
            return t.to_local() if isinstance(t, DTensor) else t

        rec = self.sample(local_only, x)
        self.assertEqual(rec["outcome"], "wrong", str(rec))
        self.assertTrue(rec["message"].startswith("myop sample 2 mesh 4 (S0): output 0 rank 0:"), rec)

        def refuse(t: torch.Tensor) -> torch.Tensor:
            if isinstance(t, DTensor):
                raise ValueError("planted refusal\nsecond line dropped")
            return t

        rec = self.sample(refuse, x)
        self.assertEqual((rec["outcome"], rec["type"]), ("raised", "ValueError"))
        self.assertEqual(rec["message"], "myop sample 2 mesh 4: ValueError: planted refusal")
        self.assertIn("refuse", rec["where"])

        rec = self.sample(lambda t: torch.rand_like(t) + t, x)
        self.assertEqual(rec["outcome"], "skipped", str(rec))
        self.assertIn("nondeterministic", rec["message"])

    def test_hang_recorded_as_timeout(self) -> None:
        import time

        give_up = time.monotonic() + 20  # a broken time limit fails the test instead of hanging it

        def spin(t: torch.Tensor) -> torch.Tensor:
            while isinstance(t, DTensor) and time.monotonic() < give_up:
                pass
            return t

        rec = self.sample(spin, torch.randn(8), timeout=0.3)
        self.assertEqual((rec["outcome"], rec["type"]), ("raised", "Timeout"))
        self.assertIn("in spin", rec["where"])
        self.assertIn("myop sample 2 mesh 4: Timeout", rec["message"])
        self.assertLess(rec["dtensor_s"], 10)

    def test_aggregate_worst_sample_wins(self) -> None:
        from tools.audit.parity import aggregate

        def s(i: int, outcome: str, **kw: object) -> dict[str, object]:
            return {"sample": i, "mesh": "4", "outcome": outcome, "message": f"m{i}", "dtensor_s": 0.5, **kw}

        rec = aggregate("op", [s(0, "same"), s(1, "wrong"), s(2, "raised", type="E"), s(3, "raised", type="F")])
        self.assertEqual((rec["outcome"], rec["message"], rec["sample"], rec["type"]), ("raised", "m2", "2@4", "E"))
        self.assertEqual(rec["dtensor_s"], 2.0)
        self.assertEqual(len(rec["samples"]), 4)
        self.assertEqual(aggregate("op", [s(0, "skipped"), s(1, "same")])["outcome"], "same")
        self.assertEqual(aggregate("op", [s(0, "skipped"), s(1, "skipped")])["outcome"], "skipped")
        self.assertEqual(aggregate("op", [], "no float32 on cpu")["message"], "no float32 on cpu")


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, **kw)


class TestAuditSubprocess(TestCase):
    def test_worker_json_schema(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "w.json"
            proc = _run(
                [sys.executable, "-m", "tools.audit.worker", "--role", "built", "--out", str(out),
                 "--op", "mm,t,split", "--meshes", "4,2x2", "--max-samples", "2"]
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            self.assertIn("[audit built] query ops", proc.stderr)
            doc = json.loads(out.read_text())
        self.assertEqual(doc["torch"], "built")
        keys = {(r["mode"], r["mesh"]) for r in doc["results"]}
        self.assertEqual(
            keys, {(m, mesh) for m in ("runtime", "planner", "utility") for mesh in ("4", "2x2")}
        )
        for r in doc["results"]:
            self.assertIsInstance(r["ops_sampled"], int)
            # at least aten.mm, aten.t, aten.split (single-dim ones only in utility mode)
            self.assertGreaterEqual(r["ops_sampled"], 1 if r["mode"] == "utility" else 3)
            self.assertIsInstance(r["ops_with_violations"], int)
            self.assertIsInstance(r["errors"], int)
            self.assertEqual(sorted(r["violations"]), list(CLAUSES))
            self.assertTrue(all(isinstance(v, int) for v in r["violations"].values()))
            self.assertIsInstance(r["by_registry"], dict)
        for reg in ("single_dim", "op_strategy", "decomposition", "rules"):
            self.assertIn(reg, doc["coverage"])
        for r in doc["results"]:
            self.assertIsInstance(r["refused"], int)
            self.assertIsInstance(r["refusal_details"], list)
        self.assertIn("DynamicOutputShapeException", doc["refusal_reasons"])
        self.assertTrue(doc["selections"])
        self.assertGreater(doc["capture"]["stats"]["samples"], 0)
        # every cache the change adds is reported, filled and within its bound
        for name in ("sharding_prop", "output_metas", "redistribute_cost"):
            cache = doc["caches"][name]
            if name != "sharding_prop":  # the audit's runtime queries bypass that one
                self.assertGreater(cache["entries"], 0, name)
            if cache["bound"] is not None:
                self.assertLessEqual(cache["entries"], cache["bound"], name)

    def test_contract_mode_counts_as_the_worker(self) -> None:
        """``strategy_validation --contract`` and the audit's worker count the same ops alike."""
        with tempfile.TemporaryDirectory() as tmp:
            out, preload = Path(tmp) / "w.json", Path(tmp) / "plant.py"
            # both sides see the planted bad aten.t strategy, so clause counts are compared too
            preload.write_text(PRELOAD)
            ops = ["--op", "t,nn.functional.relu", "--meshes", "4,2x2", "--max-samples", "2"]
            run_cli = ("import runpy, sys; runpy.run_path(sys.argv.pop(1)); "
                       "runpy.run_module('torch.distributed.tensor._ops.strategy_validation', run_name='__main__')")
            cli = _run([sys.executable, "-c", run_cli, str(preload), "--contract", "--device", "cpu", *ops])
            self.assertEqual(cli.returncode, 1, cli.stderr[-3000:])
            proc = _run([sys.executable, "-m", "tools.audit.worker", "--role", "built", "--out", str(out), *ops,
                         "--preload", str(preload)])
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            doc = json.loads(out.read_text())
        self.assertIn("aten.relu.default", cli.stdout)
        # the per (mode, mesh) table of the CLI is the worker's, from the same counts
        table = doc["summary"].split("=" * 70)[-1].strip()
        self.assertIn(table, cli.stdout)
        table = table.splitlines()
        for r in doc["results"]:
            row = next(line.split() for line in table if line.split()[:2] == [r["mode"], r["mesh"]])
            self.assertEqual(row[2:4], [str(r["ops_sampled"]), str(r["ops_with_violations"])])
            self.assertEqual(row[-3:], [str(r["errors"]), str(r["refused"]), str(r["no_strategy"])])
        self.assertGreater(sum(r["violations"]["C1"] for r in doc["results"]), 0)
        self.assertIn("C1 aten.t.default strategy 0", cli.stdout)

    def test_strict_fails_on_planted_violation(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            preload = Path(tmp) / "plant.py"
            preload.write_text(PRELOAD)
            proc = _run(
                [sys.executable, "-m", "tools.audit", "--only", "built", "--built-python", sys.executable,
                 "--ops", "t,split", "--meshes", "4", "--modes", "runtime", "--max-samples", "1",
                 "--preload", str(preload), "--out-dir", tmp, "--build-dir", tmp, "--strict"]
            )
            self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
            self.assertIn("FAIL", proc.stdout)
            doc = json.loads((Path(tmp) / "audit.json").read_text())
            md = (Path(tmp) / "audit.md").read_text()
        (r,) = doc["results"]
        self.assertEqual((r["torch"], r["mode"], r["mesh"]), ("built", "runtime", "4"))
        self.assertGreater(r["violations"]["C1"], 0)
        t = next(v for v in r["violating_ops"] if v["op"] == "aten.t.default")
        self.assertEqual(t["registry"], "op_strategy")
        self.assertIn("C1", t["specs_by_clause"])
        err = next(e for e in r["error_details"] if e["op"] == "aten.split.Tensor")
        self.assertEqual((err["type"], err["message"]), ("RuntimeError", "planted by test_audit"))
        self.assertIn("refusal_reasons", doc)
        self.assertTrue(doc["strict"]["failures"])
        self.assertIn("| runtime | 4 | built |", md)

    def test_parity_run_on_this_torch(self) -> None:
        """A tiny real parity sweep of three OpInfos on the running interpreter."""
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "p.json"
            proc = _run([sys.executable, "-m", "tools.audit.parity", "--role", "built", "--out", str(out),
                         "--ops", "add,mm,nn.functional.relu", "--max-samples", "2"])
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            self.assertIn("[audit built] parity 3/3", proc.stderr)
            doc = json.loads(out.read_text())
        self.assertEqual(sorted(doc["ops"]), ["add", "mm", "nn.functional.relu"])
        self.assertEqual(doc["counts"], {"same": 3, "wrong": 0, "raised": 0, "skipped": 0})
        for rec in doc["ops"].values():
            self.assertEqual(rec["outcome"], "same", rec)
            self.assertEqual(len(rec["samples"]), 2)
            self.assertGreater(rec["dtensor_s"], 0)
            # the samples picked first are the ones that get sharded
            self.assertTrue(any("S" in s["inputs"] for s in rec["samples"]), rec["samples"])

    def test_parity_strict_from_worker_json(self) -> None:
        """--parity-only --strict fails on a worse outcome, passes once it is gone, and reports it."""
        with tempfile.TemporaryDirectory() as tmp:
            stock = {"add": _parity_op("same", 0.01), "mm": _parity_op("same", 0.01)}
            built = {"add": _parity_op("same", 0.01),
                     "mm": _parity_op("raised", 0.01, "mm sample 0 mesh 4: RuntimeError: boom", "RuntimeError")}
            for role, ops in (("stock", stock), ("built", built)):
                (Path(tmp) / f"parity-{role}.json").write_text(json.dumps(_parity_doc(role, ops)))
            cmd = [sys.executable, "-m", "tools.audit", "--parity-only", "--from-json", "--strict",
                   "--build-dir", tmp, "--out-dir", tmp]
            proc = _run(cmd)
            self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
            self.assertIn("FAIL: runtime parity: 1 ops got worse than stock (mm)", proc.stdout)
            doc = json.loads((Path(tmp) / "audit.json").read_text())
            self.assertEqual([e["op"] for e in doc["parity"]["worse"]], ["mm"])
            self.assertIn("### Runtime parity", (Path(tmp) / "audit.md").read_text())
            (Path(tmp) / "parity-built.json").write_text(json.dumps(_parity_doc("built", stock)))
            proc = _run(cmd)
            self.assertEqual(proc.returncode, 0, proc.stdout[-3000:] + proc.stderr[-3000:])
            self.assertIn("PASS", proc.stdout)


if __name__ == "__main__":
    run_tests()
