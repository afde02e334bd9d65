# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Tests of the strategy contract checker. Each case breaks one clause in one known way,
and the checker must name that clause, strategy and position; complete strategies must
pass. The checker only reads DTensor's public structures, so these tests hold on stock
torch with the contract's modules alone.
"""

import math
import textwrap
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
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
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten
R, S0, S1, P = Replicate(), Shard(0), Shard(1), Partial()
MESH_SHAPES = ((4,), (2, 2), (2, 2, 2))
# a case: the schema, the strategy, and the check's keyword arguments
Case = tuple[OpSchema, object, dict]


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


class TestStrategyContract(TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.owns_group = not dist.is_initialized()
        if cls.owns_group:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
        cls.meshes = {
            s: DeviceMesh("cpu", torch.arange(math.prod(s)).reshape(s))
            for s in MESH_SHAPES
        }
        cls.m = cls.meshes[(2, 2)]

    @classmethod
    def tearDownClass(cls) -> None:
        cls.meshes = {}
        if cls.owns_group:
            dist.destroy_process_group()
        super().tearDownClass()

    def spec(
        self, meta: TensorMeta | None, placements: Sequence[Placement] = (R, R)
    ) -> DTensorSpec:
        return DTensorSpec(self.m, tuple(placements), tensor_meta=meta)

    def inp(
        self,
        t: torch.Tensor,
        *placements: Sequence[Placement],
        mesh: DeviceMesh | None = None,
    ) -> OpStrategy:
        """An input strategy for ``t``: one candidate per placement (default replicated)."""
        mesh = mesh or self.m
        return OpStrategy(
            [
                OpSpec(DTensorSpec(mesh, tuple(p), tensor_meta=meta_of(t)))
                for p in placements or [(R,) * mesh.ndim]
            ]
        )

    def op_spec(
        self,
        schema: OpSchema,
        outputs: object,
        inputs: list | None = None,
        costs: list | None = None,
    ) -> OpSpec:
        """An OpSpec whose inputs default to replicated specs with the right metas and zero costs."""
        tensors = tensor_inputs(schema)
        if inputs is None:
            inputs = [self.spec(t.tensor_meta) for t in tensors]
        if costs is None:
            costs = [[0.0] * len(t.strategies) for t in tensors]
        return OpSpec(outputs, inputs, costs)

    def outputs(self, schema: OpSchema) -> object:
        """Replicated output specs with the metas shape inference gives."""
        metas = infer_output_metas(schema)
        if isinstance(metas, TensorMeta):
            return self.spec(metas)
        return tuple(None if m is None else self.spec(m) for m in metas)

    def mm(self, *a_placements: Sequence[Placement]) -> OpSchema:
        return OpSchema(
            aten.mm.default,
            (self.inp(torch.randn(8, 4), *a_placements), self.inp(torch.randn(4, 6))),
            {},
        )

    def foreach_child(
        self, schema: OpSchema, index: int, out: TensorMeta
    ) -> OpStrategy:
        """A complete child strategy for element ``index`` of a foreach op."""
        inputs = [
            a.children[index]
            for a in schema.args_schema
            if isinstance(a, TupleStrategy)
        ]
        specs = [self.spec(i.tensor_meta) for i in inputs]
        return OpStrategy(
            [OpSpec(self.spec(out), specs, [[0.0] * len(i.strategies) for i in inputs])]
        )

    def foreach_add(self) -> OpSchema:
        xs, ys = (
            [torch.randn(4, 6), torch.randn(3)],
            [torch.randn(4, 6), torch.randn(3)],
        )
        return OpSchema(
            aten._foreach_add.List,
            (
                TupleStrategy([self.inp(t) for t in xs]),
                TupleStrategy([self.inp(t) for t in ys]),
            ),
            {},
        )

    def check(self, case: Case) -> list[ContractViolation]:
        schema, strategy, kwargs = case
        return check_strategy_contract(
            schema, strategy, infer_output_metas(schema), **kwargs
        )

    # ---- broken strategies: each case and where the checker must point ----

    def of(self, schema: OpSchema, *specs: OpSpec, **kwargs: bool) -> Case:
        """A case: ``schema``, an OpStrategy of ``specs``, the check's keyword arguments."""
        return schema, OpStrategy(list(specs)), kwargs

    def c1_missing_output_meta(self) -> Case:
        s = self.mm()
        bad = self.op_spec(s, self.spec(None, (S0, R)))
        return self.of(s, self.op_spec(s, self.outputs(s)), bad)

    def c1_input_meta_copied_onto_the_output(self) -> Case:
        # _to_copy to float32 with the bf16 input's meta on the output
        x = torch.randn(4, 6, dtype=torch.bfloat16)
        s = OpSchema(aten._to_copy.default, (self.inp(x),), {"dtype": torch.float32})
        return self.of(s, self.op_spec(s, self.spec(meta_of(x))))

    def c1_shape_swapped_but_not_the_stride(self) -> Case:
        x = torch.randn(4, 6)
        s = OpSchema(aten.transpose.int, (self.inp(x), 0, 1), {})
        wrong = self.spec(TensorMeta(torch.Size([6, 4]), x.stride(), x.dtype), (S1, R))
        good = self.op_spec(s, self.outputs(s))
        return self.of(s, good, good, self.op_spec(s, wrong))

    def c1_wrong_shape(self) -> Case:
        x = torch.randn(4, 6)
        s = OpSchema(aten.view.default, (self.inp(x), [24]), {})
        return self.of(s, self.op_spec(s, self.spec(meta_of(x))))

    def layer_norm_backward(self, mask: list[bool], affine: bool = True) -> OpSchema:
        x, stats, w = torch.randn(2, 4), torch.randn(2, 1), torch.randn(4)
        weight = (self.inp(w), self.inp(w)) if affine else (None, None)
        inputs = (self.inp(x), self.inp(x), [4], self.inp(stats), self.inp(stats))
        return OpSchema(
            aten.native_layer_norm_backward.default, (*inputs, *weight, mask), {}
        )

    def c2_spec_where_the_result_is_none(self) -> Case:
        # the mask turns grad_weight off: a spec with the weight's meta is wrong there
        s = self.layer_norm_backward([True, False, True])
        grad_input, _, grad_bias = self.outputs(s)
        weight = self.spec(tensor_inputs(s)[5].tensor_meta)
        good = self.op_spec(s, (grad_input, None, grad_bias))
        return self.of(s, good, self.op_spec(s, (grad_input, weight, grad_bias)))

    def c2_none_where_the_result_is_a_tensor(self) -> Case:
        s = self.layer_norm_backward([True, False, True])
        return self.of(s, self.op_spec(s, (self.outputs(s)[0], None, None)))

    def max_dim(self) -> OpSchema:
        return OpSchema(aten.max.dim, (self.inp(torch.randn(4, 6)), 1), {})

    def c2_one_spec_for_two_results(self) -> Case:
        s = self.max_dim()
        return self.of(s, self.op_spec(s, self.outputs(s)[0]))

    def c2_three_specs_for_two_results(self) -> Case:
        s = self.max_dim()
        v, i = self.outputs(s)
        return self.of(s, self.op_spec(s, (v, i)), self.op_spec(s, (v, i, i)))

    def c2_spec_for_an_op_without_tensor_return(self) -> Case:
        x = torch.randn(4, 6)
        s = OpSchema(aten.equal.default, (self.inp(x), self.inp(x)), {})
        return self.of(s, self.op_spec(s, None), self.op_spec(s, self.spec(meta_of(x))))

    def c2_split_with_too_few_results(self) -> Case:
        s = OpSchema(aten.split.Tensor, (self.inp(torch.randn(4, 6)), 2), {})
        outs = self.outputs(s)
        return self.of(s, *(self.op_spec(s, o) for o in (outs, outs[:1], outs[0])))

    def c2_not_a_strategy(self) -> Case:
        s = self.mm()
        return s, [self.op_spec(s, self.outputs(s))], {}

    def c3_input_specs_none(self) -> Case:
        s = self.mm()
        return self.of(s, OpSpec(self.outputs(s), None, [[0.0], [0.0]]))

    def c3_one_input_spec_for_two_inputs(self) -> Case:
        s = self.mm()
        a = self.spec(tensor_inputs(s)[0].tensor_meta)
        out = self.outputs(s)
        return self.of(s, self.op_spec(s, out), self.op_spec(s, out, [a]))

    def c3_wrong_or_missing_input_meta(self) -> Case:
        s = self.mm()
        a, b = (self.spec(t.tensor_meta) for t in tensor_inputs(s))
        # no meta; the lhs meta where the rhs belongs; no spec
        inputs = ([a, self.spec(None)], [a, a], [None, b])
        return self.of(s, *(self.op_spec(s, self.outputs(s), i) for i in inputs))

    def c3_out_kwarg_is_an_input(self) -> Case:
        x = torch.randn(4, 6)
        s = OpSchema(aten.neg.out, (self.inp(x),), {"out": self.inp(x)})
        out = self.spec(meta_of(x))
        return self.of(s, self.op_spec(s, out), self.op_spec(s, out, [out], [[0.0]]))

    def c4_costs_none(self) -> Case:
        s = self.mm()
        return self.of(
            s, OpSpec(self.outputs(s), self.op_spec(s, None).input_specs, None)
        )

    def c4_one_row_for_two_inputs(self) -> Case:
        s = self.mm()
        out = self.outputs(s)
        return self.of(s, self.op_spec(s, out), self.op_spec(s, out, costs=[[0.0]]))

    def c4_row_shorter_than_the_candidates(self) -> Case:
        s = self.mm((R, R), (S0, R), (R, S0))
        out = self.outputs(s)
        # one cost for the candidate the strategy wants, none for the others
        rows = ([[0.0, 1.0, 1.0], [0.0]], [[0.0], [0.0]])
        return self.of(s, *(self.op_spec(s, out, costs=c) for c in rows))

    def c4_bad_values(self) -> Case:
        a = self.inp(torch.randn(8, 4), (R, R), (S0, R))
        s = OpSchema(
            aten.mm.default, (a, self.inp(torch.randn(4, 6), (R, R), (S1, R))), {}
        )
        out, nan, inf = self.outputs(s), float("nan"), float("inf")
        rows = [
            [[0.0, inf], [inf, 0.0]],  # inf means "cannot get there": allowed
            [[0.0, nan], [0.0, 0.0]],
            [[0.0, 0.0], [-1.0, 0.0]],
            [[-inf, 0.0], [0.0, 0.0]],
        ]
        return self.of(s, *(self.op_spec(s, out, costs=c) for c in rows))

    def c5_child_breaks_c1_and_c3(self) -> Case:
        s = self.foreach_add()
        outs = infer_output_metas(s)
        given = self.foreach_child(s, 1, outs[1]).strategies[0]
        # child 1 gets child 0's output meta and one of its two inputs
        spec = OpSpec(
            self.spec(outs[0]), given.input_specs[:1], given.redistribute_cost
        )
        return (
            s,
            TupleStrategy([self.foreach_child(s, 0, outs[0]), OpStrategy([spec])]),
            {},
        )

    def c5_scalar_foreach_child_claims_another_input(self) -> Case:
        xs = [torch.randn(4, 6), torch.randn(3), torch.randn(2, 2)]
        s = OpSchema(
            aten._foreach_mul.Scalar,
            (TupleStrategy([self.inp(t) for t in xs]), 2.0),
            {},
        )
        children = [
            self.foreach_child(s, i, m) for i, m in enumerate(infer_output_metas(s))
        ]
        good = children[1].strategies[0]
        claim = OpSpec(good.output_specs, [self.spec(meta_of(xs[0]))], [[0.0]])
        children[1] = OpStrategy([good, claim])
        return s, TupleStrategy(children), {}

    def c5_child_not_an_op_strategy(self) -> Case:
        s = self.foreach_add()
        first = self.foreach_child(s, 0, infer_output_metas(s)[0])
        return s, TupleStrategy([first, TupleStrategy([])]), {}

    def filled_only_judges_what_is_given(self) -> Case:
        # left-out fields pass (a registry completes them); wrong values do not
        s = self.mm()
        out, a = self.outputs(s), self.spec(tensor_inputs(s)[0].tensor_meta)
        left_out = OpSpec(self.spec(None, (S0, R)), None, None)
        wrong_meta = self.op_spec(s, a)  # an input's meta on the output
        wrong_input = self.op_spec(s, out, [out, self.spec(None)])
        wrong_row = self.op_spec(s, out, costs=[[0.0], [0.0, 0.0]])
        return self.of(
            s, left_out, wrong_meta, wrong_input, wrong_row, filled_only=True
        )

    def filled_only_spec_for_a_none_result(self) -> Case:
        s = self.layer_norm_backward([True, False, False], affine=False)
        given = OpSpec((self.outputs(s)[0], self.spec(None), None), None, None)
        return self.of(s, given, filled_only=True)

    def test_each_case_is_named_by_clause_strategy_and_position(self) -> None:
        """One line per violation of every broken case: the clause, the strategy, the
        position, and the expected and the given value, as a reader needs them. A case
        the checker stops catching drops out of the table."""
        lines = [
            textwrap.indent(
                format_violations(self.check(getattr(self, case)())), f"{case}: "
            )
            for case in BROKEN_CASES
        ]
        self.assertExpectedInline(
            "\n".join(lines),
            """\
c1_missing_output_meta: C1 aten.mm.default strategy 1 output: expected TensorMeta(shape=(8, 6), stride=(6, 1), dtype=torch.float32), got no tensor_meta
c1_input_meta_copied_onto_the_output: C1 aten._to_copy.default strategy 0 output: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.bfloat16)
c1_shape_swapped_but_not_the_stride: C1 aten.transpose.int strategy 2 output: expected TensorMeta(shape=(6, 4), stride=(1, 6), dtype=torch.float32), got TensorMeta(shape=(6, 4), stride=(6, 1), dtype=torch.float32)
c1_wrong_shape: C1 aten.view.default strategy 0 output: expected TensorMeta(shape=(24,), stride=(1,), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)
c2_spec_where_the_result_is_none: C2 aten.native_layer_norm_backward.default strategy 1 output 1: expected None (result is None), got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(4,), stride=(1,), dtype=torch.float32))
c2_none_where_the_result_is_a_tensor: C2 aten.native_layer_norm_backward.default strategy 0 output 2: expected a DTensorSpec (result is a tensor), got None
c2_one_spec_for_two_results: C2 aten.max.dim strategy 0 output: expected a tuple of 2 output specs, got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(4,), stride=(1,), dtype=torch.float32))
c2_three_specs_for_two_results: C2 aten.max.dim strategy 1 output: expected a tuple of 2 output specs, got tuple of 3
c2_spec_for_an_op_without_tensor_return: C2 aten.equal.default strategy 1 output: expected None (op returns no tensor), got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32))
c2_split_with_too_few_results: C2 aten.split.Tensor strategy 1 output: expected a tuple of 2 output specs, got tuple of 1
c2_split_with_too_few_results: C2 aten.split.Tensor strategy 2 output: expected a tuple of 2 output specs, got DTensorSpec((Replicate(), Replicate()), TensorMeta(shape=(2, 6), stride=(6, 1), dtype=torch.float32))
c2_not_a_strategy: C2 aten.mm.default strategy -1 strategy: expected an OpStrategy or TupleStrategy, got list
c3_input_specs_none: C3 aten.mm.default strategy 0 input_specs: expected 2 input specs, got None
c3_one_input_spec_for_two_inputs: C3 aten.mm.default strategy 1 input_specs: expected 2 input specs, got 1 input specs
c3_wrong_or_missing_input_meta: C3 aten.mm.default strategy 0 input 1: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got no tensor_meta
c3_wrong_or_missing_input_meta: C3 aten.mm.default strategy 1 input 1: expected TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32), got TensorMeta(shape=(8, 4), stride=(4, 1), dtype=torch.float32)
c3_wrong_or_missing_input_meta: C3 aten.mm.default strategy 2 input 0: expected a DTensorSpec, got None
c3_out_kwarg_is_an_input: C3 aten.neg.out strategy 1 input_specs: expected 2 input specs, got 1 input specs
c3_out_kwarg_is_an_input: C4 aten.neg.out strategy 1 redistribute_cost: expected 2 rows, got 1 rows
c4_costs_none: C4 aten.mm.default strategy 0 redistribute_cost: expected 2 rows, got None
c4_one_row_for_two_inputs: C4 aten.mm.default strategy 1 redistribute_cost: expected 2 rows, got 1 rows
c4_row_shorter_than_the_candidates: C4 aten.mm.default strategy 1 redistribute_cost row 0: expected 3 costs (one per candidate), got 1 costs
c4_bad_values: C4 aten.mm.default strategy 1 redistribute_cost row 0: expected finite non-negative costs or inf, got nan
c4_bad_values: C4 aten.mm.default strategy 2 redistribute_cost row 1: expected finite non-negative costs or inf, got -1.0
c4_bad_values: C4 aten.mm.default strategy 3 redistribute_cost row 0: expected finite non-negative costs or inf, got -inf
c5_child_breaks_c1_and_c3: C5/C1 aten._foreach_add.List strategy 0 child 1 output: expected TensorMeta(shape=(3,), stride=(1,), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)
c5_child_breaks_c1_and_c3: C5/C3 aten._foreach_add.List strategy 0 child 1 input_specs: expected 2 input specs, got 1 input specs
c5_scalar_foreach_child_claims_another_input: C5/C3 aten._foreach_mul.Scalar strategy 1 child 1 input 0: expected TensorMeta(shape=(3,), stride=(1,), dtype=torch.float32), got TensorMeta(shape=(4, 6), stride=(6, 1), dtype=torch.float32)
c5_child_not_an_op_strategy: C5/C2 aten._foreach_add.List strategy -1 child 1 strategy: expected an OpStrategy per element, got TupleStrategy
filled_only_judges_what_is_given: C1 aten.mm.default strategy 1 output: expected TensorMeta(shape=(8, 6), stride=(6, 1), dtype=torch.float32), got TensorMeta(shape=(8, 4), stride=(4, 1), dtype=torch.float32)
filled_only_judges_what_is_given: C3 aten.mm.default strategy 2 input 0: expected TensorMeta(shape=(8, 4), stride=(4, 1), dtype=torch.float32), got TensorMeta(shape=(8, 6), stride=(6, 1), dtype=torch.float32)
filled_only_judges_what_is_given: C4 aten.mm.default strategy 3 redistribute_cost row 1: expected 1 costs (one per candidate), got 2 costs
filled_only_spec_for_a_none_result: C2 aten.native_layer_norm_backward.default strategy 0 output 1: expected None (result is None), got DTensorSpec((Replicate(), Replicate()), no tensor_meta)""",  # noqa: B950
        )

    # ---- complete strategies pass ----

    def complete_mm(self, shape: tuple[int, ...]) -> tuple[OpSchema, StrategyType]:
        mesh, rest = self.meshes[shape], (R,) * (len(shape) - 1)
        a, b = torch.randn(8, 4), torch.randn(4, 6)
        # inputs with several candidates, so cost rows have real lengths
        cands = [(p,) + rest for p in (R, S0, S1)]
        inputs = (self.inp(a, *cands, mesh=mesh), self.inp(b, *cands, mesh=mesh))
        s = OpSchema(aten.mm.default, inputs, {})

        def spec(p: Placement, t: torch.Tensor) -> DTensorSpec:
            return DTensorSpec(mesh, (p,) + rest, tensor_meta=meta_of(t))

        # replicated, row-sharded, contracting dim sharded
        layouts = [(R, R, R), (S0, R, S0), (S1, S0, P)]
        specs = [
            OpSpec(spec(o, a @ b), [spec(x, a), spec(y, b)], [[0.0] * 3] * 2)
            for x, y, o in layouts
        ]
        return s, OpStrategy(specs)

    def test_complete_strategies_pass(self) -> None:
        fe, md = self.foreach_add(), self.max_dim()
        cases = {f"mm on {shape}": self.complete_mm(shape) for shape in MESH_SHAPES}
        cases["max.dim"] = (md, OpStrategy([self.op_spec(md, self.outputs(md))]))
        children = [
            self.foreach_child(fe, i, m) for i, m in enumerate(infer_output_metas(fe))
        ]
        cases["_foreach_add"] = (fe, TupleStrategy(children))
        for name, (schema, strategy) in cases.items():
            with self.subTest(case=name):
                self.assertEqual(
                    check_strategy_contract(
                        schema, strategy, infer_output_metas(schema)
                    ),
                    [],
                )


# the methods building a broken strategy, in the order they are defined
BROKEN_CASES = [
    name
    for name in vars(TestStrategyContract)
    if name.startswith(("c1_", "c2_", "c3_", "c4_", "c5_", "filled_only_"))
]


if __name__ == "__main__":
    run_tests()
