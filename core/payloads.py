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

from core.enums import AckStatus, CheckpointKind, CommandType, EventType, GuardDecision, TrainerMode


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
    # The commands this trainer integration can apply (core/capabilities.py); absent from an
    # older agent, which the controller reads as every command.
    capabilities: NotRequired[list[CommandType]]


class StepData(TypedDict):
    loss: float  # the global (all-reduced) mean
    loss_local: float  # per rank, like every field from here to guard
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


class DataFlagData(TypedDict):
    sample_ids: list[int]
    rule: str
    score: float


class RunFinishedData(TypedDict):
    final_loss: NotRequired[float]
    steps: NotRequired[int]


class RunFailedData(TypedDict):
    error: str


EVENT_PAYLOADS: dict[EventType, type] = {
    EventType.RUN_STARTED: RunStartedData,
    EventType.STEP: StepData,
    EventType.GRAD_HIST: GradHistData,
    EventType.HEARTBEAT: HeartbeatData,
    EventType.CHECKPOINT: CheckpointData,
    EventType.VALIDATION: ValidationData,
    EventType.COMMAND_ACK: CommandAckData,
    EventType.DATA_FLAG: DataFlagData,
    EventType.RUN_FINISHED: RunFinishedData,
    EventType.RUN_FAILED: RunFailedData,
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


COMMAND_ARGS: dict[CommandType, type] = {
    CommandType.PAUSE: ReasonArgs,
    CommandType.RESUME: ReasonArgs,
    CommandType.VALIDATE: ValidateArgs,
    CommandType.ROLLBACK: RollbackArgs,
    CommandType.SET_LR_SCALE: SetLrScaleArgs,
    CommandType.CHECKPOINT_NOW: CheckpointNowArgs,
    CommandType.STOP: ReasonArgs,
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
