"""The hang injectors (trainer/hang_faults.py): parsed, counted across restarts, each doing its hang."""

from __future__ import annotations

import json
import threading

import pytest

from cliffguard.trainer.fault_wrappers import wire_faults
from cliffguard.trainer.hang_faults import FOREVER_S, HangFault, HangFaults, is_hang_fault


def test_specs_parse_and_bad_ones_are_refused():
    assert HangFault.parse("hang_rank@3:27") == HangFault("hang_rank", 3, 27, FOREVER_S, 1)
    assert HangFault.parse("hang_rank@1:5:2.5:2") == HangFault("hang_rank", 1, 5, 2.5, 2)
    assert HangFault.parse("kill_in_collective@1:9") == HangFault("kill_in_collective", 1, 9)
    assert HangFault.parse("slow_node_check@2:0.01").seconds == 0.01
    assert is_hang_fault("stuck_loader@1:3") and not is_hang_fault("slow_rank@1:0.1")
    for bad in ("hang_rank@3", "stuck_loader@1", "hang_rank@1:2:3:0", "nope@1:2"):
        with pytest.raises(ValueError, match="fault"):
            HangFault.parse(bad)


def test_a_hang_fires_on_its_first_passes_across_the_runs_lives_and_records_when(tmp_path):
    slept: list[float] = []
    spec = [HangFault.parse("hang_rank@1:5:7:2")]
    for life in range(3):  # each life is a new process: a fresh injector over the same directory
        HangFaults(spec, rank=1, state_dir=tmp_path, sleep=slept.append, life=life).before_forward(5)
    HangFaults(spec, rank=0, state_dir=tmp_path, sleep=slept.append).before_forward(5)  # another rank: never
    assert slept == [7.0, 7.0]
    fired = [json.loads(x) for x in (tmp_path / "fired.jsonl").read_text().splitlines()]
    assert [(f["kind"], f["rank"], f["step"], f["life"]) for f in fired] == [("hang_rank", 1, 5, 0), ("hang_rank", 1, 5, 1)]


def test_kill_in_collective_kills_only_once_the_rank_is_inside_a_collective(tmp_path):
    killed = threading.Event()
    inside = {"now": ""}
    f = HangFaults([HangFault.parse("kill_in_collective@0:4")], 0, tmp_path, kill=killed.set)
    f.collective = lambda: inside["now"]
    f.at_batch(3)
    f.at_batch(4)
    assert not killed.wait(0.2)  # not in a collective yet
    inside["now"] = "all_reduce"
    assert killed.wait(10)


def test_a_stuck_loader_never_returns(tmp_path):
    f = HangFaults([HangFault.parse("stuck_loader@0:2")], 0, tmp_path)
    t = threading.Thread(target=f.at_batch, args=(2,), daemon=True)
    t.start()
    t.join(0.5)
    assert t.is_alive()  # deadlocked for good (a daemon thread: the test process still exits)


def test_a_slow_node_check_sleeps_before_every_matmul_and_is_recorded_once(tmp_path):
    slept: list[float] = []
    f = HangFaults([HangFault.parse("slow_node_check@1:0.01")], 1, tmp_path, sleep=slept.append)
    for k in (0, 0, 1):
        f.node_check_round(k)
    assert slept == [0.01] * 3 and len((tmp_path / "fired.jsonl").read_text().splitlines()) == 1


def test_the_wiring_splits_the_hang_faults_from_the_others_and_needs_a_directory(tmp_path):
    w = wire_faults(["corrupt@3", "hang_rank@0:5"], rank=0, state_dir=tmp_path)
    assert [s.kind for s in w.injector.specs] == ["corrupt"] and [s.kind for s in w.hangs.specs] == ["hang_rank"]
    assert wire_faults(["slow_node_check@0:0.1"], 0, state_dir=tmp_path).node_check is not None
    assert wire_faults(["corrupt@3"], 0).node_check is None and wire_faults([], 0).hangs is None
    with pytest.raises(ValueError, match="state_dir"):
        wire_faults(["hang_rank@0:5"], 0)
