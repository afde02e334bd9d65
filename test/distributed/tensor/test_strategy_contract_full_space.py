# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
DTensor's planner answer holds the whole space of an op's single-dim rule.

A planner that wants every way to run an op can expand the op's registered
single-dim rule itself: it calls the rule it finds in
``ShardingPropagator.op_single_dim_strategy_funcs`` on the inputs' metas, adds
the all-Replicate rule, turns every ``_ShardingPlaceholder`` into ``Shard`` and
hands the rules to ``expand_to_full_mesh_op_strategy`` with the query's input
strategies, reading what the rule's registration says as DTensor does (an
in-place op's ``self`` keeps its placement, the op being in-place when its
schema writes its first argument; the rule's full-mesh filter; uneven and
unbacked sharding). ``ShardingPropagator.get_op_strategy`` on the same
schema must offer every strategy that expansion finds, whatever candidates the
inputs offer: several each, or a single unsharded one (a planner asking what an
op can do from where its inputs are), so that the planner can drop its own
expansion.

The ops are every op with a single-dim rule that OpInfo samples call (one call
each), or that takes the same arguments as one they call; foreach-like ops are
compared element by element, as DTensor expands them.
"""

import functools
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import (
    _resolve_foreach_elementwise_overload,
    _ShardingPlaceholder,
)
from torch.distributed.tensor._ops.strategy_contract import (
    element_output_metas,
    infer_output_metas,
)
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    capped_candidates,
    replicated_candidate,
)
from torch.testing._internal.distributed._tensor.contract_capture import (
    CallRecorder,
    capture_calls,
    opinfo_db,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


# Ops whose rules DTensor expands once per element of their tensor lists.
FOREACH_PREFIXES = ("aten::_foreach_", "aten::_amp_foreach_", "aten::_fused_")

CANDIDATES = {
    "one_replicated": replicated_candidate,
    "several": capped_candidates(4),
}

# (per result: its placements, or None where the op returns None; per input: its placements)
Key = tuple[tuple[object, ...], tuple[object, ...]]


def _rules() -> dict[OpOverload, Any]:
    return DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs


def _signature(op: OpOverload) -> tuple[tuple[str, str, bool], ...]:
    """What a call must match: argument names, types and keyword-onliness."""
    return tuple((a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments)


Call = tuple[tuple[object, ...], dict[str, object]]


@functools.cache
def single_dim_calls() -> dict[OpOverload, list[Call]]:
    """Per op with a single-dim rule, the calls to ask about.

    An op an OpInfo sample calls has that call. An op no sample calls has the
    calls of the sampled ops with the same signature (``__xor__.Tensor`` those of
    ``bitwise_xor.Tensor``), of which the first one shape inference accepts is
    asked about; ops with neither are left out.
    """
    rules = _rules()
    recorder = CallRecorder(1, keep=lambda op: op in rules)
    capture_calls(
        opinfo_db(),
        dtypes=(torch.float32, torch.int64, torch.bool),
        samples=1,
        foreach_tensors=2,
        recorder=recorder,
    )
    sampled: dict[OpOverload, Call] = {
        op: (call.args, call.kwargs)
        for op, calls in recorder.calls.items()
        for call in list(calls.values())[:1]
    }
    by_signature: dict[object, list[Call]] = {}
    for op in sorted(sampled, key=str):
        by_signature.setdefault(_signature(op), []).append(sampled[op])
    found: dict[OpOverload, list[Call]] = {}
    for op in sorted(rules, key=str):
        if op in sampled:
            found[op] = [sampled[op]]
        elif _signature(op) in by_signature:
            found[op] = by_signature[_signature(op)]
    return found


def schema_for(
    mesh: DeviceMesh, op: OpOverload, calls: Sequence[Call], candidates: Any
) -> OpSchema | None:
    """The strategy schema of the first of ``calls`` that shape inference accepts."""
    # Fake tensors log the meta kernel's refusal of another op's arguments (a
    # float tensor for __lshift__) before raising it; the refusal is expected.
    fake_tensor_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_tensor_log.level
    fake_tensor_log.setLevel(logging.CRITICAL)
    try:
        for args, kwargs in calls:
            schema = strategy_schema(mesh, op, args, kwargs, candidates)
            try:
                infer_output_metas(schema)
            except Exception:
                continue
            return schema
    finally:
        fake_tensor_log.setLevel(level)
    return None


def _returned(metas: object) -> list[bool]:
    """Per result position, whether the op returns a tensor there."""
    if metas is None:
        return []
    if isinstance(metas, TensorMeta):
        return [True]
    return [m is not None for m in metas]  # type: ignore[union-attr]


def key(spec: OpSpec, returned: Sequence[bool]) -> Key:
    """Placements by name: a ``_MaskPartial`` equals only itself (its mask buffer
    is compared by identity), and its name holds every other field."""
    outs = spec.output_specs
    results = outs if isinstance(outs, tuple) else (outs,)
    placed = tuple(
        tuple(str(p) for p in o.placements)
        if o is not None and i < len(returned) and returned[i]
        else None
        for i, o in enumerate(results)
    )
    inputs = tuple(tuple(str(p) for p in s.placements) for s in spec.input_specs or ())
    return placed, inputs


def writes_first_argument(op: OpOverload) -> bool:
    """In-place, as the planner reads it from the schema: the op writes ``self``.

    (``__xor__`` and ``__lshift__`` end in ``_`` and write nothing.)
    """
    arguments = op._schema.arguments
    alias_info = arguments[0].alias_info if arguments else None
    return alias_info is not None and alias_info.is_write


def describe(k: Key) -> str:
    def one(p: object) -> str:
        return "None" if p is None else "(" + ", ".join(p) + ")"  # type: ignore[call-overload]

    return ", ".join(one(o) for o in k[0]) + " <- " + ", ".join(one(i) for i in k[1])


def planner_expansion(
    op: OpOverload, schema: OpSchema, metas: object, info: Any
) -> OpStrategy:
    """``op``'s registered rule expanded by the planner over ``schema``'s candidates.

    ``op`` is the op the planner was asked about (an in-place foreach op for its
    elements' schemas), ``schema`` what the rule is called on.
    """
    mesh = schema.get_mesh_from_args(validate=False)
    inputs = [*schema.args_strategy, *schema.kwargs_strategy]
    rules = info.func(schema.op, schema.args_meta, schema.kwargs_meta)
    returned = _returned(metas)
    n_outputs = len(rules[0]) - len(inputs) if rules else len(returned)
    resolved = [
        [Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in rule]
        for rule in rules
    ]
    if not any(all(p is None or isinstance(p, Replicate) for p in r) for r in resolved):
        outputs = [
            Replicate() if i >= len(returned) or returned[i] else None
            for i in range(n_outputs)
        ]
        resolved.insert(0, outputs + [Replicate()] * len(inputs))
    extra: dict[str, Any] = {}
    # Rules registered with a full-mesh filter (torch 2.14.1 has them; 2.13.0's
    # registration has no such field) reject combinations the rule cannot run.
    flt = getattr(info, "full_mesh_strategy_filter", None)
    if flt is not None:
        extra["full_mesh_strategy_filter"] = lambda ins, outs: flt(mesh, schema, ins, outs)
    return expand_to_full_mesh_op_strategy(
        mesh,
        schema,
        resolved,
        output_tensor_meta=metas,
        input_index=n_outputs,
        inplace_op=writes_first_argument(op),
        allow_unbacked_sharding=info.allow_unbacked_sharding,
        allow_uneven_sharding=info.allow_uneven_sharding,
        **extra,
    )


def missing_strategies(schema: OpSchema) -> list[str]:
    """The strategies of the planner's expansion that ``get_op_strategy`` lacks."""
    op = schema.op
    info = _rules()[op]
    metas = infer_output_metas(schema)
    answer = DTensor._op_dispatcher.sharding_propagator.get_op_strategy(schema)
    foreach = op.name().startswith(FOREACH_PREFIXES) and any(
        isinstance(a, TupleStrategy) for a in schema.args_schema
    )
    if not foreach:
        pairs = [("", schema, metas, answer)]
    else:
        element_op = _resolve_foreach_elementwise_overload(op) or op
        pairs = []
        for i, child in enumerate(answer.children):
            args = tuple(
                a.children[i] if isinstance(a, TupleStrategy) else a
                for a in schema.args_schema
            )
            element = OpSchema(element_op, args, schema.kwargs_schema)
            pairs.append((f"element {i}: ", element, element_output_metas(op, metas, i), child))
    lacking = []
    for where, element, element_metas, got in pairs:
        returned = _returned(element_metas)
        have = {key(s, returned) for s in got.strategies}
        for spec in planner_expansion(op, element, element_metas, info).strategies:
            k = key(spec, returned)
            if k not in have:
                lacking.append(where + describe(k))
    return lacking


class TestPlannerAnswerFullSpace(StrategyContractTestBase):
    @parametrize("candidates", list(CANDIDATES))
    def test_get_op_strategy_holds_the_rules_expansion(self, candidates: str) -> None:
        mesh = self.mesh((2, 2))
        compared, failures = 0, []
        for op, calls in single_dim_calls().items():
            schema = schema_for(mesh, op, calls, CANDIDATES[candidates])
            if schema is None:
                continue
            compared += 1
            lacking = missing_strategies(schema)
            if lacking:
                failures.append(f"{op}: {len(lacking)} missing, e.g. {lacking[0]}")
        self.assertGreater(compared, 0, "no call of an op with a single-dim rule to ask about")
        if failures:
            self.fail(
                f"{len(failures)} of {compared} ops: get_op_strategy lacks strategies a "
                "planner's own expansion of the rule finds:\n" + "\n".join(failures[:20])
            )


instantiate_parametrized_tests(TestPlannerAnswerFullSpace)


if __name__ == "__main__":
    run_tests()
