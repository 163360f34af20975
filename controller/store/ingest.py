"""Events from the agent -> rows in the store, idempotently.

Kafka delivers at least once, so everything here must be safe to apply twice: a re-delivered
event changes nothing.

- Row-per-event tables (``step_metrics``, ``grad_hists``, ``validations``, ``data_flags``,
  ``data_stats``) carry the event id under a unique constraint and are inserted with
  ``ON CONFLICT DO NOTHING``.
- State tables are updated only by an event *newer* (by ``ts``) than what the row already
  reflects: heartbeats and checkpoints (``ts`` column), the run's last step (``last_event_ts``),
  its lifecycle (``started_at`` / ``ended_at``). A re-delivery carries the same ``ts`` and so
  changes nothing; an out-of-order older event cannot roll state back.
- ``command.ack`` sets the command's status once an ack from the command's own run arrives; a
  later ``duplicate`` ack (the trainer saw a re-sent command) never overwrites what the first ack
  said, and an older ack never overwrites a newer one.
- A ``ranks`` event becomes one ``rank_arrays`` row (``store.rank_arrays``; the readers expand it
  per rank); a node heartbeat updates its node's
  ``heartbeats`` row (``store.heartbeats``: one row per node, the ranks' steps in arrays).
- Step rows below ``runs.downsampled_below`` are skipped: those steps were already folded into
  buckets by ``store.retention``, and a re-delivery must not add a second copy beside the bucket.

Non-finite numbers: a NaN loss is stored as NaN on PostgreSQL and becomes NULL on SQLite, so the
loss's kind ("nan"/"inf"/"-inf") also goes into the ``nonfinite`` column; ``store.read`` turns it
back into the float on both. Other float columns hold NaN on PostgreSQL and NULL on SQLite. JSON
columns (config, histograms, per-layer norms) are passed through ``core.floats.to_json`` first,
which writes non-finite floats as the strings "NaN"/"Infinity"/"-Infinity" (PostgreSQL's JSON
rejects bare NaN).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import bindparam, func, or_, update
from sqlalchemy.orm import Session

from cliffguard.controller.store.copy_rows import insert_values
from cliffguard.controller.store.fit import fit_row, fit_rows, fit_value, fit_values
from cliffguard.controller.store.heartbeats import upsert_heartbeats
from cliffguard.controller.store.models import (
    CheckpointRow,
    CommandRow,
    DataFlagRow,
    DataStatsRow,
    ElasticEventRow,
    EvidenceRow,
    GradHistRow,
    RunRow,
    StepMetricRow,
    ValidationRow,
)
from cliffguard.controller.store.rank_arrays import insert_rank_arrays
from cliffguard.controller.store.retention import run_watermarks
from cliffguard.controller.store.step_buckets import bucket_rows
from cliffguard.controller.store.step_metrics import STEP_METRICS
from cliffguard.controller.store.upsert import built_once, insert_for
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.enums import AckStatus, CommandType, EventType
from cliffguard.core.events import Event
from cliffguard.core.floats import store_kind, to_json
from cliffguard.core.ranks import RUN_RANK

log = logging.getLogger(__name__)

# an ack status the trainer decided (a later "duplicate" ack must not replace it)
_STEP_ROW_EVENTS = frozenset({EventType.STEP, EventType.RANKS})  # the events that become step rows
_DECIDED = {str(s) for s in AckStatus if s is not AckStatus.DUPLICATE}
# commands whose applied ack means the trainer now runs at the command's lr_scale
_SETS_LR_SCALE = {str(CommandType.ROLLBACK), str(CommandType.SET_LR_SCALE)}




def ingest_event(session: Session, event: Event) -> bool:
    """Record one event in the caller's transaction.

    Returns True when the event changed the store, False when it was already there (a
    re-delivery), stale, or refers to something unknown (an ack for a command never issued).
    """
    return ingest_events(session, [event]) == 1


def ingest_events(session: Session, events: Iterable[Event], *, steps: bool = True, node_beats: bool = True) -> int:
    """Record a batch of events (in order) in the caller's transaction; returns how many changed
    the store. Cheaper than one ``ingest_event`` per event: one run update per run, and the
    batch's step rows in one INSERT. ``steps=False`` leaves the step rows to a later
    ``ingest_steps`` call (the controller's batch, which first learns what the loss rule made of
    each step and writes that in the same INSERT). ``node_beats=False`` leaves the node heartbeats'
    rows to the caller (``upsert_heartbeats``: the controller writes them after its verdicts)."""
    events = list(events)
    if not events:
        return 0
    _touch_runs(session, events)
    changed = 0
    beats: list[Event] = []
    for ev in events:
        if ev.type in _STEP_ROW_EVENTS:
            continue
        if ev.type is EventType.HEARTBEAT and ev.data.get("ranks") is not None:
            beats.append(ev)  # all of the batch's at once, below
            continue
        handler = _HANDLERS.get(ev.type)
        if handler is not None and handler(session, ev):
            changed += 1
    if node_beats:
        changed += upsert_heartbeats(session, beats)
    if steps:
        changed += ingest_steps(session, events)
    return changed


def ingest_steps(session: Session, events: Iterable[Event],
                 rule_points: Mapping[str, Mapping[str, Any]] | None = None,
                 watermarks: Mapping[str, int] | None = None, *,
                 write_bucket: int = 1, exact: Iterable[str] = ()) -> int:
    """Insert the step rows of ``events`` (``step`` and ``ranks`` events; others are ignored) whose runs are already
    recorded (``ingest_events`` touched them); returns how many were new. ``rule_points``: event
    id -> ``median``/``sigma``/``level`` of the loss-spike rule at that step, written with the row
    (what ``record_rule_stats`` would otherwise set by an UPDATE after the insert).
    ``watermarks``: each run's ``downsampled_below`` when the caller has read it already.
    ``write_bucket`` > 1 folds the rows into buckets of that many steps before they are written
    (``store/step_buckets.py``), but those of the event ids in ``exact``; the count returned is
    then of rows, not events."""
    events = [e for e in events if e.type in _STEP_ROW_EVENTS]
    if not events:
        return 0
    watermark = watermarks if watermarks is not None else run_watermarks(session, {e.run for e in events})
    points = rule_points or {}
    arrays: list[Event] = []
    applied: dict[str, Event] = {}  # run -> its newest run-rank step: the lr_scale the trainer applied
    rows: list[list[Any]] = []  # in _STEP_COLUMNS order: no dict per row on the common path
    row_of = _step_values
    for ev in events:
        run = ev.run
        if ev.type is _STEP and ev.rank == RUN_RANK and (run not in applied or ev.ts >= applied[run].ts):
            applied[run] = ev
        if ev.step < watermark.get(run, 0):
            continue
        if ev.type is _STEP:
            rows.append(row_of(ev, points.get(ev.id)))
        else:
            arrays.append(ev)
    if write_bucket > 1 and len(rows) > 1:
        folded = bucket_rows([dict(zip(_STEP_COLUMNS, r, strict=True)) for r in rows], write_bucket, exact)
        rows = [[r[c] for c in _STEP_COLUMNS] for r in folded]
    changed = _insert_step_rows(session, fit_values(StepMetricRow, _STEP_COLUMNS, rows)) if rows else 0
    changed += insert_rank_arrays(session, arrays)  # one row per ranks event (store.rank_arrays)
    _lr_scales_applied(session, [(ev.run, ev.data["lr_scale"], ev.ts) for ev in applied.values()])
    return changed


_LR_APPLIED = (update(RunRow)
               .where(RunRow.id == bindparam("b_run"),
                      or_(RunRow.lr_scale_applied_at.is_(None), RunRow.lr_scale_applied_at < bindparam("b_ts")))
               .values(lr_scale_applied=bindparam("b_scale"), lr_scale_applied_at=bindparam("b_ts")))


def _lr_scales_applied(session: Session, applied: list[tuple[str, float, float]]) -> None:
    """Each (run, scale, ts): the trainer applied ``scale`` at ``ts``; an older report never
    overwrites a newer one. One executemany for all the runs."""
    if applied:
        session.connection().execute(_LR_APPLIED, [{"b_run": r, "b_scale": s, "b_ts": t} for r, s, t in applied])


def _lr_scale_applied(session: Session, run_id: str, scale: float, ts: float) -> None:
    _lr_scales_applied(session, [(run_id, scale, ts)])


def record_rule_stats(session: Session, points: list[dict[str, Any]], spike_rules: dict[str, dict[str, Any]]) -> None:
    """Store what the loss-spike rule knew at each judged step, on that step's row, and the rule's
    settings on each run, in the caller's (the batch's) transaction. ``points``: dicts with
    ``event_id``, ``median``, ``sigma``, ``level``; ``spike_rules``: run id -> the rule's settings.
    A row that is not there (folded into a bucket) is simply not updated."""
    if points:
        sm = StepMetricRow.__table__
        stmt = (update(sm).where(sm.c.event_id == bindparam("b_event_id"))
                .values(rule_median=bindparam("b_median"), rule_sigma=bindparam("b_sigma"),
                        rule_level=bindparam("b_level")))
        session.connection().execute(stmt, [{"b_event_id": p["event_id"], "b_median": p["median"],
                                             "b_sigma": p["sigma"], "b_level": p["level"]} for p in points])
    if spike_rules:
        stmt = update(RunRow.__table__).where(RunRow.__table__.c.id == bindparam("b_run")).values(
            spike_rule=bindparam("b_rule", type_=RunRow.__table__.c.spike_rule.type))
        session.connection().execute(stmt, [{"b_run": r, "b_rule": to_json(rule)} for r, rule in spike_rules.items()])


def _insert_step_rows(session: Session, rows: list[list[Any]]) -> int:
    """Insert the rows (value lists in ``_STEP_COLUMNS`` order) whose event id is new
    (``copy_rows.insert_values``: one ``COPY`` or one executemany); returns how many were new, as
    the database counts them: no lookup first, no RETURNING."""
    at = _STEP_COLUMNS.index("event_id")
    rows = list({r[at]: r for r in rows}.values())  # a message the broker delivered twice
    return insert_values(session, StepMetricRow.__table__, _STEP_COLUMNS, rows, ["event_id"])


def _touch_runs(session: Session, events: list[Event]) -> None:
    """Create unseen runs; move each run's last step/ts/world to its newest event."""
    newest: dict[str, Event] = {}
    for ev in events:
        cur = newest.get(ev.run)
        if cur is None or ev.ts >= cur.ts:
            newest[ev.run] = ev
    # one executemany for the batch's runs (every column a new row needs has a default)
    session.connection().execute(built_once(session, "touch_runs", _touch_runs_upsert), fit_rows(RunRow, [
        dict(id=ev.run, world_size=ev.world, last_step=ev.step, last_event_ts=ev.ts) for ev in newest.values()]))


def _touch_runs_upsert(session: Session) -> Any:
    ins = insert_for(session, RunRow)
    return ins.on_conflict_do_update(
        index_elements=["id"],
        set_={
            "world_size": ins.excluded.world_size,
            "last_step": ins.excluded.last_step,
            "last_event_ts": ins.excluded.last_event_ts,
            "updated_at": func.now(),
        },
        where=or_(RunRow.last_event_ts.is_(None), RunRow.last_event_ts < ins.excluded.last_event_ts),
    )


_METRIC_NAMES = tuple(m.name for m in STEP_METRICS)
_STEP_COLUMNS = (*_METRIC_NAMES, "loss", "event_id", "run_id", "step", "rank", "ts", "resolution", "loss_min",
                 "loss_max", "nonfinite", "guard", "layer_grad_norms", "rule_median", "rule_sigma", "rule_level")
"""The columns of a step row as ``_step_values`` lists them."""
_STEP = EventType.STEP  # an enum member read through its class costs ~10x a module global


def _step_values(ev: Event, point: Mapping[str, Any] | None) -> list[Any]:
    """One step event's row, as values in ``_STEP_COLUMNS`` order (fitted to the columns with
    the rest of the batch: ``fit_values``); ``point``: what the loss rule knew at this step."""
    get = ev.data.get
    loss, guard, norms = get("loss"), get("guard"), get("layer_grad_norms")
    row = list(map(get, _METRIC_NAMES))
    row += (loss, ev.id, ev.run, ev.step, ev.rank, ev.ts, 1, None, None, store_kind(loss),
            None if guard is None else str(guard), None if norms is None else to_json(norms),
            *((point["median"], point["sigma"], point["level"]) if point else (None, None, None)))
    return row


def _wrote(session: Session, stmt: Any, key: Any) -> bool:
    """Run an INSERT ... ON CONFLICT and tell whether it wrote a row. RETURNING, not rowcount:
    drivers disagree on an upsert's rowcount (psycopg reports -1 through the ORM)."""
    return session.execute(stmt.returning(key)).first() is not None


def _insert_once(session: Session, model: Any, values: dict[str, Any]) -> bool:
    stmt = (
        insert_for(session, model)
        .values(**fit_row(model, values))
        .on_conflict_do_nothing(index_elements=["event_id"])
    )
    return _wrote(session, stmt, model.id)


def _grad_hist(session: Session, ev: Event) -> bool:
    return _insert_once(
        session,
        GradHistRow,
        dict(
            event_id=ev.id,
            run_id=ev.run,
            step=ev.step,
            rank=ev.rank,
            ts=ev.ts,
            edges=to_json(ev.data["edges"]),
            layers=to_json(ev.data["layers"]),
        ),
    )


def _validation(session: Session, ev: Event) -> bool:
    val_loss = ev.data["val_loss"]
    return _insert_once(
        session,
        ValidationRow,
        dict(
            event_id=ev.id,
            run_id=ev.run,
            step=ev.step,
            ts=ev.ts,
            cmd=ev.data.get("cmd"),
            val_loss=val_loss,
            nonfinite=store_kind(val_loss),
            batches=ev.data["batches"],
        ),
    )


def _data_flag(session: Session, ev: Event) -> bool:
    return _insert_once(
        session,
        DataFlagRow,
        dict(
            event_id=ev.id,
            run_id=ev.run,
            step=ev.step,
            ts=ev.ts,
            rule=ev.data["rule"],
            score=ev.data["score"],
            sample_ids=list(ev.data["sample_ids"]),
        ),
    )


def _data_stats(session: Session, ev: Event) -> bool:
    d = ev.data
    ppl = [v for v in d.get("step_ppl", []) if v == v]
    per_step = {"steps": d["steps"], "dup": d["step_dup"], "pad": d["step_pad"],
                **({"garbled": d["step_garbled"]} if "step_garbled" in d else {}),
                **({"ppl": d["step_ppl"]} if "step_ppl" in d else {})}
    outliers = [list(o) for o in zip(d["outlier_steps"], d["outlier_ids"], d["outlier_reasons"], d["outlier_scores"],
                                     strict=False)]
    return _insert_once(session, DataStatsRow, dict(
        event_id=ev.id, run_id=ev.run, rank=ev.rank, first_step=d["first_step"], step=ev.step, ts=ev.ts,
        batches=d["batches"], sequences=d["sequences"], tokens=d["tokens"], pad_share=d["pad_share"],
        dup_share=d["dup_share"], dup_in_batch=d["dup_in_batch"], garbled=d.get("garbled"),
        ppl=sum(ppl) / len(ppl) if ppl else None, dropped=d.get("dropped", 0), per_step=to_json(per_step),
        len_counts=list(d["len_counts"]), sketch=list(d["sketch"]), outliers=to_json(outliers)))


def _elastic(session: Session, ev: Event) -> bool:
    d = ev.data
    return _insert_once(session, ElasticEventRow, dict(
        event_id=ev.id, run_id=ev.run, step=ev.step, ts=ev.ts,
        direction="up" if ev.type is EventType.ELASTIC_SCALED_UP else "down",
        **{k: d[k] for k in ("from_world", "to_world", "from_global_batch", "global_batch", "grad_accum", "lr",
                             "lr_factor", "steps_lost", "seconds_lost", "backoff_s", "policy", "lr_rule")}))


def _evidence(session: Session, ev: Event) -> bool:
    """A rank's hang evidence or a node check, kept whole (bounded by the agent) for the dashboard."""
    d = ev.data
    check = ev.type is EventType.NODE_CHECK
    return _insert_once(session, EvidenceRow, dict(
        event_id=ev.id, run_id=ev.run, kind=str(ev.type), rank=ev.rank, step=ev.step, ts=ev.ts, life=int(d["life"]),
        reason=("ok" if d["ok"] else "failed") if check else str(d["reason"]),
        node="" if check else str(d["node"]), data=to_json(d)))


def _triaged(session: Session, ev: Event) -> bool:
    """A critical step's re-run verdict (agent/recovery/triage_run.py), kept whole: ``reason`` is its
    class, ``node`` its remedy, ``rank`` the suspect rank (or the bad shard's; -1: none)."""
    d = ev.data
    return _insert_once(session, EvidenceRow, dict(
        event_id=ev.id, run_id=ev.run, kind=str(ev.type), rank=int(d.get("rank", -1)), step=ev.step, ts=ev.ts, life=0,
        reason=str(d["class"])[:32], node=str(d["remedy"])[:128], data=to_json(d)))


def _heartbeat(session: Session, ev: Event) -> bool:
    return upsert_heartbeats(session, [ev]) == 1


def _checkpoint(session: Session, ev: Event) -> bool:
    d = ev.data
    row = dict(
        run_id=ev.run,
        step=ev.step,
        kind=str(d["kind"]),
        path=d["path"],
        bytes=d["bytes"],
        sha256=d["sha256"],
        seconds=d["seconds"],
        verified=d["verified"],
        detail=d.get("detail"),
        ts=ev.ts,
    )
    ins = insert_for(session, CheckpointRow).values(**fit_row(CheckpointRow, row))
    # stable/stable_reason belong to the controller and are left alone
    updated = ("path", "bytes", "sha256", "seconds", "verified", "detail", "ts")
    stmt = ins.on_conflict_do_update(
        index_elements=["run_id", "step", "kind"],
        set_={c: getattr(ins.excluded, c) for c in updated},
        where=CheckpointRow.ts < ins.excluded.ts,
    )
    return _wrote(session, stmt, CheckpointRow.id)


def acked_command(session: Session, ev: Event) -> CommandRow | None:
    """The command a ``command.ack`` event acknowledges, or None (logged) when there is no such
    command or it belongs to another run: a run's acks never speak for another run's commands."""
    cmd_id = ev.data["cmd"]
    row = session.get(CommandRow, cmd_id)
    if row is None:
        log.warning("ack for unknown command %s (run %s): %s", cmd_id, ev.run, ev.data.get("status"))
        return None
    if row.run_id != ev.run:
        log.warning("ack from run %s for command %s of run %s ignored", ev.run, cmd_id, row.run_id)
        return None
    return row


def _command_ack(session: Session, ev: Event) -> bool:
    row = acked_command(session, ev)
    if row is None:
        return False
    status = str(ev.data["status"])
    already_decided = row.status in _DECIDED and row.acked_at is not None
    if already_decided and (status == AckStatus.DUPLICATE or ev.ts <= row.acked_at):
        return False
    if row.status == status and row.acked_at == ev.ts:
        return False
    row.status = status
    row.ack_detail = fit_value(CommandRow, "ack_detail", ev.data.get("detail"))
    row.acked_at = ev.ts
    if status == AckStatus.APPLIED and row.type in _SETS_LR_SCALE:
        _lr_scale_applied(session, ev.run, float(row.args["lr_scale"]), ev.ts)
    return True


def _trainer_timeout(session: Session, ev: Event) -> bool:
    """A trainer that acted alone runs at the LR scale it reports (the recovery machine records who
    decided it and why, and adopts it as the run's: controller/recovery_others.py)."""
    _lr_scale_applied(session, ev.run, float(ev.data["lr_scale"]), ev.ts)
    return True


def _run_started(session: Session, ev: Event) -> bool:
    caps = ev.data.get("capabilities")
    res = session.execute(
        update(RunRow)
        .where(RunRow.id == ev.run, or_(RunRow.started_at.is_(None), RunRow.started_at < ev.ts))
        .values(
            config=to_json(ev.data),
            capabilities=None if caps is None else [str(c) for c in normalize_capabilities(caps)],
            world_size=fit_value(RunRow, "world_size", ev.data["world_size"]),
            started_at=ev.ts,
        )
    )
    if res.rowcount == 0:
        return False
    # a restart after a finish/failure makes the run live again; a late copy of an old start does not
    session.execute(
        update(RunRow)
        .where(RunRow.id == ev.run, or_(RunRow.ended_at.is_(None), RunRow.ended_at < ev.ts))
        .values(status="running", ended_at=None, error=None)
    )
    return True


def _run_ended(session: Session, ev: Event) -> bool:
    failed = ev.type is EventType.RUN_FAILED
    res = session.execute(
        update(RunRow)
        .where(
            RunRow.id == ev.run,
            or_(RunRow.started_at.is_(None), RunRow.started_at <= ev.ts),
            or_(RunRow.ended_at.is_(None), RunRow.ended_at < ev.ts),
        )
        .values(
            status="failed" if failed else "finished",
            ended_at=ev.ts,
            error=fit_value(RunRow, "error", ev.data.get("error")) if failed else None,
            summary=None if failed else (to_json(_summary(ev.data)) or None),
        )
    )
    return res.rowcount > 0


def _run_preempted(session: Session, ev: Event) -> bool:
    """Saved for the scheduler's warning and exiting to be requeued: ``preempted`` until it starts again."""
    res = session.execute(
        update(RunRow)
        .where(RunRow.id == ev.run, or_(RunRow.started_at.is_(None), RunRow.started_at <= ev.ts),
               or_(RunRow.ended_at.is_(None), RunRow.ended_at < ev.ts))
        .values(status="preempted")
    )
    return res.rowcount > 0


_FINISHED_FIGURES = ("steps", "final_loss")  # the run's own row has them (last_step, the curve)


def _summary(data: Mapping[str, Any]) -> dict[str, Any]:
    """What ``run.finished`` says beyond its figures (the kit's ``validation`` cost)."""
    return {k: v for k, v in data.items() if k not in _FINISHED_FIGURES}


_HANDLERS = {
    EventType.GRAD_HIST: _grad_hist,
    EventType.VALIDATION: _validation,
    EventType.DATA_FLAG: _data_flag,
    EventType.DATA_STATS: _data_stats,
    EventType.HEARTBEAT: _heartbeat,
    EventType.CHECKPOINT: _checkpoint,
    EventType.COMMAND_ACK: _command_ack,
    EventType.RUN_STARTED: _run_started,
    EventType.RUN_FINISHED: _run_ended,
    EventType.RUN_FAILED: _run_ended,
    EventType.ELASTIC_SCALED_DOWN: _elastic,
    EventType.ELASTIC_SCALED_UP: _elastic,
    EventType.HANG_EVIDENCE: _evidence,
    EventType.NODE_CHECK: _evidence,
    EventType.TRAINER_TIMEOUT: _trainer_timeout,
    EventType.RUN_PREEMPTED: _run_preempted,
    EventType.STEP_TRIAGED: _triaged,
}
