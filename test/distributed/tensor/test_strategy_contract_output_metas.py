# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
What a strategy query knows before any rule runs (``_ops/_output_metas.py``), called
directly: the output metas (a caller's when they fit the op's returns, else shape
inference, cached unless data-dependent), the query's metas for the spec builders,
the call's omitted optional arguments filled with their defaults, and the bounded
cache behind it all.
"""

import torch
from torch.distributed.tensor._ops import _output_metas as om
from torch.distributed.tensor._ops._bounded_cache import BoundedCache
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten


class TestOutputMetas(StrategyContractTestBase):
    def setUp(self) -> None:
        super().setUp()
        om.clear_meta_cache()
        x, y = torch.randn(8, 12), torch.randn(12, 4)
        self.mm = strategy_schema(self.mesh((2,)), aten.mm.default, (x, y))
        self.mm_meta = meta_of(x @ y)
        xs = [torch.randn(8, 12), torch.randn(4)]
        self.foreach = strategy_schema(self.mesh((2,)), aten._foreach_neg.default, (xs,))
        self.foreach_metas = [meta_of(-t) for t in xs]

    # case -> (schema, the metas a caller passes, used as given)
    CASES = {
        "one meta": ("mm", lambda t: t.mm_meta, True),
        "one-element list": ("mm", lambda t: [t.mm_meta], True),
        "list for one tensor": ("mm", lambda t: [t.mm_meta, t.mm_meta], False),
        "per element": ("foreach", lambda t: t.foreach_metas, True),
        "too few elements": ("foreach", lambda t: t.foreach_metas[:1], False),
        "one meta for a list": ("foreach", lambda t: t.foreach_metas[0], False),
        "none": ("mm", lambda t: None, False),
    }

    @parametrize("case", list(CASES))
    def test_caller_metas_used_only_when_they_fit(self, case: str) -> None:
        schema_name, given, as_given = self.CASES[case]
        schema = getattr(self, schema_name)
        got = om.resolve_output_metas(schema, given(self))
        self.assertEqual(got, self.mm_meta if schema is self.mm else self.foreach_metas)
        # used as given: no shape inference ran (nothing cached)
        self.assertEqual(om.meta_cache_size(), 0 if as_given else 1)

    def test_data_dependent_metas_not_cached(self) -> None:
        """Unbacked sizes belong to one inference's ShapeEnv: handed out, never kept."""
        x = torch.randn(4, 3)
        metas = om.output_metas_for(strategy_schema(self.mesh((2,)), aten.nonzero.default, (x,)))
        self.assertFalse(om._all_sizes_concrete(metas), metas)
        self.assertEqual(om.meta_cache_size(), 0)
        om.output_metas_for(strategy_schema(self.mesh((2,)), aten.relu.default, (x,)))
        self.assertEqual(om.meta_cache_size(), 1)

    def test_builders_take_the_metas_of_the_query_answered(self) -> None:
        marker = [meta_of(torch.empty(1))]
        with om.answering(self.mm, marker):  # type: ignore[arg-type]
            self.assertIs(om.metas_for_builder(self.mm, None), marker)
            # another schema (a nested query of the same op) infers its own
            other = strategy_schema(self.mesh((2,)), aten.mm.default, (torch.randn(8, 12), torch.randn(12, 4)))
            self.assertEqual(om.metas_for_builder(other, None), self.mm_meta)
        self.assertEqual(om.metas_for_builder(self.mm, None), self.mm_meta)

    def test_omitted_arguments_filled_with_defaults(self) -> None:
        x = torch.randn(8, 6)
        schema = strategy_schema(self.mesh((2,)), aten.sum.dim_IntList, (x, [1]))
        filled = om.with_default_args(schema)
        self.assertEqual(filled.args_schema[1:], ([1], False))
        # a positional argument passed by keyword moves to its position
        self.assertEqual(
            om.fill_omitted_args(aten.sum.dim_IntList, (x, [1]), {"keepdim": True, "dtype": None}),
            ((x, [1], True), {"dtype": None}),
        )
        # nothing to fill, or a required argument missing: left to the op
        self.assertIsNone(om.fill_omitted_args(aten.sum.dim_IntList, (x, [1], False), {}))
        self.assertIsNone(om.fill_omitted_args(aten.mm.default, (x,), {}))
        self.assertIs(om.with_default_args(self.mm), self.mm)

    def test_default_filling_rule(self) -> None:
        seen = []

        def rule(op, args_schema, kwargs_schema):  # type: ignore[no-untyped-def]
            seen.append(tuple(args_schema))
            return []

        wrapped = om.DefaultFillingRule(rule)
        self.assertEqual(wrapped.__name__, "rule")
        wrapped(aten.sum.dim_IntList, (meta_of(torch.randn(8, 6)), [1]), {})
        self.assertEqual(seen[0][1:], ([1], False))


class TestBoundedCache(TestCase):
    """The cache class behind the output-meta and cost caches."""

    def test_oldest_entry_evicted_at_the_bound(self) -> None:
        cache: BoundedCache[int, int] = BoundedCache(3)
        computed: list[int] = []
        for k in (1, 2, 3, 1, 4, 1):
            self.assertEqual(cache.get_or_compute(k, lambda k=k: computed.append(k) or k * k), k * k)
        # 1, 2, 3 computed; 1 served; 4 evicts 1 (the oldest); 1 computed again
        self.assertEqual(computed, [1, 2, 3, 4, 1])
        self.assertEqual([k for k, _ in cache.items()], [3, 4, 1])
        cache.clear()
        self.assertEqual(len(cache), 0)

    def test_unhashable_key_computed_not_stored(self) -> None:
        cache: BoundedCache[object, int] = BoundedCache(4)
        calls = []
        for _ in range(2):
            self.assertEqual(cache.get_or_compute([1, 2], lambda: calls.append(1) or 7), 7)
        self.assertEqual((len(calls), len(cache)), (2, 0))

    def test_keep_decides_what_is_stored(self) -> None:
        cache: BoundedCache[int, int] = BoundedCache(4)
        for k in range(4):
            cache.get_or_compute(k, lambda k=k: k, keep=lambda v: v % 2 == 0)
        self.assertEqual([k for k, _ in cache.items()], [0, 2])
        with self.assertRaisesRegex(ValueError, "max_size must be positive, got 0"):
            BoundedCache(0)


instantiate_parametrized_tests(TestOutputMetas)


if __name__ == "__main__":
    run_tests()
