"""Who leaves an elastic run after a preemption save (agent/recovery/preempt_leave.py), the files
the launcher and its workers tell each other by (core/node_warning.py), and the launcher's side
(cliffguard/node_leave.py), each with a fake clock or process where the real one would wait."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from cliffguard.agent.recovery import preempt_leave
from cliffguard.agent.recovery.preempt_leave import Leave, decide, exit_code, scheduler_warned, wait_to_leave
from cliffguard.agent.recovery.preemption import Request
from cliffguard.core import node_warning
from cliffguard.core.restart_plan import MIN_NODES_ENV, RESTART_EXIT_CODE
from cliffguard.node_leave import NodeLeave


def test_the_warning_files_round_trip_and_hostile_ones_count_as_absent(tmp_path):
    node_warning.write_warned(tmp_path, "node/a b", "SIGTERM", at=100.0)
    assert node_warning.read_warned(tmp_path, "node/a b", since=99.0)["signal"] == "SIGTERM"
    assert node_warning.read_warned(tmp_path, "node/a b", since=101.0) is None  # older than the worker
    assert node_warning.warned_path(tmp_path, "node/a b").parent == tmp_path  # the node name cannot climb out
    node_warning.warned_path(tmp_path, "x").write_text("{not json")
    assert node_warning.read_warned(tmp_path, "x", 0.0) is None
    node_warning.warned_path(tmp_path, "y").write_text(json.dumps({"node": "other", "at": 1e12}))
    assert node_warning.read_warned(tmp_path, "y", 0.0) is None  # another node's file under this name
    node_warning.write_left(tmp_path, "n")
    node_warning.write_saved(tmp_path, "n", 7)
    assert node_warning.has_left(tmp_path, "n", 0.0) and node_warning.has_saved(tmp_path, "n", 0.0)
    node_warning.clear(tmp_path, "n")
    assert not node_warning.has_left(tmp_path, "n", 0.0) and not node_warning.has_saved(tmp_path, "n", 0.0)


def test_only_an_elastic_launch_takes_the_elastic_path():
    assert preempt_leave.is_elastic({MIN_NODES_ENV: "1"})
    assert not preempt_leave.is_elastic({})


def test_a_signal_is_the_schedulers_only_when_the_launcher_said_so(tmp_path):
    now = time.monotonic()
    sleeps = []
    # torchrun's membership SIGTERM: no word from the launcher within the confirm window
    assert not scheduler_warned(Request("SIGTERM", now - 5.0), str(tmp_path), "a", 0.0, confirm_s=2.0,
                                sleep=sleeps.append)
    assert sleeps == []  # the window had passed already: no wait
    node_warning.write_warned(tmp_path, "a", "SIGTERM")
    assert scheduler_warned(Request("SIGTERM", now), str(tmp_path), "a", 0.0)
    assert not scheduler_warned(None, str(tmp_path), "a", 0.0)  # a peer's flag reached this rank: not warned


def test_a_late_launcher_word_within_the_window_still_counts(tmp_path):
    def sleep(s):  # the launcher writes during the worker's wait
        node_warning.write_warned(tmp_path, "a", "SIGTERM")

    assert scheduler_warned(Request("SIGTERM", time.monotonic()), str(tmp_path), "a", 0.0, confirm_s=10.0, sleep=sleep)


@pytest.mark.parametrize(("answers", "scope", "nodes", "leaving"), [
    ([(False, "a"), (False, "b")], "regroup", (), 0),
    ([(True, "a"), (False, "b"), (True, "a"), (False, "b")], "nodes", ("a",), 2),
    ([(True, "a"), (True, "b")], "job", ("a", "b"), 2),
])
def test_the_shared_answers_decide_the_scope(monkeypatch, answers, scope, nodes, leaving):
    monkeypatch.setattr(preempt_leave.dist, "get_world_size", lambda: len(answers))
    monkeypatch.setattr(preempt_leave.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), answers))
    leave = decide(answers[0][0], answers[0][1], distributed=True)
    assert (leave.scope, leave.nodes, leave.ranks_leaving, leave.world) == (scope, nodes, leaving, len(answers))


def test_a_leaving_rank_exits_with_the_requeue_code_and_a_staying_one_with_torchruns_restart_code():
    assert exit_code(Leave(warned=True, nodes=("a",), ranks_leaving=1, world=2), 75) == 75
    assert exit_code(Leave(warned=True, nodes=("a",), ranks_leaving=1, world=2), 99) == 99
    assert exit_code(Leave(warned=False, nodes=("a",), ranks_leaving=1, world=2), 99) == RESTART_EXIT_CODE


def test_a_staying_rank_waits_until_every_warned_node_has_left(tmp_path):
    leave = Leave(warned=False, nodes=("a", "b"), ranks_leaving=2, world=3)
    left = iter(["a", "b"])
    waits = []

    def sleep(s):
        waits.append(s)
        node_warning.write_left(tmp_path, next(left))

    wait_to_leave(leave, str(tmp_path), "c", 0.0, local_rank=0, step=5, sleep=sleep)
    assert len(waits) == 2 and node_warning.has_left(tmp_path, "b", 0.0)


def test_a_leaving_rank_marks_its_node_saved_and_waits_to_be_stopped(tmp_path, caplog):
    leave = Leave(warned=True, nodes=("a",), ranks_leaving=1, world=2)
    wait_to_leave(leave, str(tmp_path), "a", 0.0, local_rank=0, step=5, timeout_s=0.2, sleep=lambda s: time.sleep(0.05))
    assert node_warning.has_saved(tmp_path, "a", 0.0)
    assert "did not stop this worker" in caplog.text  # nobody stopped it: said, then it exits by itself


def test_the_launcher_leaves_once_its_workers_saved_and_not_before(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        leave = NodeLeave(tmp_path, "a", deadline_s=30.0)
        leave.tick(proc)
        assert proc.poll() is None and not leave.left  # no warning: nothing happens
        leave.warned("SIGTERM")
        assert node_warning.read_warned(tmp_path, "a", 0.0)["signal"] == "SIGTERM"
        leave.tick(proc)
        assert proc.poll() is None and not leave.left  # warned, not saved yet
        node_warning.write_saved(tmp_path, "a", 12)
        leave.tick(proc)
        assert leave.left and leave.saved and proc.poll() is not None
        assert node_warning.has_left(tmp_path, "a", 0.0)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_fresh_launch_forgets_the_last_warning(tmp_path):
    node_warning.write_warned(tmp_path, "a", "SIGTERM")
    node_warning.write_left(tmp_path, "a")
    NodeLeave(tmp_path, "a", deadline_s=30.0)
    assert node_warning.read_warned(tmp_path, "a", 0.0) is None and not node_warning.has_left(tmp_path, "a", 0.0)


def test_a_rank_its_peers_warned_dates_the_preemption_from_the_first_warned_nodes_signal(tmp_path):
    node_warning.write_warned(tmp_path, "b", "SIGUSR1", at=time.time() - 3.0)
    node_warning.write_warned(tmp_path, "a", "SIGTERM", at=time.time() - 1.0)
    req = preempt_leave.origin(str(tmp_path), ("a", "b"), fallback_at=time.monotonic())
    assert req is not None and req.signal == "SIGUSR1" and req.elapsed() == pytest.approx(3.0, abs=0.5)
    assert preempt_leave.origin(str(tmp_path), ("c",), fallback_at=time.monotonic()) is None


def test_a_worker_its_signal_missed_learns_of_its_nodes_warning_from_the_launchers_word(tmp_path):
    word = preempt_leave.LauncherWord(str(tmp_path), "b")
    assert word.read() is None  # no warning: one stat, nothing more
    node_warning.write_warned(tmp_path, "b", "SIGTERM", at=time.time() - 2.0)
    req = word.read()
    assert req is not None and req.signal == "SIGTERM" and req.elapsed() == pytest.approx(2.0, abs=0.5)
    assert scheduler_warned(req, str(tmp_path), "b", 0.0)  # and at the boundary it is the scheduler's


def test_a_node_warned_moments_after_another_is_in_the_same_decision_and_no_warning_means_no_wait(tmp_path):
    """One scheduler decision warns two node-group jobs; the second launcher's word may come a step
    later. A rank of the second node waits until ``settle_s`` after the first warning for its own."""
    import threading

    start = time.time() - 5
    t0 = time.monotonic()
    assert preempt_leave.settle(str(tmp_path), "group-a", start, settle_s=2.0) is False  # a membership change
    assert time.monotonic() - t0 < 0.5
    node_warning.write_warned(tmp_path, "group-a", "SIGUSR1", at=start - 1)  # an old warning: before this group
    assert preempt_leave.settle(str(tmp_path), "group-b", start, settle_s=2.0) is False
    node_warning.write_warned(tmp_path, "group-b", "SIGUSR1")  # the first warned node of this decision
    later = threading.Timer(0.4, node_warning.write_warned, args=(tmp_path, "group-a", "SIGUSR1"))
    later.start()
    assert preempt_leave.settle(str(tmp_path), "group-a", start, settle_s=2.0) is True  # its word came in time
    later.join()
    t0 = time.monotonic()
    assert preempt_leave.settle(str(tmp_path), "group-c", start, settle_s=0.5) is False  # never warned
    assert time.monotonic() - t0 < 1.5
    assert node_warning.first_warned_since(tmp_path, start) is not None


def test_a_rank_whose_own_signal_comes_during_the_save_still_dates_it_from_the_first_warned_node(tmp_path, monkeypatch):
    """CI: both groups warned at one Slurm decision; rank 0's SIGUSR1 arrived while it saved on its
    peers' flag, so the record said signal "peer", dated from rank 0's boundary."""
    from types import SimpleNamespace

    from cliffguard.agent.recovery import preempt_boundary
    from cliffguard.agent.recovery.preemption import PreemptionConfig

    node_warning.write_warned(tmp_path, "b", "SIGUSR1", at=time.time() - 3.0)
    node_warning.write_warned(tmp_path, "a", "SIGUSR1", at=time.time() - 0.5)
    monkeypatch.setenv(MIN_NODES_ENV, "1")
    monkeypatch.setattr(preempt_leave, "decide", lambda warned, node, distributed: Leave(True, ("a", "b"), 2, 2))
    monkeypatch.setattr(preempt_leave, "wait_to_leave", lambda *a, **k: None)
    emitted = []
    preemption = SimpleNamespace(config=PreemptionConfig(deadline_s=20.0), request=None)

    def save_now(step, state, timeout):
        preemption.request = Request("SIGUSR1", time.monotonic())  # the handler, mid-save
        return {"verified": True, "path": "ckpt"}

    agent = SimpleNamespace(step=7, rank=0, distributed=False, emit=lambda kind, data, step: emitted.append(data),
                            close=lambda *a, **k: None, modes=SimpleNamespace(move=lambda mode: None),
                            hang=SimpleNamespace(plan_dir=tmp_path, life=SimpleNamespace(node="a")))
    kit = SimpleNamespace(agent=agent, preemption=preemption, state=SimpleNamespace(capture=lambda step: {}),
                          store=SimpleNamespace(save_now=save_now), _started_wall=time.time() - 60.0)
    boundary = preempt_boundary.save_and_stop(kit)
    assert not boundary and kit.stop_reason == "preempted"
    assert emitted[0]["signal"] == "SIGUSR1" and emitted[0]["save_s"] == pytest.approx(3.0, abs=0.5)
    assert emitted[0]["scope"] == "job"
