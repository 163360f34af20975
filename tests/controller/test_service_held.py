"""A held run is answered, and a trainer that acted alone is an incident: the controller service
through the real broker and a SQLite store, the test playing the trainer (testing/controller_service.py)."""

from __future__ import annotations

import time

import pytest

from cliffguard.cli import main
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import CommandRow, RunRow
from testing.controller_service import FakeTrainer, Running, prefix, step_data, store_engine, wait_for

pytestmark = pytest.mark.broker

BAD = 20.0  # x10 the healthy loss: critical at once


def bad_steps(t: FakeTrainer, run: str, steps: dict[int, str]) -> None:
    """Steps of a corrupted stretch, each with what the guard decided (skip or hold)."""
    for step, guard in steps.items():
        t.send(run, "step", step, {**step_data(BAD, step), "guard": guard, "skipped": True})
    t.producer.flush()


def answer_normal(t: FakeTrainer, run: str, step: int, pause=None) -> None:
    """pause -> validate (normal: every bad update was skipped) -> resume, as the kit answers."""
    t.ack(pause or t.expect(run, "pause"))
    val = t.expect(run, "validate")
    t.ack(val)
    t.validation(run, step, 2.01, cmd=val)
    t.ack(t.expect(run, "resume"))


def test_a_hold_after_a_resume_is_answered_in_seconds_without_touching_the_lr(kafka_cfg, tmp_path):
    """The issue's stretch: bad 41-45, paused at 43 and resumed (validation normal), the guard
    holds at 45: the controller pauses it again at once, validates, and resumes it."""
    run = "held-run"
    t = FakeTrainer(kafka_cfg)
    try:
        with store_engine("sqlite", tmp_path) as (engine, _url), Running(kafka_cfg, engine):
            prefix(t, run)
            bad_steps(t, run, {41: "skip", 42: "skip"})
            answer_normal(t, run, 43)
            sent = time.monotonic()
            bad_steps(t, run, {43: "skip", 44: "skip", 45: "hold"})
            pause = t.expect(run, "pause", timeout_s=10)
            answered_s = time.monotonic() - sent
            answer_normal(t, run, 46, pause)
            t.steps(run, 46, 60)
            wait_for(lambda: _outcomes(engine, run) == ["resumed", "resumed"], 20)
            with session_scope(engine) as s:
                held, first = read.incidents(s, run)  # newest first
                row = s.get(RunRow, run)
                assert (row.lr_scale, row.recovery_state) == (1.0, "running")
    finally:
        t.close()
    assert answered_s < 5, f"the hold was answered after {answered_s:.1f} s"
    assert held["rule"] == "guard_hold" and held["onset_step"] == 41 and held["spike_step"] == 45
    assert held["evidence"]["escalation"]["follows"] == first["id"] and held["evidence"]["escalation"]["level"] == 1
    assert t.types(run) == ["pause", "validate", "resume"] * 2


def test_a_trainer_timeout_is_an_incident_naming_who_cut_the_lr_and_why(kafka_cfg, tmp_path, capsys):
    """The controller was away while the trainer held: the trainer rolled back to 40 alone with
    lr_scale 0.5. Back, the controller records it as an incident (cause: held, decided by the
    trainer-side timeout), cancels the pause it would have sent, and shows 0.5 as asked and applied."""
    run = "alone-run"
    t = FakeTrainer(kafka_cfg)
    try:
        with store_engine("sqlite", tmp_path) as (engine, url):
            prefix(t, run)
            bad_steps(t, run, {41: "skip", 42: "skip", 43: "hold"})
            t.send(run, "trainer.timeout", 40, {
                "wait": "hold", "policy": "rollback", "waited_s": 120.0, "at_step": 44, "applied": True,
                "lr_scale_before": 1.0, "lr_scale": 0.5, "first_bad_step": 41, "to_step": 40,
                "detail": "rolled back: restored step 40 from memory; lr_scale=0.5"})
            for step in range(40, 51):
                t.send(run, "step", step, {**step_data(2.0, step), "lr_scale": 0.5})
            t.producer.flush()
            with Running(kafka_cfg, engine):
                wait_for(lambda: _outcomes(engine, run)[:1] == ["rolled_back"], 30)
            with session_scope(engine) as s:
                row = s.get(RunRow, run)
                (inc,) = read.incidents(s, run)
                timeline = read.transitions(s, run)
                pauses = [c for c in s.query(CommandRow).filter_by(run_id=run) if c.type == "pause"]
                assert (row.lr_scale, row.lr_scale_applied) == (0.5, 0.5)
            assert main(["status", "--db", url]) == 0
            listing = capsys.readouterr().out
            assert main(["status", run, "--db", url]) == 0
            detail = capsys.readouterr().out
    finally:
        t.close()
    alone = [x for x in timeline if x["reason"].startswith("trainer_rolled_back")]
    assert len(alone) == 1 and "decided by the trainer-side timeout" in alone[0]["reason"]
    assert alone[0]["evidence"]["cause"] == "held" and alone[0]["evidence"]["lr_scale"] == 0.5
    assert inc["rule"] == "loss_spike" and inc["rollback_to"] == 40 and inc["evidence"]["lr_scales"] == [0.5]
    assert [c.status for c in pauses] == ["cancelled"]  # the pause nobody applied: superseded
    assert "(asked" not in listing and "0.5" in listing
    assert "lr_scale 1 -> 0.5" in detail and "trainer_rolled_back" in detail


def _outcomes(engine, run: str) -> list[str]:
    with session_scope(engine) as s:
        return [i["outcome"] for i in read.incidents(s, run)]
