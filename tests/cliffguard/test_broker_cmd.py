"""``cliffguard broker --port P``: starts, serves Kafka, stops cleanly on SIGTERM and SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cliffguard.controller.broker import _accepts, free_port, port_is_free

pytestmark = [pytest.mark.broker]


def _start(port: int, tmp_path) -> subprocess.Popen:
    log = open(tmp_path / f"broker-{port}.out", "w")  # noqa: SIM115 - closed by the OS with the process
    return subprocess.Popen([sys.executable, "-m", "cliffguard.cli", "broker", "--port", str(port),
                             "--topic-prefix", "cmd"], stdout=log, stderr=subprocess.STDOUT,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


def _wait_listening(proc, port, tmp_path, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            pytest.fail(f"broker command exited early: {(tmp_path / f'broker-{port}.out').read_text()}")
        if "listening" in (tmp_path / f"broker-{port}.out").read_text():
            return
        time.sleep(0.1)
    proc.kill()
    pytest.fail("broker command did not report listening in time")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_broker_command_serves_and_stops_on_signal(sig, tmp_path):
    from kafka.admin import KafkaAdminClient

    from tests.controller.test_broker import _broker_available

    _broker_available()
    port = free_port()
    proc = _start(port, tmp_path)
    try:
        _wait_listening(proc, port, tmp_path)
        assert _accepts("127.0.0.1", port)
        admin = KafkaAdminClient(bootstrap_servers=[f"127.0.0.1:{port}"])
        try:  # the command also created the cliffguard topics
            assert {"cmd.metrics", "cmd.commands", "cmd.dlq"} <= set(admin.list_topics())
        finally:
            admin.close()
        proc.send_signal(sig)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = (tmp_path / f"broker-{port}.out").read_text()
    assert "broker stopped" in out
    end = time.monotonic() + 5
    while not port_is_free("127.0.0.1", port) and time.monotonic() < end:
        time.sleep(0.1)
    assert port_is_free("127.0.0.1", port), "the Tansu child must be gone with the command"


def test_broker_command_port_taken_fails_with_a_message(tmp_path):
    import socket

    from tests.controller.test_broker import _broker_available

    _broker_available()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = _start(port, tmp_path)
        assert proc.wait(30) == 1
    assert "is taken" in (tmp_path / f"broker-{port}.out").read_text()


def test_a_sigkilled_broker_command_takes_the_tansu_child_with_it(tmp_path):
    from tests.controller.test_broker import _broker_available

    _broker_available()
    port = free_port()
    proc = _start(port, tmp_path)
    try:
        _wait_listening(proc, port, tmp_path)
        proc.kill()  # SIGKILL: no handler runs, only the kernel's parent-death signal
        proc.wait(15)
        end = time.monotonic() + 10
        while _accepts("127.0.0.1", port) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _accepts("127.0.0.1", port), "the orphaned Tansu child still serves the port"
        end = time.monotonic() + 5
        while not port_is_free("127.0.0.1", port) and time.monotonic() < end:
            time.sleep(0.1)
        assert port_is_free("127.0.0.1", port), "the next start would find the port taken"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
