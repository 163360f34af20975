"""``bench.hangs``' CI smoke: one kind (a rank that sleeps before an all-reduce) on a 2-process
torchrun run with the real broker and controller: the culprit named correctly, the group restarted
in place and training again, no rank of the hung group left running (how fast is the benchmark's
to say). The kinds and the judge are checked without a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.hangs.__main__ import judge
from bench.hangs.kinds import kinds

REPO = Path(__file__).resolve().parents[2]


def test_every_kind_names_the_last_rank_and_the_straggler_expects_no_restart():
    table = kinds(4, 27)
    assert set(table) == {"sleep", "kill", "stuck", "straggler", "again"}
    assert all(k.culprit == (3,) for k in table.values() if k.name != "straggler")
    assert table["straggler"].culprit == () and table["straggler"].restarts == ()
    assert table["again"].restarts == ("in_place", "exclude") and table["again"].nodes == 2


def test_the_judge_wants_the_right_culprit_the_remedy_60_s_and_nobody_left_waiting():
    k = kinds(4, 27)["sleep"]
    ep = {"culprit_correct": True, "remedy": "in_place", "training_again_s": 42.0, "left_waiting": []}
    row = {"episodes": [ep], "timed_out": False}
    assert judge(k, row, "cliffguard")
    assert not judge(k, {**row, "episodes": [{**ep, "training_again_s": 61.0}]}, "cliffguard")
    assert not judge(k, {**row, "episodes": [{**ep, "culprit_correct": False}]}, "cliffguard")
    assert not judge(k, {**row, "episodes": [{**ep, "left_waiting": [1]}]}, "cliffguard")
    straggler = kinds(4, 27)["straggler"]
    assert judge(straggler, {"episodes": [], "hang_incidents": 0, "lives": [0], "timed_out": False}, "cliffguard")
    assert not judge(straggler, {"episodes": [], "hang_incidents": 0, "lives": [0, 1], "timed_out": False}, "cliffguard")


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sleeping_rank_is_named_and_the_group_trains_again(tmp_path):
    out = tmp_path / "hangs.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench.hangs", "--kinds", "sleep", "--nproc", "2", "--no-baseline",
                           "--fault-step", "12", "--steps-after", "4", "--goal-s", "240", "--json", str(out), "--dir", str(tmp_path / "w")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    (ep,) = row["episodes"]
    assert ep["culprit"] == [1] and ep["culprit_correct"] and ep["remedy"] == "in_place"
    assert ep["frame"].endswith("in hang") and "hang_faults.py" in ep["frame"]
    # the order of the marks; how fast is bench.hangs' to measure (a loaded CI box starts torch slowly)
    assert 0 < ep["detect_s"] < ep["named_s"] < ep["restart_begun_s"] < ep["training_again_s"]
    assert ep["steps_lost"] == 2 and ep["left_waiting"] == [] and ep["outcome"] == "restarted"
    assert row["node_checks"] and row["node_checks"][0]["ok"] and row["exit_codes"] == [0]
