"""The dashboard over a PostgreSQL store (the at-scale backend), filled the same way."""

from __future__ import annotations

import uuid

import pytest
from streamlit.testing.v1 import AppTest

from testing.controller_service import store_engine
from testing.dashboard_fill import fill_store
from tests.dashboard.conftest import APP, chart_with

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(180)]


def test_sections_render_over_postgresql(pg_url, tmp_path, monkeypatch):
    # A schema of its own: the database is shared with other tests (and other checkouts' schemas).
    with store_engine("postgres", tmp_path, pg_url) as (engine, url):
        run_id = f"dash-{uuid.uuid4().hex[:10]}"
        run = fill_store(engine, run_id)
        _render(url, run_id, run, monkeypatch)


def _render(url, run_id, run, monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DB_URL", url)
    monkeypatch.delenv("CLIFFGUARD_OPERATOR_TOKEN", raising=False)
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["run"] = run_id
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert run_id in at.title[0].value
    _, curve = chart_with(at, "loss_plot")
    assert len(curve) == run.n_step_events // run.world
    _, segments = chart_with(at, "seconds since the incident opened")
    assert segments["incident"].nunique() == 2
    assert any("straggler rank(s): 1" in w.value for w in at.warning)
