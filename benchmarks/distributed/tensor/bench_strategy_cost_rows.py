"""Planner queries over repeated transformer layers: how many redistribution costs
DTensor's strategy expansion computes, and how long the queries take.

    python benchmarks/distributed/tensor/bench_strategy_cost_rows.py [--layers 8]

Each layer's ops are asked through ``ShardingPropagator.enumerate_strategies`` with
several candidate placements per input, on a fake 2x4 mesh. The cost rows a query
computes are kept for later queries, or (``--clear-per-query``) dropped before each
query; the counts do not depend on the machine.
"""

import argparse
import time
from unittest import mock

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._ops import utils
from torch.testing._internal.distributed._tensor import strategy_contract as sc
from torch.testing._internal.distributed.fake_pg import FakeStore


aten = torch.ops.aten


def layer_calls(tokens: int, hidden: int) -> list[tuple[torch._ops.OpOverload, tuple]]:
    """The aten calls of one MLP block with its norm and residual."""
    x, h = torch.empty(tokens, hidden), torch.empty(tokens, 4 * hidden)
    w_in, w_out, g = (
        torch.empty(hidden, 4 * hidden),
        torch.empty(4 * hidden, hidden),
        torch.empty(hidden),
    )
    return [
        (aten.native_layer_norm.default, (x, [hidden], g, g, 1e-5)),
        (aten.mm.default, (x, w_in)),
        (aten.gelu.default, (h,)),
        (aten.mm.default, (h, w_out)),
        (aten.add.Tensor, (x, x)),
        (aten.view.default, (x, [4, tokens // 4, hidden])),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--clear-per-query", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    mesh = init_device_mesh("cpu", (2, 4))
    propagator = DTensor._op_dispatcher.sharding_propagator
    calls = layer_calls(tokens=64, hidden=32)
    schemas = [sc.strategy_schema(*c, {}, mesh, sc.planner_candidates) for c in calls]
    clear = getattr(utils, "_cost_row", None)  # the cross-query cache, where present
    with mock.patch.object(
        utils, "redistribute_cost", wraps=utils.redistribute_cost
    ) as cost:
        start = time.perf_counter()
        for _ in range(args.layers):
            for schema in schemas:
                if clear is not None and args.clear_per_query:
                    clear.cache_clear()
                propagator.enumerate_strategies(schema)
        elapsed = time.perf_counter() - start
    queries = args.layers * len(schemas)
    print(
        f"{queries} planner queries ({args.layers} layers of {len(schemas)} ops): "
        f"{cost.call_count} redistribution costs computed "
        f"({cost.call_count / queries:.1f} per query), {elapsed:.2f} s"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
