"""BatchProcessor (controller/batch.py): what a batch feeds the recovery machines."""

from __future__ import annotations

import json

import pytest

from cliffguard.controller.alerts import AlertsConfig
from cliffguard.controller.batch import BatchContext, BatchProcessor
from cliffguard.controller.edge_classify import EdgeBatch, EdgeRecord
from cliffguard.controller.recovery_state import Incident, RecoveryState
from cliffguard.controller.recovery_types import Phase, RecoveryConfig
from cliffguard.controller.runstate import RunTable, default_detector_factory
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.models import CommandRow, IncidentRow, RunRow
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event, new_id
from cliffguard.core.signing import Secret
from testing import store_factory as f

T0 = 1_700_000_000.0


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'batch.db'}")
    init_db(eng)
    yield eng
    eng.dispose()


def _halted(session, run: str) -> RecoveryState:
    inc = Incident(id=new_id(), rule="loss_spike", level="critical", spike_step=5, onset_step=5, opened_at=T0)
    session.add(IncidentRow(id=inc.id, run_id=run, opened_at=T0, rule=inc.rule, level=inc.level, spike_step=5))
    return RecoveryState(run=run, salt="s", phase=Phase.HALTED, incident=inc)


def _operator_resume(session, run: str) -> str:
    cmd_id = new_id()
    session.add(CommandRow(id=cmd_id, run_id=run, type="resume", args={}, issued_at=T0, expires_at=T0 + 60,
                           status="sent", source="operator"))
    return cmd_id


@pytest.mark.parametrize(("owner", "moved"), [("run-b", True), ("run-a", False)])
def test_an_ack_moves_only_the_run_whose_command_it_names(engine, owner, moved):
    """An operator resume of run-b resumes halted run-b; an ack from run-b naming run-a's command
    changes nothing."""
    runs = RunTable(default_detector_factory())
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    with session_scope(engine) as s:
        s.add_all([RunRow(id="run-a"), RunRow(id="run-b")])
        s.flush()
        cmd_id = _operator_resume(s, owner)
        runs.get(s, "run-b").recovery = _halted(s, "run-b")
        ack = make_event(EventType.COMMAND_ACK, "run-b", 10, {"cmd": cmd_id, "cmd_type": "resume",
                                                                "status": "applied"}, ts=T0 + 10)
        BatchProcessor(ctx, runs).process(s, EdgeBatch(records=[EdgeRecord("events", 0, 0, ack)]), now=T0 + 10)
    assert (runs.slots["run-b"].recovery.phase is Phase.RUNNING) is moved


def test_an_unverified_checkpoint_event_is_stored_and_alerted(engine):
    from sqlalchemy import select

    from cliffguard.controller.store.models import AlertRow, CheckpointRow

    runs = RunTable(default_detector_factory())
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    ev = make_event(EventType.CHECKPOINT, "run-a", 7, {"kind": "full", "path": "/ck/7", "bytes": 0, "sha256": "",
                                                       "seconds": 0.0, "verified": False,
                                                       "detail": "corrupt: sha256 mismatch"}, ts=T0)
    with session_scope(engine) as s:
        res = BatchProcessor(ctx, runs).process(s, EdgeBatch(records=[EdgeRecord("events", 0, 0, ev)]), now=T0)
    assert res.alerts == 1
    with session_scope(engine) as s:
        (alert,) = s.scalars(select(AlertRow)).all()
        assert alert.rule == "checkpoint_unverified" and alert.run_id == "run-a" and "sha256" in alert.body
        assert s.scalar(select(CheckpointRow.verified)) is False


class _FlagsStep15:
    """A stand-in detector: one warning verdict, at step 15."""

    def on_event(self, ev):
        from cliffguard.controller.verdict import Verdict
        from cliffguard.core.enums import Level

        return [Verdict(rule="loss_spike", level=Level.WARN, step=15, message="test")] if ev.step == 15 else []

    def tick(self, now):
        return []

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_with_a_write_bucket_the_steps_a_verdict_names_and_the_newest_stay_exact(engine):
    from sqlalchemy import select

    from cliffguard.controller.store.models import StepMetricRow
    from cliffguard.controller.store.retention import RetentionConfig
    from testing import store_factory as f

    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig(), retention=RetentionConfig(write_bucket=10))
    evs = [f.step(s, 2.0, run="run-w", ts=T0 + s) for s in range(30)]
    batch = EdgeBatch(records=[EdgeRecord("events", 0, i, ev) for i, ev in enumerate(evs)],
                      next_offsets={("events", 0): len(evs)})
    with session_scope(engine) as s:
        BatchProcessor(ctx, RunTable(_FlagsStep15)).process(s, batch, now=T0 + 30)
        rows = s.execute(select(StepMetricRow.step, StepMetricRow.resolution).order_by(StepMetricRow.step)).all()
    assert [tuple(r) for r in rows] == [(0, 10), (10, 9), (15, 1), (20, 9), (29, 1)]


def test_the_spike_rules_settings_are_written_once_per_loaded_run_not_every_batch(engine):
    """``runs.spike_rule`` is written with a run's first judged loss, then only after the run's
    state is reloaded (a new slot): not with every batch."""
    from sqlalchemy import select, update

    from testing.controller_stack import step_data

    runs = RunTable(default_detector_factory())
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    proc = BatchProcessor(ctx, runs)
    offset = 0

    def batch_of_steps(first: int) -> EdgeBatch:
        nonlocal offset
        recs = []
        for step in range(first, first + 3):
            ev = make_event(EventType.STEP, "run-a", step, step_data(2.0, step), ts=T0 + step)
            recs.append(EdgeRecord("events", 0, offset, ev))
            offset += 1
        return EdgeBatch(records=recs, next_offsets={("events", 0): offset})

    def stored():
        with session_scope(engine) as s:
            return s.scalar(select(RunRow.spike_rule).where(RunRow.id == "run-a"))

    def forget():
        with session_scope(engine) as s:
            s.execute(update(RunRow).where(RunRow.id == "run-a").values(spike_rule=None))

    with session_scope(engine) as s:
        proc.process(s, batch_of_steps(0), now=T0)
    assert stored()["k_crit"] > 0
    forget()
    with session_scope(engine) as s:
        proc.process(s, batch_of_steps(3), now=T0)
    assert stored() is None  # the same slot: already written
    runs.clear()  # what the service does after a failed transaction
    with session_scope(engine) as s:
        proc.process(s, batch_of_steps(6), now=T0)
    assert stored()["k_crit"] > 0


def _spike_run(run: str, n: int = 60, spike_at: int = 50) -> list:
    """Steps of a smooth run with a spike of a few steps at ``spike_at`` (the loss rule's critical)."""
    from testing.controller_stack import step_data

    out = []
    for step in range(n):
        loss = 2.0 + 0.01 * ((step * 7919) % 13) / 13
        if spike_at <= step < spike_at + 4:
            loss = 9.0
        out.append(make_event(EventType.STEP, run, step, step_data(loss, step), ts=T0 + step))
    return out


def _counts(engine, run: str) -> tuple[int, int]:
    from sqlalchemy import func, select

    with session_scope(engine) as s:
        return (s.scalar(select(func.count()).select_from(IncidentRow).where(IncidentRow.run_id == run)),
                s.scalar(select(func.count()).select_from(CommandRow).where(CommandRow.run_id == run)))


def test_a_re_read_stretch_of_steps_is_stored_once_and_judged_once(engine):
    """The same events read again (a re-created topic read from its start, an agent's re-sent
    batch, a copy inside one poll) open no second incident and send no second command; a step
    re-run after a rollback (same step number, a new event) is judged (issue 29 B)."""
    from sqlalchemy import func, select

    from cliffguard.controller.store.models import StepMetricRow

    runs = RunTable(default_detector_factory())
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    proc = BatchProcessor(ctx, runs)
    evs = _spike_run("run-r")
    offset = 0

    def feed(events, now) -> object:
        nonlocal offset
        recs = [EdgeRecord("events", 0, offset + i, ev) for i, ev in enumerate(events)]
        offset += len(events)
        with session_scope(engine) as s:
            if s.get(RunRow, "run-r") is None:
                s.add(RunRow(id="run-r"))
                s.flush()
            return proc.process(s, EdgeBatch(records=recs, next_offsets={("events", 0): offset}), now=now)

    def rules_state() -> str:
        return json.dumps(runs.slots["run-r"].detector.state_dict(), sort_keys=True, default=str)

    first = feed(evs, T0 + 60)
    judged, state = _counts(engine, "run-r"), rules_state()
    assert judged[0] == 1 and judged[1] >= 1 and first.replays == 0
    again = feed(evs[30:], T0 + 70)  # read again, from the middle of the stretch on
    assert again.replays == 30 and _counts(engine, "run-r") == judged
    assert rules_state() == state  # no rule saw them a second time
    runs.clear()  # a successor controller: the slot comes back from the store, judged_ts with it
    twice = feed(evs[40:55] + evs[40:55], T0 + 80)
    assert twice.replays == 30 and _counts(engine, "run-r") == judged and rules_state() == state
    with session_scope(engine) as s:
        assert s.scalar(select(func.count()).select_from(StepMetricRow)) == 60  # one row per step
    rerun = [make_event(EventType.STEP, "run-r", ev.step, ev.data, ts=T0 + 100 + i) for i, ev in enumerate(evs[45:])]
    assert feed(rerun, T0 + 120).replays == 0  # new events of old step numbers: judged


def _node_beat(run: str, step: int, ts: float, first: int = 0):
    return make_event(EventType.HEARTBEAT, run, step, {"state": "running", "ranks": [first, first + 1],
                                                        "steps": [step, step], "ages_s": [0.1, 0.1],
                                                        "collectives": ["", ""]}, rank=first, world=4, ts=ts)


@pytest.mark.parametrize("life_change", [False, True])
def test_the_batchs_steps_are_judged_before_its_heartbeats_and_booked_in_the_logs_order(engine, life_change):
    """A loss spike's pause leaves as its step is judged, so the batch's node heartbeats (most of a
    large run's events) are judged after its other events; the goodput ledger still books every
    event in the log's order, and a batch where a run's life changes is judged in the log's order."""
    from cliffguard.controller.store import models

    runs = RunTable(default_detector_factory())
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig())
    proc = BatchProcessor(ctx, runs)
    log = [_node_beat("run-a", 4, T0 + 3.9), f.step(5, 2.0, world=4, ts=T0 + 4), _node_beat("run-a", 5, T0 + 4.1, first=2)]
    if life_change:
        log.insert(0, f.run_started("run-a", ts=T0 + 3.8, world=4))
    judged: list[str] = []
    booked: list[str] = []
    with session_scope(engine) as s:
        s.add(RunRow(id="run-a"))
        s.flush()
        slot = runs.get(s, "run-a")
        real_judge, real_book = slot.detector.on_event, proc.goodput.on_event
        slot.detector.on_event = lambda ev: judged.append(str(ev.type)) or real_judge(ev)
        proc.goodput.on_event = lambda session, sl, ev, now: booked.append(str(ev.type)) or real_book(session, sl, ev, now)
        proc.process(s, EdgeBatch(records=[EdgeRecord("events", 0, i, ev) for i, ev in enumerate(log)]), now=T0 + 5)
        beats = s.query(models.HeartbeatRow).count()
    in_log = [str(ev.type) for ev in log]
    assert booked == in_log and beats == 2
    assert judged == (in_log if life_change else ["step", "heartbeat", "heartbeat"])
