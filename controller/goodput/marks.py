"""The declared table from an event to how it books time: one row per kind of event.

The ledger (``ledger.py``) keeps a cursor (everything before it is booked) and a *phase* (the
bucket of the time until the next event). Each event that is a *mark* books the gap since the
cursor and may move the phase:

- ``gap``: the bucket of that gap when the run was training (``RUNNING``); while the run is in
  another phase (paused, held, restarting) the gap is that phase's, unless ``force`` says the
  gap is this mark's whatever the phase (a rollback's ack ends the restore that preceded it);
- ``then``: the phase from this event on (None: unchanged).

A ``step`` event claims its own interval ``[ts - step_time_s, ts)`` (productive, data wait or
skipped) and books the gap before that start; ``ledger.py`` does the steps, the restarts (first
start or a later one) and the redone steps. Events that are no mark (histograms, rank arrays,
data flags, disk checkpoint writes, heartbeats) book nothing: heartbeats only say, inside a long
gap, that the process was alive (``hang``).

A new event kind (issue 21's hold timeout, 22's re-runs, 23's hang detection, 24's preemption)
is one row here, keyed as ``mark_key`` spells it, with the bucket its time belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.controller.goodput.buckets import RUNNING, Bucket
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event


@dataclass(frozen=True, slots=True)
class Mark:
    gap: Bucket | None
    """The gap before the event when the run was training (None: the phase's, i.e. unknown)."""
    then: Bucket | None
    """The phase from this event on; None keeps it."""
    force: bool = False
    """``gap`` applies whatever the phase."""


B = Bucket
MARKS: dict[str, Mark] = {
    # a run's lifecycle (ledger.py picks first/again: the first start opens the ledger)
    "run.started:first": Mark(None, B.INITIALIZATION),
    "run.started:again": Mark(B.RESTART, B.CHECKPOINT_RESTORE, force=True),  # resumes from a checkpoint
    "run.started:again_at_0": Mark(B.RESTART, B.INITIALIZATION, force=True),  # nothing trained yet
    "run.finished": Mark(None, B.RESTART),  # until a later start, if any: the run is down
    "run.failed": Mark(None, B.RESTART),
    # steps: the step's own interval is booked by the ledger; then the phase
    "step": Mark(None, RUNNING),
    "step:hold": Mark(None, B.HOLD_WAIT),  # the guard held: waiting for the controller
    # checkpoints: a memory snapshot is emitted when the training thread's copy is done
    "checkpoint:memory": Mark(B.CHECKPOINT_SAVE, None),
    # validations: the gap before one is the validation (after a pause, the phase's)
    "validation": Mark(B.PAUSE_VALIDATION, None),
    # command acks, by "command.ack:<command type>[:<status>]", the most specific row wins
    "command.ack:pause:applied": Mark(B.PAUSE_VALIDATION, B.PAUSE_VALIDATION),
    "command.ack:validate:applied": Mark(B.PAUSE_VALIDATION, None),
    "command.ack:resume:applied": Mark(None, RUNNING),
    "command.ack:rollback:applied": Mark(B.CHECKPOINT_RESTORE, RUNNING, force=True),
    "command.ack:rollback": Mark(B.CHECKPOINT_RESTORE, B.PAUSE_VALIDATION, force=True),  # failed: paused
    "command.ack:checkpoint_now:applied": Mark(B.CHECKPOINT_SAVE, None),
    "command.ack": Mark(None, None),  # any other ack: nothing moves
    # elastic scale changes (emitted once the new world restored): then the flap back-off, if any
    "elastic.scaled_down": Mark(None, B.RESTART),
    "elastic.scaled_up": Mark(None, B.RESTART),
    # the trainer's own hold timeout (issue 21): the wait was the hold's; its policy applied, it trains on
    "trainer.timeout": Mark(B.HOLD_WAIT, RUNNING),
    # the scheduler's warning signal (issue 24): the gap before it is the step in flight and the
    # preemption save; the run is then down until it starts again (requeued), all of it preemption
    "run.preempted": Mark(B.PREEMPTION, B.PREEMPTION, force=True),
    # a hang (issue 23, rank 0's own evidence): from its last step to the watchdog's dump is the hang until
    # detection, and so is the wait until the group is torn down (then run.failed: the restart); a
    # collective that failed ends it at once; a stall that ended by itself trains on
    "hang.evidence:stalled": Mark(B.HANG, B.HANG),
    "hang.evidence:collective_error": Mark(B.HANG, B.RESTART),
    "hang.evidence:resolved": Mark(B.HANG, RUNNING),
    # a restarted group's pre-flight node check: part of the restart, before the checkpoint's restore
    "node.check": Mark(B.RESTART, B.CHECKPOINT_RESTORE, force=True),
}
"""Mark key -> how the event books time (``mark_key`` spells the keys)."""

AFTER_PREEMPTION: dict[str, Mark] = {
    "run.started:again": Mark(B.PREEMPTION, B.CHECKPOINT_RESTORE, force=True),
    "run.started:again_at_0": Mark(B.PREEMPTION, B.INITIALIZATION, force=True),
}
"""A start after ``run.preempted``: the time the run was down (queued, requeued) was the preemption's,
not a restart's."""

NOT_MARKS: frozenset[EventType] = frozenset({EventType.GRAD_HIST, EventType.RANKS, EventType.DATA_FLAG,
                                             EventType.HEARTBEAT, EventType.DATA_STATS, EventType.STEP_TRIAGED})
"""Events that book no time (a disk checkpoint's write is not a mark either: ``mark_key``). A
``step.triaged`` verdict is reported inside its step: the re-runs' time is that step's interval,
which the step event books (its ``triage`` cost is in the verdict)."""


def mark_key(event: Event) -> str | None:
    """The ``MARKS`` key of a run-level event, or None when it books nothing. ``run.started`` is
    keyed ``run.started`` here; the ledger, which knows whether the run started before, adds
    ``:first``/``:again``. Command acks fall back from ``command.ack:<type>:<status>`` to
    ``command.ack:<type>`` to ``command.ack``."""
    t = event.type
    if t in NOT_MARKS:
        return None
    d = event.data
    if t is EventType.STEP:
        return "step:hold" if str(d.get("guard")) == "hold" else "step"
    if t is EventType.CHECKPOINT:
        key = f"checkpoint:{d['kind']}"
        return key if key in MARKS else None
    if t is EventType.HANG_EVIDENCE:
        key = f"hang.evidence:{d['reason']}"
        return key if key in MARKS else None
    if t is EventType.COMMAND_ACK:
        cmd_type = d.get("cmd_type")
        for key in (f"command.ack:{cmd_type}:{d['status']}", f"command.ack:{cmd_type}"):
            if cmd_type and key in MARKS:
                return key
        return "command.ack"
    key = str(t)
    return key if key in MARKS or t is EventType.RUN_STARTED else None
