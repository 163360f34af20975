"""The hang watchdog (agent/hang/watchdog.py) and the evidence it captures (agent/hang/evidence.py),
on this process's real threads and stacks."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.hang.evidence import capture, in_flight, is_collective_error, pg_status, raised_at
from cliffguard.agent.hang.watchdog import Watchdog
from cliffguard.core.enums import TrainerMode


class Loop:
    """The training thread's side as the watchdog reads it: a step, a mode, a clock."""

    def __init__(self) -> None:
        self.step, self.mode, self.now = 0, TrainerMode.RUNNING, 1000.0
        self.reports: list = []

    def dog(self, **kw) -> Watchdog:
        return Watchdog(HangConfig(dump_after_s=8.0), step=lambda: self.step, mode=lambda: self.mode,
                        collective=lambda: "all_reduce", report=self.reports.append, node="n1", life=2,
                        clock=lambda: self.now, **kw)


def test_a_stall_is_reported_once_after_dump_after_s_and_its_end_is_reported_too():
    loop = Loop()
    dog = loop.dog(gone=lambda: [5])
    dog.check()  # step 0 seen
    loop.step, loop.now = 1, loop.now + 1
    dog.check()  # moved once: armed
    loop.now += 7.9
    assert dog.check() is None and not dog.stalled
    loop.now += 0.1
    ev = dog.check()
    assert ev is not None and ev.reason == "stalled" and ev.stalled_s == pytest.approx(8.0)
    assert (ev.node, ev.life, ev.collective, ev.gone) == ("n1", 2, "all_reduce", [5]) and dog.stalled
    loop.now += 30
    assert dog.check() is None and len(loop.reports) == 1  # once per stall
    loop.step = 2
    resolved = dog.check()
    assert resolved.reason == "resolved" and not dog.stalled and len(loop.reports) == 2


def test_no_stall_before_the_first_step_of_a_life_nor_while_paused_or_validating():
    loop = Loop()
    dog = loop.dog()
    dog.check()
    loop.now += 100  # the first step of a life may wait long (rendezvous, compile, a slow rank's start)
    assert dog.check() is None
    loop.step = 1
    dog.check()
    loop.mode = TrainerMode.PAUSED
    loop.now += 100
    assert dog.check() is None and dog.stalled_s == 0.0
    loop.mode = TrainerMode.RUNNING
    dog.check()  # the clock restarts when the mode comes back
    loop.now += 7
    assert dog.check() is None
    loop.now += 1
    assert dog.check().reason == "stalled"


def test_a_watchdog_starved_until_the_hang_judges_it_from_the_training_threads_marks():
    """On a busy box the side thread may first run only once the training thread blocks (it held the
    GIL until then): it sees the step for the first time and never sees it move, yet the training
    thread's marks say 12 steps closed, the last 7.5 s ago."""
    loop = Loop()
    closed, marked = 12, loop.now - 7.5
    loop.step = 12
    dog = loop.dog(progress=lambda: (closed, marked))
    assert dog.check() is None and dog.stalled_s == pytest.approx(7.5)
    loop.now += 0.5
    ev = dog.check()
    assert ev is not None and ev.reason == "stalled" and ev.stalled_s == pytest.approx(8.0)


def test_with_marks_no_stall_before_the_first_step_closes_nor_counted_across_a_pause():
    loop = Loop()
    marks = {"closed": 0, "at": loop.now}
    dog = loop.dog(progress=lambda: (marks["closed"], marks["at"]))
    loop.now += 100  # rendezvous, compile: no step closed in this process yet
    assert dog.check() is None and not dog.stalled
    marks["closed"], marks["at"] = 1, loop.now
    loop.now += 5
    marks["at"] = loop.now  # a pause ended here (the mode machine's mark), unseen by this thread
    loop.now += 7
    assert dog.check() is None
    loop.now += 1
    assert dog.check().reason == "stalled"


def test_a_failed_collective_reports_at_once_with_where_it_was_raised_unless_the_stall_was_reported():
    loop = Loop()
    dog = loop.dog()

    def collective():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:3457")

    try:
        collective()
    except RuntimeError as exc:
        error = exc
    ev = dog.collective_failed(error)
    assert ev.reason == "collective_error" and "Connection closed by peer" in ev.error
    assert ev.frame.endswith("in collective") and __file__ in ev.frame
    assert dog.collective_failed(error) is None  # already reported


def test_the_thread_checks_on_its_own():
    loop = Loop()
    got, looked = threading.Event(), threading.Event()

    def step() -> int:
        looked.set()
        return loop.step

    cfg = HangConfig(dump_after_s=0.05, check_every_s=0.01)
    dog = Watchdog(cfg, step=step, mode=lambda: loop.mode, collective=lambda: "",
                   report=lambda ev: got.set(), node="n", life=0).start()
    assert looked.wait(10)
    loop.step = 1  # moved once after the first look: armed, then it never moves again
    try:
        assert got.wait(10)
    finally:
        dog.close()


def _stuck_in_the_loader(ready: threading.Event, lock: threading.Lock) -> None:
    ready.set()
    lock.acquire()


def test_capture_reads_every_threads_stack_and_names_where_the_training_thread_is_stuck(tmp_path):
    lock, ready = threading.Lock(), threading.Event()
    lock.acquire()
    t = threading.Thread(target=_stuck_in_the_loader, args=(ready, lock), name="loader-like", daemon=True)
    t.start()
    assert ready.wait(10)
    try:
        ev = capture("stalled", stalled_s=9.0, node="n1", life=0, training=t.ident)
    finally:
        lock.release()
        t.join(10)
    assert ev.frame.endswith("in _stuck_in_the_loader") and __file__ in ev.frame  # not threading.py's
    main = ev.stacks[0]
    assert main.main and main.name == "loader-like"
    assert any(s.name == "MainThread" for s in ev.stacks)
    assert ev.fr == {} or "pg_status" in ev.fr  # no process group in this process: nothing recorded
    data = ev.event_data(frames=3, last=0)
    assert data["reason"] == "stalled" and data["frame"] == ev.frame and data["pid"] == os.getpid()
    assert all(len(s["frames"]) <= 3 for s in data["stacks"]) and data["last"] == []
    path = ev.write(tmp_path / "evidence", "run-1", 2)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and ev.path == str(path)
    body = json.loads(path.read_text())
    assert body["rank"] == 2 and body["stacks"][0]["frames"] == main.frames  # the whole stack on disk


def test_the_flight_recorders_numbers_and_in_flight_entries():
    fr = {"pg_status": {"0": {"last_enqueued_collective": "4", "last_started_collective": "-1",
                              "last_completed_collective": "3"}},
          "entries": [{"collective_seq_id": s, "process_group": ["0", "default_pg"], "profiling_name": "gloo:all_reduce",
                       "input_sizes": [[4]], "state": "scheduled", "time_created_ns": 10**9 * s} for s in (3, 4)]}
    status = pg_status(fr)
    assert status == {"0": {"enqueued": 4, "started": -1, "completed": 3}}
    (entry,) = in_flight(fr, status, now_ns=10**9 * 6)
    assert (entry["seq"], entry["op"], entry["age_s"], entry["pg_name"]) == (4, "gloo:all_reduce", 2.0, "default_pg")


def test_collective_errors_are_told_from_the_loops_own():
    assert is_collective_error(RuntimeError("Timed out waiting 5000ms for recv operation to complete"))
    assert is_collective_error(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:3457"))
    assert not is_collective_error(RuntimeError("shape mismatch"))
    assert not is_collective_error(ValueError("Timed out waiting"))
    assert not is_collective_error("Timed out waiting") and not is_collective_error(None)
    assert raised_at(None) == ""
