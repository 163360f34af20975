"""The soak's controller handle (bench/soak/faults.py ``ControllerProcess``) on a stand-in process:
each exit booked once with who asked for it, an unasked exit restarted after a back-off, and a
kill from an event thread racing the runner's checks never books a process twice or loses one."""

from __future__ import annotations

import sys
import threading
import time

from bench.soak import faults
from bench.soak.faults import ControllerProcess

STAND_IN = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    "print('ready', flush=True); time.sleep(60)"
)


def _proc(tmp_path, code: str = STAND_IN) -> ControllerProcess:
    return ControllerProcess(
        argv=[sys.executable, "-c", code], env={}, log_path=tmp_path / "c.log", cwd=str(tmp_path)
    )


def _readies(c: ControllerProcess) -> int:
    return c.log_path.read_text().count("ready") if c.log_path.exists() else 0


def _start_ready(c: ControllerProcess) -> None:
    """Start the stand-in and wait until it says ``ready`` (its SIGTERM handler is in place)."""
    before = _readies(c)
    c.start()
    deadline = time.monotonic() + 30
    while _readies(c) <= before:
        assert time.monotonic() < deadline, "the stand-in did not start"
        time.sleep(0.05)


def test_kills_and_the_final_stop_are_booked_as_asked(tmp_path):
    c = _proc(tmp_path)
    _start_ready(c)
    c.kill()
    assert c.proc is None and c.exits == [{"rc": -9, "asked": True, "how": "SIGKILL"}]
    assert c.check() is False  # a kill the soak did is not restarted behind the fault's back
    _start_ready(c)
    c.stop()
    assert c.exits[-1] == {"rc": 0, "asked": True, "how": "SIGTERM"} and len(c.exits) == 2


def test_an_unasked_exit_is_booked_and_restarted_after_the_back_off(tmp_path, monkeypatch):
    monkeypatch.setattr(faults, "RESTART_AFTER_S", 0.3)
    c = _proc(tmp_path, "import sys; sys.exit(3)").start()
    c.proc.wait(10)
    assert c.check() is False and c.exits == [{"rc": 3, "asked": False, "how": "unasked"}]
    time.sleep(0.35)
    assert c.check() is True and c.proc is not None
    c.proc.wait(10)
    c.stop()  # it had exited again: booked unasked, and no successor after the stop
    assert [e["how"] for e in c.exits] == ["unasked", "unasked"] and c.check() is False


def test_a_kill_racing_the_runners_checks_books_each_process_once(tmp_path):
    c = _proc(tmp_path).start()
    done = threading.Event()

    def checks() -> None:
        while not done.is_set():
            c.check()

    t = threading.Thread(target=checks)
    t.start()
    try:
        for _ in range(5):
            c.kill()
            c.start()
    finally:
        done.set()
        t.join(10)
    c.kill()
    _start_ready(c)
    c.stop()
    assert [e["how"] for e in c.exits] == ["SIGKILL"] * 6 + ["SIGTERM"]
    assert c.exits[-1]["rc"] == 0
    assert c.proc is None
