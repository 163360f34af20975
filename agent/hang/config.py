"""The hang settings (``[agent.hang]``): collective timeouts, the watchdog, the evidence and the
pre-flight node check. Kept apart from the runtime so the config map reads it without torch
threads or collectives being touched."""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class HangConfig:
    enabled: bool = True
    """The watchdog, the evidence and the restart command (off: the timeouts still apply)."""
    collective_timeout_s: float = bounded(30.0, gt=0)
    """Every process group the agent creates or is given fails a collective after this (torch's
    default is 30 minutes for gloo, 10 for NCCL): a dead peer never holds the survivors longer.
    Above the longest collective a healthy step makes, including a first one that waits for a
    slow rank's start."""
    dump_after_s: float = bounded(8.0, gt=0)
    """A training thread that has not finished a step for this long while running dumps its
    evidence (well below ``collective_timeout_s``, so the ranks still wait in the collective when
    they dump; above the slowest healthy step: a straggler is not a hang)."""
    check_every_s: float = bounded(0.5, gt=0)
    """How often the watchdog looks at the training thread."""
    fr_buffer: int = bounded(2000, ge=0)
    """Flight Recorder entries per process (``TORCH_FR_BUFFER_SIZE``, set before the process
    group is made unless already set; 0 = leave it off)."""
    stack_frames: int = bounded(30, ge=1)
    """Innermost frames of each thread kept in the event (the file on disk keeps them all)."""
    last_entries: int = bounded(8, ge=0)
    """Newest Flight Recorder entries kept in the event."""
    evidence_dir: str = ""
    """Where each rank writes its whole dump (default: beside the node heartbeats)."""
    plan_dir: str = ""
    """Where a restart's plan is written and read (core/restart_plan.py); it must be one directory
    for the whole job (the bundled trainer uses its checkpoint directory). Default: beside the
    node heartbeats, which serves a one-node job."""
    plan_grace_s: float = bounded(1.5, ge=0)
    """Rank 0 waits this long after writing a plan before it leaves, so every launcher has read
    an exclusion before torchrun forms the next rendezvous (launchers poll every 0.25 s)."""
    preflight: bool = True
    """A restarted worker group checks its ranks (agent/hang/node_check.py) before it trains."""
    check_size: int = bounded(256, ge=8)
    """The node check's matmul is check_size x check_size."""
    check_iters: int = bounded(20, ge=1)
    """Matmuls per rank per round."""
    check_timeout_s: float = bounded(10.0, gt=0)
    """The node check's own collectives fail after this (a broken rank fails its pair)."""
    check_slow_factor: float = bounded(3.0, gt=1)
    """A rank (or pair) this many times slower than the median is slow."""
    check_min_s: float = bounded(0.002, ge=0)
    """...and slower by at least this much (a single matmul's time, or a pair's round)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.dump_after_s >= self.collective_timeout_s:
            raise ValueError("dump_after_s: must be below collective_timeout_s (the ranks must still "
                             "wait in the collective when they dump)")
