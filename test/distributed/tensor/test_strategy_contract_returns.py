# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of what the contract reads about an op's results (``_op_returns``).

Shape inference on the global inputs, for strategy schemas (``OpStrategy``
arguments) and runtime schemas (``DTensorSpec`` arguments) alike, and which results
a call masks off or no rule shards. Only the op's schema and DTensor's public
structures are read, so these hold on stock torch with this module alone.
"""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
)
from torch.distributed.tensor._ops._op_returns import (
    infer_output_metas,
    masked_off_returns,
    REPLICATED_RETURNS,
    replicated_returns,
    tensor_inputs,
)
from torch.distributed.tensor.placement_types import Replicate
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


class TestOpReturns(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.owns_group = not dist.is_initialized()
        if cls.owns_group:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        cls.m = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))

    @classmethod
    def tearDownClass(cls) -> None:
        del cls.m
        if cls.owns_group:
            dist.destroy_process_group()
        super().tearDownClass()

    def spec(self, meta: TensorMeta | None) -> DTensorSpec:
        return DTensorSpec(self.m, (Replicate(), Replicate()), tensor_meta=meta)

    def strategy(self, meta: TensorMeta | None) -> OpStrategy:
        return OpStrategy([OpSpec(self.spec(meta))])

    def both_schemas(
        self, op: torch._ops.OpOverload, *args: object
    ) -> dict[str, OpSchema]:
        """``op(*args)`` as a strategy schema and as a runtime schema; tensors (and
        lists of them) become one-candidate strategies or specs with their metas."""

        def convert(x: object, leaf) -> object:
            if isinstance(x, torch.Tensor):
                return leaf(meta_of(x))
            if isinstance(x, list) and x and isinstance(x[0], torch.Tensor):
                return [convert(e, leaf) for e in x]
            return x

        strategy_args = tuple(convert(a, self.strategy) for a in args)
        strategy_args = tuple(
            TupleStrategy(a)
            if isinstance(a, list) and a and isinstance(a[0], OpStrategy)
            else a
            for a in strategy_args
        )
        return {
            "strategy": OpSchema(op, strategy_args, {}),
            "runtime": OpSchema(op, tuple(convert(a, self.spec) for a in args), {}),
        }

    @parametrize("kind", ["strategy", "runtime"])
    def test_infer_matches_eager(self, kind: str) -> None:
        a, b, x = torch.randn(8, 4), torch.randn(4, 6), torch.randn(5, 6)
        xs = [torch.randn(2, 6), torch.randn(3, 6)]
        cases = [
            (aten.mm.default, (a, b), meta_of(a @ b)),
            # a non-contiguous result keeps its stride
            (aten.t.default, (b,), meta_of(b.t())),
            # a List[Tensor] result: one meta per element
            (aten.split.Tensor, (x, 2), [meta_of(t) for t in torch.split(x, 2)]),
            # a list argument: a TupleStrategy, or a list of specs
            (aten.cat.default, (xs,), meta_of(torch.cat(xs))),
        ]
        for op, args, expected in cases:
            with self.subTest(op=str(op)):
                metas = infer_output_metas(self.both_schemas(op, *args)[kind])
                self.assertEqual(
                    list(metas) if isinstance(expected, list) else metas, expected
                )
        cat = self.both_schemas(aten.cat.default, xs)["strategy"]
        self.assertEqual(len(tensor_inputs(cat)), 2)

    def test_infer_masked_off_result_is_none(self) -> None:
        grad_out, x, w = (
            torch.randn(1, 2, 3, 3),
            torch.randn(1, 2, 5, 5),
            torch.randn(2, 2, 3, 3),
        )
        mask = [True, False, True]  # no grad_weight
        args = (grad_out, x, w, [2], [1, 1], [0, 0], [1, 1], False, [0, 0], 1, mask)
        expected = (meta_of(x), None, TensorMeta(torch.Size([2]), (1,), torch.float32))
        for kind, schema in self.both_schemas(
            aten.convolution_backward.default, *args
        ).items():
            with self.subTest(kind=kind):
                self.assertEqual(tuple(infer_output_metas(schema)), expected)
                self.assertEqual(masked_off_returns(schema), frozenset({1}))
        unmasked = OpSchema(aten.mm.default, (self.strategy(meta_of(x)),) * 2, {})
        self.assertEqual(masked_off_returns(unmasked), frozenset())

    def test_infer_no_tensor_return_does_not_run(self) -> None:
        # Inputs without tensor_meta cannot become fake tensors: getting None back
        # shows the op was not run.
        for op in (aten.equal.default, aten.is_same_size.default):
            for leaf in (self.spec, self.strategy):
                with self.subTest(op=str(op), leaf=leaf.__name__):
                    self.assertIsNone(
                        infer_output_metas(OpSchema(op, (leaf(None), leaf(None)), {}))
                    )
        with self.assertRaisesRegex(ValueError, "tensor_meta"):
            infer_output_metas(OpSchema(aten.neg.default, (self.spec(None),), {}))

    def test_replicated_returns(self) -> None:
        cases = {
            aten._scaled_dot_product_efficient_attention.default: {2, 3},
            # cum_seq_q, cum_seq_k, rng_state, unused
            aten._scaled_dot_product_flash_attention.default: {2, 3, 6, 7},
            aten.mm.default: set(),
        }
        for op, expected in cases.items():
            with self.subTest(op=str(op)):
                self.assertEqual(replicated_returns(op), frozenset(expected))
        for name, reason in REPLICATED_RETURNS.items():
            self.assertTrue(reason.strip(), f"{name} is replicated without a reason")


instantiate_parametrized_tests(TestOpReturns)


if __name__ == "__main__":
    run_tests()
