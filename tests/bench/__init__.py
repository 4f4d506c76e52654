"""Benchmarks: print figures and ratios against a baseline run in the same process; they assert no timings.

Not collected by pytest (no ``test_`` prefix). ``make bench`` runs ``python -m tests.bench.run_all``.
"""
