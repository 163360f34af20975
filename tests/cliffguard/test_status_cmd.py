"""``cliffguard status`` over the store recorded by a real demo run (tests/dashboard/data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cliffguard.cli import main

DATA = Path(__file__).resolve().parents[1] / "dashboard" / "data"


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_CONFIG", raising=False)
    db = tmp_path / "demo_store.db"
    shutil.copy(DATA / "demo_store.db", db)
    return f"sqlite:///{db}", json.loads((DATA / "demo_store.json").read_text())


def test_status_lists_the_runs(recorded, capsys):
    url, summary = recorded
    assert main(["status", "--db", url]) == 0
    out = capsys.readouterr().out
    assert summary["run"] in out and summary["run_status"] in out
    assert main(["status", "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in doc["runs"]] == [summary["run"]]
    assert "controller_state" not in doc["runs"][0]


def test_status_of_one_run_tells_its_incidents_and_commands(recorded, capsys):
    url, summary = recorded
    assert main(["status", summary["run"], "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "controller_state" not in doc["run"]
    assert {i["id"] for i in doc["incidents"]} == {i["id"] for i in summary["incidents"]}
    assert {c["type"] for c in doc["commands"]} >= {"pause", "validate", "rollback", "resume"}
    # the timeline: oldest first, ending where the newest incident's timeline ends
    assert doc["transitions"][-1]["to_state"] == summary["incidents"][-1]["transitions"][-1]["to"]
    assert main(["status", summary["run"], "--db", url]) == 0
    text = capsys.readouterr().out
    assert all(f"incident {i['id'][:8]}" in text for i in summary["incidents"])
    assert main(["status", "no-such-run", "--db", url]) == 1


def test_status_shows_the_commands_a_run_applies_and_the_lr_scale_it_applied_not_the_one_asked(recorded, capsys):
    from cliffguard.controller.store.db import Store, StoreConfig
    from cliffguard.controller.store.models import RunRow

    url, summary = recorded
    store = Store.open(StoreConfig(url=url))
    try:
        with store.session() as s:
            run = s.get(RunRow, summary["run"])
            run.lr_scale, run.lr_scale_applied, run.capabilities = 0.5, 1.0, ["pause", "resume", "validate"]
            s.add(RunRow(id="tracker-run", capabilities=[], lr_scale_applied=1.0))
    finally:
        store.close()
    assert main(["status", "--db", url]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(summary["run"]))
    assert "1 (asked 0.5)" in line and line.endswith("pause, resume, validate")
    assert next(x for x in out.splitlines() if x.startswith("tracker-run")).endswith("none (alerts only)")
    assert main(["status", summary["run"], "--db", url]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert "lr_scale applied 1 (asked 0.5)" in head and "commands it applies: pause, resume, validate" in head

def test_status_of_an_elastic_run_tells_its_world_batch_and_scale_changes(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_CONFIG", raising=False)
    shutil.copy(DATA / "elastic_store.db", tmp_path / "elastic.db")
    url, summary = f"sqlite:///{tmp_path / 'elastic.db'}", json.loads((DATA / "elastic_store.json").read_text())
    assert main(["status", summary["run"], "--db", url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["scale"]["world"], doc["scale"]["global_batch"]) == (4, 16)
    assert [(e["from_world"], e["to_world"], e["global_batch"]) for e in doc["elastic_events"]] == [
        (e["from_world"], e["to_world"], e["global_batch"]) for e in summary["scale_events"]]
    assert main(["status", summary["run"], "--db", url]) == 0
    text = capsys.readouterr().out
    assert "world 4, global batch 16 (2 scale changes)" in text
    assert "scaled down at step 100: world 4 -> 2, global batch 16 -> 8" in text


def test_status_of_one_run_tells_each_recovery_rungs_room_by_the_commands_limits_when_none_are_stored(
        recorded, tmp_path, capsys):
    url, summary = recorded  # recorded before the controller stored its limits with a run's state
    cfg = tmp_path / "controller.toml"
    cfg.write_text("[recovery]\nrollback_budget = 5\nrollback_window_s = 1000000000\n")
    assert main(["status", summary["run"], "--db", url, "--config", str(cfg), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["rung"]: r for r in doc["budgets"]["rungs"]}
    assert set(by) == {"retry", "rerun", "rollback", "restart", "evict"}
    # the recorded demo rolled back once; in this window that rollback still counts
    assert (by["rollback"]["in_window"], by["rollback"]["per_window"], by["rollback"]["left"]) == (1, 5, 4)
    assert main(["status", summary["run"], "--db", url, "--config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert f"recovery budgets ({cfg} limits)" in text and "rollback 1/5 per 1000000000 s (4 left, then halt)" in text
    assert main(["status", summary["run"], "--db", url]) == 0  # the defaults: that rollback is out of its hour
    assert "rollback 0/3 per 3600 s (3 left, then halt)" in capsys.readouterr().out


def test_a_reader_that_leaves_the_pipe_stops_it_quietly(recorded):
    """``cliffguard status RUN | head``: the command stops with 141 (SIGPIPE's), not a traceback."""
    import subprocess
    import sys

    url, summary = recorded
    proc = subprocess.Popen([sys.executable, "-m", "cliffguard", "status", summary["run"], "--db", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and "Traceback" not in err, err
