"""Kill -9 the controller between "pause sent" and "validation received"; a new one continues.

The controller runs as the real ``cliffguard controller`` process. After a SIGKILL, a new process
in the same group seeks to the offsets stored with the last committed batch, reloads the run's
recovery state (pausing, with the pause's id pending) and carries on with the same incident:
exactly one pause, one validate and one rollback reach the trainer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import CommandRow
from testing.controller_service import SECRET, FakeTrainer, prefix, spike
from tests.controller.test_service import db as db  # noqa: F401 - the store fixture

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def start_controller(kafka, url: str, log_path) -> subprocess.Popen:
    env = {
        **os.environ,
        "CLIFFGUARD_COMMAND_SECRET": SECRET.reveal().decode(),
        "CLIFFGUARD_CONTROLLER__SESSION_TIMEOUT_MS": "3000",
        "CLIFFGUARD_CONTROLLER__HEARTBEAT_INTERVAL_MS": "500",
        "CLIFFGUARD_CONTROLLER__MAX_POLL_INTERVAL_MS": "3000",
        "CLIFFGUARD_CONTROLLER__OUTBOX_INTERVAL_S": "0.2",
        "CLIFFGUARD_RECOVERY__STABLE_WINDOW": "5",
        "CLIFFGUARD_RECOVERY__RECOVER_WINDOW": "5",
    }
    cmd = [sys.executable, "-m", "cliffguard.cli", "controller", "--bootstrap", kafka.bootstrap,
           "--topic-prefix", kafka.topic_prefix, "--db", url, "--group", "ctl-restart"]
    return subprocess.Popen(cmd, env=env, stdout=log_path.open("ab"), stderr=subprocess.STDOUT)


def test_killed_between_pause_and_validation_continues_the_same_incident(kafka_cfg, db, tmp_path):
    engine, url = db
    log_path = tmp_path / "controller.log"
    t = FakeTrainer(kafka_cfg)
    first = start_controller(kafka_cfg, url, log_path)
    second = None
    try:
        prefix(t, "run-k")
        spike(t, "run-k", 41)
        pause = t.expect("run-k", "pause", timeout_s=60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        t.ack(pause)  # the ack waits in Kafka while no controller runs
        second = start_controller(kafka_cfg, url, log_path)
        val = t.expect("run-k", "validate", timeout_s=60)
        t.ack(val)
        t.validation("run-k", 43, 3.0, cmd=val)
        rb = t.expect("run-k", "rollback")
        assert rb.args == {"to_step": 20, "lr_scale": 0.5}
        t.ack(rb)
        t.steps("run-k", 21, 27)
        t.quiet(2.0)
        assert t.types("run-k") == ["pause", "validate", "rollback"]
        assert {c.id for c in t.duplicates} <= {pause.id}  # at most the pause again, refused by id
        deadline = time.monotonic() + 20
        while True:
            with session_scope(engine) as s:
                incidents = read.incidents(s, "run-k")
                timeline = [(x["from_state"], x["to_state"]) for x in read.transitions(s, "run-k")]
                cmds = s.scalars(select(CommandRow).where(CommandRow.run_id == "run-k")).all()
            if incidents and incidents[0]["outcome"] != "open" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(incidents) == 1 and incidents[0]["outcome"] == "rolled_back"
        assert timeline == [("running", "pausing"), ("pausing", "validating"), ("validating", "rolling_back"),
                            ("rolling_back", "recovering"), ("recovering", "running")]
        assert sorted(c.type for c in cmds) == ["pause", "rollback", "validate"]
        assert {c.incident_id for c in cmds} == {incidents[0]["id"]}
    finally:
        t.close()
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        print(log_path.read_text()[-3000:])
