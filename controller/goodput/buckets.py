"""The goodput buckets: where each second of a run went, in exactly one of them.

ETTR (effective training time ratio) is ``productive / wall``: the share of the wall-clock time
from the run's first start that produced training progress that was kept. GPU-seconds weight
every bucket by the world size at the time, so a second at world 8 counts 8.
"""

from __future__ import annotations

from enum import StrEnum


class Bucket(StrEnum):
    PRODUCTIVE = "productive"
    """Step time of steps kept (less the data wait inside them)."""
    ROLLED_BACK = "rolled_back"
    """Step time of steps later redone (a rollback, a restart or a scale change resumed before
    them), moved here from ``productive`` when the redo happens."""
    SKIPPED = "skipped"
    """Steps whose update the guard skipped: the batch's time, no progress."""
    CHECKPOINT_SAVE = "checkpoint_save"
    """The training thread's stall for a snapshot (the copy for a disk checkpoint included;
    the background write is not a stall)."""
    CHECKPOINT_RESTORE = "checkpoint_restore"
    """Loading a state: a rollback until its ack, a restarted process until its first step."""
    PAUSE_VALIDATION = "pause_validation"
    """Paused by a command, and forward validations (commanded or periodic)."""
    RERUN_TRIAGE = "rerun_triage"
    """Re-running a step to find out why it went bad (issue 22's events book here)."""
    HOLD_WAIT = "hold_wait"
    """Held by the guard, waiting for the controller."""
    HANG = "hang"
    """Alive (heartbeats) but no step, from the last step until detection or the end of the gap."""
    RESTART = "restart"
    """Between processes: from the last sign of the old one to the new one's ``run.started``
    (relaunch, rendezvous), and an elastic flap back-off."""
    PREEMPTION = "preemption"
    """Signal to exit and requeue wait, when the scheduler says so (issue 24's events book here)."""
    DATA_WAIT = "data_wait"
    """Waiting for the next batch inside steps kept."""
    INITIALIZATION = "initialization"
    """From the first ``run.started`` to the first step (listener, first batch, ...)."""
    UNKNOWN = "unknown"
    """Gaps no event explains. Shown, never hidden: a growing share means an event is missing."""


BUCKETS: tuple[Bucket, ...] = tuple(Bucket)
"""The order of every bucket array (state, store, charts)."""
INDEX: dict[Bucket, int] = {b: i for i, b in enumerate(BUCKETS)}

RUNNING = Bucket.UNKNOWN
"""The phase of a run that is training: a gap between its steps that no event explains is unknown."""

CHARGED: frozenset[Bucket] = frozenset({
    Bucket.ROLLED_BACK, Bucket.SKIPPED, Bucket.CHECKPOINT_RESTORE, Bucket.PAUSE_VALIDATION,
    Bucket.RERUN_TRIAGE, Bucket.HOLD_WAIT, Bucket.HANG, Bucket.RESTART, Bucket.PREEMPTION,
})
"""What an open incident (or a restart) is charged with: the time it cost. Productive time, data
wait, routine checkpoint stalls, initialization and unknown gaps are nobody's remedy."""

LABELS: dict[Bucket, str] = {
    Bucket.PRODUCTIVE: "productive (steps kept)",
    Bucket.ROLLED_BACK: "steps rolled back",
    Bucket.SKIPPED: "updates skipped by the guard",
    Bucket.CHECKPOINT_SAVE: "checkpoint save stall",
    Bucket.CHECKPOINT_RESTORE: "checkpoint restore",
    Bucket.PAUSE_VALIDATION: "pause and validation",
    Bucket.RERUN_TRIAGE: "re-runs and triage",
    Bucket.HOLD_WAIT: "hold / wait",
    Bucket.HANG: "hang until detection",
    Bucket.RESTART: "restart and rendezvous",
    Bucket.PREEMPTION: "preemption",
    Bucket.DATA_WAIT: "data wait inside steps",
    Bucket.INITIALIZATION: "initialization",
    Bucket.UNKNOWN: "unknown (no event explains it)",
}

COLORS: dict[Bucket, str] = {
    Bucket.PRODUCTIVE: "#2ca02c", Bucket.ROLLED_BACK: "#d62728", Bucket.SKIPPED: "#ff9896",
    Bucket.CHECKPOINT_SAVE: "#1f77b4", Bucket.CHECKPOINT_RESTORE: "#aec7e8", Bucket.PAUSE_VALIDATION: "#f0a030",
    Bucket.RERUN_TRIAGE: "#ffbb78", Bucket.HOLD_WAIT: "#9467bd", Bucket.HANG: "#8c564b",
    Bucket.RESTART: "#e377c2", Bucket.PREEMPTION: "#c5b0d5", Bucket.DATA_WAIT: "#17becf",
    Bucket.INITIALIZATION: "#bcbd22", Bucket.UNKNOWN: "#7f7f7f",
}
"""One colour per bucket, the same on the dashboard and in the report."""
