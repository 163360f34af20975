"""Memory: CUDA allocator statistics on a GPU, the resident set size on a CPU.

``mem_allocated``/``mem_reserved`` are the CUDA caching allocator's ``memory_allocated`` and
``memory_reserved`` (host-side counters: no device sync). On a CPU there is no allocator pool, so
both are the process's current RSS (from ``/proc/self/statm``; ``ru_maxrss`` elsewhere): reserved −
allocated is 0 there and the memory-growth rule sees the RSS trend.
"""

from __future__ import annotations

import os
import resource
import sys

import torch

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


_statm: tuple[int, int] | None = None
"""(pid, fd) of the kept-open ``/proc/self/statm``: a step's read is one ``pread`` (~1 us, where
open/read/close cost 15-150 us in a training process)."""


def _statm_fd() -> int:
    global _statm
    pid = os.getpid()
    if _statm is None or _statm[0] != pid:  # a forked child must read its own file
        _statm = (pid, os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)))
    return _statm[1]


def rss_bytes() -> int:
    try:
        return int(os.pread(_statm_fd(), 256, 0).split()[1]) * _PAGE
    except (OSError, AttributeError, IndexError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def memory_stats(device: torch.device) -> tuple[int, int]:
    """(allocated, reserved) bytes for ``device``."""
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device)), int(torch.cuda.memory_reserved(device))
    rss = rss_bytes()
    return rss, rss
