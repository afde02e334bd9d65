# Copyright (c) Meta Platforms, Inc. and affiliates
# Owner(s): ["oncall: distributed"]
"""
Every single-dim rule DTensor registers, called directly with only the op's
required arguments.

A downstream planner that expands DTensor's single-dim rules itself takes the
function out of ``ShardingPropagator.op_single_dim_strategy_funcs`` and calls it
with the arguments its graph node has: a call that left its optional arguments
out passes only the required ones, and DTensor's own entry points, which fill in
the defaults, are not on that path. Each rule must then return its rules or
refuse the call by name; an ``IndexError``, ``TypeError``, ``AttributeError`` or
``KeyError`` from reading an argument the call left out is a bug.

The ops come from the registry itself, so the test covers whatever this torch
registers. Arguments come, in this order, from: a call OpInfo samples make
(``contract_sweep.capture_calls``); the captured call of an overload with the
same arguments (an in-place or ``out=`` variant of a sampled op, whose ``out=``
tensors get the sampled op's result metas); the fused attention kernels
(``contract_common.attention_calls``) and the scaled and grouped matmuls, which
no CPU sample reaches. An op none of these gives arguments for is listed as
skipped, with why.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import TensorMeta
from torch.distributed.tensor._op_schema import TupleStrategy
from torch.distributed.tensor._ops._finalize_strategy import StrategyContractError
from torch.distributed.tensor._ops.single_dim_strategy import (
    _resolve_foreach_elementwise_overload,
)
from torch.distributed.tensor._ops.strategy_contract import infer_output_metas
from torch.testing._internal.common_utils import run_tests
from torch.testing._internal.distributed._tensor.contract_candidates import meta_of
from torch.testing._internal.distributed._tensor.contract_capture import (
    capture_calls,
    opinfo_db,
)
from torch.testing._internal.distributed._tensor.contract_common import (
    attention_calls,
    StrategyContractTestBase,
)
from torch.testing._internal.distributed._tensor.contract_sweep import strategy_schema


aten = torch.ops.aten

Args = tuple[tuple[object, ...], dict[str, object]]

# Ops whose rules DTensor calls once per element of their tensor lists.
FOREACH_PREFIXES = ("aten._foreach_", "aten._amp_foreach_", "aten._fused_")

# Exceptions that say a rule read an argument the call does not have.
MISSING_ARGUMENT_ERRORS = (IndexError, TypeError, AttributeError, KeyError)


def _signature(op: OpOverload) -> tuple[tuple[str, str, bool], ...]:
    """An op's arguments but its ``out=`` tensors: overloads alike here take the same calls."""
    return tuple(
        (a.name, str(a.type), a.kwarg_only) for a in op._schema.arguments if not a.is_out
    )


def _base_name(op: OpOverload) -> str:
    return op._schema.name.split("::")[-1].removesuffix("_")


def required_only(op: OpOverload, args: Sequence[object], kwargs: Mapping[str, object]) -> Args:
    """The call with every argument that has a default left out.

    Positional arguments up to the last one without a default stay (one the
    call passed by keyword moves to its place); keyword-only ones stay only if
    they have no default. Raises ``ValueError`` if the call lacks a required one.
    """
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    n_required = max(
        (i + 1 for i, a in enumerate(positional) if not a.has_default_value()), default=0
    )
    kept: list[object] = []
    for i, arg in enumerate(positional[:n_required]):
        if i < len(args):
            kept.append(args[i])
        elif arg.name in kwargs:
            kept.append(kwargs[arg.name])
        else:
            raise ValueError(f"{op}: the call has no argument {arg.name}")
    required_kw = {
        a.name for a in op._schema.arguments if a.kwarg_only and not a.has_default_value()
    }
    missing = required_kw - set(kwargs)
    if missing:
        raise ValueError(f"{op}: the call has no argument {sorted(missing)}")
    return tuple(kept), {k: v for k, v in kwargs.items() if k in required_kw}


class ArgumentSource:
    """Arguments for a registered op, from OpInfo samples or hand-made calls."""

    def __init__(
        self,
        captured: Mapping[OpOverload, Args],
        made: Mapping[OpOverload, Args],
        infer: Callable[[OpOverload, Args], Any],
    ) -> None:
        self.captured = captured
        self.made = made
        self.infer = infer
        self.by_signature: dict[object, list[OpOverload]] = {}
        for op in sorted(captured, key=str):
            self.by_signature.setdefault(_signature(op), []).append(op)

    def sibling(self, op: OpOverload) -> OpOverload | None:
        """A sampled overload taking the same arguments, of the same op if there is one."""
        same = self.by_signature.get(_signature(op), [])
        for candidate in same:
            if candidate.namespace == op.namespace and _base_name(candidate) == _base_name(op):
                return candidate
        return same[0] if same else None

    def out_kwargs(self, op: OpOverload, sibling: OpOverload) -> dict[str, object] | None:
        """``op``'s ``out=`` tensors, given the metas of the sibling's results."""
        outs = [a.name for a in op._schema.arguments if a.is_out]
        if not outs:
            return {}
        if any(a.is_out for a in sibling._schema.arguments):
            return None
        results = self.infer(sibling, self.captured[sibling])
        if isinstance(results, TensorMeta):
            results = (results,)
        if not isinstance(results, (tuple, list)) or len(results) != len(outs):
            return None
        if not all(isinstance(r, TensorMeta) for r in results):
            return None
        return dict(zip(outs, results))

    def arguments(self, op: OpOverload) -> tuple[Args | None, str]:
        """(the call, where it came from), or (None, why there is none)."""
        if op in self.captured:
            return self.captured[op], "OpInfo sample"
        if op in self.made:
            return self.made[op], "hand-made call"
        sibling = self.sibling(op)
        if sibling is None:
            return None, "no OpInfo sample calls it or an overload with its arguments"
        try:
            outs = self.out_kwargs(op, sibling)
        except Exception as e:
            return None, f"shape inference of {sibling} for its out= tensors raised {type(e).__name__}"
        if outs is None:
            return None, f"{sibling}'s results do not match its out= tensors"
        args, kwargs = self.captured[sibling]
        return (args, {**kwargs, **outs}), f"OpInfo sample of {sibling}"


def made_calls() -> dict[OpOverload, Args]:
    """Calls of the registered ops that OpInfo samples on CPU never make."""
    calls: dict[OpOverload, Args] = {
        op: (args, kwargs) for op, (_, args, kwargs) in attention_calls().items()
    }
    f8 = meta_of(torch.empty(16, 32, dtype=torch.float8_e4m3fn))
    f8_t = meta_of(torch.empty(16, 32, dtype=torch.float8_e4m3fn).t())
    scale = meta_of(torch.ones(()))
    calls[aten._scaled_mm.default] = ((f8, f8_t, scale, scale), {})
    bf = meta_of(torch.empty(4, 8, 16, dtype=torch.bfloat16))
    bf_w = meta_of(torch.empty(4, 16, 8, dtype=torch.bfloat16))
    calls[aten._grouped_mm.default] = ((bf, bf_w), {})
    return calls


def is_named_refusal(op: OpOverload, error: Exception) -> bool:
    """Whether ``error`` refuses the call by name rather than failing on an argument."""
    if isinstance(error, StrategyContractError):
        return True
    if isinstance(error, MISSING_ARGUMENT_ERRORS):
        return False
    text = str(error)
    return str(op) in text or op._schema.name.split("::")[-1] in text


class TestSingleDimRulesCalledDirectly(StrategyContractTestBase):
    captured: dict[OpOverload, Args]

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        recorder, _ = capture_calls(
            opinfo_db(),
            dtypes=(torch.float32, torch.int64, torch.bool),
            samples=1,
            backward=True,
            foreach_tensors=2,
        )
        cls.captured = {
            op: (call.args, call.kwargs)
            for op, pool in recorder.calls.items()
            for call in list(pool.values())[:1]
        }

    def infer(self, op: OpOverload, call: Args) -> Any:
        return infer_output_metas(strategy_schema(self.mesh((4,)), op, *call))

    def rule_call(self, op: OpOverload, args: Args) -> tuple[OpOverload, tuple, dict]:
        """(op, args_meta, kwargs_meta) as DTensor hands them to the rule.

        DTensor calls the rule of a foreach or fused op once per element of its
        tensor lists, with that element, and with the per-element op where there
        is one (``_foreach_add.List`` -> ``add.Tensor``): the first element here.
        """
        schema = strategy_schema(self.mesh((4,)), op, *args)
        is_list = [isinstance(a, TupleStrategy) for a in schema.args_schema]
        if not any(is_list) or not str(op).startswith(FOREACH_PREFIXES):
            return op, schema.args_meta, schema.kwargs_meta
        element_op = _resolve_foreach_elementwise_overload(op) or op
        element_args = tuple(
            a[0] if listed else a for a, listed in zip(schema.args_meta, is_list)
        )
        return element_op, element_args, schema.kwargs_meta

    def test_required_arguments_only(self) -> None:
        registry = DTensor._op_dispatcher.sharding_propagator.op_single_dim_strategy_funcs
        source = ArgumentSource(self.captured, made_calls(), self.infer)
        called: dict[str, str] = {}
        skipped: dict[str, str] = {}
        failures: list[str] = []
        for op in sorted(registry, key=str):
            found, origin = source.arguments(op)
            if found is None:
                skipped[str(op)] = origin
                continue
            try:
                args = required_only(op, *found)
            except ValueError as e:
                skipped[str(op)] = str(e)
                continue
            rule_op, call_args, call_kwargs = self.rule_call(op, args)
            info = registry[op]
            func = getattr(info, "func", info)
            try:
                rules = func(rule_op, call_args, call_kwargs)
            except Exception as e:
                if is_named_refusal(rule_op, e):
                    called[str(op)] = f"refused: {type(e).__name__}"
                    continue
                failures.append(
                    f"{op} ({origin}, {len(args[0])} positional arguments): "
                    f"{type(e).__name__}: {str(e)[:200]}"
                )
                continue
            if not isinstance(rules, list):
                failures.append(f"{op} ({origin}): returned {type(rules).__name__}, not a list")
                continue
            called[str(op)] = origin
        print(
            f"{len(registry)} registered single-dim ops: {len(called)} called, "
            f"{len(failures)} failed, {len(skipped)} skipped"
        )
        for op, reason in sorted(skipped.items()):
            print(f"  skipped {op}: {reason}")
        refused = sorted(op for op, how in called.items() if how.startswith("refused"))
        for op in refused:
            print(f"  {op}: {called[op]}")
        if failures:
            self.fail(
                f"{len(failures)} single-dim rules fail when called with only the "
                "required arguments:\n" + "\n".join(failures)
            )
        # the call that started this test, wherever this torch registers it
        if aten._scaled_mm.default in registry:
            self.assertTrue(str(aten._scaled_mm.default) in called, "_scaled_mm was not called")


if __name__ == "__main__":
    run_tests()
