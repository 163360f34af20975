"""The ledgers at the controller's batch: the scripted run through ``BatchProcessor`` into the
store (SQLite, and PostgreSQL in its tier), its partition moving half-way (the ledger reloaded from the store), and the read API."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertRow
from testing.controller_service import store_engine
from testing.goodput_script import book_through_controller, schedule


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request, tmp_path):
    pg = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with store_engine(request.param, tmp_path, pg) as (eng, _url):
        yield eng


def test_the_scripted_run_is_booked_in_the_store_across_a_partition_move(engine):
    s = schedule()
    book_through_controller(engine, s.events(), reload_at=80)
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
    with session_scope(engine) as ses:  # a window after the run: nothing
        assert read.remedy_costs(ses, since=s.t + 1) == []


def test_an_ettr_below_the_floor_raises_an_alert(engine):
    s = schedule()
    book_through_controller(engine, s.events(), GoodputConfig(ettr_floor=0.7, ettr_window_s=30.0))
    with session_scope(engine) as ses:
        rows = ses.scalars(select(AlertRow).where(AlertRow.rule == "ettr_floor").order_by(AlertRow.ts)).all()
    assert rows and rows[0].level == "warn" and "below the floor of 70%" in rows[0].title
    assert rows[0].evidence["ettr"] < 0.7
