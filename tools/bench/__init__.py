"""``make bench``: what the change costs or saves DTensor, stock torch 2.14.1 vs built.

``python -m tools.bench`` (``__main__``) runs ``tools.bench.worker`` under each
venv, alternating stock and built per repeat, and compares their pyperf timings.
"""
