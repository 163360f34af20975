"""Typed payloads: the ``data`` of each event type and the ``args`` of each command type.

These TypedDicts are the schema. ``core/events.py`` derives its validation tables from them
(``schema_of``), so a field is declared once: a producer that builds ``StepData(...)`` gets type
checking, and a consumer gets a validated dict of the same shape. ``NotRequired`` fields may be
absent; unknown fields are tolerated on read (a newer minor version may add them).

How an annotation is validated: ``float`` accepts a number or a non-finite wire string
(``core/floats.py``); ``int``, ``str``, ``bool`` are strict; ``dict[str, Any]`` any object;
``dict[str, float]`` an object of numbers; ``list[int]`` / ``list[float]`` lists of those;
``dict[str, HistLayer]`` an object of histogram layers; a StrEnum one of its values.
"""

import typing
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from cliffguard.core.enums import (
    AckStatus,
    CheckpointKind,
    CommandType,
    EventType,
    GuardDecision,
    TrainerMode,
)


class ParamCheckData(TypedDict):
    """The data-parallel replicas' parameter hashes compared at a step, before its update."""

    agree: bool
    suspects: NotRequired[list[int]]  # ranks outside the largest group of equal hashes (every rank when none is)
    named: NotRequired[bool]  # a strict majority agreed, so the suspects are known (never with two replicas)
    groups: NotRequired[list[list[int]]]  # ranks by equal hash, largest group first
    last_agreed: NotRequired[int]  # the last step at which every replica agreed (a clean state's label; absent: none yet)
    mismatches: NotRequired[int]  # disagreeing checks so far in this process


class RunStartedData(TypedDict):
    n_params: int
    n_layers: int
    n_heads: int
    head_dim: int
    seq_len: int
    global_batch: int
    peak_flops: float
    peak_source: str  # "table" | "config" | "calibration"
    lr_schedule: dict[str, Any]
    world_size: int
    config: NotRequired[dict[str, Any]]
    param_check_every: NotRequired[int]  # steps between the SDC watch's checks (0: off; agent/param_check.py)
    # The commands this trainer integration can apply (core/capabilities.py); absent from an
    # older agent, which the controller reads as every command.
    capabilities: NotRequired[list[CommandType]]
    # Under torchrun (core/restart_plan.py ``WorkerLife``): which start of the worker group this
    # is (the same on every rank, agent/hang/life.py), the restarts torchrun allows and has left,
    # the nodes now and the fewest the launch accepts (a node can be left out only while nodes > min_nodes).
    life: NotRequired[int]
    max_restarts: NotRequired[int]
    restarts_left: NotRequired[int]
    nodes: NotRequired[int]
    min_nodes: NotRequired[int]


class LossSummary(TypedDict):
    """The ranks' losses at one step, in a run-level ``step`` event (core/rank_arrays.py)."""

    min: float  # over the finite losses (NaN when none is finite)
    max: float
    argmin: int  # the rank holding min
    argmax: int  # the rank holding max
    median: float
    mad: float  # median absolute deviation from the median
    outliers: list[int]  # ranks with |loss - median| > k * sigma, or a non-finite loss; worst first, capped
    outlier_losses: list[float]  # their losses, in the same order
    losses: NotRequired[list[float]]  # every rank's loss, only when there is an outlier (and world is bounded)


class StepData(TypedDict):
    loss: float  # the global (all-reduced) mean; a ``triaged`` step's is its bad execution's
    loss_local: float  # per rank (the sender's own), like every field from here to guard
    lr: float
    lr_scale: float  # the scale the trainer applied
    grad_norm: float
    tokens: int
    step_time_s: float
    data_wait_s: float
    comm_exposed_s: float
    compute_s: float
    tokens_per_s: float
    mfu: float
    mem_allocated: int
    mem_reserved: int
    loss_scale: float
    skipped: bool
    clipped_layers: int
    guard: GuardDecision
    layer_grad_norms: NotRequired[dict[str, float]]
    sample_range: NotRequired[list[int]]  # [first, last+1) sample indices of this global batch
    rank_losses: NotRequired[LossSummary]  # present = a run-level step event (rank 0 alone sends one)
    detail: NotRequired[bool]  # true = a per-rank step event asked for by a detail command (not for the rules)
    triaged: NotRequired[str]  # the kit re-ran this bad step: its class (core/triage.py; data and transient it cured)
    param_check: NotRequired[ParamCheckData]  # the SDC watch checked at this step (agent/param_check.py)


class RanksData(TypedDict):
    """Per-rank performance of ranks [first_rank, first_rank + n), every array of length n: the
    means over the last ``steps`` steps (memory: the newest value), from one all-reduce."""

    first_rank: int
    steps: int
    step_time_s: list[float]
    data_wait_s: list[float]
    comm_exposed_s: list[float]
    mfu: list[float]
    tokens_per_s: list[float]
    mem_allocated: list[int]
    mem_reserved: list[int]
    loss_local: list[float]  # each rank's loss at the event's step


class HistLayer(TypedDict):
    counts: list[int]
    zeros: int
    nonfinite: int
    p50: float
    p99: float
    max: float
    norm: float
    underflow: float
    numel: NotRequired[int]


class GradHistData(TypedDict):
    edges: list[float]  # log2-spaced |g| bin edges, fixed for the run
    layers: dict[str, HistLayer]


class HeartbeatData(TypedDict):
    state: TrainerMode
    # A node heartbeat (the node's local rank 0 speaks for the node's ranks); all four or none.
    ranks: NotRequired[list[int]]
    steps: NotRequired[list[int]]  # each rank's newest step
    ages_s: NotRequired[list[float]]  # seconds since each rank's process last said it was alive
    collectives: NotRequired[list[str]]  # the collective each rank is inside ("" = none)
    # Who beats (issue 22's suspect-node store keeps a suspect node out by it): the node's id
    # (core/restart_plan.py ``node_id``) and, under the hang part, its worker group's life.
    node: NotRequired[str]
    life: NotRequired[int]
    # The device slot of each of the node's ranks, in ``ranks``' order (core/restart_plan.py
    # ``device_slots``): what a device-level eviction names and leaves out.
    slots: NotRequired[list[int]]


class CheckpointData(TypedDict):
    kind: CheckpointKind
    path: str
    bytes: int
    sha256: str
    seconds: float
    verified: bool
    detail: NotRequired[str]


class ValidationData(TypedDict):
    cmd: NotRequired[str]  # the command answered; absent for periodic (val_every) validation
    val_loss: float
    batches: int


class CommandAckData(TypedDict):
    cmd: str
    cmd_type: NotRequired[str]
    status: AckStatus
    detail: NotRequired[str]
    available: NotRequired[list[int]]  # a failed rollback's: the steps every rank can restore


class DataFlagData(TypedDict):
    sample_ids: list[int]
    rule: str
    score: float


class DataStatsData(TypedDict):
    """One rank's batches over the window of steps [``first_step``, the event's step]: what the data
    rules judge (controller/rules/data_quality.py) and a loss incident shows beside the baseline.
    Built off the training thread (agent/data_watch/); the per-step arrays follow ``steps``."""

    first_step: int
    batches: int  # batches the rank watched in the window
    sequences: int
    tokens: int  # tokens that are not padding
    pad_share: float  # share of the window's token slots that are padding
    len_counts: list[int]  # sequence lengths in log2 bins: bin 0 is length 0, bin i >= 1 holds [2^(i-1), 2^i)
    sketch: list[int]  # token frequencies: each id counted in one of len(sketch) hashed buckets (a one-row count-min sketch)
    dup_share: float  # share of sequences with a near-duplicate earlier in their batch or in the recent window
    dup_in_batch: float  # ... earlier in their own batch
    steps: list[int]
    step_dup: list[float]  # each batch's duplicate share
    step_pad: list[float]  # each batch's padding share
    step_garbled: NotRequired[list[float]]  # each batch's share of sequences the garbled-text rules flag
    step_ppl: NotRequired[list[float]]  # each batch's mean log-perplexity per token under the reference model
    garbled: NotRequired[float]  # the window's share of garbled sequences
    outlier_steps: list[int]  # the window's outlier sequences: the step, sample id, why and how much
    outlier_ids: list[int]
    outlier_reasons: list[str]  # novelty | perplexity | garbled | duplicate
    outlier_scores: list[float]
    dropped: NotRequired[int]  # batches handed over while the watcher was behind: skipped, counted here


class RunFinishedData(TypedDict):
    final_loss: NotRequired[float]
    steps: NotRequired[int]
    # what the run's validations cost (agent/recovery/cadence.py ``summary``): every, max_share,
    # periodic, periodic_s, on_command, on_command_s, train_s, share, off
    validation: NotRequired[dict[str, Any]]


class RunFailedData(TypedDict):
    error: str


class ElasticScaleData(TypedDict):
    """A membership change the run resumed from (the event's step: the restored step)."""

    from_world: int
    to_world: int
    from_global_batch: int
    global_batch: int
    grad_accum: int
    lr: float  # the learning rate at the restored step, ramping to lr_factor's over the rescale warm-up
    lr_factor: float  # the new batch's LR factor (its rule: lr_rule)
    steps_lost: int  # steps done after the restored checkpoint, redone
    seconds_lost: float  # from the last progress before the change to training again (rendezvous + reload)
    backoff_s: float  # a declared pause for a flapping node (0 = none)
    policy: str  # the batch policy: halve | keep | proportional
    lr_rule: str  # sqrt | linear | none


class HangEvidenceData(TypedDict):
    """One rank's evidence when its training thread stalls or a collective fails (agent/hang/):
    its Flight Recorder's sequence numbers and its Python stacks, bounded (the whole dump stays
    in ``path`` on the rank's disk)."""

    reason: str  # stalled (the watchdog) | collective_error (a collective raised) | resolved (it moved again)
    stalled_s: float  # seconds since the training thread last finished a step
    node: str  # the node's id (CLIFFGUARD_NODE_ID, else the host name)
    local_world: NotRequired[int]  # ranks on this node (contiguous): names a silent rank's node
    pid: int
    life: int  # the worker group's start (TORCHELASTIC_RESTART_COUNT)
    collective: str  # the agent collective the training thread is inside ("" = none it knows of)
    fr: bool  # whether the Flight Recorder had entries (TORCH_FR_BUFFER_SIZE)
    pg_status: dict[str, Any]  # process group id -> {"enqueued", "started", "completed"} sequence numbers
    in_flight: list[dict[str, Any]]  # Flight Recorder entries not completed: pg, seq, op, sizes, age_s
    last: list[dict[str, Any]]  # the newest entries
    frame: str  # the training thread's innermost frame outside the libraries ("file:line in function")
    stacks: list[dict[str, Any]]  # every thread: {"name", "main", "frames": ["file:line in function", ...]}
    error: NotRequired[str]  # the collective's error (collective_error)
    gone: NotRequired[list[int]]  # this node's ranks whose process was gone when it reported (dead)
    path: NotRequired[str]  # the whole dump on the rank's disk


class NodeCheckData(TypedDict):
    """A restarted worker group's pre-flight check (agent/hang/node_check.py), from rank 0."""

    ok: bool
    life: int
    ranks: list[int]
    nodes: list[str]  # each rank's node id
    matmul_s: list[float]  # each rank's matmul time
    rounds: list[dict[str, Any]]  # {"groups": [[ranks...], ...], "seconds": [...], "slow": [group index...]}
    slow: list[int]  # the ranks found slow or broken (in a slow group in every round they were checked)
    slow_nodes: list[str]
    seconds: float  # the whole check
    detail: str
class TrainerTimeoutData(TypedDict):
    """The trainer waited past a timeout with no controller command and applied its own policy
    (agent/recovery/timeouts.py). The event's step is the step the loop runs next (after a
    rollback: the restored one)."""

    wait: str  # "hold": the guard held; "pause": the controller fell silent while the run was paused
    policy: str  # "rollback" | "resume" | "stop" ([agent.guard] on_timeout, [agent.recovery] on_pause_timeout)
    waited_s: float  # how long it waited (the timeout)
    at_step: int  # the step it waited at
    applied: bool  # false: the policy could not apply (no checkpoint, a restore failed) and the run stops
    lr_scale_before: float
    lr_scale: float  # what the trainer runs at from now on (a rollback cut it by [policy] lr_factor)
    detail: str
    first_bad_step: NotRequired[int]  # the first step the guard skipped in the stretch it held on
    to_step: NotRequired[int]  # the step a rollback restored


StepTriagedData = TypedDict("StepTriagedData", {
    "class": str,  # core/triage.py TriageClass: data | transient | bad_rank | optimizer | unclear
    "remedy": str,  # skip_batch | retry_step | suspect_rank | rollback
    "rank": NotRequired[int],  # the suspect rank, or the rank whose shard was bad (absent: every shard / unknown)
    "node": NotRequired[str],  # bad_rank, transient: the suspect rank's node (what an eviction leaves out)
    "reason": str,
    "reruns": int,  # forward+backward re-executions this verdict cost
    "rerun_s": float,
    "evidence": dict[str, Any],  # each re-run's per-rank loss and local grad norm, the guard's median and sigma
    "sample_ids": list[int],  # data: the batch put on the bad-batch list (never fed again)
    "update_applied": bool,  # transient: the retried step's update was applied
    "bad_batches": int,  # entries on the run's bad-batch list now
    "transient_counts": dict[str, int],  # transient faults seen per rank so far
})
"""A critical step the kit re-ran (agent/recovery/triage_run.py); rank 0 sends it, at that step."""


class RunPreemptedData(TypedDict):
    """The scheduler's warning signal reached the run; it saved at the next step boundary and exits
    to be requeued (agent/recovery/preemption.py). The event's step is the saved one: the step a
    restart resumes at."""

    signal: str  # "SIGTERM" (preemption, within the partition's GraceTime) | "SIGUSR1" (--signal=B:USR1@N) | ...
    deadline_s: float  # [agent.preemption] deadline_s: the save must be verified this long after the signal
    save_s: float  # signal -> checkpoint verified on disk (or -> given up, when not verified)
    margin_s: float  # deadline_s - save_s (negative: the deadline was missed)
    verified: bool  # the disk checkpoint of ``step`` verified within the deadline
    wait_s: float  # signal -> the step boundary that handled it (the step in flight finished first)
    exit_code: int  # what the process exits with (the scheduler requeues on it)
    path: NotRequired[str]  # the checkpoint directory
    scope: NotRequired[str]  # elastic launches: "nodes" (only the warned nodes leave, the rest go on) | "job"
    nodes: NotRequired[list[str]]  # the warned nodes (elastic)
    ranks_leaving: NotRequired[int]  # ranks on the warned nodes (elastic)
    world: NotRequired[int]  # ranks that saved (elastic)
    detail: NotRequired[str]


EVENT_PAYLOADS: dict[EventType, type] = {
    EventType.RUN_STARTED: RunStartedData,
    EventType.STEP: StepData,
    EventType.GRAD_HIST: GradHistData,
    EventType.HEARTBEAT: HeartbeatData,
    EventType.RANKS: RanksData,
    EventType.CHECKPOINT: CheckpointData,
    EventType.VALIDATION: ValidationData,
    EventType.COMMAND_ACK: CommandAckData,
    EventType.DATA_FLAG: DataFlagData,
    EventType.DATA_STATS: DataStatsData,
    EventType.RUN_FINISHED: RunFinishedData,
    EventType.RUN_FAILED: RunFailedData,
    EventType.ELASTIC_SCALED_DOWN: ElasticScaleData,
    EventType.ELASTIC_SCALED_UP: ElasticScaleData,
    EventType.HANG_EVIDENCE: HangEvidenceData,
    EventType.NODE_CHECK: NodeCheckData,
    EventType.TRAINER_TIMEOUT: TrainerTimeoutData,
    EventType.RUN_PREEMPTED: RunPreemptedData,
    EventType.STEP_TRIAGED: StepTriagedData,
}


class ReasonArgs(TypedDict):
    reason: NotRequired[str]


class ValidateArgs(TypedDict):
    batches: NotRequired[int]


class RollbackArgs(TypedDict):
    to_step: int
    lr_scale: float
    skip_data: NotRequired[list[int]]  # [first, last+1) sample indices to skip


class SetLrScaleArgs(TypedDict):
    lr_scale: float


class CheckpointNowArgs(TypedDict):
    kind: NotRequired[CheckpointKind]


class DetailArgs(TypedDict):
    steps: int  # publish per-rank step events for this many steps (1..core.rank_arrays.MAX_DETAIL_STEPS)


class RestartArgs(TypedDict):
    """Tear down worker group ``life`` for torchrun to start again (core/restart_plan.py)."""

    mode: str  # in_place | exclude (without exclude_nodes) | halt (stop the job for a human)
    life: int  # the worker group's start this is for: a later life acks it without acting
    ranks: NotRequired[list[int]]  # the culprit ranks
    exclude_nodes: NotRequired[list[str]]
    exclude_devices: NotRequired[list[dict[str, Any]]]  # [{node, slot}]: a device-level eviction (its node stays)
    reason: NotRequired[str]
    incident: NotRequired[str]


COMMAND_ARGS: dict[CommandType, type] = {
    CommandType.PAUSE: ReasonArgs,
    CommandType.RESUME: ReasonArgs,
    CommandType.VALIDATE: ValidateArgs,
    CommandType.ROLLBACK: RollbackArgs,
    CommandType.SET_LR_SCALE: SetLrScaleArgs,
    CommandType.CHECKPOINT_NOW: CheckpointNowArgs,
    CommandType.STOP: ReasonArgs,
    CommandType.DETAIL: DetailArgs,
    CommandType.RESTART: RestartArgs,
}

FieldSpec = tuple[Any, bool]
"""(kind, required): kind is a plain type, a StrEnum, or a ``("list"|"map", inner)`` pair."""


def _kind(hint: Any) -> Any:
    origin = typing.get_origin(hint)
    if origin is list:
        return ("list", _kind(typing.get_args(hint)[0]))
    if origin is dict:
        value = typing.get_args(hint)[1]
        return dict if value is Any else ("map", _kind(value))
    if typing.is_typeddict(hint):
        return schema_of(hint)
    if hint in (int, float, str, bool) or (isinstance(hint, type) and issubclass(hint, StrEnum)):
        return hint
    raise TypeError(f"no validation for the annotation {hint!r}")


def schema_of(payload: type) -> dict[str, FieldSpec]:
    """A TypedDict -> {field: (kind, required)}, the table ``core/events.py`` validates against."""
    hints = typing.get_type_hints(payload)
    required = payload.__required_keys__  # type: ignore[attr-defined]
    return {name: (_kind(hint), name in required) for name, hint in hints.items()}
