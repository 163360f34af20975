"""Collectors: the pieces of the agent that turn tensors and clocks into event fields.

Each one is pure measurement with no I/O: ``grad_hist`` (per-layer log2 histograms and norms,
computed on device), ``mfu`` (PaLM FLOPs per token and the peak FLOP/s: table, config or
calibration), ``timing`` (step clock and the DDP communication hook), ``memory`` (CUDA stats or
RSS). The ``Agent`` in ``agent/hooks.py`` wires them to the loop.
"""
