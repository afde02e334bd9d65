# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
The fused attention ops: every tensor result has a spec with its meta.

The attention kernels return their RNG state and unused buffers as tensors
that no sharding rule places. A planner reading a strategy must not mistake
them for results the op leaves out, so every answer handed out gives them a
``Replicate`` spec with their meta, and ``None`` is left for the results the op
returns as ``None``. DTensor's eager dispatch keeps handing them back as stock
DTensor does (a plain per-rank tensor where the rule gives no placement), which
the last test compares with stock torch run in a subprocess.

The ops come from DTensor's registries (every op whose name holds
``attention``), their calls from ``contract_common.attention_calls``, which runs
the kernels' meta implementations on fake CPU tensors.
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


try:
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
    from torch.distributed.tensor._ops import strategy_contract
    from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
    from torch.testing._internal.distributed._tensor.contract_common import (
        attention_calls,
        mesh_name,
        OP_MESHES,
        output_tuple,
        stock_python,
        STOCK_PYTHON_ENV,
        StrategyContractTestBase,
    )
    from torch.testing._internal.distributed._tensor.contract_ops_common import (
        mode_candidates,
        QUERY_MODES,
    )
    from torch.testing._internal.distributed._tensor.contract_sweep import (
        strategy_registry,
        strategy_schema,
    )
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
    from torch.testing._internal.distributed._tensor.contract_sweep import author_rules
except ImportError:  # stock torch: only the --eager-worker runs there
    StrategyContractTestBase = TestCase  # type: ignore[misc, assignment]


aten = torch.ops.aten
EAGER_FLAG = "--eager-worker"
REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)


# ---------------------------------------------------------------------------
# Eager calls, run by this interpreter and by stock torch's
# ---------------------------------------------------------------------------


def _describe(x: object) -> str:
    if isinstance(x, DTensor):
        local = tuple(x._local_tensor.shape)
        return f"DTensor{tuple(x.placements)}{tuple(x.shape)}:{x.dtype} local {local}"
    if isinstance(x, torch.Tensor):
        return f"Tensor{tuple(x.shape)}:{x.dtype}"
    return repr(x)


def eager_outcomes() -> dict[str, list[str]]:
    """What eager DTensor hands back for the efficient and flash attention ops,
    forward, backward op and autograd, on fake CPU tensors, per input placement.

    Uses only APIs stock torch has, so stock and changed torch run it alike.
    """
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    mesh = DeviceMesh("cpu", torch.arange(4))
    results: dict[str, list[str]] = {}
    placements: list[list[Placement]] = [[Shard(0)], [Shard(1)], [Replicate()]]
    with FakeTensorMode():
        for pl in placements:
            local = [2 if isinstance(pl[0], Shard) and pl[0].dim == d else 8 for d in range(2)]
            q = DTensor.from_local(torch.randn(*local, 8, 16), mesh, pl)
            q.requires_grad_(True)
            key = str(tuple(pl))
            try:
                out = aten._scaled_dot_product_efficient_attention(q, q, q, None, True)
                results[f"efficient {key}"] = [_describe(x) for x in out]
                grads = aten._scaled_dot_product_efficient_attention_backward(
                    out[0], q, q, q, None, out[0], out[1], out[2], out[3], 0.0,
                    [True, True, True, False],
                )
                results[f"efficient backward {key}"] = [_describe(x) for x in grads]
                out[0].sum().backward()
                results[f"efficient autograd {key}"] = [_describe(q.grad)]
            except Exception as e:
                results[f"efficient {key}"] = [f"raised {type(e).__name__}"]
            q.grad = None
            try:
                out = aten._scaled_dot_product_flash_attention(q, q, q)
                results[f"flash {key}"] = [_describe(x) for x in out]
                grads = aten._scaled_dot_product_flash_attention_backward(
                    out[0], q, q, q, out[0], out[1], out[2], out[3], out[4], out[5],
                    0.0, False, out[6], out[7],
                )
                results[f"flash backward {key}"] = [_describe(x) for x in grads]
                out[0].sum().backward()
                results[f"flash autograd {key}"] = [_describe(q.grad)]
            except Exception as e:
                results[f"flash {key}"] = [f"raised {type(e).__name__}"]
    return results


def run_worker(python: str, stock: bool) -> dict[str, list[str]]:
    """:func:`eager_outcomes` in ``python``, as JSON through a file."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if stock:
        env.pop("PYTHONPATH", None)  # stock must import its own torch, not an overlay
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "outcomes.json")
        proc = subprocess.run(
            [python, os.path.abspath(__file__), EAGER_FLAG, path],
            env=env, cwd=tmp, capture_output=True, text=True, timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"eager worker ({python}) exited {proc.returncode}:\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        with open(path) as f:
            return json.load(f)


# ---------------------------------------------------------------------------
# The tests
# ---------------------------------------------------------------------------


def registered_attention_ops() -> list[torch._ops.OpOverload]:
    """Every attention op some DTensor registry answers for."""
    from torch._decomp import decomposition_table

    propagator = DTensor._op_dispatcher.sharding_propagator
    ops = {
        *propagator.op_single_dim_strategy_funcs,
        *propagator.op_strategy_funcs,
        *(op for op in decomposition_table if isinstance(op, torch._ops.OpOverload)),
    }
    return sorted(
        (op for op in ops if "attention" in str(op) and strategy_registry(op) is not None),
        key=str,
    )


def expected_results(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> list[Any]:
    """The op's results on fake tensors: a ``TensorMeta`` per tensor, else the value."""
    with FakeTensorMode():
        # (a TensorMeta is a NamedTuple: a leaf here, not a node)
        fake_args, fake_kwargs = torch.utils._pytree.tree_map(
            lambda m: torch.empty_strided(m.shape, m.stride, dtype=m.dtype)
            if isinstance(m, TensorMeta)
            else m,
            (args, kwargs),
            is_leaf=lambda x: isinstance(x, TensorMeta),
        )
        out = op(*fake_args, **fake_kwargs)
    return [meta_of(r) if isinstance(r, torch.Tensor) else r for r in out]


class TestAttentionResultSpecs(StrategyContractTestBase):
    def assert_every_tensor_result_placed(
        self, op: torch._ops.OpOverload, specs: list[OpSpec], expected: list[Any]
    ) -> None:
        names = [r.name for r in op._schema.returns]
        for i, spec in enumerate(specs):
            outs = output_tuple(spec)
            self.assertEqual(len(outs), len(expected), f"{op} OpSpec {i}")
            for pos, (out, want) in enumerate(zip(outs, expected)):
                where = f"{op} OpSpec {i} output {pos} ({names[pos] or 'unnamed'})"
                if isinstance(want, TensorMeta):
                    self.assertIsInstance(out, DTensorSpec, where)
                    self.assertEqual(out.tensor_meta, want, where)
                else:
                    self.assertIsNone(out, where)

    def test_registries_hold_attention_ops(self) -> None:
        ops = registered_attention_ops()
        calls = attention_calls()
        print(f"attention ops in the registries: {[str(op) for op in ops]}")
        self.assertGreaterEqual(len(ops), 6)
        for op in ops:
            self.assertIn(op, calls, f"{op} is registered but attention_calls has no call of it")

    def test_planner_answers(self) -> None:
        """``get_op_strategy`` gives every tensor result a spec with its meta, on
        every mesh and for runtime-like and planner candidates."""
        propagator = DTensor._op_dispatcher.sharding_propagator
        calls = attention_calls()
        for op in registered_attention_ops():
            _, args, kwargs = calls[op]
            expected = expected_results(op, args, kwargs)
            for shape in OP_MESHES:
                for mode in QUERY_MODES:
                    with self.subTest(op=str(op), mesh=mesh_name(shape), mode=mode):
                        schema = strategy_schema(
                            self.mesh(shape), op, args, kwargs, mode_candidates(mode)
                        )
                        strategy = propagator.get_op_strategy(schema)
                        self.assertIsInstance(strategy, OpStrategy)
                        self.assertGreater(len(strategy.strategies), 0)
                        self.assert_every_tensor_result_placed(
                            op, strategy.strategies, expected
                        )
                        self.assert_contract(schema, strategy)

    def expand_rules(
        self, op: torch._ops.OpOverload, schema: OpSchema, mesh: DeviceMesh
    ) -> OpStrategy:
        """The op's registered single-dim rules, resolved by the harness as a rule
        author does (``author_rules``), expanded with no output metas."""
        info = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs[op]
        rules, n_outputs = author_rules(schema, info)
        return expand_to_full_mesh_op_strategy(
            mesh, schema, rules, input_index=n_outputs  # type: ignore[arg-type]
        )

    def test_utility_specs(self) -> None:
        """``expand_to_full_mesh_op_strategy`` over a registered single-dim rule, as a
        downstream author calls it, places the results the rule leaves ``None``."""
        calls = attention_calls()
        ops = [
            op for op in registered_attention_ops()
            if strategy_registry(op) == "single_dim"
            and strategy_contract.replicated_returns(op)
        ]
        if not ops:
            self.skipTest("this torch has no single-dim attention rule with RNG-state results")
        for op in ops:
            _, args, kwargs = calls[op]
            expected = expected_results(op, args, kwargs)
            for shape in OP_MESHES:
                with self.subTest(op=str(op), mesh=mesh_name(shape)):
                    mesh = self.mesh(shape)
                    schema = strategy_schema(mesh, op, args, kwargs, mode_candidates("planner"))
                    strategy = self.expand_rules(op, schema, mesh)
                    self.assert_every_tensor_result_placed(op, strategy.strategies, expected)
                    self.assert_contract(schema, strategy)

    def test_checker_rejects_none_for_rng_state(self) -> None:
        """C2: ``None`` for a tensor result no rule shards is a violation, but in the
        strategy DTensor's eager dispatch runs with."""
        op = aten._scaled_dot_product_efficient_attention.default
        _, args, kwargs = attention_calls()[op]
        mesh = self.mesh((4,))
        schema = strategy_schema(mesh, op, args, kwargs)
        expected = expected_results(op, args, kwargs)
        rep = (Replicate(),)
        inputs = [DTensorSpec(mesh, rep, tensor_meta=m) for m in args if isinstance(m, TensorMeta)]
        outputs = tuple(
            DTensorSpec(mesh, rep, tensor_meta=m) if pos < 2 else None
            for pos, m in enumerate(expected)
        )
        strategy = OpStrategy(
            [OpSpec(outputs, inputs, redistribute_cost=[[0.0]] * len(inputs))]
        )
        violations = strategy_contract.check_strategy_contract(schema, strategy, expected)
        self.assertEqual(
            [(v.clause, v.position) for v in violations], [("C2", "output 2"), ("C2", "output 3")]
        )
        self.assertEqual(
            strategy_contract.check_strategy_contract(
                schema, strategy, expected, eager_dispatch=True
            ),
            [],
        )

    def test_eager_matches_stock(self) -> None:
        """Eager forward, backward and autograd hand back what stock DTensor does."""
        python = stock_python(os.path.join(REPO_ROOT, ".venv-stock"))
        if python is None:
            self.skipTest(f"no stock torch interpreter (set ${STOCK_PYTHON_ENV})")
        built = eager_outcomes()
        stock = run_worker(python, stock=True)
        print(json.dumps(built, indent=1))
        self.assertEqual(sorted(built), sorted(stock))
        for key in built:
            self.assertEqual(built[key], stock[key], key)
            self.assertFalse(built[key][0].startswith("raised"), f"{key}: {built[key]}")
        # the RNG state of the efficient kernel is each rank's plain tensor, as on stock
        self.assertTrue(built["efficient (Shard(dim=0),)"][2].startswith("Tensor()"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == EAGER_FLAG:
        with open(sys.argv[2], "w") as f:
            json.dump(eager_outcomes(), f)
    else:
        run_tests()
