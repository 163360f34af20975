"""``cliffguard status`` on what first users hit: an empty store says so in one line (no header,
no log line), a run whose events are all refused is listed by its dead letters with what to set,
and a finished run shows what its validations cost and a global batch it never declared."""

from __future__ import annotations

import pytest

from cliffguard.cli import main
from cliffguard.controller.store.db import Store, StoreConfig
from cliffguard.controller.store.dlq import count_run_dead_letter
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.core.events import make_event


@pytest.fixture
def url(tmp_path, monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_CONFIG", raising=False)
    return f"sqlite:///{tmp_path / 'store.db'}"


def _store(url: str) -> Store:
    return Store.open(StoreConfig(url=url))


def test_an_empty_store_is_one_line(url, capsys, caplog):
    _store(url).close()
    with caplog.at_level("INFO"):
        assert main(["status", "--db", url]) == 0
    assert capsys.readouterr().out == "no runs in the store\n"
    assert not [r for r in caplog.records if r.name.startswith("cliffguard.controller.store")]


def test_a_run_heard_only_as_dead_letters_is_listed_with_what_to_set(url, capsys):
    store = _store(url)
    try:
        with store.session() as s:
            count_run_dead_letter(s, "nanogpt-1", "unsigned", "$: unsigned event for run 'nanogpt-1'", n=51)
    finally:
        store.close()
    assert main(["status", "--db", url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] == [
        "no runs in the store",
        "",
        "runs whose events are dead-lettered (the controller never sees them):",
    ]
    assert lines[4].split()[:3] == ["nanogpt-1", "unsigned", "51"]
    assert lines[5].startswith(
        "  unsigned: the trainer signs no events: give it CLIFFGUARD_AGENT_SECRET_FILE"
    )
    assert main(["status", "nanogpt-1", "--db", url]) == 1
    out = capsys.readouterr().out
    assert out.startswith(
        "cliffguard status: run 'nanogpt-1' is not in the store: none of its events was accepted"
    )


def test_a_finished_run_shows_its_validation_cost_and_an_undeclared_global_batch(url, capsys):
    validation = {
        "every": 50,
        "max_share": 0.1,
        "periodic": 3,
        "periodic_s": 1.2,
        "on_command": 1,
        "on_command_s": 0.4,
        "train_s": 24.0,
        "share": 0.0667,
        "off": "",
    }
    started = {
        "n_params": 10,
        "n_layers": 0,
        "n_heads": 0,
        "head_dim": 0,
        "seq_len": 0,
        "global_batch": 0,
        "peak_flops": 1e9,
        "peak_source": "calibration",
        "lr_schedule": {},
        "world_size": 1,
    }
    store = _store(url)
    try:
        with store.session() as s:
            ingest_events(
                s,
                [
                    make_event("run.started", "loop-1", 0, started),
                    make_event("run.finished", "loop-1", 150, {"steps": 150, "validation": validation}),
                ],
            )
    finally:
        store.close()
    assert main(["status", "loop-1", "--db", url]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "  world 1, global batch not declared"
    assert out[2] == (
        "  validation every 50 steps; 3 periodic (1.2 s), 1 on command (0.4 s), 6.7% of 24 s of training"
    )
