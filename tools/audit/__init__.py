"""Stock-vs-built check of DTensor sharding strategies against the strategy contract.

``python -m tools.audit -h`` for options; the report goes to ``reports/audit.md``.
"""
