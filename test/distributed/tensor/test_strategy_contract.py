# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the strategy contract checker itself.

Each clause gets hand-made strategies that break it in one known way, and the
checker must name that clause, strategy and position; complete strategies must
pass. The checker only reads DTensor's public structures, so these tests hold on
stock torch as well as with the upstream strategy changes.
"""

from collections.abc import Sequence

import torch
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    TupleStrategy,
)
from torch.distributed.tensor._ops._contract_validation import ContractValidation
from torch.distributed.tensor._ops.strategy_contract import (
    check_strategy_contract,
    ContractViolation,
    format_violations,
    infer_output_metas,
    tensor_inputs,
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
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    MESH_SHAPES,
    meta_of,
    op_strategy,
    planner_candidates,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import (
    CallRecorder,
    CapturedCall,
    first_candidates,
    RUNTIME_REFUSAL_TYPES,
    RUNTIME_REFUSALS,
    runtime_refusal,
    runtime_refusal_key,
)


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()


def zero_costs(op_schema: OpSchema) -> list[list[float]]:
    """Well-formed (all zero) redistribute costs for every tensor input of ``op_schema``."""
    return [[0.0] * len(inp.strategies) for inp in tensor_inputs(op_schema)]


def located(
    violations: Sequence[ContractViolation],
) -> list[tuple[str, str | None, int, str]]:
    """Where each violation points: (clause, child_clause, strategy_index, position)."""
    return [
        (v.clause, v.child_clause, v.strategy_index, v.position) for v in violations
    ]


class TestStrategyContract(StrategyContractTestBase):
    def setUp(self) -> None:
        super().setUp()
        self.m = self.mesh((2, 2))

    def spec(
        self, meta: TensorMeta | None, placements: Sequence[Placement] = (R, R)
    ) -> DTensorSpec:
        return DTensorSpec(self.m, tuple(placements), tensor_meta=meta)

    def check(self, op_schema: OpSchema, strategy) -> list[ContractViolation]:
        return check_strategy_contract(
            op_schema, strategy, infer_output_metas(op_schema)
        )

    def op_spec(
        self,
        op_schema: OpSchema,
        output_specs,
        input_specs: Sequence[DTensorSpec | None] | None = None,
        costs: list[list[float]] | None = None,
    ) -> OpSpec:
        """An OpSpec whose inputs default to replicated specs carrying the right metas."""
        if input_specs is None:
            input_specs = [
                self.spec(inp.tensor_meta) for inp in tensor_inputs(op_schema)
            ]
        if costs is None:
            costs = zero_costs(op_schema)
        return OpSpec(output_specs, input_specs, costs)

    # mm (8, 4) @ (4, 6) with its output meta, shared by several tests.
    def mm_schema(self) -> tuple[OpSchema, TensorMeta]:
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        schema = OpSchema(
            aten.mm.default,
            (op_strategy(self.m, meta_of(a)), op_strategy(self.m, meta_of(b))),
            {},
        )
        return schema, meta_of(a @ b)

    # ---- complete strategies ----

    @parametrize("shape", MESH_SHAPES)
    def test_complete_mm_passes(self, shape: tuple[int, ...]) -> None:
        mesh = self.mesh(shape)
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        out = meta_of(a @ b)
        # Inputs with every planner candidate, so cost rows have real lengths.
        schema = OpSchema(
            aten.mm.default,
            (
                op_strategy(mesh, meta_of(a), *planner_candidates(mesh, meta_of(a))),
                op_strategy(mesh, meta_of(b), *planner_candidates(mesh, meta_of(b))),
            ),
            {},
        )
        rest = (R,) * (mesh.ndim - 1)
        layouts = [
            ((R,) + rest, (R,) + rest, (R,) + rest),  # replicated
            ((S0,) + rest, (R,) + rest, (S0,) + rest),  # row-sharded lhs
            ((S1,) + rest, (S0,) + rest, (P,) + rest),  # contracting dim sharded
        ]
        specs = [
            OpSpec(
                DTensorSpec(mesh, o, tensor_meta=out),
                [
                    DTensorSpec(mesh, x, tensor_meta=meta_of(a)),
                    DTensorSpec(mesh, y, tensor_meta=meta_of(b)),
                ],
                zero_costs(schema),
            )
            for x, y, o in layouts
        ]
        self.assert_contract(schema, OpStrategy(specs))
        self.assert_contract(schema, OpStrategy(specs), out)

    def test_complete_multi_output_passes(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(aten.max.dim, (op_strategy(self.m, meta_of(x)), 1), {})
        values, indices = infer_output_metas(schema)
        spec = self.op_spec(schema, (self.spec(values), self.spec(indices)))
        self.assert_contract(schema, OpStrategy([spec]))

    def test_assert_contract_reports_violations(self) -> None:
        schema, out = self.mm_schema()
        bad = self.op_spec(schema, self.spec(None))
        with self.assertRaisesRegex(
            AssertionError, "C1 aten.mm.default strategy 0 output"
        ):
            self.assert_contract(schema, OpStrategy([bad]))

    # ---- C1: output metadata ----

    def test_c1_missing_output_meta(self) -> None:
        schema, out = self.mm_schema()
        good = self.op_spec(schema, self.spec(out))
        bad = self.op_spec(schema, self.spec(None, (S0, R)))
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C1", None, 1, "output")])
        self.assertExpectedInline(
            format_violations(v),
            """C1 aten.mm.default strategy 1 output: expected TensorMeta(shape=(8, 6), stride=(6, 1), dtype=torch.float32), got no tensor_meta""",  # noqa: B950
        )

    def test_c1_wrong_dtype(self) -> None:
        # _to_copy to float32 with the bf16 input's meta copied onto the output.
        x = torch.randn(4, 6, dtype=torch.bfloat16)
        schema = OpSchema(
            aten._to_copy.default,
            (op_strategy(self.m, meta_of(x)),),
            {"dtype": torch.float32},
        )
        copied = self.op_spec(schema, self.spec(meta_of(x)))
        v = self.check(schema, OpStrategy([copied]))
        self.assertEqual(located(v), [("C1", None, 0, "output")])
        self.assertExpectedInline(
            format_violations(v),
            """C1 aten._to_copy.default strategy 0 output: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.bfloat16)""",  # noqa: B950
        )

    def test_c1_wrong_stride(self) -> None:
        # A transposed view has the input's shape swapped *and* its stride
        # swapped; a strategy that only swaps the shape gets the stride wrong.
        x = torch.randn(4, 6)
        wrong = TensorMeta(torch.Size([6, 4]), x.stride(), x.dtype)
        for op, args in (
            (aten.t.default, ()),
            (aten.transpose.int, (0, 1)),
        ):
            with self.subTest(op=str(op)):
                schema = OpSchema(op, (op_strategy(self.m, meta_of(x)), *args), {})
                good = self.op_spec(schema, self.spec(meta_of(x.t())))
                bad = self.op_spec(schema, self.spec(wrong, (S1, R)))
                v = self.check(schema, OpStrategy([good, good, bad]))
                self.assertEqual(located(v), [("C1", None, 2, "output")])
                self.assertEqual(
                    v[0].expected,
                    "TensorMeta(shape=(6, 4), stride=(1, 6), dtype=torch.float32)",
                )
                self.assertEqual(
                    v[0].got,
                    "TensorMeta(shape=(6, 4), stride=(6, 1), dtype=torch.float32)",
                )

    def test_c1_wrong_shape(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(
            aten.view.default, (op_strategy(self.m, meta_of(x)), [24]), {}
        )
        unchanged = self.op_spec(schema, self.spec(meta_of(x)))
        v = self.check(schema, OpStrategy([unchanged]))
        self.assertEqual(located(v), [("C1", None, 0, "output")])
        self.assertExpectedInline(
            format_violations(v),
            """C1 aten.view.default strategy 0 output: expected TensorMeta(shape=(24,), stride=(1,), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)""",  # noqa: B950
        )

    # ---- C2: output structure ----

    def conv_backward_schema(self) -> OpSchema:
        grad_out = torch.randn(1, 2, 3, 3)
        x = torch.randn(1, 2, 5, 5)
        w = torch.randn(2, 2, 3, 3)
        return OpSchema(
            aten.convolution_backward.default,
            (
                op_strategy(self.m, meta_of(grad_out)),
                op_strategy(self.m, meta_of(x)),
                op_strategy(self.m, meta_of(w)),
                [2],  # bias_sizes
                [1, 1],  # stride
                [0, 0],  # padding
                [1, 1],  # dilation
                False,  # transposed
                [0, 0],  # output_padding
                1,  # groups
                [True, False, True],  # output_mask: no grad_weight
            ),
            {},
        )

    def test_c2_spec_where_result_is_none(self) -> None:
        schema = self.conv_backward_schema()
        grad_input, grad_weight, grad_bias = infer_output_metas(schema)
        self.assertIsNone(grad_weight)
        w_meta = tensor_inputs(schema)[2].tensor_meta
        good = self.op_spec(schema, (self.spec(grad_input), None, self.spec(grad_bias)))
        bad = self.op_spec(
            schema, (self.spec(grad_input), self.spec(w_meta), self.spec(grad_bias))
        )
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C2", None, 1, "output 1")])
        self.assertEqual(v[0].expected, "None (result is None)")

    def test_c2_none_where_result_is_tensor(self) -> None:
        x = torch.randn(2, 4)
        stats = torch.randn(2, 1)
        affine = torch.randn(4)
        schema = OpSchema(
            aten.native_layer_norm_backward.default,
            (
                op_strategy(self.m, meta_of(x)),  # grad_out
                op_strategy(self.m, meta_of(x)),  # input
                [4],
                op_strategy(self.m, meta_of(stats)),  # mean
                op_strategy(self.m, meta_of(stats)),  # rstd
                op_strategy(self.m, meta_of(affine)),  # weight
                op_strategy(self.m, meta_of(affine)),  # bias
                [True, False, True],
            ),
            {},
        )
        grad_input, grad_weight, grad_bias = infer_output_metas(schema)
        self.assertIsNone(grad_weight)
        bad = self.op_spec(schema, (self.spec(grad_input), None, None))
        v = self.check(schema, OpStrategy([bad]))
        self.assertEqual(located(v), [("C2", None, 0, "output 2")])
        self.assertExpectedInline(
            format_violations(v),
            """C2 aten.native_layer_norm_backward.default strategy 0 output 2: expected a DTensorSpec (result is a tensor), got None""",  # noqa: B950
        )

    def test_c2_single_spec_for_multi_output(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(aten.max.dim, (op_strategy(self.m, meta_of(x)), 1), {})
        values, _ = infer_output_metas(schema)
        v = self.check(schema, OpStrategy([self.op_spec(schema, self.spec(values))]))
        self.assertEqual(located(v), [("C2", None, 0, "output")])
        self.assertExpectedInline(
            format_violations(v),
            """C2 aten.max.dim strategy 0 output: expected a tuple of 2 output specs, got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(4,), stride=(1,), dtype=torch.float32))""",  # noqa: B950
        )

    def test_c2_wrong_tuple_length(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(aten.max.dim, (op_strategy(self.m, meta_of(x)), 1), {})
        values, indices = infer_output_metas(schema)
        good = self.op_spec(schema, (self.spec(values), self.spec(indices)))
        bad = self.op_spec(
            schema, (self.spec(values), self.spec(indices), self.spec(indices))
        )
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C2", None, 1, "output")])
        self.assertEqual(v[0].got, "tuple of 3")

    def test_c2_output_spec_for_op_without_tensor_return(self) -> None:
        x = torch.randn(4, 6)
        for op in (aten.equal.default, aten.is_same_size.default):
            with self.subTest(op=str(op)):
                schema = OpSchema(
                    op,
                    (op_strategy(self.m, meta_of(x)), op_strategy(self.m, meta_of(x))),
                    {},
                )
                self.assertIsNone(infer_output_metas(schema))
                good = self.op_spec(schema, None)
                bad = self.op_spec(schema, self.spec(meta_of(x)))
                v = self.check(schema, OpStrategy([good, bad]))
                self.assertEqual(located(v), [("C2", None, 1, "output")])
                self.assertEqual(v[0].expected, "None (op returns no tensor)")

    def test_c2_split_wrong_number_of_outputs(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(aten.split.Tensor, (op_strategy(self.m, meta_of(x)), 2), {})
        metas = infer_output_metas(schema)
        self.assertEqual(len(metas), 2)
        good = self.op_spec(schema, tuple(self.spec(m) for m in metas))
        short = self.op_spec(schema, (self.spec(metas[0]),))
        single = self.op_spec(schema, self.spec(metas[0]))
        v = self.check(schema, OpStrategy([good, short, single]))
        self.assertEqual(
            located(v), [("C2", None, 1, "output"), ("C2", None, 2, "output")]
        )
        self.assertExpectedInline(
            format_violations(v),
            """\
C2 aten.split.Tensor strategy 1 output: expected a tuple of 2 output specs, got tuple of 1
C2 aten.split.Tensor strategy 2 output: expected a tuple of 2 output specs, got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(2, 6), stride=(6, 1), dtype=torch.float32))""",  # noqa: B950
        )

    def test_c2_not_a_strategy(self) -> None:
        schema, out = self.mm_schema()
        v = check_strategy_contract(schema, [self.op_spec(schema, self.spec(out))], out)
        self.assertEqual(located(v), [("C2", None, -1, "strategy")])

    # ---- C3: input specs ----

    def test_c3_input_specs_none(self) -> None:
        schema, out = self.mm_schema()
        bad = OpSpec(self.spec(out), None, zero_costs(schema))
        v = self.check(schema, OpStrategy([bad]))
        self.assertEqual(located(v), [("C3", None, 0, "input_specs")])
        self.assertEqual((v[0].expected, v[0].got), ("2 input specs", "None"))

    def test_c3_wrong_count(self) -> None:
        schema, out = self.mm_schema()
        a_meta = tensor_inputs(schema)[0].tensor_meta
        good = self.op_spec(schema, self.spec(out))
        bad = self.op_spec(schema, self.spec(out), [self.spec(a_meta)])
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C3", None, 1, "input_specs")])
        self.assertEqual((v[0].expected, v[0].got), ("2 input specs", "1 input specs"))

    def test_c3_wrong_or_missing_input_meta(self) -> None:
        schema, out = self.mm_schema()
        a_meta, b_meta = (inp.tensor_meta for inp in tensor_inputs(schema))
        missing = self.op_spec(
            schema, self.spec(out), [self.spec(a_meta), self.spec(None)]
        )
        # The lhs meta where the rhs belongs, as a strategy copying one meta would do.
        swapped = self.op_spec(
            schema, self.spec(out), [self.spec(a_meta), self.spec(a_meta)]
        )
        not_spec = self.op_spec(schema, self.spec(out), [None, self.spec(b_meta)])
        v = self.check(schema, OpStrategy([missing, swapped, not_spec]))
        self.assertEqual(
            located(v),
            [
                ("C3", None, 0, "input 1"),
                ("C3", None, 1, "input 1"),
                ("C3", None, 2, "input 0"),
            ],
        )
        self.assertExpectedInline(
            format_violations(v),
            """\
C3 aten.mm.default strategy 0 input 1: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got no tensor_meta
C3 aten.mm.default strategy 1 input 1: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got TensorMeta(shape=(8, 4), stride=(4, 1), dtype=torch.float32)
C3 aten.mm.default strategy 2 input 0: expected a DTensorSpec, got None""",  # noqa: B950
        )

    def test_c3_kwarg_tensor_inputs_count(self) -> None:
        # Tensor kwargs (here ``out=``) are inputs too, after the positional ones.
        x = torch.randn(4, 6)
        schema = OpSchema(
            aten.neg.out,
            (op_strategy(self.m, meta_of(x)),),
            {"out": op_strategy(self.m, meta_of(x))},
        )
        self.assertEqual(len(tensor_inputs(schema)), 2)
        good = self.op_spec(schema, self.spec(meta_of(x)))
        bad = self.op_spec(
            schema, self.spec(meta_of(x)), [self.spec(meta_of(x))], [[0.0]]
        )
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(
            located(v),
            [("C3", None, 1, "input_specs"), ("C4", None, 1, "redistribute_cost")],
        )

    # ---- C4: redistribute costs ----

    def test_c4_costs_none(self) -> None:
        schema, out = self.mm_schema()
        bad = OpSpec(self.spec(out), self.op_spec(schema, None).input_specs, None)
        v = self.check(schema, OpStrategy([bad]))
        self.assertEqual(located(v), [("C4", None, 0, "redistribute_cost")])

    def test_c4_wrong_row_count(self) -> None:
        schema, out = self.mm_schema()
        good = self.op_spec(schema, self.spec(out))
        bad = self.op_spec(schema, self.spec(out), costs=[[0.0]])
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C4", None, 1, "redistribute_cost")])
        self.assertEqual((v[0].expected, v[0].got), ("2 rows", "1 rows"))

    def test_c4_row_shorter_than_candidates(self) -> None:
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        schema = OpSchema(
            aten.mm.default,
            (
                op_strategy(self.m, meta_of(a), (R, R), (S0, R), (R, S0)),
                op_strategy(self.m, meta_of(b)),
            ),
            {},
        )
        out = self.spec(meta_of(a @ b))
        good = self.op_spec(schema, out, costs=[[0.0, 1.0, 1.0], [0.0]])
        # One cost for the candidate the strategy wants, none for the others.
        bad = self.op_spec(schema, out, costs=[[0.0], [0.0]])
        v = self.check(schema, OpStrategy([good, bad]))
        self.assertEqual(located(v), [("C4", None, 1, "redistribute_cost row 0")])
        self.assertExpectedInline(
            format_violations(v),
            """C4 aten.mm.default strategy 1 redistribute_cost row 0: expected 3 costs (one per candidate), got 1 costs""",
        )

    def test_c4_bad_values(self) -> None:
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        schema = OpSchema(
            aten.mm.default,
            (
                op_strategy(self.m, meta_of(a), (R, R), (S0, R)),
                op_strategy(self.m, meta_of(b), (R, R), (S1, R)),
            ),
            {},
        )
        out = self.spec(meta_of(a @ b))
        nan, inf = float("nan"), float("inf")
        strategies = OpStrategy(
            [
                # inf means "cannot get there": allowed.
                self.op_spec(schema, out, costs=[[0.0, inf], [inf, 0.0]]),
                self.op_spec(schema, out, costs=[[0.0, nan], [0.0, 0.0]]),
                self.op_spec(schema, out, costs=[[0.0, 0.0], [-1.0, 0.0]]),
                self.op_spec(schema, out, costs=[[-inf, 0.0], [0.0, 0.0]]),
            ]
        )
        v = self.check(schema, strategies)
        self.assertExpectedInline(
            format_violations(v),
            """\
C4 aten.mm.default strategy 1 redistribute_cost row 0: expected finite non-negative costs or inf, got nan
C4 aten.mm.default strategy 2 redistribute_cost row 1: expected finite non-negative costs or inf, got -1.0
C4 aten.mm.default strategy 3 redistribute_cost row 0: expected finite non-negative costs or inf, got -inf""",
        )

    # ---- C5: TupleStrategy children ----

    def foreach_add_schema(self) -> tuple[OpSchema, list[TensorMeta]]:
        xs = [torch.randn(4, 6), torch.randn(3)]
        ys = [torch.randn(4, 6), torch.randn(3)]
        schema = OpSchema(
            aten._foreach_add.List,
            (
                TupleStrategy([op_strategy(self.m, meta_of(t)) for t in xs]),
                TupleStrategy([op_strategy(self.m, meta_of(t)) for t in ys]),
            ),
            {},
        )
        return schema, [meta_of(x + y) for x, y in zip(xs, ys)]

    def foreach_child(
        self, op_schema: OpSchema, index: int, out: TensorMeta
    ) -> OpStrategy:
        """A complete child strategy for element ``index`` of a foreach op."""
        inputs = [
            arg.children[index]
            for arg in op_schema.args_schema
            if isinstance(arg, TupleStrategy)
        ]
        return OpStrategy(
            [
                OpSpec(
                    self.spec(out),
                    [self.spec(inp.tensor_meta) for inp in inputs],
                    [[0.0] * len(inp.strategies) for inp in inputs],
                )
            ]
        )

    # ---- filled_only: what a strategy function gave, before a registry completes it ----

    def test_filled_only_judges_what_is_filled_in(self) -> None:
        """Left-out fields pass (the registry completes them); a wrong value, a spec
        for a None result and a cost row of the wrong length do not."""
        schema, out = self.mm_schema()
        metas = infer_output_metas(schema)
        a_meta = tensor_inputs(schema)[0].tensor_meta
        left_out = OpSpec(self.spec(None, (S0, R)), None, None)
        wrong = [
            self.op_spec(schema, self.spec(a_meta)),  # C1: an input's meta
            self.op_spec(schema, self.spec(out), [self.spec(out), self.spec(None)]),  # C3
            self.op_spec(schema, self.spec(out), costs=[[0.0], [0.0, 0.0]]),  # C4
        ]
        strategy = OpStrategy([left_out, *wrong])
        self.assertEqual(
            located(check_strategy_contract(schema, strategy, metas, filled_only=True)),
            [("C1", None, 1, "output"), ("C3", None, 2, "input 0"),
             ("C4", None, 3, "redistribute_cost row 1")],
        )
        # the full check also names what was left out
        full = located(check_strategy_contract(schema, strategy, metas))
        self.assertIn(("C1", None, 0, "output"), full)
        self.assertIn(("C3", None, 0, "input_specs"), full)
        self.assertIn(("C4", None, 0, "redistribute_cost"), full)
        self.assertIn(("C3", None, 2, "input 1"), full)

    def test_filled_only_spec_for_none_result(self) -> None:
        x = torch.randn(4, 6)
        schema = OpSchema(
            aten.native_layer_norm_backward.default,
            (op_strategy(self.m, meta_of(x)), op_strategy(self.m, meta_of(x)), [6],
             op_strategy(self.m, meta_of(torch.randn(4, 1))),
             op_strategy(self.m, meta_of(torch.randn(4, 1))), None, None,
             [True, False, False]),
            {},
        )
        metas = infer_output_metas(schema)
        given = OpStrategy([OpSpec((self.spec(metas[0]), self.spec(None), None), None, None)])
        self.assertEqual(
            located(check_strategy_contract(schema, given, metas, filled_only=True)),
            [("C2", None, 0, "output 1")],
        )

    def test_c5_complete_tuple_strategy_passes(self) -> None:
        schema, outs = self.foreach_add_schema()
        self.assertEqual(infer_output_metas(schema), outs)
        strategy = TupleStrategy(
            [self.foreach_child(schema, i, out) for i, out in enumerate(outs)]
        )
        self.assert_contract(schema, strategy)
        self.assert_contract(schema, strategy, outs)

    def test_c5_child_breaks_c1_and_c3(self) -> None:
        schema, outs = self.foreach_add_schema()
        broken = self.foreach_child(schema, 1, outs[1])
        # Child 1 given child 0's output meta and only one of its two inputs.
        spec = broken.strategies[0]
        broken = OpStrategy(
            [OpSpec(self.spec(outs[0]), spec.input_specs[:1], spec.redistribute_cost)]
        )
        strategy = TupleStrategy([self.foreach_child(schema, 0, outs[0]), broken])
        v = self.check(schema, strategy)
        self.assertEqual(
            located(v),
            [("C5", "C1", 0, "child 1 output"), ("C5", "C3", 0, "child 1 input_specs")],
        )
        self.assertExpectedInline(
            format_violations(v),
            """\
C5/C1 aten._foreach_add.List strategy 0 child 1 output: expected TensorMeta(shape=(3,), stride=(1,), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)
C5/C3 aten._foreach_add.List strategy 0 child 1 input_specs: expected 2 input specs, got 1 input specs""",  # noqa: B950
        )

    def test_c5_scalar_foreach_child_breaks_c3(self) -> None:
        xs = [torch.randn(4, 6), torch.randn(3), torch.randn(2, 2)]
        schema = OpSchema(
            aten._foreach_mul.Scalar,
            (TupleStrategy([op_strategy(self.m, meta_of(t)) for t in xs]), 2.0),
            {},
        )
        outs = infer_output_metas(schema)
        children = [self.foreach_child(schema, i, out) for i, out in enumerate(outs)]
        # Child 1 claims element 0's input.
        good = children[1].strategies[0]
        children[1] = OpStrategy(
            [good, OpSpec(good.output_specs, [self.spec(meta_of(xs[0]))], [[0.0]])]
        )
        v = self.check(schema, TupleStrategy(children))
        self.assertEqual(located(v), [("C5", "C3", 1, "child 1 input 0")])
        self.assertEqual(
            v[0].got, "TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)"
        )

    def test_c5_child_not_an_op_strategy(self) -> None:
        schema, outs = self.foreach_add_schema()
        strategy = TupleStrategy(
            [self.foreach_child(schema, 0, outs[0]), TupleStrategy([])]
        )
        v = self.check(schema, strategy)
        self.assertEqual(located(v), [("C5", "C2", -1, "child 1 strategy")])


class TestContractHarness(StrategyContractTestBase):
    def test_meshes(self) -> None:
        for shape in MESH_SHAPES:
            mesh = self.mesh(shape)
            self.assertEqual(tuple(mesh.shape), shape)
            self.assertEqual(mesh.device_type, "cpu")
            self.assertIs(self.mesh(list(shape)), mesh)

    def test_op_strategy(self) -> None:
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(4, 6))
        default = op_strategy(mesh, meta)
        self.assertEqual(len(default.strategies), 1)
        self.assertEqual(default.strategies[0].output_spec.placements, (R, R))
        self.assertEqual(default.tensor_meta, meta)
        several = op_strategy(mesh, meta, (S0, R), [R, P])
        self.assertEqual(
            [s.output_spec.placements for s in several.strategies], [(S0, R), (R, P)]
        )
        with self.assertRaises(ValueError):
            op_strategy(mesh, meta, (S0,))

    def test_planner_candidates(self) -> None:
        mesh = self.mesh((2, 4))
        floats = planner_candidates(mesh, meta_of(torch.randn(2, 8)))
        # Tensor dim 0 has 2 elements: it can only be split over mesh dim 0.
        self.assertEqual(
            floats,
            [
                (R, R), (R, S1), (R, P),
                (S0, R), (S0, S1), (S0, P),
                (S1, R), (S1, S1), (S1, P),
                (P, R), (P, S1), (P, P),
            ],
        )
        ints = planner_candidates(mesh, meta_of(torch.ones(2, 8, dtype=torch.long)))
        self.assertFalse(any(isinstance(p, Partial) for c in ints for p in c))
        scalar = planner_candidates(self.mesh((4,)), meta_of(torch.tensor(1.0)))
        self.assertEqual(scalar, [(R,), (P,)])

    def test_first_candidates(self) -> None:
        """Fewest non-Replicate mesh dims first, in option order, capped; uneven
        and empty shards stay in (the audit's planner candidates)."""
        mesh = self.mesh((2, 2))
        meta = meta_of(torch.randn(2, 3))
        every = first_candidates(100)(mesh, meta)
        # per mesh dim: R, S(0), S(1), P -> 16 tuples
        self.assertEqual(len(every), 16)
        self.assertEqual(every[:4], [(R, R), (R, S0), (R, S1), (R, P)])
        self.assertEqual(every[4:7], [(S0, R), (S1, R), (P, R)])
        # S(0) twice splits 2 rows over 4 ranks: offered all the same
        self.assertIn((S0, S0), every)
        self.assertEqual(first_candidates(5)(mesh, meta), every[:5])
        ints = first_candidates(100)(self.mesh((4,)), meta_of(torch.ones(4, 2, dtype=torch.long)))
        # no Partial for integers; dim 1 (2) is shorter than the mesh (4)
        self.assertEqual(ints, [(R,), (S0,)])
        with self.assertRaisesRegex(ValueError, "at least 1"):
            first_candidates(0)

    def test_runtime_refusal_classification(self) -> None:
        """DTensor deliberately refusing a runtime input is told from a failure per
        query: by message for the placement refusals, by exception type (also when
        DTensor's dispatch wraps it) for data-dependent result sizes."""
        pattern = "in-place operations that require placement changes are not supported"
        inplace = RuntimeError(f"aten.scatter_.src: {pattern}, got Shard(0)")
        self.assertEqual(runtime_refusal_key(inplace), pattern)
        self.assertEqual(runtime_refusal(inplace), RUNTIME_REFUSALS[pattern])

        dynamic = DynamicOutputShapeException(aten.nonzero.default)
        self.assertEqual(runtime_refusal_key(dynamic), "DynamicOutputShapeException")
        self.assertEqual(
            runtime_refusal(dynamic), RUNTIME_REFUSAL_TYPES[DynamicOutputShapeException]
        )
        scalar = DataDependentOutputException(aten._local_scalar_dense.default)
        self.assertEqual(
            runtime_refusal(scalar), RUNTIME_REFUSAL_TYPES[DataDependentOutputException]
        )
        # DTensor's dispatch re-raises strategy failures inside a RuntimeError
        try:
            try:
                raise dynamic
            except DynamicOutputShapeException as e:
                raise RuntimeError("Sharding propagation failed for aten.index.Tensor") from e
        except RuntimeError as wrapped:
            self.assertEqual(runtime_refusal_key(wrapped), "DynamicOutputShapeException")
        # an unrelated error raised while a refusal was handled is no refusal
        try:
            try:
                raise dynamic
            except DynamicOutputShapeException:
                raise KeyError("a bug in the handler")  # noqa: B904
        except KeyError as unrelated:
            self.assertIsNone(runtime_refusal(unrelated))
        self.assertIsNone(runtime_refusal(ValueError("Shard(0) is not supported")))
        self.assertIsNone(runtime_refusal_key(RuntimeError("")))

        # A real runtime query: a boolean-mask index on a sharded input. Eager
        # DTensor needs the result's global size before it runs the op, so the
        # query is refused, on stock torch as with the change; the same call asked
        # as a planner is never a refusal, whatever the answer.
        mesh = self.mesh((4,))
        x = torch.randn(8, 4)
        call = CapturedCall(
            aten.index.Tensor, (meta_of(x), [meta_of(x[:, 0] > 0)]), {}, "test forward"
        )
        sweep = ContractValidation(
            {call.op: [call]}, check_strategy_contract, infer_output_metas
        )
        runtime = sweep.queries(call, mesh, "runtime")
        self.assertEqual(
            [q.label for q in runtime], ["all Replicate", "input 0 Shard(0)"]
        )
        for query in runtime:
            answer = sweep.ask(query, None)
            self.assertIsInstance(answer.error, DynamicOutputShapeException, str(query))
            self.assertEqual(
                answer.refusal, RUNTIME_REFUSAL_TYPES[DynamicOutputShapeException]
            )
        (planner,) = sweep.queries(call, mesh, "planner")
        self.assertIsNone(sweep.ask(planner, None).refusal)

    def test_call_recorder(self) -> None:
        """The recorder keeps distinct calls with tensor arguments, metas taken
        before the call (an in-place op may change its self), only the ops
        ``keep`` chooses; calls without tensors are counted, not kept."""
        x = torch.randn(4, 3)
        recorder = CallRecorder(pool_size=2)
        with recorder:
            recorder.source = "test forward"
            torch.empty(5)
            x.clone().t_()
            for rows in (x[:1], x[:2], x[:3]):
                torch.add(rows, rows)
        self.assertEqual(recorder.tensorless[aten.empty.memory_format], 1)
        (t_call,) = recorder.calls[aten.t_.default].values()
        self.assertEqual(t_call.tensor_metas, [meta_of(x)])
        self.assertEqual(t_call.source, "test forward")
        # three distinct calls, two kept (pool_size)
        self.assertEqual(len(recorder.calls[aten.add.Tensor]), 2)
        only_add = CallRecorder(keep=lambda op: op == aten.add.Tensor)
        with only_add:
            torch.add(x, 1).neg()
        self.assertEqual(list(only_add.calls), [aten.add.Tensor])
        self.assertEqual(only_add.seen, 1)


instantiate_parametrized_tests(TestStrategyContract)


if __name__ == "__main__":
    run_tests()
