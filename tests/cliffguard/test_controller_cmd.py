"""``cliffguard controller`` under store faults, as a supervisor sees it: /healthz and /readyz
answer, a deleted store stops the process with exit 3 and the reason, and a controller started on
an empty store next to the group's committed offsets rebuilds every row from the log start."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from sqlalchemy import func, select

from cliffguard.controller.broker import free_port
from cliffguard.controller.store.db import make_engine, session_scope
from cliffguard.controller.store.models import StepMetricRow
from testing.controller_service import SECRET, FakeTrainer

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def start(kafka, url: str, port: int, out) -> subprocess.Popen:
    env = {**os.environ, "CLIFFGUARD_COMMAND_SECRET": SECRET.reveal().decode(),
           "CLIFFGUARD_CONTROLLER__SESSION_TIMEOUT_MS": "3000",
           "CLIFFGUARD_CONTROLLER__HEARTBEAT_INTERVAL_MS": "500",
           "CLIFFGUARD_CONTROLLER__MAX_POLL_INTERVAL_MS": "3000",
           "CLIFFGUARD_CONTROLLER__HEALTH_PORT": str(port)}
    cmd = [sys.executable, "-m", "cliffguard.cli", "controller", "--bootstrap", kafka.bootstrap,
           "--topic-prefix", kafka.topic_prefix, "--db", url, "--group", "ctl-faults"]
    return subprocess.Popen(cmd, env=env, stdout=out.open("ab"), stderr=subprocess.STDOUT)


def probe(port: int, path: str) -> tuple[int, dict] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return None


def wait_for(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout:.0f} s")


def step_rows(url: str) -> int:
    eng = make_engine(url)
    try:
        with session_scope(eng) as s:
            return s.scalar(select(func.count()).select_from(StepMetricRow))
    except Exception:  # noqa: BLE001 - not created yet
        return 0
    finally:
        eng.dispose()


def test_a_deleted_store_stops_the_controller_and_an_empty_one_is_rebuilt_from_the_log(kafka_cfg, tmp_path):
    store_dir = tmp_path / "store"
    url = f"sqlite:///{store_dir / 'cg.db'}"
    out = tmp_path / "controller.out"
    port = free_port()
    t = FakeTrainer(kafka_cfg)
    proc = start(kafka_cfg, url, port, out)
    try:
        t.steps("run-s", 0, 29)
        wait_for(lambda: step_rows(url) == 30, 90, "30 stored steps")
        ready = lambda: (r := probe(port, "/readyz")) is not None and r[0] == 200 and r  # noqa: E731
        _, body = wait_for(ready, 15, "a ready answer from /readyz")
        assert body["reason"] == "ready" and body["assigned"] == kafka_cfg.partitions
        assert probe(port, "/healthz")[0] == 200
        shutil.rmtree(store_dir)  # the store directory is gone under the running controller
        t.steps("run-s", 30, 59)
        assert proc.wait(30) == 3
        text = out.read_text()
        assert "stopped, the store is lost" in text and "deleted" in text
        # A new, empty store in the same group: the group has committed offsets at the broker,
        # but the store has none, so it is rebuilt from the log start (all 60 rows).
        proc = start(kafka_cfg, url, port, out)
        wait_for(lambda: step_rows(url) == 60, 90, "60 stored steps after the rebuild")
        second = out.read_text().split("stopped, the store is lost")[1]
        # the batch that went into the deleted store never reached Kafka's committed offsets
        assert "rebuilding it from the log start" in second and ": 30}" in second
    finally:
        t.close()
        if proc.poll() is None:
            proc.terminate()
            proc.wait(15)


def test_a_controller_started_while_the_broker_is_down_waits_for_it_and_says_so(tmp_path):
    """A supervisor restarts the controller while the broker is down too (the soak's seed 4 saw it
    exit with a bootstrap traceback): it must say it waits, then start once the broker is there."""
    from cliffguard.controller.broker import EmbeddedBroker
    from cliffguard.core.kafka_config import KafkaConfig

    port = free_port()
    kafka = KafkaConfig(bootstrap=f"127.0.0.1:{port}", topic_prefix="late")
    log_path = tmp_path / "controller.log"
    proc = start(kafka, f"sqlite:///{tmp_path / 'store.db'}", free_port(), log_path)
    try:
        wait_for(lambda: "not reachable" in log_path.read_text(), 60, "waiting line")
        assert proc.poll() is None, log_path.read_text()
        with EmbeddedBroker(port=port):
            wait_for(lambda: f"on 127.0.0.1:{port}" in log_path.read_text(), 90, "start once the broker is up")
            assert proc.poll() is None
            proc.terminate()  # while the broker is up: closing needs no timeouts against a dead one
            proc.wait(60)
        text = log_path.read_text()
        assert "Traceback" not in text, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_sigusr1_prints_every_threads_stack_into_the_controllers_log(kafka_cfg, tmp_path):
    """A controller that seems stuck can be asked where it is, without stopping it."""
    import signal

    log_path = tmp_path / "controller.log"
    proc = start(kafka_cfg, f"sqlite:///{tmp_path / 'store.db'}", free_port(), log_path)
    try:
        wait_for(lambda: "consuming" in log_path.read_text(), 90, "the controller consuming")
        proc.send_signal(signal.SIGUSR1)
        wait_for(lambda: "run_forever" in log_path.read_text(), 30, "a stack dump")
        text = log_path.read_text()
        assert "Thread 0x" in text and "controller/service.py" in text, text
        assert proc.poll() is None  # it goes on
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.timeout(60)
def test_a_loop_iteration_stuck_past_stall_dump_s_prints_the_stacks():
    """The watchdog the command re-arms before each loop iteration: stuck past it, the stacks are printed."""
    code = ("import time\nfrom cliffguard.commands.controller import _stall_watchdog\n"
            "rearm = _stall_watchdog(0.5)\nrearm()\ndef stuck_in_a_call():\n    time.sleep(3)\nstuck_in_a_call()\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert "Timeout (0:00:00.500000)!" in out.stderr and "stuck_in_a_call" in out.stderr, out.stderr
