"""The priority classes, declared: each is a Slurm partition with a priority tier and what happens
to its jobs when a higher tier needs the CPUs (``preempt/partition_prio``).

- ``exploration``: small, agile experiments (a new LR schedule); the higher tier, never preempted.
- ``production``: long, stable, maximum-throughput training; preempted by exploration with
  ``PreemptMode=REQUEUE``: warned with SIGUSR1 at the decision (its jobs ask ``--signal=B:USR1@N``,
  the cluster sends it at preemption: ``preempt_send_user_signal``), ``GraceTime`` to save and exit
  75 (agent/recovery/preemption.py), then the job is requeued and resumes from its save.

``cliffguard submit --class NAME`` submits to the class's partition; ``cliffguard queue`` lists
the classes, the jobs and what preempted what. Measured here (slurm-wlm 22.05): the preemption is
decided by the backfill pass (``bf_interval``, set low in the template), and a requeued job is
eligible again about two minutes later (Slurm's own requeue delay).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    tier: int
    """Slurm ``PriorityTier``: a higher tier preempts a lower one."""
    preempt_mode: str | None
    """What a job of this class undergoes when preempted (None: the cluster's, never exercised here:
    nothing ranks above the top tier). Partition ``PreemptMode=OFF`` is not used: it also stopped
    the partition's jobs from preempting others (measured on 22.05)."""
    grace: bool
    """Its jobs get the cluster's ``GraceTime`` between the preemption and SIGTERM."""
    warn_s: int = 0
    """Its jobs ask for SIGUSR1 this long before a time limit (``--signal=B:USR1@N``; 0: none), which
    the cluster also sends at a preemption decision: without it the launcher (the batch shell)
    heard of a preemption only when ``GraceTime`` ended, with ``KillWait`` left to save."""
    default: bool = False


CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass("production", tier=1, preempt_mode="REQUEUE", grace=True, warn_s=60, default=True),
    PriorityClass("exploration", tier=10, preempt_mode=None, grace=False),
)
BY_NAME = {c.name: c for c in CLASSES}


def partition_lines(classes: tuple[PriorityClass, ...], node: str, grace_s: int) -> list[str]:
    out = []
    for c in classes:
        parts = [f"PartitionName={c.name}", f"Nodes={node}", f"PriorityTier={c.tier}", "MaxTime=INFINITE",
                 "State=UP", "OverSubscribe=NO"]
        if c.default:
            parts.append("Default=YES")
        if c.preempt_mode:
            parts.append(f"PreemptMode={c.preempt_mode}")
        if c.grace:
            parts.append(f"GraceTime={grace_s}")
        out.append(" ".join(parts))
    return out
