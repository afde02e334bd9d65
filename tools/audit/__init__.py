"""Audit of DTensor sharding strategies against the strategy contract (C1-C5).

``python -m tools.audit`` runs :mod:`tools.audit.worker` once under a stock torch
and once under the built torch, merges both JSON results and writes
``reports/audit.json`` and ``reports/audit.md``. See ``python -m tools.audit -h``.
"""
