"""A filled store for the dashboard tests: a short 2-rank run told through the real write paths.

Agent-side facts go in as real ``core.events.make_event`` events through the store's
``ingest_events`` (steps for both ranks, gradient histograms, checkpoints, validations, acks,
data flags, heartbeats). Controller-side facts are written as the controller writes them:
incidents, transitions and commands as rows; alerts through ``enqueue_alert`` (with the
deliverer's outcome then recorded on the outbox rows); DLQ counts through ``count_dead_letter``;
the spike rule's statistics per step through ``record_rule_stats``, from the controller's own
``RunDetector`` fed the same events.

The story (``steps`` = 120 by default; the step numbers scale with it):
  * steps 0..61 at lr_scale 1; rank 1 is a straggler (slower steps, more data wait);
  * an LR blow-up from step 58: the loss climbs, the controller opens incident 1 at step 60
    (critical), pauses, validates (abnormal), rolls back to the stable checkpoint at step 40 with
    lr_scale 0.5; the trainer replays steps 41.. (the rollback);
  * a corrupted batch at step 100: incident 2, validation normal -> resume, samples flagged;
  * checkpoints: memory every 10 steps, incremental at 40 and 80, full at 80; stable up to 40
    and at 80.

The lead will later swap this for a recorded short demo run; tests only rely on ``FilledRun``.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Engine, update

from cliffguard.controller.alerts.config import AlertsConfig, EndpointConfig
from cliffguard.controller.alerts.enqueue import enqueue_alert
from cliffguard.controller.alerts.spec import AlertSpec
from cliffguard.controller.detect import RunDetector
from cliffguard.controller.store.db import init_db, session_scope
from cliffguard.controller.store.dlq import count_dead_letter
from cliffguard.controller.store.ingest import ingest_events, record_rule_stats
from cliffguard.controller.store.models import (
    CheckpointRow,
    CommandRow,
    IncidentRow,
    OutboxRow,
    RunRow,
    TransitionRow,
)
from cliffguard.core.enums import AckStatus, CommandType, EventType, GuardDecision
from cliffguard.core.events import Event, make_event, new_id

LAYERS = ["wte", "h.0.attn", "h.0.mlp", "h.1.attn", "h.1.mlp", "lm_head"]
EDGES = [2.0**e for e in range(-24, 1)]  # 25 edges -> 24 log2 bins
DT = 0.5  # seconds per step in the story


@dataclass
class FilledRun:
    run_id: str
    world: int
    steps: int
    spike_step: int
    rollback_to: int
    corrupt_step: int
    incident_ids: list[str] = field(default_factory=list)
    command_ids: list[str] = field(default_factory=list)
    alert_ids: list[str] = field(default_factory=list)
    stable_steps: list[int] = field(default_factory=list)
    n_step_events: int = 0


def _loss(step: int, rng: random.Random, blowup_from: int | None, corrupt: int | None) -> float:
    base = 1.6 + 3.9 / math.sqrt(step + 1)
    noise = rng.gauss(0, 0.012) * base
    if blowup_from is not None and step >= blowup_from:
        base *= 1.0 + 0.9 * (step - blowup_from + 1)
    if corrupt is not None and step == corrupt:
        base *= 1.7
    return base + noise


def _step_event(run: str, step: int, rank: int, world: int, ts: float, loss: float, lr: float, lr_scale: float,
                rng: random.Random, guard: GuardDecision) -> Event:
    slow = 1.5 if rank == 1 else 1.0
    compute = 0.05 * (1 + rng.uniform(-0.05, 0.05))
    data_wait = (0.004 if rank == 0 else 0.02) * (1 + rng.uniform(0, 0.3))
    comm = (0.018 if rank == 0 else 0.004) * (1 + rng.uniform(0, 0.3))  # rank 0 waits on the straggler
    step_time = (compute + data_wait + comm) * (slow if rank == 1 else 1.0)
    tokens = 8 * 256
    norms = {name: (0.05 + 0.02 * i) * (1 + rng.uniform(-0.1, 0.1)) * (loss / 2.0) ** 2 for i, name in enumerate(LAYERS)}
    return make_event(
        EventType.STEP, run, step,
        {
            "loss": loss, "loss_local": loss * (1 + rng.uniform(-0.05, 0.05)), "lr": lr * lr_scale,
            "lr_scale": lr_scale, "grad_norm": math.sqrt(sum(v * v for v in norms.values())), "tokens": tokens,
            "step_time_s": step_time, "data_wait_s": data_wait, "comm_exposed_s": comm, "compute_s": compute,
            "tokens_per_s": tokens / step_time, "mfu": 0.52 * compute / step_time,
            "mem_allocated": int((180 + 0.2 * step) * 2**20), "mem_reserved": int((260 + 0.3 * step) * 2**20),
            "loss_scale": 65536.0, "skipped": guard is GuardDecision.SKIP, "clipped_layers": 0, "guard": guard,
            "layer_grad_norms": norms,
        },
        rank=rank, world=world, ts=ts,
    )


def _hist_event(run: str, step: int, rank: int, world: int, ts: float, shift: int) -> Event:
    layers: dict[str, Any] = {}
    for i, name in enumerate(LAYERS):
        center = 10 + i % 3 + shift
        counts = [int(5000 * math.exp(-((b - center) ** 2) / 6)) for b in range(len(EDGES) - 1)]
        layers[name] = {
            "counts": counts, "zeros": 3, "nonfinite": 0, "p50": 2.0 ** (center - 24), "p99": 2.0 ** (center - 21),
            "max": 2.0 ** (center - 20), "norm": 0.05 * 2**shift, "underflow": 0.001, "numel": sum(counts),
        }
    return make_event(EventType.GRAD_HIST, run, step, {"edges": EDGES, "layers": layers}, rank=rank, world=world, ts=ts)


def _ckpt_event(run: str, step: int, kind: str, world: int, ts: float) -> Event:
    return make_event(
        EventType.CHECKPOINT, run, step,
        {"kind": kind, "path": f"/tmp/ckpt/{run}/{kind}-{step}.pt", "bytes": 48_000_000 if kind != "memory" else 0,
         "sha256": f"{step:064x}", "seconds": 0.4 if kind != "memory" else 0.01, "verified": True},
        world=world, ts=ts,
    )


def _ack(run: str, step: int, world: int, ts: float, cmd: CommandRow, detail: str) -> Event:
    return make_event(
        EventType.COMMAND_ACK, run, step,
        {"cmd": cmd.id, "cmd_type": cmd.type, "status": AckStatus.APPLIED, "detail": detail}, world=world, ts=ts,
    )


def _command(run: str, incident: str, ctype: CommandType, args: dict, ts: float) -> CommandRow:
    return CommandRow(id=new_id(), run_id=run, incident_id=incident, type=str(ctype), args=args,
                      issued_at=ts, expires_at=ts + 60, source="controller", status="sent")


def _transitions(run: str, incident: str, path: list[tuple[str, str, float, int, str]]) -> list[TransitionRow]:
    return [TransitionRow(run_id=run, incident_id=incident, ts=ts, step=step, from_state=a, to_state=b, reason=why,
                       evidence={}) for a, b, ts, step, why in path]


def fill_store(engine: Engine, run_id: str = "demo-run", *, steps: int = 120, world: int = 2, seed: int = 0,
               t0: float | None = None) -> FilledRun:
    """Create the schema if needed and write the story above; returns what was written."""
    init_db(engine)
    t0 = time.time() - 80.0 if t0 is None else t0  # the story ends about now, so heartbeats are fresh
    rng = random.Random(seed)
    if steps < 80:
        raise ValueError("steps: the story needs at least 80 steps")
    spike, corrupt = steps // 2, steps - 20
    back_to, late = (spike - 20) // 10 * 10, (corrupt - 20) // 10 * 10  # checkpoint steps
    info = FilledRun(run_id, world, steps, spike, back_to, corrupt)
    events: list[Event] = [make_event(EventType.RUN_STARTED, run_id, 0, {
        "n_params": 1_200_000, "n_layers": 2, "n_heads": 4, "head_dim": 32, "seq_len": 256, "global_batch": 8,
        "peak_flops": 1e12, "peak_source": "calibration", "lr_schedule": {"kind": "cosine", "lr": 3e-3, "warmup": 20},
        "world_size": world}, world=world, ts=t0)]

    def lr_at(step: int) -> float:
        return 3e-3 * min(1.0, (step + 1) / 20) * (0.5 + 0.5 * math.cos(math.pi * step / (2 * steps)))

    # branch A: steps 0..spike+1, LR blow-up from spike-2
    ts = t0
    for step in range(spike + 2):
        ts = t0 + step * DT
        loss = _loss(step, rng, spike - 2, None)
        guard = GuardDecision.SKIP if step >= spike else GuardDecision.OK
        events += [_step_event(run_id, step, r, world, ts + 0.01 * r, loss, lr_at(step) * (1 if step < spike - 2 else 50),
                               1.0, rng, guard) for r in range(world)]
        if step % 10 == 0:
            events += [_hist_event(run_id, step, r, world, ts + 0.02, 0) for r in range(world)]
            events.append(_ckpt_event(run_id, step, "memory", world, ts + 0.03))
        if step in (back_to,):
            events.append(_ckpt_event(run_id, step, "incremental", world, ts + 0.3))
    events.append(_hist_event(run_id, spike, 0, world, ts + 0.05, 6))
    t_spike = t0 + spike * DT
    detector = RunDetector()
    with session_scope(engine) as s:
        ingest_events(s, events)
        _judge(s, detector, events)
        s.execute(update(CheckpointRow).where(CheckpointRow.run_id == run_id, CheckpointRow.step <= back_to)
                  .values(stable=True, stable_reason="20 healthy steps after it"))
    info.stable_steps = [st for st in range(0, back_to + 1, 10)]
    info.n_step_events = sum(1 for e in events if e.type is EventType.STEP)

    # incident 1: the controller's rows, then the trainer's acks and validation as events
    inc1 = new_id()
    evidence1 = {"window": {"loss": _loss(spike, random.Random(1), spike - 2, None), "median": 2.05, "sigma": 0.03,
                            "sigmas": 41.0, "n": 60}, "verdict": "loss_spike critical", "baseline_val_loss": 2.1}
    pause1 = _command(run_id, inc1, CommandType.PAUSE, {"reason": "loss spike"}, t_spike + 0.2)
    val1 = _command(run_id, inc1, CommandType.VALIDATE, {"batches": 8}, t_spike + 1.5)
    rb1 = _command(run_id, inc1, CommandType.ROLLBACK, {"to_step": back_to, "lr_scale": 0.5}, t_spike + 3.0)
    with session_scope(engine) as s:
        s.add(IncidentRow(id=inc1, run_id=run_id, opened_at=t_spike + 0.1, closed_at=t_spike + 12, rule="loss_spike",
                       level="critical", spike_step=spike, onset_step=spike - 2, outcome="rolled_back",
                       rollback_to=back_to, lr_scale=0.5, evidence=evidence1))
        s.flush()
        s.add_all([pause1, val1, rb1])
        s.add_all(_transitions(run_id, inc1, [
            ("running", "pausing", t_spike + 0.1, spike, "loss 41.0σ above median"),
            ("pausing", "validating", t_spike + 1.5, spike + 1, "pause applied"),
            ("validating", "rolling_back", t_spike + 3.0, spike + 1, "val_loss 3.90 > baseline 2.10 + 10%"),
            ("rolling_back", "recovering", t_spike + 4.5, back_to, "rollback applied from memory"),
            ("recovering", "running", t_spike + 12, back_to + 15, "15 healthy steps after rollback"),
        ]))
        s.execute(update(RunRow).where(RunRow.id == run_id).values(lr_scale=0.5, recovery_state="running",
                                                                    controller_state=_recovery_after(run_id, t_spike + 3.0)))
    info.incident_ids.append(inc1)
    info.command_ids += [pause1.id, val1.id, rb1.id]

    # branch B: the trainer replays from back_to + 1 at lr_scale 0.5; a corrupted batch at `corrupt`
    ev2: list[Event] = [
        _ack(run_id, spike + 1, world, t_spike + 0.8, pause1, "paused at step boundary"),
        make_event(EventType.VALIDATION, run_id, spike + 1, {"cmd": val1.id, "val_loss": 3.9, "batches": 8},
                   world=world, ts=t_spike + 2.5),
        _ack(run_id, spike + 1, world, t_spike + 2.6, val1, "8 batches"),
        _ack(run_id, back_to, world, t_spike + 4.4, rb1, f"restored step {back_to} from memory; lr_scale 0.5"),
    ]
    tb = t_spike + 4.5
    for i, step in enumerate(range(back_to + 1, steps)):
        ts = tb + i * DT
        loss = _loss(step, rng, None, corrupt)
        guard = GuardDecision.WARN if step == corrupt else GuardDecision.OK
        ev2 += [_step_event(run_id, step, r, world, ts + 0.01 * r, loss, lr_at(step), 0.5, rng, guard) for r in range(world)]
        if step % 10 == 0:
            ev2 += [_hist_event(run_id, step, r, world, ts + 0.02, 0) for r in range(world)]
            ev2.append(_ckpt_event(run_id, step, "memory", world, ts + 0.03))
        if step == late:
            ev2.append(_ckpt_event(run_id, step, "incremental", world, ts + 0.3))
            ev2.append(_ckpt_event(run_id, step, "full", world, ts + 0.6))
    t_corrupt = tb + (corrupt - back_to - 1) * DT
    inc2 = new_id()
    pause2 = _command(run_id, inc2, CommandType.PAUSE, {"reason": "loss spike"}, t_corrupt + 0.2)
    val2 = _command(run_id, inc2, CommandType.VALIDATE, {"batches": 8}, t_corrupt + 1.0)
    res2 = _command(run_id, inc2, CommandType.RESUME, {"reason": "validation normal"}, t_corrupt + 2.0)
    ev2 += [
        _ack(run_id, corrupt + 1, world, t_corrupt + 0.5, pause2, "paused"),
        make_event(EventType.VALIDATION, run_id, corrupt + 1, {"cmd": val2.id, "val_loss": 1.98, "batches": 8},
                   world=world, ts=t_corrupt + 1.5),
        _ack(run_id, corrupt + 1, world, t_corrupt + 1.6, val2, "8 batches"),
        _ack(run_id, corrupt + 1, world, t_corrupt + 2.3, res2, "resumed"),
        make_event(EventType.DATA_FLAG, run_id, corrupt, {"sample_ids": list(range(800, 808)), "rule": "garbled_text",
                                                          "score": 0.93}, world=world, ts=t_corrupt + 2.4),
    ]
    ev2 += [make_event(EventType.HEARTBEAT, run_id, steps - 1, {"state": "running"}, rank=r, world=world, ts=ts + 0.2)
            for r in range(world)]
    with session_scope(engine) as s:
        s.add(IncidentRow(id=inc2, run_id=run_id, opened_at=t_corrupt + 0.1, closed_at=t_corrupt + 2.3, rule="loss_spike",
                       level="critical", spike_step=corrupt, onset_step=corrupt, outcome="resumed",
                       evidence={"window": {"loss": 3.4, "median": 2.0, "sigma": 0.025, "sigmas": 56.0, "n": 100},
                                 "baseline_val_loss": 2.0}))
        s.flush()
        s.add_all([pause2, val2, res2])
        s.add_all(_transitions(run_id, inc2, [
            ("running", "pausing", t_corrupt + 0.1, corrupt, "loss 56.0σ above median"),
            ("pausing", "validating", t_corrupt + 1.0, corrupt + 1, "pause applied"),
            ("validating", "resuming", t_corrupt + 2.0, corrupt + 1, "val_loss 1.98 within baseline 2.00 + 10%"),
            ("resuming", "running", t_corrupt + 2.3, corrupt + 1, "resume applied; samples 800..807 flagged"),
        ]))
        s.flush()
        ingest_events(s, ev2)
        _judge(s, detector, ev2)
        s.execute(update(CheckpointRow).where(CheckpointRow.run_id == run_id, CheckpointRow.step == late)
                  .values(stable=True, stable_reason="20 healthy steps after it"))
        info.stable_steps.append(late)
        info.n_step_events += sum(1 for e in ev2 if e.type is EventType.STEP)
        info.incident_ids.append(inc2)
        info.command_ids += [pause2.id, val2.id, res2.id]
        info.alert_ids = _alerts(s, info, inc1, inc2, t_spike, t_corrupt)
        # what the consumer edge counted (shared by every run in the store)
        count_dead_letter(s, "cliffguard.metrics", "invalid_json", "invalid JSON at line 1 column 7", n=3, now=t_spike)
        count_dead_letter(s, "cliffguard.metrics", "unknown_version", "unknown major schema version 9", now=t_spike)
    return info


def _judge(s: Any, detector: RunDetector, events: list[Event]) -> None:
    """The controller's spike-rule statistics for these events, stored as its batch stores them."""
    points = []
    for ev in events:
        before = detector.loss.last_point
        detector.on_event(ev)
        p = detector.loss.last_point
        if p is not None and p is not before:
            points.append({"event_id": ev.id, "median": p.median, "sigma": p.sigma, "level": str(p.level)})
    record_rule_stats(s, points, {events[0].run: asdict(detector.config.spike)})


def _alerts(s: Any, info: FilledRun, inc1: str, inc2: str, t1: float, t2: float) -> list[str]:
    run_id = info.run_id
    cfg = AlertsConfig(endpoints=[
        EndpointConfig(name="oncall-hook", url="http://127.0.0.1:9/hook", format="generic", secret="whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ="),
        EndpointConfig(name="team-slack", url="http://127.0.0.1:9/slack", format="slack", min_level="critical"),
    ])
    spike, back_to = info.spike_step, info.rollback_to
    specs = [
        (AlertSpec(rule="loss_spike", level="critical", title=f"loss spike at step {spike}: rolling back", run_id=run_id,
                   incident_id=inc1, evidence={"sigmas": 41.0}), t1 + 0.1),
        (AlertSpec(rule="loss_spike", level="critical", title=f"recovered: rolled back to step {back_to}, lr x0.5",
                   run_id=run_id, incident_id=inc1, action="resolve"), t1 + 12),
        (AlertSpec(rule="straggler", level="warn", title="rank 1 is a straggler (1.5x step time)", run_id=run_id), t2 - 5),
        (AlertSpec(rule="straggler", level="warn", title="rank 1 is a straggler (1.5x step time)", run_id=run_id), t2 - 4),
    ]
    ids = []
    for spec, now in specs:
        alert = enqueue_alert(s, spec, cfg, now)
        s.flush()
        ids.append(alert.id)
    # what the deliverer recorded: the hook took everything, Slack failed once on the first alert
    for row in s.query(OutboxRow).filter(OutboxRow.kind == "alert").all():
        if row.target == "team-slack" and row.payload == ids[0].encode():
            row.status, row.attempts, row.last_error = "pending", 2, "HTTP 503 Service Unavailable"
        else:
            row.status, row.attempts, row.delivered_at = "delivered", 1, row.created_at + 0.3
    return ids


def _recovery_after(run_id: str, rolled_back_at: float) -> dict:
    """The run's stored controller state after incident 1, as the controller writes it: the recovery
    machine's state with its one rollback counted, and the rung limits it enforces."""
    from cliffguard.controller.recovery_budgets import limits_doc, note
    from cliffguard.controller.recovery_state import RecoveryState
    from cliffguard.controller.recovery_types import RecoveryConfig

    cfg = RecoveryConfig()
    st = RecoveryState(run=run_id, salt="fill", rollback_times=(rolled_back_at,), lr_scale=0.5)
    note(cfg, st, "rollback", rolled_back_at)
    return {"recovery": st.state_dict(), "budget_limits": limits_doc(cfg)}
