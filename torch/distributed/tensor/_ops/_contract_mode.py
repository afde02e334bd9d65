# Copyright (c) Meta Platforms, Inc. and affiliates
"""
``strategy_validation --contract``: clauses C1-C5 per op, from OpInfo samples.

``strategy_validation`` checks which placements a rule offers against ground
truth; this mode checks what every ``OpSpec`` handed out carries::

    python -m torch.distributed.tensor._ops.strategy_validation --contract --device cpu --op mm,t
    python -m torch.distributed.tensor._ops.strategy_validation --contract --device cpu --op "nn.functional.*"

Ops are chosen by ``strategy_validation``'s own name resolution (a pattern naming
no OpInfo is an aten op name, such as ``aten.convolution_backward.default``).
The asking and counting is ``_contract_validation``; this module holds the
options, the run and the per-op report.
"""

import argparse
import fnmatch
import functools
import math
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.testing._internal.distributed._tensor.contract_sweep as sweep
from torch._ops import OpOverload
from torch.distributed.tensor._ops._contract_validation import (
    Answer,
    CheckFunc,
    CLAUSES,
    ContractValidation,
    InferFunc,
    make_meshes,
    OpCounts,
    Query,
    totals,
)
from torch.distributed.tensor._ops.strategy_validation import (
    get_opinfo_by_name,
    resolve_op_names,
)
from torch.testing._internal.distributed._tensor.contract_candidates import (
    first_candidates,
)
from torch.testing._internal.distributed._tensor.contract_capture import (
    CallRecorder,
    capture_calls,
    opinfo_db,
    select_calls,
)


# The sizes strategy_validation's command line gives OpInfo samples (so that they
# shard evenly); the contract mode and the audit sample with the same ones.
CLI_SAMPLE_SIZES = {"L": 24, "M": 12, "S": 4, "XS": 2}

# Samples of these dtypes also run backward (the others forward and in-place only).
BACKWARD_DTYPES = ("float32",)


def _aten_names(op: OpOverload) -> tuple[str, ...]:
    """Names an aten op answers to: ``aten.mm.default``, ``mm.default``, ``mm``."""
    packet = op._schema.name.split("::")[-1]
    return (str(op), f"{packet}.{op._overloadname}", packet)


def aten_selected(patterns: Sequence[str], op: OpOverload) -> bool:
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in _aten_names(op))


def select_opinfos(patterns: Sequence[str]) -> tuple[list[tuple[Any, bool]], list[str]]:
    """(OpInfo, record every op it calls) pairs to sample, and the aten patterns.

    No patterns: every OpInfo. A pattern ``resolve_op_names`` resolves picks
    those OpInfos; any other is an aten op name (globs allowed), for which every
    other OpInfo is sampled too, recording only the matching ops.
    """
    db = opinfo_db()
    if not patterns:
        return [(info, True) for info in db], []
    chosen: set[int] = set()
    aten: list[str] = []
    for pattern in patterns:
        try:
            names = resolve_op_names([pattern])
        except ValueError:
            aten.append(pattern)
            continue
        chosen.update(id(info) for name in names for info in get_opinfo_by_name(name))
    picked = [(info, True) for info in db if id(info) in chosen]
    if aten:
        picked += [(info, False) for info in db if id(info) not in chosen]
    return picked, aten


def use_cli_sample_sizes() -> None:
    """Give OpInfo samples the sizes strategy_validation's command line gives them."""
    import torch.testing._internal.common_methods_invocations as common_ops
    from torch.testing._internal.opinfo import core as opinfo_core

    for module in (opinfo_core, common_ops):
        for name, value in CLI_SAMPLE_SIZES.items():
            setattr(module, name, value)


def capture(
    picked: Sequence[tuple[Any, bool]],
    aten: Sequence[str],
    args: argparse.Namespace,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[CallRecorder, dict[str, int]]:
    """Run the samples of ``picked`` under one recorder; return it and its counters."""
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    backward = {getattr(torch, d) for d in BACKWARD_DTYPES}
    recorder = CallRecorder(64)
    counts: Counter[str] = Counter()
    for n, (info, everything) in enumerate(picked, 1):
        recorder.keep = None if everything else (lambda op: aten_selected(aten, op))
        _, got = capture_calls(
            [info],
            dtypes=(),
            extra_dtypes=dtypes,
            samples=args.max_samples or 3,
            backward=True,
            backward_dtypes=backward,
            foreach_tensors=args.foreach_tensors or None,
            recorder=recorder,
        )
        counts.update(got)
        if progress is not None:
            progress(n, len(picked))
    matched = set(recorder.calls) | set(recorder.tensorless)
    for pattern in aten:
        if not any(aten_selected([pattern], op) for op in matched):
            raise ValueError(
                f'"{pattern}" names no OpInfo and no aten op the samples call'
            )
    return recorder, dict(counts)


def validate(
    args: argparse.Namespace,
    check: CheckFunc,
    infer: InferFunc,
    after_runtime: Callable[[Query, Answer], None] | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[ContractValidation, CallRecorder, dict[str, int]]:
    """Choose the ops of ``args``, capture their calls and ask every query.

    The process group must hold as many ranks as the largest mesh.
    """
    use_cli_sample_sizes()
    patterns = (
        []
        if args.all_registered or not args.op
        else [p.strip() for p in args.op.split(",")]
    )
    picked, aten = select_opinfos(patterns)

    def phase(name: str) -> Callable[[int, int], None] | None:
        return None if progress is None else functools.partial(progress, name)

    recorder, counts = capture(picked, aten, args, phase("capture"))
    cv = ContractValidation(
        select_calls(recorder, args.calls_per_op),
        check,
        infer,
        make_meshes(args.meshes),
        [m for m in args.modes.split(",") if m],
        first_candidates(args.candidates),
        args.query_timeout,
        after_runtime,
    )
    cv.run(phase("query ops"))
    return cv, recorder, counts


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``--contract`` flag and the options only the contract mode reads.

    ``--op``, ``--all-registered`` (here: every OpInfo, each reaching what it
    reaches), ``--device`` and ``--max-samples`` (per OpInfo and dtype, default 3)
    are ``strategy_validation``'s own; the audit's worker parses these same
    options, so both run with the same defaults.
    """
    group = parser.add_argument_group("strategy contract (--contract)")
    group.add_argument(
        "--contract",
        action="store_true",
        help="check C1-C5 of strategy_contract for every strategy the samples reach",
    )
    group.add_argument(
        "--meshes", default="4,2x2", help="mesh shapes, e.g. 4,2x2,2x2x2"
    )
    group.add_argument("--modes", default=",".join(sweep.MODES))
    group.add_argument(
        "--dtypes",
        default="float32,bfloat16,int64,bool,complex64",
        help="dtypes to sample in (each one an OpInfo supports; --dtype is not read)",
    )
    group.add_argument(
        "--calls-per-op", type=int, default=4, help="captured calls asked per aten op"
    )
    group.add_argument(
        "--candidates", type=int, default=16, help="planner candidates per input"
    )
    group.add_argument(
        "--foreach-tensors",
        type=int,
        default=8,
        help="tensors per foreach list (0: 20)",
    )
    group.add_argument(
        "--query-timeout",
        type=float,
        default=60.0,
        help="CPU seconds per query (0: none)",
    )


def format_ops(
    validation: ContractValidation, only_failed: bool = False, limit: int | None = None
) -> str:
    """Per op: its queries and OpSpecs, then per mode and mesh what broke,
    with the first example of each clause and every error."""
    ops: dict[str, list[tuple[str, OpCounts]]] = defaultdict(list)
    for (mode, mesh_name), per_op in validation.results.items():
        for op, counts in per_op.items():
            ops[op].append((f"{mode} mesh {mesh_name}", counts))
    names = sorted(
        o for o, cs in ops.items() if not only_failed or any(c.failed for _, c in cs)
    )
    lines = []
    for i, op in enumerate(names[:limit], 1):
        per = ops[op]
        queries = sum(c.queries for _, c in per)
        specs = sum(c.specs for _, c in per)
        lines.append(
            f"\n[{i}/{len(names)}] {op} ({per[0][1].registry})"
            f" — Queries: {queries}, OpSpecs: {specs}\n" + "-" * 70
        )
        for where, c in per:
            t = totals([c])
            broke = [f"{k} {n}" for k, n in sorted(c.clauses.items())]
            broke += [f"{t['errors']} errors"] if c.errors else []
            broke += [f"{t['refused']} refused"] if c.refusals else []
            if c.data_dependent:
                # shape inference could not size the result: nothing to judge
                broke.append(
                    f"{c.data_dependent} calls not judged (data-dependent size)"
                )
            if broke:
                lines.append(f"  {where}: " + ", ".join(broke))
            for e in c.examples.values():
                lines.append(
                    f"    {e['violation']}\n      in {e['query']}: {e['call']}"
                )
            for e in c.errors.values():
                lines.append(
                    f"    raised {e['type']}: {e['message']}\n"
                    f"      in {e['query']}: {e['call']}"
                )
            for e in c.uninferable.values():
                lines.append(
                    f"    shape inference raised {e['type']}: {e['message']}\n"
                    f"      in {e['call']}"
                )
    if limit is not None and len(names) > limit:
        more = names[limit:]
        lines.append(f"... and {len(more)} more ops: {', '.join(more)}")
    return "\n".join(lines)


def format_summary(validation: ContractValidation, per_op_table: bool = True) -> str:
    """Two tables: per op summed over modes and meshes, and per mode and mesh."""
    per_op: dict[str, list[OpCounts]] = defaultdict(list)
    for counts in validation.results.values():
        for op, c in counts.items():
            per_op[op].append(c)
    rows = [[op, *_cells(cs), _seconds(cs)] for op, cs in sorted(per_op.items())]
    every = [c for cs in per_op.values() for c in cs]
    rows.append(["Total", *_cells(every), _seconds(every)])
    by_mesh = [
        [mode, mesh, len(cs), sum(1 for c in cs.values() if c.clauses)]
        + _cells(cs.values(), True)
        for (mode, mesh), cs in validation.results.items()
    ]
    counted = ["errors", "refused", "no strategy"]
    lines = ["\n" + "=" * 70, "Summary (OpSpecs breaking each clause)", "=" * 70]
    if per_op_table:
        headers = ["Op", *CLAUSES, *(h.capitalize() for h in counted), "Time"]
        lines += [_table(headers, rows), ""]
    headers = ["mode", "mesh", "ops", "ops w/ viol", *CLAUSES, *counted]
    lines.append(_table(headers, by_mesh))
    return "\n".join(lines)


def _cells(ops: Any, with_ops: bool = False) -> list[str]:
    """Table cells of ``ops``' totals: OpSpecs per clause (with ``with_ops``
    followed by the ops breaking it), errors, refused and no-strategy answers."""
    t = totals(ops)
    cells = [
        f"{n} ({t['ops_by_clause'][k]})" if with_ops and n else str(n)
        for k, n in t["violations"].items()
    ]
    return cells + [str(t["errors"]), str(t["refused"]), str(t["no_strategy"])]


def _seconds(ops: Sequence[OpCounts]) -> str:
    return f"{sum(c.seconds for c in ops):.1f}s"


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table, the first column left-aligned, the others right."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def fmt(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()

    return "\n".join([fmt(headers), "-" * len(fmt(headers))] + [fmt(r) for r in cells])


def main(args: argparse.Namespace) -> int:
    """``strategy_validation --contract``: print C1-C5 per op.

    Returns 1 when an op broke a clause, raised (a runtime refusal does not
    count) or could not be shape-inferred, else 0.
    """
    import torch.distributed as dist
    from torch.distributed.tensor._ops.strategy_contract import (
        check_strategy_contract,
        infer_output_metas,
    )
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if args.device != "cpu":
        raise SystemExit(
            "--contract asks DTensor's registries on CPU meshes: pass --device cpu"
        )
    if not args.op and not args.all_registered:
        args.op = "add"  # strategy_validation's default
    ranks = max(
        math.prod(int(x) for x in s.split("x")) for s in args.meshes.split(",") if s
    )
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        t0 = time.monotonic()
        cv, recorder, counts = validate(
            args, check_strategy_contract, infer_output_metas
        )
        print(f"Testing ops: {', '.join(str(op) for op in cv.calls)}")
        print(
            f"Mode: contract (C1-C5), meshes {args.meshes}, modes {args.modes}; "
            f"Device: cpu, Dtypes: {args.dtypes}"
        )
        print(
            f"Captured: {counts.get('opinfos', 0)} OpInfos, {counts.get('samples', 0)} samples, "
            f"{sum(len(c) for c in cv.calls.values())} calls of {len(cv.calls)} registered aten ops "
            f"({time.monotonic() - t0:.1f}s)"
        )
        print(format_ops(cv))
        print(format_summary(cv))
        failed = any(
            c.failed for per_op in cv.results.values() for c in per_op.values()
        )
        return 1 if failed else 0
    finally:
        dist.destroy_process_group()
