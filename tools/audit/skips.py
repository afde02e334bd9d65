"""The audit's skip list: aten ops whose findings do not fail ``--strict``.

Keys are aten op names as ``str(OpOverload)`` prints them (``aten.foo.default``).
A skipped op is still sampled, queried and counted in every table (nothing is
hidden); only ``--strict`` ignores its violations and errors. Every entry is
printed in the report with its reason, so an entry is a claim a reader can
check: add one only when the finding is DTensor deliberately refusing an input,
unrelated to the strategy contract -- never to make a contract violation or a
crash go away.
"""

_INPLACE_REFUSAL = (
    "runtime query with self Shard(0): DTensor deliberately refuses an in-place op whose "
    "self would need a placement change (RuntimeError 'in-place operations that require "
    "placement changes are not supported'); the same input is served in planner mode"
)

SKIPS: dict[str, str] = {
    "aten.index_put_.default": _INPLACE_REFUSAL,
    "aten.scatter_.src": _INPLACE_REFUSAL,
    "aten.scatter_.value": _INPLACE_REFUSAL,
    "aten.unbind.int": (
        "runtime query with the unbound dim sharded (Shard(0) of a 1-D input): DTensor deliberately "
        "refuses to unbind along a sharded dim without redistribution (RuntimeError 'Attempted to "
        "unbind along the sharded dimension')"
    ),
    "aten.index.Tensor": (
        "runtime query with a boolean-mask index: the result's size depends on the mask's "
        "values, and eager DTensor needs a concrete global shape before it runs the op, so it "
        "refuses (DynamicOutputShapeException from shape inference, as on stock); planner "
        "queries of the same calls get unbacked symbolic sizes and are judged"
    ),
    "aten._unsafe_view.default": (
        "runtime query with Shard(0) on a dim the mesh does not divide (51 rows over 4 or 2): DTensor "
        "deliberately refuses to flatten an unevenly sharded tensor (RuntimeError 'Cannot flatten "
        "unevenly sharded tensor')"
    ),
}
