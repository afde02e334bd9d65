"""Checks the strategies of the aten calls OpInfo samples make against the contract
stated on ``OpSpec``, as ``strategy_validation --contract`` does, and whether a
query's refusal is one eager DTensor makes too."""

import collections
import itertools
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import distribute_tensor, DTensor
from torch.testing._internal.distributed._tensor.strategy_contract import (
    check_call,
    registry,
    runtime_candidate,
)
from torch.utils._pytree import tree_map_only


aten = torch.ops.aten


def eager_error(
    op: OpOverload, args: tuple, kwargs: dict, mesh: DeviceMesh
) -> Exception | None:
    """What eager DTensor raises for ``op`` on DTensors placed as
    ``runtime_candidate`` places them (in ``LocalTensorMode`` and inference mode,
    where composite ops reach dispatch as called), or None where it runs."""
    from torch.distributed._local_tensor import LocalTensorMode

    def dtensor(x: torch.Tensor) -> DTensor:
        data = torch.randn(x.shape).to(x.dtype)
        return distribute_tensor(data, mesh, runtime_candidate(x, mesh)[0])

    with LocalTensorMode(frozenset(range(mesh.size()))), torch.inference_mode():
        try:
            args, kwargs = tree_map_only(torch.Tensor, dtensor, (args, kwargs))
            op(*args, **kwargs)
        except Exception as e:
            return e
    return None


def refused_alike(error: Exception, eager: Exception | None, planner: bool) -> bool:
    """Whether a query's ``error`` is a refusal eager DTensor makes too, with the
    same message: no strategy (``NotImplementedError``) or, as dispatch asks, a
    ``RuntimeError`` (a rule refusing the placement, a data-dependent shape), which
    dispatch reports as ``RuntimeError``; never an internal error."""
    kinds = (NotImplementedError,) if planner else (NotImplementedError, RuntimeError)
    kind = next((k for k in kinds if isinstance(error, k)), ())
    return isinstance(eager, kind) and str(error).split("\n")[0] in str(eager)


def check_opinfo_calls(op_names: list[str], world_size: int) -> int:
    """Checks DTensor's strategy for each aten call of each op's first OpInfo
    sample, as dispatch and as a planner (``enumerate_strategies``) ask; prints
    findings, queries and refusals, and returns the number of findings, ops without
    a strategy included."""
    from torch.distributed.tensor._ops import strategy_validation as sv

    shape = (2, world_size // 2) if world_size % 2 == 0 else (world_size,)
    mesh = init_device_mesh("cpu", shape)
    calls: dict[str, tuple[OpOverload, tuple[Any, ...], dict[str, Any]]] = {}
    no_strategy: set[str] = set()
    for opinfo in (o for name in op_names for o in sv.get_opinfo_by_name(name)):
        sample = next(iter(opinfo.sample_inputs("cpu", torch.float32)), None)
        capture = sv.get_aten_op_for_sample(opinfo.op, sample, opinfo.name)
        for op, args, kwargs, _ in capture.all_ops if sample else ():
            if op is aten._local_scalar_dense.default:  # dispatch asks no strategy
                continue
            if registry(op) is None:
                no_strategy.add(str(op))
            else:
                meta = lambda t: (t.shape, t.stride(), t.dtype)  # noqa: E731
                key = f"{op}{tree_map_only(torch.Tensor, meta, (args, kwargs))}"
                calls.setdefault(key, (op, args, kwargs))
    asks = (None, DTensor._op_dispatcher.sharding_propagator.enumerate_strategies)
    answered, found, refused = 0, 0, collections.Counter()
    for (op, args, kwargs), ask in itertools.product(calls.values(), asks):
        try:
            findings = check_call(op, args, kwargs, mesh, ask)
            answered += 1
        except Exception as e:
            if refused_alike(e, eager_error(op, args, kwargs, mesh), bool(ask)):
                refused[f"{type(e).__name__}: {str(e).splitlines()[0]}"] += 1
                continue
            findings = [f"{op}: {type(e).__name__}: {e}"]
        found += bool(findings)
        for finding in findings:
            print(f"{'planner' if ask else 'dispatch'}: {finding}")
    print(
        f"{len(asks) * len(calls)} queries of {len(calls)} aten calls on {shape}: "
        f"{answered} answered, {sum(refused.values())} refused as eager DTensor "
        f"refuses them, {found} break the strategy contract"
    )
    for reason, count in sorted(refused.items()):
        print(f"  refused {count}x: {reason}")
    if no_strategy:
        print(f"no strategy at all: {', '.join(sorted(no_strategy))}")
    return found + len(no_strategy)
