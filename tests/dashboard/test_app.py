"""AppTest over a filled store: every section renders what the store holds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.models import (
    AlertRow,
    CheckpointRow,
    CommandRow,
    DlqCountRow,
    OutboxRow,
    RunRow,
    StepMetricRow,
)
from testing.dashboard_fill import LAYERS, fill_store
from tests.dashboard.conftest import chart_with, run_app, texts

pytestmark = pytest.mark.timeout(180)


def test_run_picker_lists_every_run_and_switches(filled):
    second = fill_store(filled.engine, "second-run", steps=80)
    at = run_app()
    picker = at.selectbox(key="run_picker")
    assert {o.split(" · ")[0] for o in picker.options} == {"demo-run", "second-run"}
    picker.set_value("second-run").run()
    assert not at.exception
    assert "second-run" in at.title[0].value
    _, curve = chart_with(at, "loss_plot")
    assert len(curve) == second.n_step_events // second.world  # the second run's steps, not the first's
    assert curve["step"].max() == second.steps - 1


def test_header_shows_run_state(filled):
    at = run_app()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["recovery state"] == "running"
    assert metrics["lr_scale applied"] == "0.5"  # the trainer's steps after the rollback say so
    assert metrics["world size"] == "2"
    assert metrics["last step"] == str(filled.run.steps - 1)
    assert "heartbeats — 2 ranks, running" in texts(at)  # a summary (read.liveness), not a line per rank
    assert "commands this run applies: all" in texts(at)  # its run.started declared none: an older agent
    # the ladder's room, by the limits the controller stored: the run's one rollback counts
    (budgets,) = [t for t in texts(at).splitlines() if t.startswith("recovery budgets — ")]
    assert "rollback 1/3 per 3600 s: 2 left, then halt" in budgets and "default limits" not in budgets, budgets


def test_loss_chart_has_median_bands_spikes_incidents_and_rollback(filled):
    at = run_app()
    spec, df = chart_with(at, "loss_plot")
    # both branches are there: the replayed steps after the rollback and the abandoned ones
    assert len(df) == filled.run.n_step_events // filled.run.world
    redone = df[df["superseded"]]
    assert set(redone["step"]) == set(range(filled.run.rollback_to + 1, filled.run.spike_step + 2))
    # the bands are the controller's stored statistics of its spike rule, row for row
    with Session(filled.engine) as s:
        stored = s.execute(select(StepMetricRow.rule_median, StepMetricRow.rule_sigma, StepMetricRow.rule_level)
                           .where(StepMetricRow.run_id == filled.run.run_id, StepMetricRow.rank == 0)
                           .order_by(StepMetricRow.ts, StepMetricRow.id)).all()
        rule = s.get(RunRow, filled.run.run_id).spike_rule
    assert len(stored) == len(df) and all(level is not None for _, _, level in stored)
    median = [np.nan if m is None else m for m, _, _ in stored]
    crit = [np.nan if m is None else m + rule["k_crit"] * sg for m, sg, _ in stored]
    warn = [np.nan if m is None else m + rule["k_warn"] * sg for m, sg, _ in stored]
    assert df["median"].to_numpy() == pytest.approx(np.array(median), nan_ok=True)
    assert df["warn"].to_numpy() == pytest.approx(np.array(warn), nan_ok=True)
    assert df["crit"].to_numpy() == pytest.approx(np.array(crit), nan_ok=True)
    assert list(df["level"]) == [level for _, _, level in stored]
    # the blow-up is critical for the controller's rule; so is the one-step corrupted batch, far
    # beyond the rule's extreme threshold (critical at once, patience or not: core/spike.py),
    # exactly what the controller decided
    assert filled.run.spike_step in set(df.loc[df["level"] == "critical", "step"])
    assert df.loc[df["step"] == filled.run.corrupt_step, "level"].tolist() == ["critical"]
    assert f"+ {rule['k_crit']:g}σ" in texts(at)
    layers = spec["layer"]
    spans = next(ly for ly in layers if ly["mark"]["type"] == "rect")["data"]["values"]
    assert {s["outcome"] for s in spans} == {"rolled_back", "resumed"}
    rule = next(ly for ly in layers if ly["mark"]["type"] == "rule")["data"]["values"]
    assert [(r["from_step"], r["to_step"]) for r in rule] == [(filled.run.spike_step + 1, filled.run.rollback_to)]
    assert '"type": "log"' not in json.dumps(spec)
    at.toggle(key="loss_log_y").set_value(True).run()
    spec, _ = chart_with(at, "loss_plot")
    assert '"type": "log"' in json.dumps(spec)


def test_lr_and_lr_scale_chart(filled):
    at = run_app()
    _, df = chart_with(at, "learning rate")
    current = df[~df["superseded"]]
    assert set(current.loc[current["step"] > filled.run.rollback_to, "lr_scale"]) == {0.5}
    assert set(current.loc[current["step"] <= filled.run.rollback_to, "lr_scale"]) == {1.0}


def test_gradient_heatmaps_per_layer(filled):
    at = run_app()
    layer_box = at.selectbox(key="hist_layer")
    assert list(layer_box.options) == LAYERS
    _, cells = chart_with(at, "log_count")
    assert cells["count"].sum() > 0
    _, norms = chart_with(at, "log_norm")
    assert set(norms["layer"]) == set(LAYERS)
    layer_box.set_value("lm_head").run()
    assert "gradient histogram of lm_head" in texts(at)


def test_ranks_show_the_straggler(filled):
    at = run_app()
    assert any("straggler rank(s): 1" in w.value for w in at.warning)
    spec, summary = chart_with(at, "straggler")
    assert summary.set_index("rank").loc[1, "straggler"] and not summary.set_index("rank").loc[0, "straggler"]
    for field in ("mfu", "tokens_per_s", "data_wait_ratio", "comm_exposed_ratio", "MiB"):
        _, df = chart_with(at, f'"{field}"')
        assert set(df["rank"]) == {0, 1}


def test_checkpoint_timeline(filled):
    with Session(filled.engine) as s:  # one the trainer reported failed: the page marks it
        s.add(CheckpointRow(run_id=filled.run.run_id, step=999_999, kind="full", path="/ck/x", bytes=0, sha256="",
                            seconds=0.0, verified=False, detail="write failed: disk full", ts=1.0))
        s.commit()
    at = run_app()
    _, df = chart_with(at, "unverified")
    with Session(filled.engine) as s:
        n = s.scalar(select(func.count()).select_from(CheckpointRow))
        n_stable = s.scalar(select(func.count()).select_from(CheckpointRow).where(CheckpointRow.stable))
    assert len(df) == n
    assert (df["state"] == "stable").sum() == n_stable
    assert set(df["kind"]) == {"memory", "incremental", "full"}
    assert f"{n_stable} stable" in texts(at)
    assert "failed verification" in texts(at) and "step 999999 full (write failed: disk full)" in texts(at)


def test_incident_timeline_with_evidence(filled):
    at = run_app()
    spec, segments = chart_with(at, "seconds since the incident opened")
    assert set(segments["state"]) >= {"pausing", "validating", "rolling_back", "recovering", "resuming", "running"}
    labels = [e.label for e in at.expander]
    assert any("rolled back" in lb and f"step {filled.run.spike_step}" in lb for lb in labels)
    assert any("resumed" in lb and f"step {filled.run.corrupt_step}" in lb for lb in labels)
    frames = [d.value for d in at.dataframe]
    cmds = [f for f in frames if "ack_detail" in f.columns]
    assert {"pause", "validate", "rollback", "resume"} <= set().union(*(set(f["type"]) for f in cmds))
    assert set().union(*(set(f["status"]) for f in cmds)) == {"applied"}
    vals = [f for f in frames if "val_loss" in f.columns]
    assert {3.9, 1.98} <= set().union(*(set(f["val_loss"]) for f in vals))
    metric_labels = {m.label for m in at.metric}
    assert {"median", "sigma", "σ above median"} <= metric_labels


def test_alerts_with_delivery_status_and_dlq(filled):
    at = run_app()
    frames = [d.value for d in at.dataframe]
    alerts = next(f for f in frames if "delivery" in f.columns)
    with Session(filled.engine) as s:
        n_suppressed = s.scalar(select(func.count()).select_from(AlertRow).where(AlertRow.suppressed))
        n_rows = s.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.kind == "alert"))
        n_dlq = s.scalar(select(func.sum(DlqCountRow.count)))
    assert (alerts["delivery"] == "suppressed").sum() == n_suppressed >= 1
    assert (alerts["delivery"].isin(["delivered", "pending"])).sum() == n_rows
    assert "HTTP 503 Service Unavailable" in set(alerts["last_error"].dropna())
    assert any(m.label == "dead letters" and m.value == str(n_dlq) for m in at.metric)
    dlq = next(f for f in frames if "reason" in f.columns and "count" in f.columns)
    assert set(dlq["reason"]) == {"invalid_json", "unknown_version"}


def test_every_section_is_a_live_fragment(filled, monkeypatch):
    import streamlit

    real = streamlit.fragment
    calls: list[tuple[str, object]] = []

    def recording(func=None, *, run_every=None, **kw):
        calls.append((func.__module__, run_every))
        return real(func, run_every=run_every, **kw)

    monkeypatch.setattr(streamlit, "fragment", recording)
    at = run_app()
    sections = {"header", "loss", "goodput", "incidents", "hangs", "suspects", "checkpoints", "elastic", "preemptions",
                "gradients", "ranks", "alerts"}
    assert {m.rsplit(".", 1)[-1] for m, _ in calls} == sections
    assert {every for _, every in calls} == {5.0}
    calls.clear()
    at.toggle(key="live").set_value(False).run()
    assert calls and {every for _, every in calls} == {None}  # live off: no timers


def test_empty_store_says_so(tmp_path, monkeypatch):
    from cliffguard.controller.store.db import init_db, make_engine

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    init_db(make_engine(url))
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DB_URL", url)
    at = run_app()
    assert any("no runs in the store yet" in i.value for i in at.info)


def test_operator_actions_read_only_without_token(filled):
    at = run_app()
    assert any("read-only" in i.value for i in at.info)
    with Session(filled.engine) as s:
        assert s.scalar(select(func.count()).select_from(CommandRow).where(CommandRow.source == "operator")) == 0


def test_a_store_at_an_older_schema_says_to_start_the_controller(filled):
    from alembic import command

    from cliffguard.controller.store.db import alembic_config

    command.downgrade(alembic_config(filled.engine), "0001")
    at = run_app()
    assert "start `cliffguard controller" in texts(at) and not at.get("vega_lite_chart")
