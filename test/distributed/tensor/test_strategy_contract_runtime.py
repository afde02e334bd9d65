# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
DTensor's eager runtime once every strategy is finalized.

Finalizing strategies on their way out of the registry must neither slow down
DTensor's eager path nor change what it computes or selects:

* TestShapeInferenceCount: a runtime sharding query runs shape inference once, a
  query answered from a sharding-propagation cache runs none, and direct registry
  calls (what a planner does) run it at most once per distinct schema.

Everything runs on the harness's fake process group (collectives are no-ops). Eager
results equal to plain torch and runtime selections equal to stock's:
test_strategy_contract_eager.py.
"""

import contextlib
import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor._decompositions import DecompShardingStrategy
from torch.distributed.tensor._op_schema import OpSchema
from torch.distributed.tensor._ops import strategy_contract
from torch.distributed.tensor._ops.single_dim_strategy import (
    _expand_single_dim_strategy_to_mesh,
)
from torch.distributed.tensor._ops.strategy_contract import op_has_tensor_returns
from torch.distributed.tensor._sharding_prop import ShardingPropagator
from torch.distributed.tensor.debug import (
    _clear_sharding_prop_cache,
    _get_fast_path_sharding_prop_cache_stats,
)
from torch.distributed.tensor.placement_types import (
    Partial,
    Placement,
    Replicate,
    Shard,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
    meta_of,
    op_strategy,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    answered_by,
    ops_by_registry,
    query_strategy,
    REGISTRIES,
    strategy_schema,
)
from torch.utils import _pytree as pytree


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


@functools.cache
def _opinfos() -> dict[tuple[str, str], Any]:
    # Imported on first use: loading op_db takes seconds.
    from torch.testing._internal.common_methods_invocations import op_db

    return {(o.name, o.variant_test_name): o for o in op_db}


# ---------------------------------------------------------------------------
# Counting shape inference
# ---------------------------------------------------------------------------


@dataclass
class InferenceCounts:
    # Strategy or runtime schemas shape inference ran on (ops with tensor returns).
    inferred: list[OpSchema] = field(default_factory=list)
    # Runtime sharding queries propagated without a cache hit.
    queries: list[OpSchema] = field(default_factory=list)

    def inferred_ops(self) -> Counter[str]:
        return Counter(str(s.op) for s in self.inferred)

    def queried_ops_with_tensor_returns(self) -> Counter[str]:
        return Counter(str(s.op) for s in self.queries if op_has_tensor_returns(s.op))


def _modules_binding(func: Callable[..., Any]) -> list[Any]:
    """Every loaded module whose namespace holds ``func`` itself."""
    name = func.__name__
    return [
        module
        for module in list(sys.modules.values())
        if module is not None and vars(module).get(name) is func
    ]


@contextlib.contextmanager
def count_inferences(propagator: ShardingPropagator) -> Iterator[InferenceCounts]:
    """Count shape inferences and uncached runtime sharding queries.

    Shape inference is counted at ``strategy_contract.infer_output_metas``, the one
    function that runs an op on fake tensors for output metadata. Callers import it
    by name: ``_output_metas`` at module import, ``_sharding_prop`` lazily inside
    ``_propagate_tensor_meta_non_cached`` (which reads the ``strategy_contract``
    attribute at call time), the test harness at import. Patching a single module
    attribute would miss the by-name bindings, so every loaded module whose namespace
    binds the original function is patched. Counting ``FakeTensorMode`` entries was
    rejected: one inference enters fake mode twice for ``aten.t`` and four times for
    ``aten._to_copy`` (nested entries inside the fake tensor machinery), identically
    on stock torch, so entries do not map to inferences.

    Calls for ops without tensor returns are not counted: ``infer_output_metas``
    returns ``None`` for them without running the op.

    Runtime queries are counted at the propagator's ``_propagate_tensor_meta_non_cached``,
    which ``propagate_op_sharding_non_cached`` calls exactly once per query, on stock
    and patched torch alike; patching the instance attribute intercepts it.
    """
    original = strategy_contract.infer_output_metas
    counts = InferenceCounts()

    def counting_infer(op_schema: OpSchema, *args: Any, **kwargs: Any) -> Any:
        if op_has_tensor_returns(op_schema.op):
            counts.inferred.append(op_schema)
        return original(op_schema, *args, **kwargs)

    original_query = propagator._propagate_tensor_meta_non_cached

    def counting_query(op_schema: OpSchema) -> Any:
        counts.queries.append(op_schema)
        return original_query(op_schema)

    modules = _modules_binding(original)
    if strategy_contract not in modules:
        raise AssertionError("strategy_contract.infer_output_metas is already patched")
    with contextlib.ExitStack() as stack:
        for module in modules:
            stack.enter_context(
                mock.patch.object(module, "infer_output_metas", counting_infer)
            )
        stack.enter_context(
            mock.patch.object(
                propagator, "_propagate_tensor_meta_non_cached", counting_query
            )
        )
        yield counts


def clear_sharding_caches(propagator: ShardingPropagator) -> None:
    """Forget every cached sharding decision and output meta."""
    # Python LRU cache of propagate_op_sharding and the C++ fast-path cache.
    _clear_sharding_prop_cache()
    propagator.propagate_op_sharding.cache_clear()
    cached_meta = getattr(propagator, "_propagate_tensor_meta_cached", None)
    if cached_meta is not None and hasattr(cached_meta, "cache_clear"):
        cached_meta.cache_clear()
    # The output-meta cache for direct registry calls, if this torch has one.
    finalize = sys.modules.get("torch.distributed.tensor._ops._output_metas")
    meta_cache = getattr(finalize, "_meta_cache", None)
    if meta_cache is not None:
        meta_cache.clear()


def _propagator() -> ShardingPropagator:
    return DTensor._op_dispatcher.sharding_propagator


# A DTensor factory: global shape, placements, dtype.
MakeDTensor = Callable[..., DTensor]

# Eager cases: name -> (op, args builder); together they reach every registry.
EAGER_CASES: dict[
    str, tuple[torch._ops.OpOverload, Callable[[MakeDTensor], tuple[tuple, dict]]]
] = {
    "t": (aten.t.default, lambda dt: ((dt((8, 6), S0, R),), {})),
    "sum_dim": (
        aten.sum.dim_IntList,
        lambda dt: ((dt((8, 6), S0, S1), [1]), {}),
    ),
    "view": (
        aten.view.default,
        lambda dt: ((dt((8, 6), S0, R), [4, 12]), {}),
    ),
    "mm": (
        aten.mm.default,
        lambda dt: ((dt((8, 6), S0, R), dt((6, 4), R, S1)), {}),
    ),
    "add": (
        aten.add.Tensor,
        lambda dt: ((dt((8, 6), S0, R), dt((8, 6), R, S1)), {}),
    ),
    "to_copy": (
        aten._to_copy.default,
        lambda dt: ((dt((8, 6), S0, P),), {"dtype": torch.float64}),
    ),
    "max_dim": (
        aten.max.dim,
        lambda dt: ((dt((8, 6), S0, S1), 1), {}),
    ),
    "foreach_add": (
        aten._foreach_add.List,
        lambda dt: (
            ([dt((8, 6), S0, R), dt((4,), R, R)], [dt((8, 6), R, S1), dt((4,), S0, R)]),
            {},
        ),
    ),
    "hardswish": (
        aten.hardswish.default,
        lambda dt: ((dt((8, 6), S0, S1),), {}),
    ),
    "mv": (
        aten.mv.default,
        lambda dt: ((dt((8, 6), S0, S1), dt((6,), S0, R)), {}),
    ),
}


class TestShapeInferenceCount(StrategyContractTestBase):
    def setUp(self) -> None:
        super().setUp()
        self.m = self.mesh((2, 2))
        self.p = _propagator()

    def dt(
        self, shape: Sequence[int], *placements: Placement, dtype: torch.dtype = torch.float32
    ) -> DTensor:
        """A DTensor on the 2x2 mesh (values are irrelevant: the PG is fake)."""
        full = torch.randn(shape).to(dtype)
        no_partial = [R if p.is_partial() else p for p in placements]
        base = distribute_tensor(full, self.m, no_partial)
        return DTensor.from_local(
            base.to_local(),
            self.m,
            placements,
            run_check=False,
            shape=base.shape,
            stride=base.stride(),
        )

    def test_eager_cases_cover_every_registry(self) -> None:
        """Releases move ops between registries; the cases must still reach each."""
        reached = ops_by_registry(op for op, _ in EAGER_CASES.values())
        self.assertEqual(set(reached), set(REGISTRIES), f"the cases by registry: {reached}")

    @parametrize("case", list(EAGER_CASES))
    def test_one_inference_per_runtime_query(self, case: str) -> None:
        """A cache miss infers once per sharding query; a repeat infers nothing.

        Decomposition-derived ops propagate their decomposition's ops as separate
        (cached) queries while tracing; each query still infers exactly once.
        """
        op, make_args = EAGER_CASES[case]
        args, kwargs = make_args(self.dt)
        clear_sharding_caches(self.p)

        with count_inferences(self.p) as first:
            op(*args, **kwargs)
        self.assertEqual(
            sum(1 for q in first.queries if q.op == op), 1, "the op was queried once"
        )
        self.assertEqual(
            len(set(first.queries)),
            len(first.queries),
            "a sharding query was propagated twice despite the cache",
        )
        # One inference per query and no other: the finalizer reuses the metas.
        self.assertEqual(
            dict(first.inferred_ops()),
            dict(first.queried_ops_with_tensor_returns()),
            "shape inferences (left) differ from the sharding queries (right)",
        )
        self.assertEqual(first.inferred_ops()[str(op)], 1, f"inferences: {first.inferred_ops()}")

        fast_before = _get_fast_path_sharding_prop_cache_stats()
        python_before = self.p.propagate_op_sharding.cache_info()
        with count_inferences(self.p) as second:
            op(*args, **kwargs)
        fast_after = _get_fast_path_sharding_prop_cache_stats()
        python_after = self.p.propagate_op_sharding.cache_info()
        self.assertEqual(second.queries, [], "the repeat was propagated again")
        self.assertEqual(second.inferred, [], "the repeat ran shape inference")
        # Eager repeats are answered by the C++ fast-path cache, which subsumes the
        # Python one (whose hits therefore stay put, on stock torch too).
        hits = (fast_after[0] - fast_before[0]) + (python_after.hits - python_before.hits)
        self.assertGreaterEqual(hits, 1, "the repeat did not hit a sharding cache")

    @parametrize("case", ["t", "mm", "max_dim", "foreach_add", "hardswish"])
    def test_python_sharding_cache_still_hits(self, case: str) -> None:
        """``propagate_op_sharding``'s own LRU cache answers a repeated query."""
        op, make_args = EAGER_CASES[case]
        args, kwargs = make_args(self.dt)
        schema = DTensor._op_dispatcher.unwrap_to_op_info(op, args, kwargs).schema
        clear_sharding_caches(self.p)
        with count_inferences(self.p) as first:
            expected = self.p.propagate_op_sharding(schema)
        self.assertEqual(first.inferred_ops()[str(op)], 1)
        before = self.p.propagate_op_sharding.cache_info()
        with count_inferences(self.p) as second:
            got = self.p.propagate_op_sharding(schema)
        after = self.p.propagate_op_sharding.cache_info()
        self.assertEqual(after.hits - before.hits, 1)
        self.assertEqual(after.misses, before.misses)
        self.assertEqual(second.inferred, [])
        self.assertIs(got, expected)

    # ---- direct registry calls (what a planner does) ----

    def planner_schema(
        self,
        op: torch._ops.OpOverload,
        shapes: Sequence[Sequence[int]],
        *rest: object,
        n_candidates: int | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> OpSchema:
        """A fresh strategy schema: one input per shape with planner candidates."""
        inputs = []
        for shape in shapes:
            meta = meta_of(torch.empty(shape, dtype=dtype))
            candidates = planner_candidates(self.m, meta)[:n_candidates]
            inputs.append(op_strategy(self.m, meta, *candidates))
        return OpSchema(op, (*inputs, *rest), {})

    def assert_inferences(
        self, op: torch._ops.OpOverload, expected: int, call: Callable[[], object]
    ) -> object:
        """Run ``call`` and check it inferred ``op``'s outputs ``expected`` times."""
        with count_inferences(self.p) as counts:
            result = call()
        self.assertEqual(counts.inferred_ops()[str(op)], expected, counts.inferred_ops())
        return result

    def test_registry_call_infers_once_per_schema(self) -> None:
        # A registered op strategy, and two values of its non-tensor argument
        # giving different output metas.
        op, arg, other = answered_by(
            "op_strategy",
            [(aten.sum.dim_IntList, [0], [1]), (aten.unsqueeze.default, 0, 1)],
        )
        func = self.p.op_strategy_funcs[op]
        clear_sharding_caches(self.p)
        self.assert_inferences(op, 1, lambda: func(self.planner_schema(op, [(8, 6)], arg)))
        # An equal schema (a distinct object) is answered from the finalizer's cache.
        self.assert_inferences(op, 0, lambda: func(self.planner_schema(op, [(8, 6)], arg)))
        # Other candidates for the same metas: the output metas are the same.
        self.assert_inferences(
            op, 0, lambda: func(self.planner_schema(op, [(8, 6)], arg, n_candidates=3))
        )
        # A different input meta or non-tensor argument infers again.
        self.assert_inferences(op, 1, lambda: func(self.planner_schema(op, [(8, 4)], arg)))
        self.assert_inferences(op, 1, lambda: func(self.planner_schema(op, [(8, 6)], other)))
        strategy = func(self.planner_schema(op, [(8, 4)], arg))
        self.assert_contract(self.planner_schema(op, [(8, 4)], arg), strategy)

    def test_single_dim_expansion_infers_once_per_schema(self) -> None:
        op = aten.mm.default
        info = self.p.op_single_dim_strategy_funcs[op]

        def query(shapes: Sequence[Sequence[int]]) -> object:
            schema = self.planner_schema(op, shapes)
            expand = _expand_single_dim_strategy_to_mesh(self.m, schema, info, None)
            return expand(op, schema.args_meta, schema.kwargs_meta)

        clear_sharding_caches(self.p)
        self.assert_inferences(op, 1, lambda: query([(8, 6), (6, 4)]))
        self.assert_inferences(op, 0, lambda: query([(8, 6), (6, 4)]))
        self.assert_inferences(op, 1, lambda: query([(8, 6), (6, 8)]))
        self.assert_contract(self.planner_schema(op, [(8, 6), (6, 8)]), query([(8, 6), (6, 8)]))

    def test_decomposition_query_infers_once_per_schema(self) -> None:
        op = answered_by("decomposition", [aten.hardswish.default])
        self.p.decomp_strategy.ensure_schema_info(op)

        def query(shape: Sequence[int]) -> object:
            return self.p.decomp_strategy.propagate_strategy(self.planner_schema(op, [shape]))

        clear_sharding_caches(self.p)
        self.assert_inferences(op, 1, lambda: query((8, 6)))
        # The decomposition's own queries hit the sharding cache on a repeat too.
        with count_inferences(self.p) as repeat:
            query((8, 6))
        self.assertEqual(repeat.inferred, [])
        self.assert_inferences(op, 1, lambda: query((8, 4)))
        self.assert_contract(self.planner_schema(op, [(8, 4)]), query((8, 4)))

    # 2 == 2.0 (as True == 1) in Python, so a cache keyed on plain equality of the
    # non-tensor args would reuse int64 for add.Tensor(int64, 2.0) (C1).
    def test_registry_cache_distinguishes_scalar_types(self) -> None:
        op = aten.add.Tensor
        info = self.p.op_single_dim_strategy_funcs[op]
        clear_sharding_caches(self.p)
        # int64 + 2 is int64, int64 + 2.0 is float32.
        for scalar in (2, 2.0):
            schema = self.planner_schema(op, [(8, 6)], scalar, dtype=torch.int64)
            expand = _expand_single_dim_strategy_to_mesh(self.m, schema, info, None)
            strategy = expand(op, schema.args_meta, schema.kwargs_meta)
            self.assert_contract(schema, strategy)


# ---------------------------------------------------------------------------
# Decomposition-derived strategies: what eager dispatch traces
# ---------------------------------------------------------------------------

# Decomposition-only ops whose tensor-list argument eager dispatch does not flatten
# (their schema info has no needs_pytree): stock torch 2.13.0 traces combinations of
# placements for each call and then gives up, so no trace can help; planners, which
# flatten the lists, get an answer.
LIST_ARG_DECOMPOSITION_OPS: tuple[str, ...] = (
    "_unsafe_masked_index",
    "_unsafe_masked_index_put_accumulate",
)


class TestDecompositionTraceBound(StrategyContractTestBase):
    """Eager dispatch must never trace a decomposition more than stock does."""

    def sample_args(self, name: str) -> tuple[torch._ops.OpOverload, tuple, dict]:
        opinfo = _opinfos()[(name, "")]
        sample = next(iter(opinfo.sample_inputs("cpu", torch.float32)))
        op = getattr(aten, name).default
        return op, (sample.input, *sample.args), dict(sample.kwargs)

    @parametrize("name", LIST_ARG_DECOMPOSITION_OPS)
    def test_eager_list_arguments_trace_nothing(self, name: str) -> None:
        op, args, kwargs = self.sample_args(name)
        answered_by("decomposition", [op])
        p = _propagator()
        mesh = self.mesh((4,))
        traced = mock.patch.object(
            DecompShardingStrategy,
            "_propagate_through_decomp",
            autospec=True,
            side_effect=DecompShardingStrategy._propagate_through_decomp,
        )
        for placement in (R, S0):
            with self.subTest(placement=str(placement)):
                clear_sharding_caches(p)

                def distribute(t: torch.Tensor) -> DTensor:
                    shardable = t.dim() > 0 and t.shape[0] % mesh.size() == 0
                    return distribute_tensor(t, mesh, [placement if shardable else R])

                dargs, dkwargs = pytree.tree_map_only(torch.Tensor, distribute, (args, kwargs))
                with traced as trace, self.assertRaisesRegex(NotImplementedError, str(op)):
                    op(*dargs, **dkwargs)
                self.assertEqual(trace.call_count, 0)

    @parametrize("name", LIST_ARG_DECOMPOSITION_OPS)
    def test_planner_query_reaches_list_arguments(self, name: str) -> None:
        op, args, kwargs = self.sample_args(name)
        mesh = self.mesh((4,))
        schema = strategy_schema(mesh, op, args, kwargs, capped_candidates(4))
        strategy = query_strategy(schema, mesh)
        self.assertIsNotNone(strategy, f"no planner strategy for {op}")
        self.assert_contract(schema, strategy)


instantiate_parametrized_tests(TestShapeInferenceCount)
instantiate_parametrized_tests(TestDecompositionTraceBound)


if __name__ == "__main__":
    run_tests()
