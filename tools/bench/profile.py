"""Profile one benchmark in this interpreter: where a measured call spends its time.

Run it with each venv's python to compare the two torches, e.g.::

    .venv/bin/python -m tools.bench.profile --bench planner_enumeration
    .venv-stock/bin/python -m tools.bench.profile --bench planner_enumeration

It builds the benchmark as the worker does, runs one warm-up call, then profiles
``--calls`` measured calls with cProfile (DTensor's caches cleared before each call
where the benchmark clears them) and prints the top functions by cumulative and by
own time. cProfile slows Python code more than C code, so read shares, not seconds.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys

from tools.bench.worker import BENCHES, make_bench


def profile(bench_name: str, calls: int, top: int, quick: bool) -> str:
    """The profile report of ``calls`` measured calls of ``bench_name``."""
    from tools.bench import common

    common.init_fake_process_group()
    bench = make_bench(bench_name, quick)
    bench.time_func(1)  # warm-up: imports, first-call caches outside DTensor's
    profiler = cProfile.Profile()
    profiler.enable()
    seconds = bench.time_func(calls)
    profiler.disable()
    bench.check()
    side = "built" if common.has_contract_change() else "stock"
    out = io.StringIO()
    out.write(f"{bench_name} on {side} torch: {calls} call(s), {seconds:.3f} s under cProfile\n")
    for key in ("cumulative", "tottime"):
        out.write(f"\n-- top {top} by {key} --\n")
        stats = pstats.Stats(profiler, stream=out)
        stats.strip_dirs().sort_stats(key).print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--bench", required=True, choices=sorted(BENCHES))
    ap.add_argument("--calls", type=int, default=1, help="measured calls to profile")
    ap.add_argument("--top", type=int, default=25, help="functions listed per ordering")
    ap.add_argument("--quick", action="store_true", help="the benchmark's tiny smoke plan")
    args = ap.parse_args(argv)
    print(profile(args.bench, args.calls, args.top, args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
