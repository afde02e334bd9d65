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
:func:`infer_output_metas` provides the expected output metadata. Both only rely
on DTensor's public data structures, so they can judge any strategy, whichever
version of the machinery produced it.
"""

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast, TypeAlias

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
from torch.utils import _pytree as pytree


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

# Output metadata as shape inference gives it: ``TensorMeta`` for a tensor, ``None``
# for a ``None`` or non-tensor result, and tuples/lists mirroring the op's returns.
OutputMetas: TypeAlias = TensorMeta | Sequence[Any] | None


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


def op_has_tensor_returns(op: OpOverload) -> bool:
    """Whether any declared return of ``op`` can hold a tensor."""
    return any("Tensor" in str(ret.type) for ret in op._schema.returns)


def _is_tensor_input(x: object) -> bool:
    return isinstance(x, OpStrategy)


def tensor_inputs(op_schema: OpSchema) -> list[OpStrategy]:
    """The tensor inputs of a strategy schema, flattened in argument order.

    Lists of tensors (``TupleStrategy`` or plain lists, possibly with ``None``
    holes) contribute their elements; kwargs (e.g. ``out=``) come after args.
    """
    leaves = pytree.tree_leaves(
        (op_schema.args_schema, list(op_schema.kwargs_schema.values()))
    )
    return [leaf for leaf in leaves if _is_tensor_input(leaf)]


def element_schema(op_schema: OpSchema, index: int) -> OpSchema:
    """The per-element schema of a foreach-like op: list args reduced to element ``index``."""

    def pick(x: object) -> object:
        if isinstance(x, TupleStrategy):
            return x.children[index]
        return x

    args = tuple(pick(a) for a in op_schema.args_schema)
    kwargs = {k: pick(v) for k, v in op_schema.kwargs_schema.items()}
    return OpSchema(op_schema.op, args, kwargs, schema_info=op_schema.schema_info)


def element_output_metas(op: OpOverload, output_metas: OutputMetas, index: int) -> OutputMetas:
    """The results of element ``index`` of a foreach-like op."""
    if output_metas is None or isinstance(output_metas, TensorMeta):
        # In-place foreach ops return nothing; a per-element result is None.
        return None if output_metas is None else output_metas
    returns = op._schema.returns
    if len(returns) == 1:
        # A single List[Tensor] return: element i is the i-th tensor.
        return cast(OutputMetas, output_metas[index])
    # Several list returns (e.g. functional fused optimizers): one entry per return.
    # (a TensorMeta is a NamedTuple: a tensor return is taken whole, not indexed)
    return tuple(
        m[index] if isinstance(m, (list, tuple)) and not isinstance(m, TensorMeta) else m
        for m in output_metas
    )


# Op results no sharding rule places, by return name, each with why it is
# ``Replicate``: every rank holds the whole (small) tensor, and no placement of the
# inputs changes it. Rules leave them ``None``; specs handed out replicate them.
_RNG_STATE = (
    "the RNG state the kernel drew its dropout mask from; each rank holds all of "
    "it, and the backward kernel reads it whole"
)
_DENSE_UNUSED = (
    "an offset buffer only nested (jagged) inputs use; for the dense inputs "
    "DTensor runs, each rank holds the same empty or unused tensor"
)
REPLICATED_RETURNS: dict[str, str] = {
    "philox_seed": _RNG_STATE,
    "philox_offset": _RNG_STATE,
    "rng_state": _RNG_STATE,
    "unused": (
        "a placeholder the flash kernel returns beside its RNG state (and its "
        "backward takes as philox_offset); each rank holds the same 0-d tensor"
    ),
    "cum_seq_q": _DENSE_UNUSED,
    "cum_seq_k": _DENSE_UNUSED,
}


@functools.cache
def replicated_returns(op: OpOverload) -> frozenset[int]:
    """Positions of ``op``'s tensor returns named in :data:`REPLICATED_RETURNS`."""
    return frozenset(
        pos
        for pos, ret in enumerate(op._schema.returns)
        if ret.name in REPLICATED_RETURNS and "Tensor" in str(ret.type)
    )


@functools.cache
def _mask_argument(op: OpOverload) -> tuple[int, str] | None:
    """(position, name) of ``op``'s ``bool[]`` argument masking its results, if any."""
    returns = op._schema.returns
    if len(returns) < 2 or not all(str(ret.type) == "Tensor" for ret in returns):
        return None
    for position, arg in enumerate(op._schema.arguments):
        if str(arg.type) == "List[bool]" and arg.name.endswith("mask"):
            return position, arg.name
    return None


def masked_off_returns(op_schema: OpSchema) -> frozenset[int]:
    """The return positions ``op_schema``'s call masks off.

    An op with several tensor returns and a ``bool[]`` argument named ``*mask``
    (``output_mask``, ``grad_input_mask``) with one entry per return asks, with a
    False entry, not to compute that return. Whether the result then is ``None``
    is the kernel's call (see C2); where shape inference gives ``None`` it is
    ``None`` (CPU convolution on its mkldnn path still computes ``grad_weight``
    along with a requested ``grad_bias``; DTensor fails on that result, as it
    always has).
    """
    found = _mask_argument(op_schema.op)
    if found is None:
        return frozenset()
    position, name = found
    if position < len(op_schema.args_schema):
        mask = op_schema.args_schema[position]
    else:
        mask = op_schema.kwargs_schema.get(name)
    if not isinstance(mask, (list, tuple)) or len(mask) != len(op_schema.op._schema.returns):
        return frozenset()
    return frozenset(pos for pos, wanted in enumerate(mask) if not wanted)


def without_unplaced(
    op_schema: OpSchema,
    strategy: OpStrategy,
    output_metas: OutputMetas,
    eager_dispatch: bool = False,
) -> OutputMetas:
    """``output_metas`` with ``None`` at the results ``strategy`` may leave unplaced.

    A masked-off result (:func:`masked_off_returns`) that no ``OpSpec`` of the
    strategy gives a spec is not computed, or DTensor hands back the kernel's
    ``None``. With ``eager_dispatch`` (DTensor's own dispatch, whose strategy no one
    else sees) a result named in :data:`REPLICATED_RETURNS` that every ``OpSpec``
    leaves ``None`` is too: eager hands it back as each rank's plain tensor, as
    stock DTensor does. Everywhere else such a result holds a spec (C2).
    """
    if output_metas is None or isinstance(output_metas, TensorMeta) or not strategy.strategies:
        return output_metas
    outs = [spec.output_specs for spec in strategy.strategies]
    returns = op_schema.op._schema.returns
    if len(returns) != len(output_metas) or not all(
        isinstance(o, tuple) and len(o) == len(output_metas) for o in outs
    ):
        return output_metas
    may_be_unplaced = masked_off_returns(op_schema)
    if eager_dispatch:
        may_be_unplaced |= replicated_returns(op_schema.op)
    unplaced = [
        isinstance(m, TensorMeta)
        and pos in may_be_unplaced
        and all(o[pos] is None for o in outs)  # type: ignore[index]
        for pos, m in enumerate(output_metas)
    ]
    if not any(unplaced):
        return output_metas
    return tuple(None if is_unplaced else m for m, is_unplaced in zip(output_metas, unplaced))


def _spec_to_fake(spec: object, device: str) -> object:
    meta = spec.tensor_meta  # type: ignore[attr-defined]
    if meta is None:
        raise ValueError("shape inference needs every tensor input to carry tensor_meta")
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=device)


def _to_meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return TensorMeta(shape=x.shape, stride=x.stride(), dtype=x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_to_meta(e) for e in x)
    return None


def infer_output_metas(op_schema: OpSchema, data_dependent: bool = True) -> OutputMetas:
    """Run shape inference of ``op_schema.op`` on fake tensors built from the global input metas.

    Accepts runtime schemas (``DTensorSpec`` args) and strategy schemas
    (``OpStrategy``/``TupleStrategy`` args). Returns ``None`` for ops without tensor
    returns, without running them (data-dependent ops such as ``aten.equal``).
    A result whose size depends on the data gets unbacked symbolic sizes; with
    ``data_dependent=False`` (eager DTensor, whose global shapes must be concrete)
    shape inference raises for it instead.
    """
    if not op_has_tensor_returns(op_schema.op):
        return None
    from torch._guards import detect_fake_mode
    from torch._subclasses import FakeTensorMode
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    device = "cpu"
    for leaf in pytree.tree_leaves((op_schema.args_schema, op_schema.kwargs_schema)):
        if isinstance(leaf, (OpStrategy, DTensorSpec)):
            device = leaf.mesh.device_type
            break

    def convert(x: object) -> object:
        if isinstance(x, TupleStrategy):
            # A list argument: the op takes a list of tensors, not the strategy.
            return [convert(child) for child in x.children]
        if isinstance(x, OpStrategy):
            return _spec_to_fake(x.strategies[0].output_spec, device)
        if isinstance(x, DTensorSpec):
            return _spec_to_fake(x, device)
        return x

    def run(fake_mode: FakeTensorMode) -> object:
        # Under make_fx, this global-shape computation must not be recorded into
        # the traced graph: it only derives metadata for the (local) computation.
        with fake_mode, disable_proxy_modes_tracing():
            args, kwargs = pytree.tree_map(
                convert,
                (op_schema.args_schema, op_schema.kwargs_schema),
                is_leaf=lambda x: isinstance(x, (OpStrategy, TupleStrategy, DTensorSpec)),
            )
            return op_schema.op(*args, **kwargs)

    ambient = detect_fake_mode()
    if ambient is not None:
        out = run(ambient)
    else:
        try:
            out = run(FakeTensorMode())
        except (DataDependentOutputException, DynamicOutputShapeException):
            if not data_dependent:
                raise
            # The result's size depends on the data (nonzero, masked_select, ...):
            # with a ShapeEnv it comes out as an unbacked symbolic size.
            out = run(FakeTensorMode(shape_env=ShapeEnv()))
    return cast(OutputMetas, _to_meta(out))


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
