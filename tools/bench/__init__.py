"""``make bench``: what the strategy-contract change costs DTensor, stock vs built.

``python -m tools.bench`` (``__main__``) runs ``tools.bench.worker`` under each
venv, alternating stock and built per repeat, and compares their pyperf timings.
"""
