"""The data page's live statistics (sections/data_live.py) beside the offline report, and an
incident's batch statistics in the run view, over the filled store plus the data watch's windows
of real code batches with garbled text at steps 100-103 (testing/data_watch.py)."""

from __future__ import annotations

import pytest

from testing.data_watch import fill_data_stats
from tests.dashboard.conftest import charts, run_app, texts


@pytest.fixture
def with_data(filled):
    fill_data_stats(filled.engine, filled.run.run_id, steps=filled.run.steps)
    return filled


def _data_view():
    at = run_app()
    at.radio(key="view").set_value("data quality").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_data_page_shows_the_runs_live_statistics_beside_their_baseline(with_data):
    at = _data_view()
    metrics = {m.label: m.value for m in at.metric}
    assert set(metrics) >= {"log-perplexity", "near-duplicates", "garbled", "padding", "token drift"}
    assert metrics["padding"] == "0.0 %"
    found = {spec.get("layer", [{}])[0].get("encoding", {}).get("y", {}).get("title") or spec["encoding"]["y"]["title"]:
             df for spec, df in charts(at)}
    ppl = found["log-perplexity (nats/token)"]
    assert ppl["step"].tolist() == list(range(with_data.run.steps))
    shares = found["share of the batch"]
    garbled = shares[shares["share"] == "garbled"].set_index("step")["value"]
    assert garbled.loc[100] == 0.5 and garbled.loc[99] == 0.0
    assert len(found["JS divergence (nats)"]) == with_data.run.steps // 10
    outliers = next(d.value for d in at.dataframe if "sample_id" in d.value.columns)
    assert set(outliers["reason"]) >= {"novelty", "perplexity"}
    assert "baseline filling (12 windows so far)" in texts(at)  # 120 steps: the rules' baseline needs 200


def test_without_data_statistics_the_page_says_where_they_come_from(filled):
    at = _data_view()
    assert any("[agent.data_watch]" in i.value for i in at.info)


def test_an_incident_shows_its_steps_batch_statistics_beside_the_baseline(with_data):
    at = run_app()
    shown = texts(at)
    corrupt = with_data.run.corrupt_step
    assert f"Batch statistics of steps {corrupt}-{corrupt}" in shown
    table = next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "ppl", "dup", "garbled", "pad"])
    assert table["step"].tolist() == ["baseline", str(corrupt)] and table["garbled"].tolist() == [0.0, 0.5]
    assert "garbled at step 100" in shown
