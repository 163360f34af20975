"""Parallelism planner: model shape, per-device memory, step time, and the configuration search.

Pure functions over small dataclasses; the ``cliffguard plan`` command (cliffguard/commands/plan.py)
is the I/O edge.
"""
