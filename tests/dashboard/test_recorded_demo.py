"""Every dashboard section over a store recorded from a real short demo run.

``tests/dashboard/data/demo_store.db`` is what the controller wrote during
``scripts/record_demo_store.sh tests/dashboard/data/demo_store.db 200``: a 2-rank run with a
corrupted batch (resumed) and an LR blow-up (rolled back); ``demo_store.json`` is that run's demo
summary. The synthetic store of fill.py checks exact numbers; this one checks that what the real
parts wrote renders, section by section, against the facts of the recording.

The fixture upgrades its copy to the newest schema, as a controller of this version would on start.
A recording made before the controller stored its spike-rule statistics has none: the loss chart
then has no bands (and no spike levels) rather than a second run of the rule; a recording made
since has them, and the chart's critical points must match the recorded incident.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.db import init_db, make_engine
from cliffguard.controller.store.models import (
    AlertRow,
    AuditRow,
    CheckpointRow,
    CommandRequestRow,
    CommandRow,
    GradHistRow,
    OutboxRow,
    StepMetricRow,
)
from tests.dashboard.conftest import TOKEN, chart_with, run_app, texts

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    db = tmp_path / "demo_store.db"
    shutil.copy(DATA / "demo_store.db", db)  # the app may write (operator actions); keep the file pristine
    url = f"sqlite:///{db}"
    upgrade = make_engine(url)
    init_db(upgrade)  # what a controller of this version does on start (a no-op at head)
    upgrade.dispose()
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DB_URL", url)
    for var in ("CLIFFGUARD_OPERATOR_TOKEN", "CLIFFGUARD_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    engine = make_engine(url)
    yield engine, json.loads((DATA / "demo_store.json").read_text())
    engine.dispose()


def _incident(summary, outcome):
    return next(i for i in summary["incidents"] if i["outcome"] == outcome)


def test_header_and_loss_chart(recorded):
    engine, summary = recorded
    at = run_app()
    assert summary["run"] in at.title[0].value
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["world size"] == "2"
    # recorded before the applied scale had a column: migration 0003 filled it from the newest step
    assert float(metrics["lr_scale applied"]) == _incident(summary, "rolled_back")["lr_scale"]
    _, df = chart_with(at, "loss_plot")
    with Session(engine) as s:
        rank0 = s.scalar(select(func.count()).select_from(StepMetricRow).where(StepMetricRow.rank == 0))
    assert len(df) == rank0  # every step row, both branches of the rollback
    assert df["superseded"].any()  # the steps the rollback abandoned are drawn (faded)
    with Session(engine) as s:
        judged = s.scalar(select(func.count()).select_from(StepMetricRow).where(StepMetricRow.rule_level.is_not(None)))
    if not judged:  # recorded before the controller stored its rule statistics
        assert df["median"].isna().all() and set(df["level"]) == {"ok"}
        assert "no bands" in texts(at)
        return
    crit = set(df.loc[df["level"] == "critical", "step"])
    resumed = _incident(summary, "resumed")
    assert crit & set(range(resumed["onset_step"], resumed["spike_step"] + 1))


def test_lr_scale_halved_after_the_rollback(recorded):
    _, summary = recorded
    at = run_app()
    _, df = chart_with(at, "learning rate")
    rolled = _incident(summary, "rolled_back")
    current = df[~df["superseded"]]
    assert set(current.loc[current["step"] > rolled["spike_step"], "lr_scale"]) == {rolled["lr_scale"]}


def test_gradients_ranks_and_checkpoints(recorded):
    engine, _ = recorded
    at = run_app()
    with Session(engine) as s:
        n_hist = s.scalar(select(func.count()).select_from(GradHistRow))
        n_ckpt = s.scalar(select(func.count()).select_from(CheckpointRow))
    assert n_hist > 0
    _, cells = chart_with(at, "log_count")
    assert cells["count"].sum() > 0
    for field in ("mfu", "tokens_per_s", "data_wait_ratio", "comm_exposed_ratio"):
        _, df = chart_with(at, f'"{field}"')
        assert set(df["rank"]) == {0, 1}
    _, ckpts = chart_with(at, "unverified")
    assert len(ckpts) == n_ckpt
    assert (ckpts["state"] == "stable").any()


def test_incident_timeline_and_alerts(recorded):
    engine, summary = recorded
    at = run_app()
    labels = [e.label for e in at.expander]
    for inc in summary["incidents"]:
        word = "rolled back" if inc["outcome"] == "rolled_back" else "resumed"
        assert any(word in lb and f"step {inc['spike_step']}" in lb for lb in labels), labels
    frames = [d.value for d in at.dataframe]
    cmds = [f for f in frames if "ack_detail" in f.columns]
    assert {"pause", "validate", "rollback", "resume"} <= set().union(*(set(f["type"]) for f in cmds))
    with Session(engine) as s:
        n_alerts = s.scalar(select(func.count()).select_from(AlertRow))
    alerts = next(f for f in frames if "delivery" in f.columns)
    assert len(alerts) == n_alerts > 0
    assert "read-only" in texts(at) or any("read-only" in i.value for i in at.info)


def test_operator_token_on_the_recorded_run(recorded, monkeypatch):
    engine, summary = recorded
    monkeypatch.setenv("CLIFFGUARD_OPERATOR_TOKEN", TOKEN)

    def counts():
        with Session(engine) as s:
            return (
                s.scalar(select(func.count()).select_from(CommandRequestRow)),
                s.scalar(select(func.count()).select_from(CommandRow).where(CommandRow.source == "operator")),
                s.scalar(select(func.count()).select_from(AuditRow)),
                s.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.kind == "command")),
            )

    before = counts()
    at = run_app()

    def submit(token):
        at.selectbox(key="op_action").set_value("pause")
        at.text_input(key="op_actor").input("bob")
        at.text_input(key="op_token").input(token)
        next(b for b in at.button if b.label == "send command").click().run()
        assert not at.exception

    submit("wrong")
    assert counts() == before
    submit(TOKEN)
    assert counts() == (before[0] + 1, *before[1:])  # a request only: the controller signs
    with Session(engine) as s:
        req = s.scalars(select(CommandRequestRow)).one()
    assert (req.run_id, req.type, req.requested_by) == (summary["run"], "pause", "dashboard:bob")

