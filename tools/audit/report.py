"""The audit's pure parts: refusal classification, merging both sides, ``--strict``, the markdown.

Standard library only: the parent process and the tests use it under any python.
"""

from __future__ import annotations

import re
from typing import Any

ROLES = ("stock", "built")
MODES = ("runtime", "planner", "utility")
MESHES = ("4", "2x2")  # device meshes over a fake world of 4 ranks
CLAUSES = ("C1", "C2", "C3", "C4", "C5")
# Every query lands in exactly one category.
CATEGORIES = ("ok", "violation", "error", "refused", "no_strategy", "tensor_list", "unjudged")
LABELS = {"no_strategy": "no strategy", "tensor_list": "tensor-list call"}

REACH_TARGET = 0.95  # share of the registered ops a full audit must ask

LEGEND = {
    "ops": "distinct aten ops queried",
    "queries": "strategy queries: one per captured call (op + input shapes/dtypes + other args)",
    "ok": "answered, and every OpSpec meets C1-C5",
    "violation": "answered with at least one OpSpec breaking the contract",
    "C1-C5": "queries whose violations name that clause (a query can name several)",
    "error": "the query raised and was not refused alike: eager DTensor runs the same call with the same "
    "input placements (runtime: the one sharded candidate; planner: the first candidate, all-Replicate) "
    "or raises another type or reason, the query raised an internal error, or it timed out",
    "refused": "a query raised its mode's refusal type (NotImplementedError; as dispatch asks, also a "
    "RuntimeError, shape inference's data-dependent ones included) and eager DTensor, asked the same call "
    "on the same placements, raises that type with "
    "the same message; or the op itself rejects the call on plain tensors and eager DTensor raises too; "
    "or a NotImplementedError for a composite op, which dispatch decomposes instead. A right answer, "
    "unless stock's runtime answers the same call (listed as a new refusal, fails --strict)",
    "no strategy": "nothing to judge: runtime: dispatch asks no strategy (`_local_scalar_dense`; a "
    "decomposition that raises or answers None is reported by dispatch as a NotImplementedError, judged "
    "as error or refused); planner: stock's decomposition path answered "
    "None (the built torch's `enumerate_strategies` raises instead, judged as error or refused); utility: "
    "the op has no single-dim rule (another registry holds it)",
    "tensor-list call": "utility mode only: a foreach/cat-style call with a tensor-list argument, "
    "which the utility does not expand",
    "unjudged": "answered, but the op's result meta cannot be computed from input metas "
    "(data-dependent shape), so the answer is not judged",
}


#: The errors a query may refuse with where eager DTensor refuses alike: no strategy for the op, and,
#: asked as dispatch asks, a rule refusing the placement. An internal error never is one.
REFUSAL_TYPES = {"planner": ("NotImplementedError",), "runtime": ("NotImplementedError", "RuntimeError"),
                 "utility": ("NotImplementedError", "RuntimeError")}


def typed_error(exc: BaseException, mode: str) -> str:
    """``Type: message`` of a query's raise, typed as the nearest of ``mode``'s refusal types it derives from:
    dispatch reports the RuntimeErrors of shape inference (a data-dependent shape) as RuntimeError with their
    message. An internal error keeps its own type."""
    kind = next((t.__name__ for t in type(exc).__mro__ if t.__name__ in REFUSAL_TYPES[mode]), type(exc).__name__)
    return f"{kind}: {' '.join(str(exc).split())}"


def raised_category(mode: str, decomposes: bool, eager_refusal: str | None, error: str = "",
                    op_rejects: bool = False) -> str:
    """The category of a query that raised ``error`` (``Type: message``), in any mode: refused when
    dispatch decomposes the op instead (``decomposes``); when the op itself rejects the call on plain
    tensors (``op_rejects``) and eager DTensor raises too; or when the query raised the mode's refusal
    type and eager DTensor, asked the same call, raises that type with the same message
    (``eager_refusal``); otherwise an error."""
    if decomposes:
        return "refused"
    if eager_refusal is None:
        return "error"
    kind, _, text = error.partition(": ")
    alike = kind in REFUSAL_TYPES[mode] and eager_refusal.startswith(f"{kind}: ") and text[:100] in eager_refusal
    return "refused" if op_rejects or alike else "error"


def clauses(violations: list[str]) -> set[str]:
    """The clauses (C1-C5) a query's violations name, each message naming its clause first."""
    return {m.group(0) for m in (re.search(r"\bC[1-5]\b", v) for v in violations) if m}


def _refused_where_stock_answers(docs: dict[str, dict], mode: str, mesh: str) -> list[str]:
    """The calls built refuses in (mode, mesh) where stock, asked the same, answers."""
    keyed = {(role, r["mode"], r["mesh"]): r for role in ROLES for r in docs[role]["results"]}
    stock_calls = set(docs["stock"].get("calls", ()))
    stock_by_call = keyed[("stock", mode, mesh)].get("by_call", {})
    return sorted(
        call for call, category in keyed[("built", mode, mesh)].get("by_call", {}).items()
        if category == "refused" and call in stock_calls
        and stock_by_call.get(call, "ok") in ("ok", "violation", "unjudged"))


def refusal_candidates(docs: dict[str, dict]) -> list[dict[str, str]]:
    """The runtime calls built refuses where stock's registry answers, as ``{call, mesh}``: new refusals
    where stock's eager DTensor runs them, which ``merge`` is told (``stock_eager``) after asking."""
    return [{"call": call, "mesh": r["mesh"]} for r in docs["stock"]["results"] if r["mode"] == "runtime"
            for call in _refused_where_stock_answers(docs, "runtime", r["mesh"])]


def merge(docs: dict[str, dict], config: dict[str, Any], stock_eager: list[dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    """Both workers' documents as one report: per (mode, mesh), stock's and built's results side by side,
    and the calls built refuses where stock, asked the same, answers. A runtime one is new unless
    ``stock_eager`` (``worker.ask_eager``'s answers for ``refusal_candidates``) says stock's eager DTensor
    raises on it too; those are kept apart, with stock eager's message."""
    for role in ROLES:
        if role not in docs:
            raise ValueError(f"the {role} worker's results are missing")
    keyed = {(role, r["mode"], r["mesh"]): r for role in ROLES for r in docs[role]["results"]}
    pairs = list(dict.fromkeys((r["mode"], r["mesh"]) for r in docs["stock"]["results"]))
    eager = {(a["mesh"], a["call"]): a for a in stock_eager or () if a.get("eager")}
    results = []
    for mode, mesh in pairs:
        entry: dict[str, Any] = {"mode": mode, "mesh": mesh}
        for role in ROLES:
            rec = keyed.get((role, mode, mesh))
            if rec is None:
                raise ValueError(f"the {role} worker has no results for mode {mode} on mesh {mesh}")
            entry[role] = {"counts": rec["counts"], "examples": rec["examples"]}
        refused = _refused_where_stock_answers(docs, mode, mesh)
        raises = [eager[(mesh, call)] for call in refused if mode == "runtime" and (mesh, call) in eager]
        entry["new_refusals"] = [call for call in refused if mode != "runtime" or (mesh, call) not in eager]
        entry["stock_eager_raises"] = [{"call": a["call"], "message": a["eager"], "how": a.get("how", "")}
                                       for a in raises]
        results.append(entry)
    report = {
        "config": config,
        "torch": {role: docs[role]["torch"] for role in ROLES},
        "capture": {role: docs[role]["capture"] for role in ROLES},
        "results": results,
    }
    report["strict_failures"] = strict_failures(report)
    return report


def strict_failures(report: dict[str, Any]) -> list[str]:
    """Why the built torch fails ``--strict``: any violation, error, planner query without a strategy, or
    runtime refusal stock's dispatch does not make (stock's registry answers, and stock's eager DTensor runs
    the call or was not asked); in a full audit, fewer than REACH_TARGET of the
    registered ops asked. A planner refusal eager DTensor makes too is right even where stock's raw
    registry call offered an answer: eager DTensor does not run what it offered."""
    reasons = []
    for r in report["results"]:
        c = r["built"]["counts"]
        bad = [f"{c['violation']} with violations"] if c["violation"] else []
        bad += [f"{c['error']} errors"] if c["error"] else []
        if r["mode"] == "planner" and c["no_strategy"]:
            bad.append(f"{c['no_strategy']} without a strategy")
        if r["mode"] == "runtime" and r.get("new_refusals"):
            bad.append(f"{len(r['new_refusals'])} refused where stock answers")
        if bad:
            reasons.append(f"built {r['mode']} mesh {r['mesh']}: {', '.join(bad)} of {c['queries']} queries")
    cap = report["capture"]["built"]
    if not report["config"].get("ops") and "registered" in cap:
        if cap["reached"] < REACH_TARGET * cap["registered"]:
            reasons.append(f"built: {cap['reached']} of {cap['registered']} registered ops asked, "
                           f"under {REACH_TARGET:.0%}")
    return reasons


def by_op(report: dict[str, Any], role: str, categories: tuple[str, ...], modes: tuple[str, ...] = MODES,
          new_only: bool = False) -> dict[str, dict]:
    """Per op: where (mode mesh) one of ``categories`` occurred for ``role``, and the first example.

    ``new_only`` keeps only what built breaks or raises where stock, asked the same, does neither.
    """
    ops: dict[str, dict] = {}
    for r in (r for r in report["results"] if r["mode"] in modes):
        stock = set().union(*(r["stock"]["examples"].get(c, {}) for c in ("violation", "error")))
        for category in categories:
            for op, example in r[role]["examples"].get(category, {}).items():
                if not (new_only and op in stock):
                    ops.setdefault(op, {"where": [], **example})["where"].append(f"{r['mode']} {r['mesh']}")
    return dict(sorted(ops.items()))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table padded to line up in a terminal too."""
    cells = [headers, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def summary_table(report: dict[str, Any]) -> str:
    """One row per count, a stock and a built column per mode and mesh."""
    headers = ["count"] + [f"{r['mode']} {r['mesh']} {role}" for r in report["results"] for role in ROLES]
    keys = ["ops", "queries", *CATEGORIES[:2], *CLAUSES, *CATEGORIES[2:]]
    rows = [[LABELS.get(k, k)] + [r[role]["counts"][k] for r in report["results"] for role in ROLES] for k in keys]
    return table(headers, rows)


def _code(text: str) -> str:
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _names(ops: list[str]) -> str:
    return ", ".join(op.removeprefix("aten.") for op in ops)


def op_table(ops: dict[str, dict]) -> str:
    """One row per op: where it happened, and its first call with the message."""
    rows = [[op, ", ".join(e["where"]), _code(e["call"]), _code(e["message"])] for op, e in ops.items()]
    return table(["op", "where", "first call", "message"], rows) if rows else "none"


def reason_table(ops: dict[str, dict]) -> str:
    """One row per message, with the ops that got it: for answers that repeat one reason."""
    grouped: dict[str, list[str]] = {}
    for op, e in ops.items():
        grouped.setdefault(e["message"], []).append(op)
    rows = [[_code(message), len(names), _names(names)] for message, names in sorted(grouped.items())]
    return table(["why", "ops", "which"], rows) if rows else "none"


def capture_line(cap: dict[str, Any]) -> str:
    """One worker's capture in a line: what ran, what failed, what DTensor serves."""
    if "registered" not in cap:  # a document from before the capture counted its reach
        return f"{cap.get('served', 0)} distinct calls DTensor serves"
    failed = ", ".join(f"{n} {v}" for v, n in cap["failed_runs"].items()) or "none"
    return (f"{cap['opinfos']} OpInfos, {cap['runs']} runs (failed: {failed}), {cap['served']} distinct calls "
            f"DTensor serves; {cap['reached']} of {cap['registered']} registered ops asked")


def reach_lines(report: dict[str, Any]) -> list[str]:
    """Registered ops asked against all registered, and each one not asked with why (built's capture)."""
    cap = report["capture"]["built"]
    if "registered" not in cap:
        return ["not counted"]
    share = cap["reached"] / cap["registered"] if cap["registered"] else 0.0
    lines = [f"{cap['reached']} of {cap['registered']} registered ops asked ({share:.1%}); target "
             f"{REACH_TARGET:.0%} in a full audit.", ""]
    if report["config"].get("ops"):
        return lines + ["A partial audit: the ops the named OpInfos do not call are not listed."]
    rows = [[op, _code(why)] for op, why in sorted(cap["unreached"].items())]
    return lines + [table(["registered op not asked", "why"], rows) if rows else "Every registered op is asked."]


def new_refusal_table(report: dict[str, Any]) -> str:
    """Per op: the calls built refuses or raises for where stock answers."""
    ops: dict[str, dict[str, Any]] = {}
    for r in report["results"]:
        for call in r.get("new_refusals", ()):
            op = call.split("(", 1)[0]
            entry = ops.setdefault(op, {"where": [], "call": call})
            entry["where"].append(f"{r['mode']} {r['mesh']}")
    rows = [[op, ", ".join(dict.fromkeys(e["where"])), _code(e["call"][:160])] for op, e in sorted(ops.items())]
    return table(["op", "where", "first call"], rows) if rows else "none"


def stock_eager_table(report: dict[str, Any]) -> str:
    """Per op: the runtime calls built refuses where stock's registry answers but stock's eager DTensor raises
    or gives other results than plain torch."""
    ops: dict[str, dict[str, Any]] = {}
    for r in report["results"]:
        for a in r.get("stock_eager_raises", ()):
            op = a["call"].split("(", 1)[0]
            entry = ops.setdefault(op, {"where": [], **a})
            entry["where"].append(f"{r['mode']} {r['mesh']}")
    rows = [[op, ", ".join(dict.fromkeys(e["where"])), _code(e["call"][:160]),
             _code((f"{e['how']}: " if e["how"] else "") + e["message"])] for op, e in sorted(ops.items())]
    return table(["op", "where", "first call", "stock's eager DTensor"], rows) if rows else "none"


def render(report: dict[str, Any]) -> str:
    """The markdown report, generated from the JSON alone."""
    cfg, cap = report["config"], report["capture"]
    out = [
        "# DTensor strategy contract audit (`python -m tools.audit`)",
        "",
        f"Every OpInfo of the OpInfo databases{' named in ' + repr(cfg['ops']) if cfg.get('ops') else ''} on CPU "
        f"(float32 where it has it; ops with no CPU kernel on meta tensors), its first {cfg['samples']} samples; "
        f"each distinct aten call they make that DTensor serves (at most {cfg.get('per_op') or 'any number of'} "
        f"per op) is asked for a strategy on meshes {', '.join(cfg['meshes'])} in modes "
        f"{', '.join(cfg['modes'])}, and each answer is judged against contract C1-C5 (`strategy_contract.py`).",
        "",
        *[f"- {role} (torch {report['torch'][role]}): {capture_line(cap[role])}" for role in ROLES],
        "",
        "The capture (`capture_calls` in `tools/audit/capture.py`) runs each sample "
        "forward, its backward (gradients of the results that need them), the OpInfo's in-place and `out=` "
        "variants and the forward under `torch.inference_mode` (composite ops reach dispatch undecomposed); "
        "it also runs the foreach OpInfo databases, the Python references (which call the `prims` ops), the "
        "in-place, `out=`, Python-number and functional overloads of every call on its metas, and by hand "
        "the ops no sample calls (CUDA-only kernels on meta tensors).",
        "",
        "## Registered ops reached",
        "",
        *reach_lines(report),
        "",
        "Modes: `runtime` asks each registry as DTensor's dispatch does (one sharded candidate per input, "
        "output metas given, a raising decomposition reported as no sharding strategy, a composite op under "
        "inference mode, the only place dispatch meets one); `planner` asks with "
        "several candidates per input (the first all-`Replicate`) through "
        "`ShardingPropagator.enumerate_strategies`, the planner entry point, where the torch has it, and "
        "otherwise (stock) calls the op's registry directly as a planner had to there; `utility` expands an "
        "op's single-dim rule with `expand_to_full_mesh_op_strategy` as a rule author does (placeholders as "
        "`Shard`, the all-`Replicate` rule added), without output metas.",
        "",
        "A runtime or planner query that raises is judged against eager DTensor: the same call on DTensors "
        "placed as the query's first candidate, run in `LocalTensorMode` (`eager_error` in "
        "`tools/audit/capture.py`); where LocalTensorMode's per-rank check fails in sharding propagation, "
        "whose shape inference it runs once per simulated rank, asked again as one rank alone, as a job's "
        "process runs it (the message says so). The query is refused (a right answer) where it raised its mode's refusal "
        "type (`NotImplementedError`; as dispatch asks, also a rule's `RuntimeError` or shape inference's "
        "data-dependent one, which dispatch reports as `RuntimeError`) and eager DTensor "
        "raises that type with the same message, or where the op itself rejects the call on plain tensors "
        "and eager DTensor raises too; otherwise its raise is an error, an internal error (`KeyError`, "
        "`AssertionError`, ...) always.",
        "",
        "## Summary, stock vs built",
        "",
        summary_table(report),
        "",
        "- columns: one per mode, mesh and torch, stock (unmodified) beside built (with the change)",
        *[f"- `{k}`: {v}" for k, v in LEGEND.items()],
        "",
        "## Strict (built: no violation, no error, a strategy for every planner query)",
        "",
        "FAIL: " + "; ".join(report["strict_failures"]) if report["strict_failures"] else "PASS",
    ]
    sections = [
        ("Built worse than stock (violation or error where stock has neither)", ("violation", "error"), MODES, True),
        ("Built: ops with violations", ("violation",), MODES, False),
        ("Built: ops whose query raised", ("error",), MODES, False),
        ("Built: planner queries without a strategy", ("no_strategy",), ("planner",), False),
        ("Built: unjudged answers", ("unjudged",), MODES, False),
    ]
    out += ["", "## Built: refused where stock answers the same call", "",
            "Runtime rows fail --strict: stock's dispatch runs what built's refuses (stock's registry answers, and "
            "stock's eager DTensor, asked the same call on the same placements, runs it and gives plain torch's "
            "results). Planner rows are "
            "refusals eager DTensor makes too, where stock's registry offered a planner an answer eager DTensor "
            "does not run.", "", new_refusal_table(report),
            "", "## Built: refused where stock's registry answers but stock's eager DTensor raises too, or runs "
            "the call with other results than plain torch's (`WrongResult`)", "",
            "Not new: stock's dispatch does not run these calls rightly either. Stock's eager DTensor is asked only "
            "about the runtime calls built refuses where stock's registry answers; its results, gathered, are "
            "compared with plain torch's on the same values (ops drawing random numbers are not compared).", "",
            stock_eager_table(report)]
    for title, categories, modes, new_only in sections:
        out += ["", f"## {title}", "", op_table(by_op(report, "built", categories, modes, new_only))]
    for title, category, modes in (("Built: runtime refusals", "refused", ("runtime",)),
                                   ("Built: planner refusals", "refused", ("planner",)),
                                   ("Built: runtime queries without a strategy", "no_strategy", ("runtime",)),
                                   ("Built: utility queries without a strategy", "no_strategy", ("utility",)),
                                   ("Built: tensor-list calls (utility)", "tensor_list", ("utility",))):
        out += ["", f"## {title}", "", reason_table(by_op(report, "built", (category,), modes))]
    out += ["", "## Stock, by op (first examples in audit.json)", ""]
    for category in ("violation", "error", "refused", "no_strategy"):
        ops = by_op(report, "stock", (category,))
        out.append(f"- {LABELS.get(category, category)} ({len(ops)} ops): {_names(list(ops)) or 'none'}")
    return "\n".join(out) + "\n"
