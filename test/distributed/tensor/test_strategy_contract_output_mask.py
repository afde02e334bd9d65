# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Ops whose ``bool[]`` mask argument leaves results out (the norm, convolution,
grid-sampler and attention backward ops), with every mask.

Autograd passes which inputs require grad as the mask, and the kernels may return
``None`` where shape inference computes a tensor (``native_batch_norm_backward``),
so C2 lets a masked-off result be ``None`` or placed (``masked_off_returns``).
The masked ops are the ones DTensor serves, found in its registries; each is run

* eagerly on DTensors (every rank simulated by LocalTensorMode), with and without
  ``requires_grad`` inputs, on a 1-D and a 2-D mesh: equal to plain torch, or
  failing where plain torch fails;
* as a planner query (``ShardingPropagator.get_op_strategy``), held to C1-C5.

Then two module cases on 2.14.1: batch norm fed a replicated input that does not
require grad (the change failed it), a convolution on a 2-D mesh whose
batch-sharded input does not require grad (stock fails it). Last, what DTensor's
eager dispatch does with a strategy the contract rejects: it runs wherever stock
DTensor runs (a planner query raises), and raises ``StrategyContractError`` where
stock fails anyway.
"""

import functools
import itertools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode
from torch.distributed.tensor import distribute_module, distribute_tensor, DTensor
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.strategy_contract import infer_output_metas
from torch.distributed.tensor.debug import _clear_sharding_prop_cache
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    mesh_name,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_ops_common import (
    sampled_planner_candidates,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema
from torch.utils import _pytree as pytree


aten = torch.ops.aten
EAGER_MESHES = ((4,), (2, 2))
# A planner's candidates: several per input (Replicate, Shard, Partial across mesh
# dims), few enough that tracing the decomposed ops stays quick.
PLANNER_CANDIDATES = capped_candidates(4)
N = 8  # the batch size of every sample: shards evenly over either mesh


def _propagator() -> Any:
    return DTensor._op_dispatcher.sharding_propagator


def _is_masked(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` takes a ``bool[]`` ``*mask`` saying which of its tensors to return."""
    returns = op._schema.returns
    return len(returns) > 1 and all(str(r.type) == "Tensor" for r in returns) and any(
        str(arg.type) == "List[bool]" and arg.name.endswith("mask")
        for arg in op._schema.arguments
    )


@functools.cache
def served_masked_ops() -> dict[str, torch._ops.OpOverload]:
    """The masked ops DTensor has a strategy for: registered, or decomposed."""
    from torch._decomp import decomposition_table

    p = _propagator()
    candidates = set(p.op_strategy_funcs) | set(p.op_single_dim_strategy_funcs)
    candidates |= set(p.op_to_rules)
    candidates |= {
        op
        for op in decomposition_table
        if isinstance(op, torch._ops.OpOverload) and DecompShardingStrategy.has_decomp(op)
    }
    return {
        str(op): op
        for op in candidates
        if isinstance(op, torch._ops.OpOverload)
        and op.namespace == "aten"
        and _is_masked(op)
    }


# ---------------------------------------------------------------------------
# Samples: the op's arguments for a mask, from its forward on CPU
# ---------------------------------------------------------------------------


def _batch_norm(train: bool) -> Callable[[list[bool]], tuple]:
    def args(mask: list[bool]) -> tuple:
        x, w = torch.randn(N, 3, 4), torch.randn(3)
        rm, rv = torch.randn(3), torch.rand(3) + 0.5
        _, mean, invstd = aten.native_batch_norm(x, w, None, rm.clone(), rv.clone(), train, 0.1, 1e-5)
        return (torch.randn_like(x), x, w, rm, rv, mean, invstd, train, 1e-5, mask)

    return args


def _batch_norm_update(train: bool) -> Callable[[list[bool]], tuple]:
    def args(mask: list[bool]) -> tuple:
        x, w = torch.randn(N, 3, 4), torch.randn(3)
        rm, rv = torch.randn(3), torch.rand(3) + 0.5
        if train:
            _, mean, invstd, reserve = aten._batch_norm_with_update(
                x, w, None, rm.clone(), rv.clone(), 0.1, 1e-5
            )
        else:
            _, mean, invstd, reserve = aten._batch_norm_no_update(x, w, None, rm, rv, 0.1, 1e-5)
        return (torch.randn_like(x), x, w, rm, rv, mean, invstd, train, 1e-5, mask, reserve)

    return args


def _layer_norm(mask: list[bool]) -> tuple:
    x, w, b = torch.randn(N, 6), torch.randn(6), torch.randn(6)
    _, mean, rstd = aten.native_layer_norm(x, [6], w, b, 1e-5)
    return (torch.randn_like(x), x, [6], mean, rstd, w, b, mask)


def _group_norm(mask: list[bool]) -> tuple:
    x, w, b = torch.randn(N, 6, 5), torch.randn(6), torch.randn(6)
    _, mean, rstd = aten.native_group_norm(x, w, b, N, 6, 5, 2, 1e-5)
    return (torch.randn_like(x), x, mean, rstd, w, N, 6, 5, 2, mask)


def _rms_norm(mask: list[bool]) -> tuple:
    x, w = torch.randn(N, 6), torch.randn(6)
    _, rstd = aten._fused_rms_norm(x, [6], w, 1e-5)
    return (torch.randn_like(x), x, [6], rstd, w, mask)


def _convolution(mask: list[bool]) -> tuple:
    x, w = torch.randn(N, 3, 6, 6), torch.randn(4, 3, 3, 3)
    conv = ([4], [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    return (torch.randn(N, 4, 4, 4), x, w, *conv, mask)


def _grid_sampler(dims: int) -> Callable[[list[bool]], tuple]:
    def args(mask: list[bool]) -> tuple:
        x = torch.randn(N, 2, *([4] * dims))
        grid = torch.rand(N, *([3] * dims), dims) * 2 - 1
        return (torch.randn(N, 2, *([3] * dims)), x, grid, 0, 0, False, mask)

    return args


def _efficient_attention(mask: list[bool]) -> tuple:
    q, k, v, out, grad = (torch.randn(2, 4, 8, 16) for _ in range(5))
    bias, lse = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 32)
    seed = offset = torch.zeros((), dtype=torch.int64)
    return (grad, q, k, v, bias, out, lse, seed, offset, 0.0, mask)


# Samples per masked op, by variant (``.out`` overloads take the ``.default``
# sample plus out tensors).
SAMPLES: dict[str, dict[str, Callable[[list[bool]], tuple]]] = {
    "native_batch_norm_backward": {"train": _batch_norm(True), "eval": _batch_norm(False)},
    "batch_norm_backward": {"train": _batch_norm_update(True), "eval": _batch_norm_update(False)},
    "native_layer_norm_backward": {"": _layer_norm},
    "native_group_norm_backward": {"": _group_norm},
    "_fused_rms_norm_backward": {"": _rms_norm},
    "convolution_backward": {"": _convolution},
    "grid_sampler_2d_backward": {"": _grid_sampler(2)},
    "grid_sampler_3d_backward": {"": _grid_sampler(3)},
    "_scaled_dot_product_efficient_attention_backward": {"": _efficient_attention},
}
MASKED_OP_NAMES = tuple(
    f"aten.{name}.{overload}"
    for name in SAMPLES
    if hasattr(aten, name)
    for overload in getattr(aten, name).overloads()
)


def _sample(op: torch._ops.OpOverload, variant: str, mask: list[bool]) -> tuple[tuple, dict]:
    """``op``'s arguments for ``mask`` (an ``.out`` overload writes into fresh tensors
    shaped like the ``.default`` results; a left-out result gets an empty one)."""
    args = SAMPLES[op.__name__.split(".")[0]][variant](mask)
    kwargs: dict[str, torch.Tensor] = {}
    outs = [a.name for a in op._schema.arguments if a.is_out]
    if outs:
        results = op.overloadpacket.default(*args)
        for out_name, result in zip(outs, results):
            kwargs[out_name] = torch.empty(0) if result is None else torch.empty_like(result)
    return args, kwargs


def _variants(op: torch._ops.OpOverload) -> list[str]:
    return list(SAMPLES[op.__name__.split(".")[0]])


def _masks(op: torch._ops.OpOverload) -> list[list[bool]]:
    return [list(m) for m in itertools.product((False, True), repeat=len(op._schema.returns))]


def _mask_label(mask: list[bool]) -> str:
    return "".join("T" if m else "F" for m in mask)


def _served(test: StrategyContractTestBase, qualified: str) -> torch._ops.OpOverload:
    """The op DTensor serves by that name, or skip naming what this torch lacks."""
    op = served_masked_ops().get(qualified)
    if op is None:
        test.skipTest(f"this torch has no DTensor strategy for {qualified}")
    return op


def _requiring_grad(args: tuple, requires_grad: bool) -> tuple:
    """Fresh ``args``; with ``requires_grad`` the incoming gradient and the forward
    input (the first two tensors) require grad, as in a double backward."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)][:2]
    return tuple(
        a.detach().clone().requires_grad_(requires_grad and i in tensors)
        if isinstance(a, torch.Tensor)
        else a
        for i, a in enumerate(args)
    )


def _rank_values(x: object) -> list[object] | None:
    """``x``'s full value on each rank (one entry for a plain value), ``None`` for ``None``."""
    if x is None:
        return None
    if isinstance(x, DTensor):
        x = x.full_tensor()
    if isinstance(x, LocalTensor):
        return [x._local_tensors[r] for r in sorted(x._local_tensors)]
    return [x]


def _outcome(fn: Callable[[], object]) -> object:
    """What ``fn`` returns, or the exception it raises."""
    try:
        return fn()
    except Exception as e:
        return e


def _no_kernel(outcome: object) -> bool:
    """Whether ``outcome`` says the op has no kernel for CPU tensors."""
    return isinstance(outcome, NotImplementedError) and "Could not run" in str(outcome)


def _kernel_rejects(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    outcome = _outcome(lambda: op(*args, **{k: v.clone() for k, v in kwargs.items()}))
    return isinstance(outcome, Exception) and not _no_kernel(outcome)


class TestMaskedOps(StrategyContractTestBase):
    def test_every_served_masked_op_has_a_sample(self) -> None:
        """A masked op DTensor starts serving needs a sample here."""
        served = served_masked_ops()
        self.assertIn("aten.native_batch_norm_backward.default", served)
        self.assertEqual(set(served) - set(MASKED_OP_NAMES), set())

    @parametrize("name", MASKED_OP_NAMES)
    def test_planner_query_every_mask(self, name: str) -> None:
        op = _served(self, name)
        for variant, shape, mask in itertools.product(_variants(op), EAGER_MESHES, _masks(op)):
            with self.subTest(variant=variant, mesh=shape, mask=_mask_label(mask)):
                args, kwargs = _sample(op, variant, mask)
                schema = strategy_schema(self.mesh(shape), op, args, kwargs, PLANNER_CANDIDATES)
                metas = _outcome(lambda: infer_output_metas(schema))
                if isinstance(metas, Exception):
                    # a call shape inference rejects: the planner gets that error
                    with self.assertRaises(type(metas)):
                        _propagator().get_op_strategy(schema)
                    continue
                strategy = _outcome(lambda: _propagator().get_op_strategy(schema))
                if isinstance(strategy, Exception) and _kernel_rejects(op, args, kwargs):
                    # a call every kernel rejects (an ``.out`` overload with a result
                    # masked off has nothing to write) needs no answer
                    continue
                self.assert_contract(schema, strategy, metas)

    @parametrize("shape", EAGER_MESHES, name_fn=mesh_name)
    @parametrize("name", MASKED_OP_NAMES)
    def test_eager_every_mask(self, name: str, shape: tuple[int, ...]) -> None:
        """Replicated inputs, as DTensor's data-parallel modules see them."""
        op = _served(self, name)
        mesh = self.mesh(shape)
        ran = 0
        for variant, mask, requires_grad in itertools.product(
            _variants(op), _masks(op), (False, True)
        ):
            args, outs = _sample(op, variant, mask)

            def fresh() -> tuple[tuple, dict]:
                return _requiring_grad(args, requires_grad), {k: v.clone() for k, v in outs.items()}

            plain_args, plain_outs = fresh()
            expected = _outcome(lambda: op(*plain_args, **plain_outs))
            if _no_kernel(expected):
                continue  # the fused RMS norm, the efficient attention
            with self.subTest(variant=variant, mask=_mask_label(mask), requires_grad=requires_grad):
                ran += 1
                if isinstance(expected, Exception) or self.unplaceable(op, args, outs, mesh):
                    with self.assertRaises(Exception):
                        self.run_eager(op, *fresh(), mesh)
                    continue
                got = self.run_eager(op, *fresh(), mesh)
                self.assertEqual(len(got), len(expected))
                for pos, (per_rank, want) in enumerate(zip(got, expected)):
                    if want is None:
                        self.assertIsNone(per_rank, f"output {pos}")
                        continue
                    self.assertIsNotNone(per_rank, f"output {pos}")
                    for rank, value in enumerate(per_rank):
                        self.assertEqual(value, want, msg=f"output {pos}, rank {rank}")
        if ran == 0:
            self.skipTest(f"{name} has no CPU kernel in this torch")

    def unplaceable(
        self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, mesh: Any
    ) -> bool:
        """Whether shape inference rejects the call, or the kernel computes a result
        shape inference leaves out (CPU convolution on its mkldnn path computes
        ``grad_weight`` along with ``grad_bias``): DTensor has no spec for such a
        result and fails, as it always has."""
        default = op.overloadpacket.default
        metas = _outcome(lambda: infer_output_metas(strategy_schema(mesh, op, args, kwargs)))
        if isinstance(metas, Exception):
            return True
        default_metas = infer_output_metas(strategy_schema(mesh, default, args))
        results = default(*args)
        return any(m is None and r is not None for m, r in zip(default_metas, results))

    def run_eager(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict, mesh: Any) -> list:
        """``op`` on replicated DTensors of ``args``: each result's value on every rank."""
        with LocalTensorMode(frozenset(range(mesh.size()))):
            dargs, dkwargs = pytree.tree_map_only(
                torch.Tensor,
                lambda t: distribute_tensor(t, mesh, [Replicate()] * mesh.ndim),
                (args, kwargs),
            )
            return [_rank_values(x) for x in op(*dargs, **dkwargs)]


class TestMaskedModules(StrategyContractTestBase):
    """Modules whose input does not require grad, against plain torch."""

    def run_module(
        self, module: nn.Module, x: torch.Tensor, shape: tuple[int, ...], placements: list[Placement]
    ) -> None:
        expected = module(x).sum()
        expected.backward()
        want = {name: p.grad for name, p in module.named_parameters()}
        module.zero_grad(set_to_none=True)
        mesh = self.mesh(shape)
        with LocalTensorMode(frozenset(range(mesh.size()))):
            dmodule = distribute_module(module, mesh)
            dx = distribute_tensor(x, mesh, placements)  # does not require grad
            out = dmodule(dx).sum()
            out.backward()
            got_out = _rank_values(out)
            got = {name: _rank_values(p.grad) for name, p in dmodule.named_parameters()}
        for rank_value in got_out:
            self.assertEqual(rank_value, expected.detach())
        self.assertEqual(set(got), set(want))
        for name, per_rank in got.items():
            for rank, value in enumerate(per_rank):
                self.assertEqual(value, want[name], msg=f"{name}.grad, rank {rank}")

    def test_batch_norm_replicated_input_without_grad(self) -> None:
        """grad_input is masked off: the kernel returns None, the decomposition
        shape inference runs computes it (the change raised on 2.14.1)."""
        self.run_module(nn.BatchNorm1d(3), torch.randn(N, 3), (4,), [Replicate()])

    def test_convolution_sharded_input_without_grad_2d_mesh(self) -> None:
        """Stock 2.14.1 raises ``strategy position 0 mixes None with placements across
        mesh dims`` (grad_input is masked off on one mesh dim of the rule only)."""
        self.run_module(
            nn.Conv2d(3, 4, 3), torch.randn(N, 3, 6, 6), (2, 2), [Shard(0), Replicate()]
        )


def _given(op_schema: OpSchema, mesh: Any = None) -> DTensorSpec:
    """A replicated spec on input 0's mesh (or on ``mesh``)."""
    mesh = mesh or op_schema.args_schema[0].strategies[0].output_spec.mesh
    return DTensorSpec(mesh, (Replicate(),) * mesh.ndim)


# A strategy giving one OpSpec the finalizer cannot reconcile: (test op, the OpSpec
# for the query's schema and another mesh, whether stock DTensor's eager dispatch
# runs with it). Stock hands back a 0-d result it has no spec for as a plain tensor
# and a None result as None, ignores input specs past the positional tensors and
# never moves a keyword tensor; anything else it fails on.
BAD_SPECS: dict[str, tuple[str, Callable[[OpSchema, Any], OpSpec], bool]] = {
    "None for a 0-d result": ("scalar", lambda o, m: OpSpec(None, [_given(o)]), True),
    "None where the kernel returns None": (
        "second_none", lambda o, m: OpSpec((_given(o), None), [_given(o)]), True
    ),
    "an input spec too many": ("one", lambda o, m: OpSpec(_given(o), [_given(o)] * 2), True),
    "no spec for a keyword tensor": ("keyword", lambda o, m: OpSpec(_given(o), [_given(o)]), True),
    "output on another mesh": ("one", lambda o, m: OpSpec(_given(o, m), [_given(o)]), True),
    "three outputs for two results": ("two", lambda o, m: OpSpec((_given(o),) * 3, [_given(o)]), False),
    "no output specs for two results": ("two", lambda o, m: OpSpec(None, [_given(o)]), False),
    "no input specs for two results": ("two", lambda o, m: OpSpec((_given(o),) * 2), False),
    "no input spec": ("one", lambda o, m: OpSpec(_given(o), []), False),
    "None for a positional input": ("one", lambda o, m: OpSpec(_given(o), [None]), False),
}


class TestEagerUsesWhatStockRuns(StrategyContractTestBase):
    """A strategy the contract cannot hold: a planner's query raises; DTensor's eager
    dispatch runs with it wherever stock DTensor does, and raises
    ``StrategyContractError`` where stock fails anyway."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        lib = cls.enterClassContext(torch.library._scoped_library("output_mask_test", "DEF"))
        lib.define("one(Tensor x) -> Tensor")
        lib.define("scalar(Tensor x) -> Tensor")
        lib.define("two(Tensor x) -> (Tensor, Tensor)")
        lib.define("second_none(Tensor x) -> (Tensor, Tensor)")
        lib.define("keyword(Tensor x, *, Tensor? w=None) -> Tensor")
        lib.impl("one", lambda x: x.clone(), "CompositeExplicitAutograd")
        lib.impl("scalar", lambda x: x.sum(), "CompositeExplicitAutograd")
        lib.impl("two", lambda x: (x.clone(), 2 * x), "CompositeExplicitAutograd")
        # the meta computes the second result, the kernel leaves it out
        lib.impl("second_none", lambda x: (x.clone(), None), "CompositeExplicitAutograd")
        lib.impl("second_none", lambda x: (torch.empty_like(x), torch.empty_like(x)), "Meta")
        lib.impl("keyword", lambda x, w=None: x + w, "CompositeExplicitAutograd")

    def register(self, op: Any, make: Callable[[OpSchema, Any], OpSpec]) -> None:
        p = _propagator()
        other_mesh = self.mesh((2, 2))
        p.register_op_strategy(op, lambda op_schema: OpStrategy([make(op_schema, other_mesh)]))

        def unregister() -> None:
            p.op_strategy_funcs.pop(op, None)
            p.op_to_schema_info.pop(op, None)
            _clear_sharding_prop_cache()

        self.addCleanup(unregister)
        _clear_sharding_prop_cache()

    @parametrize("case", tuple(BAD_SPECS))
    def test_eager_runs_where_stock_runs(self, case: str) -> None:
        name, make, stock_runs = BAD_SPECS[case]
        op = getattr(torch.ops.output_mask_test, name).default
        self.register(op, make)
        mesh = self.mesh((4,))
        x, w = torch.randn(3, 5), torch.randn(5)
        kwargs = {"w": w} if name == "keyword" else {}
        schema = strategy_schema(mesh, op, (x,), kwargs, sampled_planner_candidates)
        with self.assertRaises(StrategyContractError):
            _propagator().get_op_strategy(schema)

        def replicated(t: torch.Tensor) -> DTensor:
            return DTensor.from_local(t, mesh, [Replicate()], run_check=False)

        dkwargs = {k: replicated(v) for k, v in kwargs.items()}
        if not stock_runs:
            with self.assertRaises(RuntimeError) as ctx:
                op(replicated(x), **dkwargs)
            cause: BaseException | None = ctx.exception
            while cause is not None and not isinstance(cause, StrategyContractError):
                cause = cause.__cause__
            self.assertIsInstance(cause, StrategyContractError, str(ctx.exception))
            return
        expected = op(x, **kwargs)
        got = op(replicated(x), **dkwargs)
        pairs = zip(got, expected) if isinstance(expected, tuple) else [(got, expected)]
        for g, want in pairs:
            if want is None:
                self.assertIsNone(g)
            else:
                self.assertEqual(g.to_local() if isinstance(g, DTensor) else g, want)

    def test_none_for_a_computed_result_fails_as_on_stock(self) -> None:
        """A ``None`` spec for a non-scalar result the kernel computes: DTensor's
        wrapping refuses a tensor it has no spec for, as it always has."""
        op = torch.ops.output_mask_test.one.default
        self.register(op, lambda o, m: OpSpec(None, [_given(o)]))
        x = DTensor.from_local(torch.randn(3, 5), self.mesh((4,)), [Replicate()], run_check=False)
        with self.assertRaisesRegex(AssertionError, "output tensor should be scalar"):
            op(x)


instantiate_parametrized_tests(TestMaskedOps)
instantiate_parametrized_tests(TestEagerUsesWhatStockRuns)


if __name__ == "__main__":
    run_tests()
