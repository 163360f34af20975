"""The closed vocabularies every process shares: event and command types, ack statuses, what the
guard decided, severities (a rule's and an alert's), the trainer's modes (also what its heartbeats
report) and how an incident ended. String enums, so their values are what goes on the wire and into the store."""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    RUN_STARTED = "run.started"
    STEP = "step"
    GRAD_HIST = "grad_hist"
    HEARTBEAT = "heartbeat"
    RANKS = "ranks"  # per-rank performance arrays, every ranks_every steps (core/rank_arrays.py)
    CHECKPOINT = "checkpoint"
    VALIDATION = "validation"
    COMMAND_ACK = "command.ack"
    DATA_FLAG = "data.flag"
    DATA_STATS = "data.stats"  # a rank's batch statistics over a window of steps (agent/data_watch/)
    RUN_FINISHED = "run.finished"
    RUN_FAILED = "run.failed"
    ELASTIC_SCALED_DOWN = "elastic.scaled_down"  # the run resumed on fewer ranks (trainer/elastic.py)
    ELASTIC_SCALED_UP = "elastic.scaled_up"  # ranks rejoined: back towards the declared batch
    HANG_EVIDENCE = "hang.evidence"  # a rank's training thread stalled: its Flight Recorder and stacks (agent/hang/)
    NODE_CHECK = "node.check"  # a restarted worker group's pre-flight check: matmul + all-gather in pairs
    TRAINER_TIMEOUT = "trainer.timeout"  # a wait timed out with no controller command: the trainer acted alone
    RUN_PREEMPTED = "run.preempted"  # the scheduler's warning signal: saved at a boundary, exiting to be requeued
    STEP_TRIAGED = "step.triaged"  # a critical step re-run: why it went bad (data, transient, bad rank, optimizer)


class CommandType(StrEnum):
    PAUSE = "pause"
    RESUME = "resume"
    VALIDATE = "validate"
    ROLLBACK = "rollback"
    SET_LR_SCALE = "set_lr_scale"
    CHECKPOINT_NOW = "checkpoint_now"
    STOP = "stop"
    DETAIL = "detail"  # every rank publishes its own step events for the next N steps
    RESTART = "restart"  # tear the worker group down for torchrun to start again (in place, without a node, or halt)


class AckStatus(StrEnum):
    APPLIED = "applied"
    REJECTED = "rejected"
    FAILED = "failed"
    EXPIRED = "expired"
    DUPLICATE = "duplicate"


class CheckpointKind(StrEnum):
    MEMORY = "memory"
    INCREMENTAL = "incremental"
    FULL = "full"


class GuardDecision(StrEnum):
    """What the in-process guard decided for a step."""

    OK = "ok"
    WARN = "warn"  # above k_warn: update applied, reported
    SKIP = "skip"  # above k_crit or non-finite: the update was skipped on every rank
    HOLD = "hold"  # several consecutive skips: the trainer holds for the controller


class Level(StrEnum):
    """A rule's severity for one point."""

    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"


class AlertLevel(StrEnum):
    """How loud an alert is: an endpoint takes those at or above its ``min_level``. A rule's warn or
    critical ``Level`` raises the alert of the same name; ``info`` only says something ended well."""

    INFO = "info"
    WARN = "warn"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _ALERT_RANK[self]


_ALERT_RANK = {AlertLevel.INFO: 0, AlertLevel.WARN: 1, AlertLevel.CRITICAL: 2}


class AlertAction(StrEnum):
    TRIGGER = "trigger"
    """Something happened (an incident opened, a rule fired)."""
    RESOLVE = "resolve"
    """The incident closed; PagerDuty resolves the alert with the same dedup key."""


class TrainerMode(StrEnum):
    """The trainer's mode; its heartbeats report it as their ``state``."""

    RUNNING = "running"
    PAUSED = "paused"  # a pause command (or an operator) holds it at a step boundary
    HELD = "held"  # the guard tripped several steps in a row: waiting for the controller
    VALIDATING = "validating"  # a forward-only validation pass on frozen weights
    STOPPING = "stopping"  # leaving the loop (stop command, failure or the end of training)


class IncidentOutcome(StrEnum):
    OPEN = "open"
    RESUMED = "resumed"  # validation normal: a transient, data-induced excursion
    ROLLED_BACK = "rolled_back"
    HALTED = "halted"  # beyond the rollback budget: a human is needed
    ABANDONED = "abandoned"  # the run ended mid-recovery
    REQUEUED = "requeued"  # a preemption's: the run saved, was requeued and trains again
    SHRUNK = "shrunk"  # a preemption of some nodes of an elastic run: it trains on without them
    CURED = "cured"  # the trainer's triage re-ran the step and cured the cause itself (a data batch skipped, a fault retried)
    RESTARTED = "restarted"  # a hang: the worker group was restarted (in place or without a node) and trains again
