"""A preemption through the controller service: the real broker and a SQLite store, the test
playing the trainer (testing/controller_service.py): ``run.preempted`` is an incident of its own
kind (no command sent, nothing paged), the run's status says so, and the first step after the
restart closes it with the work lost and the time until training again; goodput books the time
down as preemption."""

from __future__ import annotations

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import RunRow
from testing.controller_service import FakeTrainer, Running, prefix, store_engine, wait_for

pytestmark = pytest.mark.broker

PREEMPTED = {"signal": "SIGTERM", "deadline_s": 30.0, "save_s": 1.25, "margin_s": 28.75, "verified": True,
             "wait_s": 0.1, "exit_code": 75, "path": "/ckpt/full-41", "detail": "verified"}


def _preemptions(engine, run):
    with session_scope(engine) as s:
        return read.preemptions(s, run)


def _status(engine, run):
    with session_scope(engine) as s:
        row = s.get(RunRow, run)
        return None if row is None else (row.status, row.recovery_state)


def test_a_preemption_is_its_own_incident_closed_when_the_run_trains_again(kafka_cfg, tmp_path):
    run = "preempted-run"
    t = FakeTrainer(kafka_cfg)
    try:
        with store_engine("sqlite", tmp_path) as (engine, _url), Running(kafka_cfg, engine):
            prefix(t, run)  # steps 0..40
            t.send(run, "run.preempted", 41, PREEMPTED)
            t.producer.flush()
            wait_for(lambda: _status(engine, run) == ("preempted", "preempted"), 20)
            (down,) = _preemptions(engine, run)
            assert down["outcome"] == "open" and down["signal"] == "SIGTERM" and down["save_s"] == 1.25
            assert down["saved_step"] == 41 and down["verified"] and down["steps_lost"] is None
            t.quiet(1.0)
            assert t.types(run) == []  # a preemption is no failure: nothing is sent to the run
            t.send(run, "run.started", 41, {"n_params": 1000, "n_layers": 2, "n_heads": 2, "head_dim": 8,
                                             "seq_len": 16, "global_batch": 8, "peak_flops": 1e12,
                                             "peak_source": "config", "lr_schedule": {}, "world_size": 1})
            t.steps(run, 41, 50)
            wait_for(lambda: [p["outcome"] for p in _preemptions(engine, run)] == ["requeued"], 20)
            (back,) = _preemptions(engine, run)
            assert back["steps_lost"] == 0 and back["seconds_to_train"] >= 0
            wait_for(lambda: _status(engine, run) == ("running", "running"), 20)
            with session_scope(engine) as s:
                assert [(i["rule"], i["level"]) for i in read.incidents(s, run)] == [("preemption", "ok")]
                assert not [a for a in read.alerts(s, run) if a["level"] == "critical"]

            def booked():
                with session_scope(engine) as s:
                    g = read.goodput(s, run)
                return g is not None and g["seconds"].get("preemption", 0) > 0
            wait_for(booked, 30)
    finally:
        t.close()
