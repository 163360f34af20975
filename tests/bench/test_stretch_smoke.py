"""``python -m bench.stretch``'s smoke: one short nanoGPT-style run with a 3-batch stretch through the
real broker and controller; the table's figures and the JSON are well formed and the run was
answered (every bad update skipped, no trainer-side timeout, the LR untouched)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.stretch import row, table
from testing.held_runs import Outcome

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_short_stretch_is_measured_and_answered(tmp_path):
    out = tmp_path / "stretch.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench.stretch", "--bad", "3", "--trainers", "nanogpt",
                           "--steps", "80", "--json", str(out)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    (r,) = doc["rows"]
    assert (r["trainer"], r["bad"], r["skipped"], r["timeouts"], r["lr_scale"]) == ("nanogpt", 3, 3, 0, 1.0)
    assert 0 < r["back_s"] < 10 and r["stall_s"] < 10 and r["incidents"]
    assert "back s" in proc.stdout and "nanogpt    3" in proc.stdout


def test_the_row_and_the_table_read_the_events():
    from cliffguard.agent.drafts import EventDraft
    from cliffguard.core.enums import EventType

    def step(s, ts, guard="ok"):
        return EventDraft(EventType.STEP, "r", s, {"skipped": guard != "ok", "guard": guard, "lr_scale": 1.0}, ts=ts)

    ack = EventDraft(EventType.COMMAND_ACK, "r", 12, {"cmd_type": "resume", "status": "applied"}, ts=12.5)
    events = [step(9, 9.0), step(10, 10.0, "skip"), step(11, 10.1, "hold"), ack, step(12, 12.6), step(13, 12.7)]
    incidents = [{"rule": "loss_spike", "outcome": "resumed", "evidence": {}}]
    r = row("nanogpt", 2, 10, Outcome("r", events, 2.5, 30.0), incidents)
    assert (r["back_s"], r["stall_s"], r["skipped"], r["holds"]) == (2.6, 2.5, 2, 1)
    assert r["incidents"] == [{"rule": "loss_spike", "outcome": "resumed", "rung": 0}]
    assert "resumed/0" in table([r])


def test_the_summary_gives_the_median_and_the_largest_of_each_group():
    from bench.stretch import summary, summary_table

    rows = [{"trainer": "hf", "bad": 5, "back_s": b, "stall_s": s} for b, s in ((1.0, 0.8), (3.0, 2.0), (2.0, 0.9))]
    (g,) = summary(rows)
    assert (g["runs"], g["back_s_median"], g["back_s_max"], g["stall_s_median"], g["stall_s_max"]) == (3, 2.0, 3.0, 0.9, 2.0)
    assert "hf" in summary_table([g])
