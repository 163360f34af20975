"""The data-quality page over a real `cliffguard data` run (report + manifest), and its loaders."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cliffguard.dashboard import data_quality as dq
from tests.dashboard.conftest import run_app, texts

CURRICULUM = {"categories": {"code": ["**/a*.py"]}, "default": "prose",
              "phases": [{"until": 0.5, "weights": {"code": 0.2}}, {"until": 1.0, "weights": {"prose": 0.5}}]}


@pytest.fixture
def data_run(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"a{i}.py").write_text("\n".join(f"def f{i}_{j}(x):\n    return x * {i} + {j}" for j in range(40)))
    (corpus / "copy.py").write_text((corpus / "a0.py").read_text())
    (corpus / "notes.txt").write_text("\n".join(f"line {j} of some plain notes about the run" for j in range(60)))
    out, report = tmp_path / "manifest.json", tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "cliffguard.cli", "data", str(corpus), "--out", str(out),
                           "--report", str(report), "--curriculum", json.dumps(CURRICULUM)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return report, out


def test_the_page_shows_counts_clusters_and_the_curriculum(data_run, filled, monkeypatch):
    report, manifest = data_run
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DATA_REPORT", str(report))
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DATA_MANIFEST", str(manifest))
    at = run_app()
    at.radio(key="view").set_value("data quality").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["documents"] == "5" and metrics["removed"] == "1" and metrics["kept"] == "4"
    clusters = next(d.value for d in at.dataframe if "examples" in d.value.columns)
    assert list(clusters["removed"]) == [1] and "copy.py" in clusters["examples"].iloc[0]
    chart = at.get("vega_lite_chart")
    assert len(chart) == 1
    assert "precision estimate" in texts(at)


def test_the_runs_view_stays_the_default(data_run, filled, monkeypatch):
    report, _ = data_run
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DATA_REPORT", str(report))
    at = run_app()
    assert at.radio(key="view").value == "runs" and "Run `demo-run`" in at.title[0].value


def test_a_broken_report_is_an_error_naming_the_file(tmp_path, filled, monkeypatch):
    bad = tmp_path / "report.json"
    bad.write_text("{not json")
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DATA_REPORT", str(bad))
    at = run_app()
    at.radio(key="view").set_value("data quality").run()
    assert any(str(bad) in e.value and "not a JSON file" in e.value for e in at.error)


def test_curriculum_frame_spans_phases_and_fills_unnamed_categories():
    frame = dq.curriculum_frame({"curriculum": CURRICULUM})
    rows = {(r.phase, r.category): (r.start, r.until, r.weight) for r in frame.itertuples()}
    assert rows == {(1, "code"): (0.0, 0.5, 0.2), (1, "prose"): (0.0, 0.5, 1.0),
                    (2, "code"): (0.5, 1.0, 1.0), (2, "prose"): (0.5, 1.0, 0.5)}
    with pytest.raises(dq.DataFileError, match="phases"):
        dq.curriculum_frame({"curriculum": {"phases": "all"}})
