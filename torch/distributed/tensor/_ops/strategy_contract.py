# Copyright (c) Meta Platforms, Inc. and affiliates
"""
The contract every sharding strategy handed out by DTensor satisfies.

Strategy functions return :class:`OpStrategy` / :class:`TupleStrategy` objects made
of :class:`OpSpec` entries. DTensor's own dispatch picks one of them; planners read
all of them. For either consumer to use a spec without re-deriving anything, each
``OpSpec`` of a strategy for ``op(*args, **kwargs)`` must satisfy:

C1  Every output position whose result is a tensor holds a ``DTensorSpec`` whose
    ``tensor_meta`` equals shape inference of the op on the global inputs
    (shape, stride and dtype). A size that depends on the input data (``nonzero``,
    ``masked_select``, a boolean-mask index) is an unbacked ``SymInt``, as under
    ``torch.compile``; metas agree when their data-dependent sizes sit in the same
    places and combine the same way (each inference names them afresh).
C2  ``None`` means the op returns ``None`` there: every output position whose
    result is ``None`` (an ``output_mask`` entry set to False that shape inference
    honours, an optional return, a non-tensor return) holds ``None``, and every
    tensor result holds a ``DTensorSpec`` (held to C1). An op returning one tensor
    has a ``DTensorSpec``; an op with several returns a tuple with one entry per
    return; a ``List[Tensor]`` return a tuple with one entry per element; an op
    with no tensor return has ``output_specs=None``. Results no rule shards (the
    RNG state and unused buffers of the attention ops, named in
    :data:`REPLICATED_RETURNS`) are tensors like any other: a rule may leave them
    ``None``, and every strategy handed out gives them ``Replicate`` with their
    meta. (DTensor's eager dispatch alone keeps the rule's ``None`` and hands such
    a result back as each rank's plain tensor, as stock DTensor does.) One kind of
    tensor result may instead be ``None`` in every ``OpSpec`` of a strategy, which
    then satisfies C2 there: a masked-off result (see :func:`masked_off_returns`),
    whose entry in the op's ``bool[]`` mask argument is False, yet shape inference
    computes it. Kernels differ there, and shape inference cannot tell them apart:
    the batch-norm kernels return ``None`` for ``grad_input`` while the
    ``native_batch_norm_backward`` decomposition computes it; the grid samplers
    compute ``grad_grid`` whatever the mask (kernels and metas), and so does the
    efficient-attention backward's meta for the query, key and value gradients.
    ``None`` says the result is left out; a ``DTensorSpec`` (held to C1) places
    it, and DTensor hands back ``None`` if the kernel leaves it out after all.
C3  ``input_specs`` is present, with one ``DTensorSpec`` per tensor input in
    flattened argument order (args, then kwargs), each carrying that input's
    ``tensor_meta``.
C4  ``redistribute_cost`` is present: one row per tensor input, each row as long as
    that input's candidate list, every value finite and non-negative, or ``inf``.
C5  Each child of a :class:`TupleStrategy` (foreach ops, list arguments) satisfies
    C1-C4 for its element: the i-th element of every list argument plus the
    non-list tensor arguments, and the i-th element of every list return.

:func:`check_strategy_contract` checks these clauses and returns every violation;
:func:`infer_output_metas` provides the expected output metadata. It and the other
readings of what an op returns live in ``_op_returns.py`` and are re-exported here.
All of it relies only on DTensor's public data structures, so it can judge any
strategy, whichever version of the machinery produced it.
"""

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch._ops import OpOverload
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor._ops._op_returns import (
    element_output_metas,
    element_schema,
    infer_output_metas,
    masked_off_returns,
    op_has_tensor_returns,
    OutputMetas,
    REPLICATED_RETURNS,
    replicated_returns,
    tensor_inputs,
    without_unplaced,
)


__all__ = [
    "CLAUSES",
    "ContractViolation",
    "OutputMetas",
    "REPLICATED_RETURNS",
    "check_strategy_contract",
    "element_output_metas",
    "element_schema",
    "format_violations",
    "infer_output_metas",
    "masked_off_returns",
    "op_has_tensor_returns",
    "replicated_returns",
    "tensor_inputs",
    "without_unplaced",
]

CLAUSES = ("C1", "C2", "C3", "C4", "C5")


@dataclass(frozen=True)
class ContractViolation:
    """One breach of the contract, located precisely enough to fix it."""

    clause: str
    op: str
    strategy_index: int
    position: str
    expected: str
    got: str
    # For C5 violations: the clause the child breaks (C1-C4).
    child_clause: str | None = None

    def __str__(self) -> str:
        clause = self.clause
        if self.child_clause is not None:
            clause = f"{clause}/{self.child_clause}"
        return (
            f"{clause} {self.op} strategy {self.strategy_index} {self.position}: "
            f"expected {self.expected}, got {self.got}"
        )


def format_violations(violations: Sequence[ContractViolation]) -> str:
    """Render violations one per line, for error messages and reports."""
    return "\n".join(str(v) for v in violations)


def _describe_meta(meta: TensorMeta | None) -> str:
    if meta is None:
        return "no tensor_meta"
    return f"TensorMeta(shape={tuple(meta.shape)}, stride={tuple(meta.stride)}, dtype={meta.dtype})"


def _describe_spec(spec: object) -> str:
    if spec is None:
        return "None"
    if isinstance(spec, DTensorSpec):
        return f"DTensorSpec({spec.placements}, {_describe_meta(spec.tensor_meta)})"
    if isinstance(spec, (tuple, list)):
        return f"{type(spec).__name__} of {len(spec)}"
    return type(spec).__name__


_UNBACKED_SYMBOL = re.compile(r"\bu\d+\b")


def _size_key(size: object) -> object:
    # Each shape inference names the data-dependent sizes it creates afresh
    # (u0, u1, ...); only where they occur and how they combine is compared.
    if isinstance(size, torch.SymInt):
        concrete = size.node.maybe_as_int()
        if concrete is not None:
            return concrete
        return _UNBACKED_SYMBOL.sub("u", str(size))
    return size


def _metas_equal(a: TensorMeta, b: TensorMeta) -> bool:
    return (
        len(a.shape) == len(b.shape)
        and len(a.stride) == len(b.stride)
        and a.dtype == b.dtype
        and all(_size_key(x) == _size_key(y) for x, y in zip(a.shape, b.shape))
        and all(_size_key(x) == _size_key(y) for x, y in zip(a.stride, b.stride))
    )


class _Checker:
    """Collects the violations of one strategy against one op schema.

    With ``filled_only``, only what a strategy function filled in is judged: a field
    left ``None``, a single spec standing for every output and counts the finalizer
    rejects on its own pass (strict mode's check of what a strategy gave).
    """

    def __init__(
        self, op: OpOverload, filled_only: bool = False, eager_dispatch: bool = False
    ) -> None:
        self.op = op
        self.op_name = str(op)
        self.filled_only = filled_only
        self.eager_dispatch = eager_dispatch
        self.violations: list[ContractViolation] = []

    def add(
        self,
        clause: str,
        index: int,
        position: str,
        expected: str,
        got: str,
        child: int | None = None,
    ) -> None:
        if child is not None:
            self.violations.append(
                ContractViolation(
                    "C5", self.op_name, index, f"child {child} {position}", expected, got, clause
                )
            )
        else:
            self.violations.append(
                ContractViolation(clause, self.op_name, index, position, expected, got)
            )

    def check_outputs(
        self, index: int, spec: OpSpec, metas: OutputMetas, child: int | None
    ) -> None:
        out = spec.output_specs
        if metas is None:
            # C2: no tensor result at all.
            if out is not None:
                self.add("C2", index, "output", "None (op returns no tensor)", _describe_spec(out), child)
            return
        if isinstance(metas, TensorMeta):
            if not isinstance(out, DTensorSpec):
                if not self.filled_only:
                    self.add("C2", index, "output", "a DTensorSpec (op returns one tensor)", _describe_spec(out), child)
                return
            self.check_one_output(index, "output", out, metas, child)
            return
        # Several results: a tuple/list with one entry per result.
        if not isinstance(out, (tuple, list)) or len(out) != len(metas):
            if self.filled_only:
                return
            self.add(
                "C2", index, "output",
                f"a tuple of {len(metas)} output specs", _describe_spec(out), child,
            )
            return
        for pos, (o, m) in enumerate(zip(out, metas)):
            where = f"output {pos}"
            if m is None:
                if o is not None:
                    self.add("C2", index, where, "None (result is None)", _describe_spec(o), child)
            elif isinstance(m, TensorMeta):
                if isinstance(o, DTensorSpec):
                    self.check_one_output(index, where, o, m, child)
                elif not self.filled_only:
                    self.add("C2", index, where, "a DTensorSpec (result is a tensor)", _describe_spec(o), child)
            elif not self.filled_only:
                # A nested list result (e.g. one return of a fused multi-list op)
                # is only described per element by TupleStrategy children.
                self.add("C2", index, where, "a TupleStrategy for a list result", _describe_spec(o), child)

    def check_one_output(
        self, index: int, where: str, out: DTensorSpec, meta: TensorMeta, child: int | None
    ) -> None:
        got = out.tensor_meta
        if got is None and self.filled_only:
            return
        if got is None or not _metas_equal(got, meta):
            self.add("C1", index, where, _describe_meta(meta), _describe_meta(got), child)

    def check_inputs(
        self, index: int, spec: OpSpec, inputs: list[OpStrategy], child: int | None
    ) -> None:
        if spec.input_specs is None:
            if not self.filled_only:
                self.add("C3", index, "input_specs", f"{len(inputs)} input specs", "None", child)
        elif len(spec.input_specs) != len(inputs):
            if not self.filled_only:
                self.add(
                    "C3", index, "input_specs", f"{len(inputs)} input specs",
                    f"{len(spec.input_specs)} input specs", child,
                )
        else:
            for pos, (got, inp) in enumerate(zip(spec.input_specs, inputs)):
                expected = inp.strategies[0].output_spec.tensor_meta
                if self.filled_only and (
                    not isinstance(got, DTensorSpec) or got.tensor_meta is None or expected is None
                ):
                    continue
                if not isinstance(got, DTensorSpec):
                    self.add("C3", index, f"input {pos}", "a DTensorSpec", _describe_spec(got), child)
                elif got.tensor_meta is None or expected is None or not _metas_equal(
                    got.tensor_meta, expected
                ):
                    self.add(
                        "C3", index, f"input {pos}", _describe_meta(expected),
                        _describe_meta(got.tensor_meta), child,
                    )
        costs = spec.redistribute_cost
        if costs is None:
            if not self.filled_only:
                self.add("C4", index, "redistribute_cost", f"{len(inputs)} rows", "None", child)
            return
        if len(costs) != len(inputs):
            self.add("C4", index, "redistribute_cost", f"{len(inputs)} rows", f"{len(costs)} rows", child)
            return
        for pos, (row, inp) in enumerate(zip(costs, inputs)):
            where = f"redistribute_cost row {pos}"
            if len(row) != len(inp.strategies):
                self.add(
                    "C4", index, where, f"{len(inp.strategies)} costs (one per candidate)",
                    f"{len(row)} costs", child,
                )
                continue
            for c in row:
                if isinstance(c, (torch.SymFloat, torch.SymInt)):
                    # A symbolic cost (dynamic shapes) is not judged: reading its
                    # value would add a guard to the trace being checked.
                    continue
                value = float(c)
                if math.isnan(value) or value < 0:
                    self.add("C4", index, where, "finite non-negative costs or inf", repr(value), child)
                    break

    def check_op_strategy(
        self,
        op_schema: OpSchema,
        strategy: OpStrategy,
        metas: OutputMetas,
        child: int | None = None,
    ) -> None:
        inputs = tensor_inputs(op_schema)
        metas = without_unplaced(op_schema, strategy, metas, self.eager_dispatch)
        for index, spec in enumerate(strategy.strategies):
            self.check_outputs(index, spec, metas, child)
            self.check_inputs(index, spec, inputs, child)


def check_strategy_contract(
    op_schema: OpSchema,
    strategy: StrategyType,
    output_metas: OutputMetas,
    filled_only: bool = False,
    eager_dispatch: bool = False,
) -> list[ContractViolation]:
    """Return every violation of C1-C5 by ``strategy`` for ``op_schema``.

    Args:
        op_schema: the strategy schema the strategy was produced for (tensor
            arguments as ``OpStrategy``/``TupleStrategy``, each candidate carrying
            the input's ``tensor_meta``).
        strategy: what the strategy machinery returned.
        output_metas: the expected results, as :func:`infer_output_metas` gives them.
        filled_only: judge only the fields the strategy filled in (see ``_Checker``);
            for a strategy function's own result, before a registry completes it.
        eager_dispatch: the strategy is the one DTensor's eager dispatch runs with,
            where a result of :data:`REPLICATED_RETURNS` may stay ``None`` (see C2).
    """
    checker = _Checker(op_schema.op, filled_only, eager_dispatch)
    if isinstance(strategy, OpStrategy):
        checker.check_op_strategy(op_schema, strategy, output_metas)
    elif isinstance(strategy, TupleStrategy):
        for i, child in enumerate(strategy.children):
            if not isinstance(child, OpStrategy):
                checker.add(
                    "C2", -1, "strategy", "an OpStrategy per element", type(child).__name__, i
                )
                continue
            checker.check_op_strategy(
                element_schema(op_schema, i),
                child,
                element_output_metas(op_schema.op, output_metas, i),
                child=i,
            )
    else:
        checker.add(
            "C2", -1, "strategy", "an OpStrategy or TupleStrategy", type(strategy).__name__
        )
    return checker.violations
