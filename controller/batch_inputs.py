"""The recovery machine's inputs that one judged event yields (pure): its verdicts, and what a
run-level event says (progress, a checkpoint, a validation, an ack, a run's start or end, ...)."""

from __future__ import annotations

from cliffguard.controller.recovery_hang_types import NodeCheckIn
from cliffguard.controller.recovery_types import (
    AckIn,
    CheckpointIn,
    Input,
    ProgressIn,
    RunEndedIn,
    RunPreemptedIn,
    StartedIn,
    TrainerTimeoutIn,
    TriagedIn,
    ValidationIn,
    VerdictIn,
)
from cliffguard.controller.verdict import Verdict
from cliffguard.core.capabilities import declared as declared_capabilities
from cliffguard.core.enums import AckStatus, EventType, Level
from cliffguard.core.events import Event
from cliffguard.core.ranks import RUN_RANK

_STEP = EventType.STEP


def inputs_for(event: Event, verdicts: list[Verdict], now: float, loss_level: Level | None = None) -> list[Input]:
    """The recovery inputs one event yields (after its verdicts); only ``core.ranks.RUN_RANK``'s
    events yield run-level inputs. ``loss_level``: what the loss rule judged this step's loss."""
    out: list[Input] = [VerdictIn(verdict=v, now=now) for v in verdicts] if verdicts else []
    if event.rank != RUN_RANK:
        return out
    d = event.data
    if event.type is _STEP:
        rng = d.get("sample_range")
        if rng and len(rng) == 2:
            out.append(ProgressIn(event.step, now, rng[1], rng[0], loss_level, event.ts))
        else:
            out.append(ProgressIn(event.step, now, None, None, loss_level, event.ts))
    elif event.type is EventType.CHECKPOINT:
        out.append(CheckpointIn(step=event.step, kind=str(d["kind"]), verified=bool(d["verified"]), now=now,
                                detail=str(d.get("detail") or "")))
    elif event.type is EventType.VALIDATION:
        out.append(ValidationIn(step=event.step, val_loss=d["val_loss"], batches=d["batches"], now=now,
                                cmd=d.get("cmd")))
    elif event.type is EventType.COMMAND_ACK:
        have = d.get("available")
        available = (tuple(int(x) for x in have) if isinstance(have, list)
                     and all(isinstance(x, int) and not isinstance(x, bool) for x in have) else None)
        out.append(AckIn(cmd_id=d["cmd"], status=AckStatus(d["status"]), now=now, cmd_type=d.get("cmd_type"),
                         detail=d.get("detail") or "", available=available))
    elif event.type is EventType.RUN_STARTED:
        out.append(StartedIn(capabilities=declared_capabilities(d), now=now, life=int(d.get("life", 0)),
                             max_restarts=int(d.get("max_restarts", 0)),
                             restarts_left=int(d.get("restarts_left", d.get("max_restarts", 0))), nodes=int(d.get("nodes", 1)),
                             min_nodes=int(d.get("min_nodes", d.get("nodes", 1)))))
    elif event.type is EventType.NODE_CHECK:
        out.append(NodeCheckIn(ok=bool(d["ok"]), life=int(d["life"]), slow=tuple(d["slow"]),
                               slow_nodes=tuple(d["slow_nodes"]), detail=str(d["detail"]), now=now, step=event.step,
                               nodes=tuple(str(n) for n in d.get("nodes") or ())))
    elif event.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED):
        out.append(RunEndedIn(now=now, failed=event.type is EventType.RUN_FAILED, detail=str(d.get("error") or "")))
    elif event.type is EventType.TRAINER_TIMEOUT:
        out.append(TrainerTimeoutIn(
            step=event.step, now=now, wait=d["wait"], policy=d["policy"], applied=d["applied"], waited_s=d["waited_s"],
            at_step=d["at_step"], lr_scale_before=d["lr_scale_before"], lr_scale=d["lr_scale"],
            detail=d.get("detail") or "", first_bad_step=d.get("first_bad_step"), to_step=d.get("to_step"),
            ts=event.ts))
    elif event.type is EventType.STEP_TRIAGED:
        out.append(TriagedIn(step=event.step, now=now, cls=str(d["class"]), remedy=str(d["remedy"]), rank=d.get("rank"),
                             reason=str(d["reason"]), reruns=int(d["reruns"]), rerun_s=float(d["rerun_s"]),
                             sample_ids=tuple(d["sample_ids"]), update_applied=bool(d["update_applied"]), ts=event.ts,
                             node=str(d.get("node") or ""), evidence=dict(d.get("evidence") or {}),
                             transient_counts={str(k): int(v) for k, v in (d.get("transient_counts") or {}).items()}))
    elif event.type is EventType.RUN_PREEMPTED:
        out.append(RunPreemptedIn(step=event.step, now=now, signal=str(d["signal"]), deadline_s=float(d["deadline_s"]),
                                  save_s=float(d["save_s"]), verified=bool(d["verified"]),
                                  exit_code=int(d["exit_code"]), ts=event.ts, scope=str(d.get("scope") or "job"),
                                  nodes=tuple(str(n) for n in d.get("nodes") or ()),
                                  ranks_leaving=int(d.get("ranks_leaving") or 0), world=int(d.get("world") or 0)))
    return out
