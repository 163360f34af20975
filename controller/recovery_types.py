"""The vocabulary of the recovery state machine: its config, inputs and actions.

Everything here is plain data; the machine's memory of a run is ``controller.recovery_state``. ``controller.recovery`` holds the transition function; the service
turns inputs from Kafka events and actions into SQL rows and outbox messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from cliffguard.controller.recovery_hang_types import (
    ClearSuspect,
    NodeCheckIn,
    RecordSuspect,
    SuspectJoinedIn,
)
from cliffguard.controller.verdict import Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.deployment import PolicyConfig
from cliffguard.core.enums import AckStatus, AlertAction, AlertLevel, CommandType, IncidentOutcome, Level
from cliffguard.core.rank_arrays import MAX_DETAIL_STEPS
from cliffguard.core.settings import shared_field


class Phase(StrEnum):
    """States of one run's recovery."""

    RUNNING = "running"  # training, watched
    PAUSING = "pausing"  # pause sent, waiting for its ack
    VALIDATING = "validating"  # paused; validate sent, waiting for the validation result
    ROLLING_BACK = "rolling_back"  # rollback sent, waiting for its ack
    RECOVERING = "recovering"  # rolled back, training again; waiting for a healthy window
    RESUMING = "resuming"  # validation was normal; resume sent, waiting for its ack
    HALTED = "halted"  # human needed (rollback budget spent, no target, command refused)
    PREEMPTED = "preempted"  # the scheduler took the nodes back (run.preempted): down until it trains again
    RESTARTING = "restarting"  # a hung worker group is torn down: waiting for torchrun's next life
    REJOINING = "rejoining"  # the next life started: waiting for its node check and first step


class Trigger(StrEnum):
    """What moves a run's recovery from one phase to another (``controller/recovery_table.py``
    declares where each may fire); stored as ``transitions.trigger``."""

    SPIKE = "spike"  # a rule's verdict asks for recovery (loss spike, divergence, non-finite loss)
    HOLD = "hold"  # the trainer's guard holds (or keeps skipping): controller/rules/held.py
    PAUSE_APPLIED = "pause_applied"
    ESCALATION_SPENT = "escalation_spent"  # paused on the ladder's last rung: a human decides
    VALIDATION_NORMAL = "validation_normal"  # the frozen weights validate within the margin
    VALIDATION_ABNORMAL = "validation_abnormal"  # ...above it, and a rollback is possible
    BUDGET_EXHAUSTED = "budget_exhausted"  # ...above it, and the rollback budget is spent
    NO_TARGET = "no_target"  # no stable checkpoint to roll back to
    ROLLBACK_UNSUPPORTED = "rollback_unsupported"  # ...above it, and the run cannot roll back
    ROLLBACK_APPLIED = "rollback_applied"
    ROLLBACK_FAILED = "rollback_failed"  # the trainer could not restore the target: try an older one
    RECOVERED = "recovered"  # a healthy window since the rollback
    RESUME_APPLIED = "resume_applied"
    OPERATOR_RESUMED = "operator_resumed"  # a resume or rollback no machine sent was applied
    COMMAND_RETRY = "command_retry"  # the pending command timed out or expired: resent
    COMMAND_GAVE_UP = "command_gave_up"  # ...and it was the last attempt
    COMMAND_REFUSED = "command_refused"  # the trainer rejected it, or a non-rollback failed
    RUN_ENDED = "run_ended"  # the run finished or failed mid-incident
    HANG = "hang"  # the hang rule named a culprit: restart the worker group in place
    HANG_AGAIN = "hang_again"  # ...a node that hung before within repeat_window_s: restart without it
    NODE_CHECK_FAILED = "node_check_failed"  # a restarted group's node check found a slow node: without it
    RESTART_UNAVAILABLE = "restart_unavailable"  # ...and torchrun has no restart left (or none was allowed)
    RESTART_BUDGET_SPENT = "restart_budget_spent"  # ...and the restart budget is spent
    EXCLUDE_UNAVAILABLE = "exclude_unavailable"  # ...the node cannot be left out (too few nodes, unknown)
    WORKERS_STARTED = "workers_started"  # the next life of the worker group said run.started
    NODE_CHECK_PASSED = "node_check_passed"
    TRAINING_AGAIN = "training_again"  # the first step after a restart (a hang) or a preemption
    RESTART_TIMED_OUT = "restart_timed_out"  # no life trained again within restart_timeout_s
    TRAINER_ROLLED_BACK = "trainer_rolled_back"  # a trainer-side timeout rolled the run back (trainer.timeout)
    TRAINER_RESUMED = "trainer_resumed"  # ... resumed it
    TRAINER_STOPPED = "trainer_stopped"  # ... stopped it (its policy, or one that could not apply)
    OPERATOR_LR_SCALE = "operator_lr_scale"  # an operator's command set the LR scale (the machine adopts it)
    PREEMPTED = "preempted"  # the trainer saved for the scheduler's warning and exits to be requeued
    TRIAGE_CURED = "triage_cured"  # the kit re-ran a bad step and cured it itself (step.triaged: data, transient)
    EVICT = "evict"  # the kit's re-runs found a bad rank: restart without its node
    SDC = "sdc"  # the replicas' parameters differ (the SDC watch): roll back to before they diverged
    SUSPECT_NODE = "suspect_node"  # a node the store holds suspect beats in the run: restart without it
    SDC_AGAIN = "sdc_again"  # the rank an SDC rollback named diverged again (persistent SDC): restart without its node
    EVICT_DEVICE = "evict_device"  # a bad rank on a node running several: restart without its device, the node stays
    SDC_AGAIN_DEVICE = "sdc_again_device"  # a persistent SDC on a node running several: restart without its device
    EVICT_BUDGET_SPENT = "evict_budget_spent"  # a node should be left out, but the eviction budget is spent
    RETRY_BUDGET_SPENT = "retry_budget_spent"  # a transient the kit retried, past the retry budget: pause, validate
    RERUN_BUDGET_SPENT = "rerun_budget_spent"  # a step the kit cured, past the re-run budget: pause, validate


@dataclass(kw_only=True, slots=True)
class RecoveryConfig:
    stable_window: int = bounded(50, ge=1)
    """Healthy steps after a checkpoint before it counts as stable (a rollback target). At 50 steps
    a spike's excursion (typically < 20 steps) has time to show, while the newest stable checkpoint
    stays close to the present."""
    recover_window: int = bounded(50, ge=1)
    """Healthy steps after a rollback before the incident closes as recovered."""
    policy: PolicyConfig = shared_field("policy", PolicyConfig)
    """The deployment's rollback policy (``[policy]``): LR cut per rollback and command lifetime."""
    skip_data: bool = False
    """Also skip the data consumed between the rollback target and the spike (PaLM skipped
    ~200-500 batches around each spike)."""
    rollback_budget: int = bounded(3, ge=0)
    """Rollbacks allowed within ``rollback_window_s``; one more validation failure halts."""
    rollback_window_s: float = bounded(3600.0, gt=0)
    """Window of the rollback budget, in seconds."""
    rollback_run_budget: int = bounded(0, ge=0)
    """Rollbacks allowed in the whole run (0 = no cap, today's behaviour): the escalation ladder's LR cuts
    and the window already bound a run that keeps going off; a cap is for a fleet that wants a human
    after so many anyway."""
    val_margin_rel: float = 0.05
    """Validation is abnormal when above the healthy baseline by more than this fraction."""
    val_margin_abs: float = 0.0
    """...plus this absolute amount (for losses near zero)."""
    baseline_window: int = bounded(5, ge=1)
    """Periodic (healthy) validations whose median is the baseline."""
    command_timeout_s: float = 30.0
    """Seconds to wait for an ack of pause/resume/rollback before resending."""
    validate_timeout_s: float = 120.0
    """Seconds to wait for the validation result of a validate command before resending."""
    max_attempts: int = bounded(3, ge=1)
    """Sends of one command (first + retries) before giving up with a critical alert."""
    health_rules: tuple[str, ...] = ("loss_spike", "divergence", "nonfinite", "guard_hold")
    """Rules whose warn/critical verdicts make a step unhealthy (for stability and recovery)."""
    max_checkpoints: int = bounded(64, ge=1)
    """Checkpoints remembered per run (oldest forgotten first; stable ones last)."""
    detail_rules: tuple[str, ...] = ("straggler", "rank_hung")
    """Alerts that also ask the run for per-rank step events (a ``detail`` command), so the
    dashboard shows every rank's steps right after them."""
    detail_steps: int = bounded(20, ge=1, le=MAX_DETAIL_STEPS)
    """Steps of per-rank step events such a command asks for."""
    restart_budget: int = bounded(3, ge=0)
    """Worker-group restarts for hangs allowed within ``restart_window_s``; one more hang halts."""
    restart_window_s: float = bounded(3600.0, gt=0)
    """Window of the restart budget, in seconds."""
    restart_run_budget: int = bounded(0, ge=0)
    """Worker-group restarts allowed in the whole run (0 = no cap, today's behaviour: torchrun's
    ``--max-restarts`` already caps a job's restarts, and ``can_restart`` reads what it has left)."""
    evict_budget: int = bounded(2, ge=0)
    """Restarts that leave a node out (a bad rank, a rank out of transient budget, a persistent SDC, a
    suspect node, a node that hung again or failed a node check) allowed within ``evict_window_s``; the
    next one halts for a human, the node named. Two an hour: one bad node is hardware, two in an hour
    is already unusual, a third says the cause is not the nodes (a bad image, a switch, a bug that
    follows the rank) and each eviction shrinks the world, so a human looks before a fourth."""
    evict_window_s: float = bounded(3600.0, gt=0)
    """Window of the eviction budget, in seconds."""
    evict_run_budget: int = bounded(4, ge=0)
    """Evictions allowed in the whole run (0 = no cap). Four: a run that has lost four nodes to
    evictions trains on a different world than it was planned for, and the fleet, not the next
    node, is the likelier cause."""
    retry_budget: int = bounded(20, ge=0)
    """Transient faults the kit cured by retrying the step (``step.triaged`` transient, any rank) allowed
    within ``retry_window_s``; the next one is not taken as cured: the run is paused and validated,
    and rolled back with the LR cut when the weights are off (a spike's path). Twenty an hour: a
    retry costs about two steps, and a healthy fleet sees a handful a day; more means faults the
    kit may not catch every time. (One rank's own transients are ``transient_budget``: evicted.)"""
    retry_window_s: float = bounded(3600.0, gt=0)
    """Window of the retry budget, in seconds."""
    retry_run_budget: int = bounded(0, ge=0)
    """Retries allowed in the whole run (0 = no cap: a weeks-long run gathers transients at a healthy
    rate; the window catches a burst)."""
    rerun_budget: int = bounded(20, ge=0)
    """Steps the kit re-ran to triage (every ``step.triaged``, whatever its class) allowed within
    ``rerun_window_s``; past it a cure the kit reports (a data batch skipped, a transient retried) is
    answered as if no triage had happened: paused, validated, rolled back with the LR cut when the
    weights are off. Twenty an hour: a triaged step costs 1.4 to 2 steps (docs/triage.md), and a
    run whose kit triages that often has a systemic fault (a poisoned data source, flaky hardware)
    that cures one step at a time hide."""
    rerun_window_s: float = bounded(3600.0, gt=0)
    """Window of the re-run budget, in seconds."""
    rerun_run_budget: int = bounded(0, ge=0)
    """Re-runs allowed in the whole run (0 = no cap: the kit's own ``[agent.recovery] triage_max_steps``,
    50 per process, already caps them)."""
    repeat_window_s: float = bounded(1800.0, ge=0)
    """A node named a hang's culprit again within this many seconds is left out of the restart
    (0 = never leave a node out for hanging again)."""
    restart_timeout_s: float = bounded(300.0, gt=0)
    """Seconds from a restart to the restarted group's first step before the run is halted."""
    transient_budget: int = bounded(3, ge=0)
    """Transient faults the kit's re-runs may find on one rank in a worker group's life; the one that
    reaches it has that rank evicted like a bad rank (0 = never evict for transients)."""
    recorded_transient_budget: int = bounded(1, ge=1)
    """The same budget for a rank whose node has a record in the suspect-node store (evicted before,
    cleared since or not): a node that was bad once is evicted sooner (the lower of the two budgets;
    ``transient_budget`` 0 still means never)."""
    escalate_within: int = bounded(50, ge=0)
    """Steps: an excursion that starts within this many steps of the end of the previous incident
    (a resume, or a rollback called recovered) climbs one rung of the escalation ladder
    (``controller/recovery_table.py`` ``LADDER``: a longer rollback, a stronger LR cut, then a
    human); so does one while recovering from a rollback. 0 = never escalate across incidents."""

    MOVED: ClassVar[dict[str, str]] = {"lr_factor": "[policy] lr_factor", "command_ttl_s": "[policy] command_ttl_s"}

    def __post_init__(self) -> None:
        check_declared(self)
        if self.val_margin_rel < 0 or self.val_margin_abs < 0:
            raise ValueError("val_margin_rel: margins must be >= 0")
        if self.command_timeout_s <= 0 or self.validate_timeout_s <= 0:
            raise ValueError("command_timeout_s: timeouts must be > 0")


# ---------------------------------------------------------------------------------------------
# Inputs: what the service feeds the machine, already typed
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerdictIn:
    """A rule's verdict. Action.RECOVER starts (or continues) an incident; others alert."""

    verdict: Verdict
    now: float


@dataclass(frozen=True, slots=True)
class ProgressIn:
    """A global training step was seen (rank 0's step event), after its verdicts."""

    step: int
    now: float
    sample_end: int | None = None
    """End (exclusive) of the sample indices this step consumed, when the trainer reports it."""
    sample_start: int | None = None
    """First sample index this step consumed."""
    loss_level: Level | None = None
    """The loss rule's level for this step's loss (None when the rule did not judge it): warn or
    critical marks the step's samples as part of an excursion."""
    ts: float = 0.0
    """The step event's ``ts`` (the trainer's clock; 0 = unknown, ``now`` stands in)."""


@dataclass(frozen=True, slots=True)
class CheckpointIn:
    step: int
    kind: str
    verified: bool
    now: float
    detail: str = ""
    """Why the trainer reports it unverified (write failed, corrupt, malformed sidecar)."""


@dataclass(frozen=True, slots=True)
class AckIn:
    cmd_id: str
    status: AckStatus
    now: float
    cmd_type: str | None = None
    detail: str = ""
    args: dict[str, Any] = field(default_factory=dict)
    """The acked command's arguments, from the store (an operator's ``lr_scale``)."""
    available: tuple[int, ...] | None = None
    """A failed rollback's: the steps the trainer can restore (None: it did not say)."""


@dataclass(frozen=True, slots=True)
class ValidationIn:
    """A validation result; ``cmd`` is the validate command it answers, None when periodic."""

    step: int
    val_loss: float
    batches: int
    now: float
    cmd: str | None = None


@dataclass(frozen=True, slots=True)
class TickIn:
    """Time passes: command timeouts are judged against ``now``."""

    now: float


@dataclass(frozen=True, slots=True)
class StartedIn:
    """Rank 0 reported ``run.started``: the commands this run declares it can apply, and under
    torchrun which life of the worker group this is and what restarts it has."""

    capabilities: tuple[CommandType, ...]
    now: float
    life: int = 0
    max_restarts: int = 0
    restarts_left: int = 0
    nodes: int = 1
    min_nodes: int = 1


@dataclass(frozen=True, slots=True)
class RunEndedIn:
    """Rank 0 reported the run finished or failed: no trainer is left to answer commands."""

    now: float
    failed: bool
    detail: str = ""
    """The failure's error text (empty for a finished run)."""


@dataclass(frozen=True, slots=True)
class TrainerTimeoutIn:
    """Rank 0 reported ``trainer.timeout``: it waited past a timeout with no command and acted alone."""

    step: int
    """The step the trainer runs next (after a rollback, the restored one)."""
    now: float
    wait: str
    policy: str
    applied: bool
    waited_s: float
    at_step: int
    lr_scale_before: float
    lr_scale: float
    detail: str = ""
    first_bad_step: int | None = None
    to_step: int | None = None
    ts: float = 0.0
    """When the trainer acted (the event's ``ts``): a report not newer than the last one applied is a
    re-read of it and changes nothing."""


@dataclass(frozen=True, slots=True)
class TriagedIn:
    """Rank 0 reported ``step.triaged``: the kit re-ran a bad step and classified it (core/triage.py)."""

    step: int
    now: float
    cls: str
    remedy: str
    rank: int | None
    reason: str
    reruns: int
    rerun_s: float
    sample_ids: tuple[int, ...]
    update_applied: bool
    ts: float = 0.0
    node: str = ""
    """bad_rank: the suspect rank's node (what an eviction leaves out; empty: unknown)."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The re-runs: each one's per-rank loss and grad norm, the guard's median and σ (core/triage.py)."""
    transient_counts: dict[str, int] = field(default_factory=dict)
    """Transient faults the kit found per rank so far in this life (``transient_budget``)."""
    node_record: bool = False
    """``node`` has a record in the suspect-node store (the edge reads it: ``controller/suspects.py``):
    its rank gets ``recorded_transient_budget``."""
    device: int | None = None
    """The rank's device slot on ``node`` by the node's heartbeats (controller/rank_nodes.py; None: unknown)."""
    node_devices: int = 0
    """How many ranks ``node`` runs (0: unknown): more than one lets an eviction leave out the device alone."""


@dataclass(frozen=True, slots=True)
class RunPreemptedIn:
    """Rank 0 reported ``run.preempted``: it saved ``step`` for the scheduler's warning and exits."""

    step: int
    """The saved step: where a restart resumes."""
    now: float
    signal: str
    deadline_s: float
    save_s: float
    verified: bool
    exit_code: int
    ts: float = 0.0
    """The event's ``ts`` (when the trainer saved): the time until training again counts from it."""
    scope: str = "job"
    """``job``: every node saved and exits to be requeued; ``nodes``: an elastic run loses only the
    warned ``nodes`` and goes on at a smaller world (agent/recovery/preempt_leave.py)."""
    nodes: tuple[str, ...] = ()
    ranks_leaving: int = 0
    world: int = 0


Input = (VerdictIn | ProgressIn | CheckpointIn | AckIn | ValidationIn | TickIn | RunEndedIn | StartedIn
         | TrainerTimeoutIn | RunPreemptedIn | NodeCheckIn | TriagedIn | SuspectJoinedIn)


# ---------------------------------------------------------------------------------------------
# Actions: what the machine asks the edges to do, as plain data
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendCommand:
    id: str
    type: CommandType
    args: dict[str, Any]
    incident_id: str | None
    attempt: int
    ttl_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class MarkCommand:
    """A command this machine gave up waiting for: status ``timeout``, or ``cancelled`` when the run
    ended before answering it."""

    id: str
    status: str
    detail: str


@dataclass(frozen=True, slots=True)
class Alert:
    level: AlertLevel
    rule: str
    title: str
    body: str
    incident_id: str | None = None
    action: AlertAction = AlertAction.TRIGGER
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OpenIncident:
    id: str
    rule: str
    level: str
    spike_step: int
    onset_step: int | None
    opened_at: float
    evidence: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CloseIncident:
    id: str
    outcome: IncidentOutcome
    closed_at: float | None
    rollback_to: int | None
    lr_scale: float
    lr_scales: tuple[float, ...] = ()
    """Every LR scale the incident set, in order (each rollback's cut, a trainer's own): kept in
    the incident's evidence, so repeated cuts show."""
    escalation: int = 0
    """The incident's rung on the escalation ladder."""


@dataclass(frozen=True, slots=True)
class RecordTransition:
    from_state: Phase
    to_state: Phase
    trigger: Trigger
    reason: str
    evidence: dict[str, Any]
    incident_id: str | None
    step: int | None
    ts: float


@dataclass(frozen=True, slots=True)
class MarkStable:
    step: int
    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class FlagSamples:
    """Samples of a transient spike (validation was normal): recorded as a data flag."""

    step: int
    ranges: tuple[tuple[int, int], ...]
    """[start, end) sample index ranges of the excursion's steps."""
    score: float
    """The spike's validation loss relative to the baseline (1.0 = on the baseline)."""
    reason: str


ActionT = (SendCommand | MarkCommand | Alert | OpenIncident | CloseIncident | RecordTransition | MarkStable
           | FlagSamples | RecordSuspect | ClearSuspect)

