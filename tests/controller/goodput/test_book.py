"""The ledgers at the controller's batch: the scripted run through ``BatchProcessor`` into the
store (SQLite), its partition moving half-way (the ledger reloaded from the store), and the read API."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller.alerts import AlertsConfig
from cliffguard.controller.batch import BatchContext, BatchProcessor
from cliffguard.controller.edge import EdgeBatch, EdgeRecord
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.runstate import RunTable, default_detector_factory
from cliffguard.controller.store import read
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.models import AlertRow
from cliffguard.core.signing import Secret
from testing.goodput_script import schedule


@pytest.fixture
def engine(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'goodput.db'}")
    init_db(eng)
    yield eng
    eng.dispose()


def _process(engine, events, goodput=None, *, reload_at=None, batch=25):
    ctx = BatchContext(group_id="g", commands_topic="cmds", secret=Secret("test-secret-of-enough-length"),
                       recovery=RecoveryConfig(), alerts=AlertsConfig(), goodput=goodput or GoodputConfig())
    runs = RunTable(default_detector_factory())
    proc = BatchProcessor(ctx, runs)
    offset = 0
    for i in range(0, len(events), batch):
        if reload_at is not None and i >= reload_at and runs.slots:
            runs.clear()  # the partition moved: the next batch loads every slot (and ledger) from the store
            reload_at = None
        chunk = events[i:i + batch]
        recs = [EdgeRecord("events", 0, offset + j, ev) for j, ev in enumerate(chunk)]
        offset += len(chunk)
        with session_scope(engine) as s:
            proc.process(s, EdgeBatch(records=recs, next_offsets={("events", 0): offset}), now=chunk[-1].ts)


def test_the_scripted_run_is_booked_in_the_store_across_a_partition_move(engine):
    s = schedule()
    _process(engine, s.events(), reload_at=80)
    with session_scope(engine) as ses:
        g = read.goodput(ses, s.run)
        costs = read.goodput_costs(ses, s.run)
        remedies = {r["remedy"]: r for r in read.remedy_costs(ses)}
        ettr = read.ettr_by_run(ses)
    assert g is not None and g["ended"] is True
    assert g["wall_s"] == pytest.approx(s.wall_s)
    assert sum(g["seconds"].values()) == pytest.approx(s.wall_s, rel=0.01)
    for bucket, seconds in s.expected.items():
        assert g["seconds"][bucket] == pytest.approx(seconds, abs=1e-6), bucket
    assert g["steps_lost"] == s.steps_lost
    assert g["checkpoints"]["counterfactual"]["interval_steps"] == 10
    assert g["timeline"]["points"] and len(g["timeline"]["points"][0]) == 1 + len(g["timeline"]["buckets"])
    assert ettr[s.run]["ettr"] == pytest.approx(g["ettr"])
    # the loss spikes opened incidents (the controller's own), and the restarts are costs of their own
    kinds = {c["kind"] for c in costs}
    assert {"incident", "restart", "elastic"} <= kinds
    assert remedies["restart"]["count"] == 1 and remedies["elastic"]["count"] == 2
    assert sum(c["steps_lost"] for c in costs) == s.steps_lost


def test_an_ettr_below_the_floor_raises_an_alert(engine):
    s = schedule()
    _process(engine, s.events(), GoodputConfig(ettr_floor=0.7, ettr_window_s=30.0))
    with session_scope(engine) as ses:
        rows = ses.scalars(select(AlertRow).where(AlertRow.rule == "ettr_floor").order_by(AlertRow.ts)).all()
    assert rows and rows[0].level == "warn" and "below the floor of 70%" in rows[0].title
    assert rows[0].evidence["ettr"] < 0.7
