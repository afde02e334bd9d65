# mypy: allow-untyped-defs
# Owner(s): ["oncall: distributed"]
"""
A check of what a DTensor sharding strategy hands its consumers.

Every ``OpSpec`` of a strategy for ``op(*args, **kwargs)``, whichever registry
produced it (a single-dim rule expanded to the mesh, a ``register_op_strategy``
function, a decomposition), satisfies:

C1  every output position where the op returns a tensor holds a ``DTensorSpec``
    whose ``tensor_meta`` (shape, stride, dtype) is the op's result on the
    global inputs;
C2  every output position where the op returns ``None`` holds ``None``; one
    tensor result is a ``DTensorSpec``, several results a tuple with one entry
    per result, a ``Tensor[]`` result a tuple with one entry per element, and
    an op without tensor results has ``output_specs=None``;
C3  ``input_specs`` holds one ``DTensorSpec`` per tensor input (arguments in
    flattened order, then keyword arguments), each with that input's meta;
C4  ``redistribute_cost`` holds one row per tensor input, each as long as that
    input's list of candidates, every value non-negative (``inf`` allowed);
C5  each child of a ``TupleStrategy`` satisfies C1-C4 for its element.

The expected metas come from running the op on fake tensors here, independently
of DTensor's own shape inference, so the check judges any torch build.
"""

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import (
    OpSchema,
    OpSpec,
    OpStrategy,
    StrategyType,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.testing._internal.opinfo.core import OpInfo
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_any, tree_flatten, tree_map


__all__ = [
    "contract_violations",
    "dtensor_calls",
    "expected_output_metas",
    "query_strategy",
    "strategy_schema",
]

# The result of an op as the contract sees it: one meta, a tuple with ``None``
# where the op returns ``None`` (or a non-tensor), or ``None`` without tensors.
Metas = TensorMeta | tuple[TensorMeta | None, ...] | None


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def _leaf_meta(x: object) -> TensorMeta | None:
    if isinstance(x, OpStrategy):
        return x.strategies[0].output_spec.tensor_meta
    if isinstance(x, DTensorSpec):
        return x.tensor_meta
    return None


def _fake_args(op_schema: OpSchema, mode: FakeTensorMode) -> tuple[Any, Any]:
    def fake(x: object) -> object:
        if isinstance(x, TupleStrategy):
            return [fake(c) for c in x.children]
        meta = _leaf_meta(x)
        if meta is None:
            return x
        with mode:
            return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype)

    is_leaf = lambda x: isinstance(x, (OpStrategy, TupleStrategy, DTensorSpec))  # noqa: E731
    return (
        tree_map(fake, op_schema.args_schema, is_leaf=is_leaf),
        tree_map(fake, op_schema.kwargs_schema, is_leaf=is_leaf),
    )


def expected_output_metas(op_schema: OpSchema) -> Metas:
    """What ``op_schema.op`` returns on its global inputs, as metas."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args, kwargs = _fake_args(op_schema, mode)
    with mode:
        out = op_schema.op(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return _meta(out)
    if isinstance(out, (tuple, list)):
        metas = tuple(_meta(o) if isinstance(o, torch.Tensor) else None for o in out)
        return metas if any(m is not None for m in metas) else None
    return None


def _input_leaves(op_schema: OpSchema) -> list[OpStrategy]:
    leaves, _ = tree_flatten(
        (op_schema.args_schema, op_schema.kwargs_schema),
        is_leaf=lambda x: isinstance(x, OpStrategy),
    )
    return [x for x in leaves if isinstance(x, OpStrategy)]


def _same_meta(a: TensorMeta, b: TensorMeta) -> bool:
    if a.dtype != b.dtype or len(a.shape) != len(b.shape):
        return False
    # Strides of size-1 dims carry no information; kernels differ there.
    return all(
        sa == sb and (sa == 1 or ta == tb)
        for sa, sb, ta, tb in zip(a.shape, b.shape, a.stride, b.stride)
    )


def _spec_violations(
    where: str, spec: OpSpec, inputs: list[OpStrategy], expected: Metas, list_return: bool
) -> list[str]:
    found: list[str] = []
    outs = spec.output_specs
    if expected is None:
        if outs is not None and not (
            isinstance(outs, tuple) and all(o is None for o in outs)
        ):
            found.append(f"{where}: C2 output_specs is {outs}, the op returns no tensor")
    elif isinstance(expected, TensorMeta) and not list_return:
        found += _output_violations(f"{where} output", outs, expected)
    else:
        metas = (expected,) if isinstance(expected, TensorMeta) else expected
        if not isinstance(outs, tuple) or len(outs) != len(metas):
            found.append(f"{where}: C2 output_specs is {outs}, expected {len(metas)} entries")
        else:
            for i, (o, m) in enumerate(zip(outs, metas)):
                found += _output_violations(f"{where} output {i}", o, m)
    if spec.input_specs is None or len(spec.input_specs) != len(inputs):
        n = None if spec.input_specs is None else len(spec.input_specs)
        found.append(f"{where}: C3 {n} input_specs for {len(inputs)} tensor inputs")
    else:
        for i, (s, inp) in enumerate(zip(spec.input_specs, inputs)):
            want = _leaf_meta(inp)
            got = s.tensor_meta if isinstance(s, DTensorSpec) else None
            if got is None or want is None or not _same_meta(got, want):
                found.append(f"{where} input {i}: C3 tensor_meta {got}, expected {want}")
    costs = spec.redistribute_cost
    if costs is None or len(costs) != len(inputs):
        n = None if costs is None else len(costs)
        found.append(f"{where}: C4 {n} redistribute_cost rows for {len(inputs)} tensor inputs")
    else:
        for i, (row, inp) in enumerate(zip(costs, inputs)):
            if len(row) != len(inp.strategies):
                found.append(
                    f"{where} input {i}: C4 cost row of {len(row)} for "
                    f"{len(inp.strategies)} candidates"
                )
            elif any(math.isnan(c) or c < 0 for c in row):
                found.append(f"{where} input {i}: C4 cost row {row}")
    return found


def _output_violations(where: str, out: object, want: TensorMeta | None) -> list[str]:
    if want is None:
        return [] if out is None else [f"{where}: C2 {out}, the op returns None"]
    if not isinstance(out, DTensorSpec):
        return [f"{where}: C2 {out}, the op returns a tensor"]
    if out.tensor_meta is None or not _same_meta(out.tensor_meta, want):
        return [f"{where}: C1 tensor_meta {out.tensor_meta}, expected {want}"]
    return []


def _element_schema(op_schema: OpSchema, i: int) -> OpSchema:
    pick = lambda x: x.children[i] if isinstance(x, TupleStrategy) else x  # noqa: E731
    is_leaf = lambda x: isinstance(x, TupleStrategy)  # noqa: E731
    return OpSchema(
        op_schema.op,
        tree_map(pick, op_schema.args_schema, is_leaf=is_leaf),
        tree_map(pick, op_schema.kwargs_schema, is_leaf=is_leaf),
    )


def contract_violations(
    op_schema: OpSchema, strategy: StrategyType, expected: Metas
) -> list[str]:
    """Every way ``strategy``, answered for ``op_schema``, breaks C1-C5.

    ``expected`` is :func:`expected_output_metas` of ``op_schema``. Each entry
    names the op, the ``OpSpec`` index, the position and the clause.
    """
    op = op_schema.op
    list_return = any(isinstance(r.type, torch.ListType) for r in op._schema.returns)
    if isinstance(strategy, TupleStrategy):
        found: list[str] = []
        for i, child in enumerate(strategy.children):
            element = _element_schema(op_schema, i)
            if isinstance(expected, tuple) and not isinstance(expected, TensorMeta):
                want: Metas = expected[i]
            else:
                # In-place foreach ops return nothing; each element is self.
                want = _leaf_meta(_input_leaves(element)[0])
            found += [
                f"child {i}: {v}"
                for v in _strategy_violations(element, child, want, False)
            ]
        return found
    return _strategy_violations(op_schema, strategy, expected, list_return)


def _strategy_violations(
    op_schema: OpSchema, strategy: StrategyType, expected: Metas, list_return: bool
) -> list[str]:
    op = op_schema.op
    if not isinstance(strategy, OpStrategy):
        return [f"{op}: C5 a {type(strategy).__name__} where an OpStrategy is expected"]
    if not strategy.strategies:
        return [f"{op}: the strategy has no OpSpec"]
    inputs = _input_leaves(op_schema)
    found: list[str] = []
    for k, spec in enumerate(strategy.strategies):
        found += _spec_violations(f"{op} OpSpec {k}", spec, inputs, expected, list_return)
    return found


def violation_clauses(violations: Sequence[str]) -> set[str]:
    """The clauses (``"C1"`` .. ``"C5"``) that ``violations`` name."""
    return {c for v in violations for c in ("C1", "C2", "C3", "C4", "C5") if f"{c} " in v}


def _propagator() -> Any:
    from torch.distributed.tensor import DTensor

    return DTensor._op_dispatcher.sharding_propagator


def registry(op: OpOverload) -> str | None:
    """Which of DTensor's registries answers ``op``: ``"single_dim"``,
    ``"op_strategy"``, ``"decomposition"``, or ``None``."""
    from torch.distributed.tensor._decompositions import DecompShardingStrategy

    prop = _propagator()
    if op in prop.op_single_dim_strategy_funcs:
        return "single_dim"
    if op in prop.op_strategy_funcs:
        return "op_strategy"
    if DecompShardingStrategy.has_decomp(op):
        return "decomposition"
    return None


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[OpOverload, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # Metas as they are at the call: later in-place calls may resize.
        self.calls.append((func, *tree_map(_as_meta, (args, kwargs))))
        return func(*args, **kwargs)


def _as_meta(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def call_key(op: OpOverload, args: tuple, kwargs: dict) -> str:
    """Tells calls apart by op, input metas and non-tensor arguments."""
    describe = lambda x: (  # noqa: E731
        (tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x
    )
    return repr((op, tree_map(describe, (args, kwargs))))


def dtensor_calls(
    opinfo: OpInfo, samples: int = 1, seen: set[str] | None = None
) -> list[tuple[OpOverload, tuple, dict]]:
    """The aten calls a registry answers among those ``opinfo``'s first
    ``samples`` CPU float32 samples make, each with at least one tensor input,
    leaving out (and adding to ``seen``) calls already in ``seen``."""
    found: list[tuple[OpOverload, tuple, dict]] = []
    seen = set() if seen is None else seen
    inputs = opinfo.sample_inputs("cpu", torch.float32, requires_grad=False)
    for sample in itertools.islice(inputs, samples):
        recorder = _Recorder()
        try:
            with recorder:
                opinfo.op(sample.input, *sample.args, **sample.kwargs)
        except Exception:
            # A sample the op rejects on CPU says nothing about DTensor.
            continue
        for call in recorder.calls:
            key = call_key(*call)
            if key not in seen and registry(call[0]) is not None and tree_any(
                lambda x: isinstance(x, torch.Tensor), (call[1], call[2])
            ):
                seen.add(key)
                found.append(call)
    return found


Candidates = Callable[[torch.Tensor, DeviceMesh], list[tuple[Placement, ...]]]


def _even_dims(t: torch.Tensor, mesh: DeviceMesh) -> list[int]:
    return [
        d for d in range(t.dim()) if t.shape[d] > 0 and t.shape[d] % mesh.size() == 0
    ]


def runtime_candidate(t: torch.Tensor, mesh: DeviceMesh) -> list[tuple[Placement, ...]]:
    """One candidate, as DTensor's dispatch sees an input: sharded on its
    first evenly shardable dim on every mesh dim, else replicated."""
    dims = _even_dims(t, mesh)
    p: Placement = Shard(dims[0]) if dims else Replicate()
    return [(p,) * mesh.ndim]


def planner_candidates(
    t: torch.Tensor, mesh: DeviceMesh, cap: int = 6
) -> list[tuple[Placement, ...]]:
    """Several candidates, as a planner offers them: ``Replicate`` and every
    evenly shardable dim on each mesh dim, at most ``cap`` combinations."""
    options = [Replicate(), *(Shard(d) for d in _even_dims(t, mesh))]
    return list(itertools.islice(itertools.product(options, repeat=mesh.ndim), cap))


def strategy_schema(
    op: OpOverload,
    args: tuple,
    kwargs: dict,
    mesh: DeviceMesh,
    candidates: Candidates = runtime_candidate,
) -> OpSchema:
    """The schema a strategy function receives for ``op(*args, **kwargs)``:
    each tensor an ``OpStrategy`` of ``candidates``, each tensor list a
    ``TupleStrategy``, with the op's registered ``RuntimeSchemaInfo``."""
    prop = _propagator()
    if registry(op) == "decomposition":
        prop.decomp_strategy.ensure_schema_info(op)

    def wrap(x: object) -> object:
        if isinstance(x, torch.Tensor):
            meta = TensorMeta(x.shape, x.stride(), x.dtype)
            return OpStrategy(
                [OpSpec(DTensorSpec(mesh, c, tensor_meta=meta)) for c in candidates(x, mesh)]
            )
        if isinstance(x, (list, tuple)) and x and all(
            isinstance(e, torch.Tensor) for e in x
        ):
            return TupleStrategy([wrap(e) for e in x])
        if isinstance(x, (list, tuple)):
            return type(x)(wrap(e) for e in x)
        return x

    info = prop.op_to_schema_info.get(op) or prop.op_to_schema_info_for_single_dim_strategy.get(op)
    return OpSchema(
        op,
        tuple(wrap(a) for a in args),
        {k: wrap(v) for k, v in kwargs.items()},
        schema_info=info,
    )


def _spec_schema(op_schema: OpSchema) -> OpSchema:
    def spec(x: object) -> object:
        if isinstance(x, OpStrategy):
            return x.strategies[0].output_spec
        if isinstance(x, TupleStrategy):
            return [spec(c) for c in x.children]
        if isinstance(x, (list, tuple)):
            return type(x)(spec(e) for e in x)
        return x

    return OpSchema(
        op_schema.op,
        tuple(spec(a) for a in op_schema.args_schema),
        {k: spec(v) for k, v in op_schema.kwargs_schema.items()},
        schema_info=op_schema.schema_info,
    )


def query_strategy(
    op_schema: OpSchema, mesh: DeviceMesh, runtime: bool
) -> StrategyType | None:
    """Ask the registry holding ``op_schema.op`` for its strategy, as DTensor's
    dispatch does (``runtime``: output metas passed, the decomposition path
    given specs) or as a planner does (the strategy schema alone). ``None``
    where the decomposition path declines."""
    from torch.distributed.tensor._ops.single_dim_strategy import (
        _expand_single_dim_strategy_to_mesh,
    )

    op = op_schema.op
    prop = _propagator()
    kind = registry(op)
    runtime_schema = _spec_schema(op_schema) if runtime else None
    metas = (
        prop._propagate_tensor_meta_non_cached(runtime_schema)
        if runtime_schema is not None
        else None
    )
    if kind == "single_dim":
        expand = _expand_single_dim_strategy_to_mesh(
            mesh, op_schema, prop.op_single_dim_strategy_funcs[op], metas
        )
        return expand(op, op_schema.args_meta, op_schema.kwargs_meta)
    if kind == "op_strategy":
        return prop.op_strategy_funcs[op](op_schema)
    if kind == "decomposition" and runtime_schema is not None:
        try:
            return prop.decomp_strategy.propagate_strategy(runtime_schema, metas)
        except Exception as e:
            # Dispatch turns any failure of the decomposition path into this.
            raise NotImplementedError(f"{op} has no sharding strategy") from e
    if kind == "decomposition":
        return prop.decomp_strategy.propagate_strategy(op_schema)
    raise ValueError(f"no DTensor registry answers {op}")
