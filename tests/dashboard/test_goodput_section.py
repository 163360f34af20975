"""The goodput section: ETTR, the stacked time chart of the buckets in their fixed colours, the
breakdown and what each incident, restart and scale change cost."""

from __future__ import annotations

import pytest

from cliffguard.controller.goodput.buckets import LABELS, Bucket
from cliffguard.controller.store.db import init_db, make_engine
from cliffguard.dashboard.sections.goodput import goodput_chart, timeline_frame
from testing.goodput_script import book_through_controller, schedule
from tests.dashboard.conftest import chart_with, run_app, texts

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    init_db(engine)
    s = schedule()
    book_through_controller(engine, s.events())
    engine.dispose()
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DB_URL", url)
    for var in ("CLIFFGUARD_OPERATOR_TOKEN", "CLIFFGUARD_COMMAND_SECRET", "CLIFFGUARD_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    return s


def test_the_section_shows_ettr_the_stacked_chart_and_the_costs(scripted):
    at = run_app()
    assert "Goodput" in texts(at)
    ettr = next(m for m in at.metric if m.label == "ETTR")
    assert ettr.value == f"{100 * scripted.expected['productive'] / scripted.wall_s:.1f} %"
    spec, df = chart_with(at, '"stack"')
    assert spec["encoding"]["y"]["stack"] == "zero"
    last = df[df["t"] == df["t"].max()].set_index("bucket")["seconds"]
    assert last[LABELS[Bucket.PRODUCTIVE]] == pytest.approx(scripted.expected["productive"], abs=0.01)
    assert last[LABELS[Bucket.ROLLED_BACK]] == pytest.approx(scripted.expected["rolled_back"], abs=0.01)
    tables = [d.value for d in at.dataframe]
    breakdown = next(t for t in tables if "share" in t.columns)
    assert LABELS[Bucket.RESTART] in set(breakdown["bucket"])
    costs = next(t for t in tables if "remedy" in t.columns)
    assert {"restart", "elastic"} <= set(costs["kind"])


def test_no_ledger_yet_says_so(filled):
    # a store filled through ingest alone (no controller): the run has no ledger
    assert "no goodput ledger yet" in texts(run_app())


def test_the_frame_is_one_row_per_point_and_bucket():
    g = {"timeline": {"buckets": ["productive", "unknown"], "points": [[0.0, 0.0, 0.0], [10.0, 9.0, 1.0]]}}
    frame = timeline_frame(g)
    assert list(frame["seconds"]) == [0.0, 0.0, 9.0, 1.0]
    assert goodput_chart(frame).spec["encoding"]["color"]["scale"]["domain"][0] == LABELS[Bucket.PRODUCTIVE]
