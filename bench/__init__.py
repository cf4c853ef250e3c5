"""One-command benchmark suite: `python -m bench [--quick]` (see BENCHMARKS.md).

Not part of the installed package (pyproject's find config lists only
moonmind_worker, tasks and bootstrap); it runs from a checkout.
"""
