"""Audit of DTensor sharding strategies against the strategy contract, stock vs built
(``python -m tools.audit -h``; the report goes to ``reports/audit.md``)."""
