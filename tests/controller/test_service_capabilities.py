"""Capabilities through the real broker and controller: a run gets only the commands it declared."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertRow, CommandRow, RunRow
from testing.controller_service import FakeTrainer, Running, prefix, spike, store_engine, wait_for
from testing.store_factory import RUN_STARTED_DATA

pytestmark = pytest.mark.broker


def _started(t: FakeTrainer, run: str, caps: list[str]) -> None:
    t.send(run, "run.started", 0, {**RUN_STARTED_DATA, "world_size": 1, "capabilities": caps})


def _critical(engine, run: str) -> list[str]:
    with session_scope(engine) as s:
        return [a.title for a in s.scalars(select(AlertRow).where(AlertRow.run_id == run, AlertRow.level == "critical"))]


def test_an_alert_only_run_gets_alerts_and_no_command_and_a_run_without_rollback_is_halted_paused(
        kafka_cfg, tmp_path):
    with store_engine("sqlite", tmp_path) as (engine, _):
        t = FakeTrainer(kafka_cfg)
        try:
            with Running(kafka_cfg, engine, group="ctl-caps"):
                _started(t, "tracker", [])
                _started(t, "no-rollback", ["pause", "validate", "resume"])
                for run in ("tracker", "no-rollback"):
                    prefix(t, run)
                    spike(t, run, 41)
                t.ack(t.expect("no-rollback", "pause"))
                val = t.expect("no-rollback", "validate")
                t.ack(val)
                t.validation("no-rollback", 43, 3.0, cmd=val)  # abnormal: a rollback is what it would need
                wait_for(lambda: any("cannot pause" in x for x in _critical(engine, "tracker")))
                wait_for(lambda: any("human needed" in x for x in _critical(engine, "no-rollback")))
                t.quiet(1.5)
            assert t.types("tracker") == []
            assert t.types("no-rollback") == ["pause", "validate"]
        finally:
            t.close()
        with session_scope(engine) as s:
            assert s.scalars(select(CommandRow).where(CommandRow.run_id == "tracker")).all() == []
            runs = {r.id: r for r in s.scalars(select(RunRow))}
            assert (runs["tracker"].capabilities, runs["tracker"].recovery_state) == ([], "running")
            assert read.incidents(s, "tracker") == []
            assert runs["no-rollback"].recovery_state == "halted" and runs["no-rollback"].lr_scale == 1.0
            assert [i["outcome"] for i in read.incidents(s, "no-rollback")] == ["halted"]
            assert read.transitions(s, "no-rollback")[-1]["reason"].startswith("rollback_unsupported")
