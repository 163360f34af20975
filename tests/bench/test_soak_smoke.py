"""The combined-fault soak's CI smoke (``python -m bench.soak``): two short seeds of the real stack
(embedded broker, ``cliffguard controller``, a 2-process bundled trainer with the demo's faults)
under their schedules of combined faults, run from a directory outside the checkout; every
invariant must hold in both, and the JSON must carry what re-runs a seed exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.soak.invariants import CHECKS
from bench.soak.schedule import ScheduleConfig, make_schedule

REPO = Path(__file__).resolve().parents[2]
SEEDS, STEPS, EVENTS, MAX_FAULT_S = (1, 2), 200, (4, 6), 10.0
"""Short seeds: the demo's two training faults scaled to 200 steps (the least they work at, see
bench.soak's MIN_STEPS), 4-6 combined faults of at most 10 s each."""


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_short_seeds_hold_every_invariant(tmp_path):
    out = tmp_path / "soak.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = [
        sys.executable,
        "-m",
        "bench.soak",
        "--seeds",
        str(len(SEEDS)),
        "--seed-base",
        str(SEEDS[0]),
        "--steps",
        str(STEPS),
        "--events",
        f"{EVENTS[0]}:{EVENTS[1]}",
        "--max-fault-s",
        str(MAX_FAULT_S),
        "--json",
        str(out),
    ]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=880)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["seeds"]
    assert [r["seed"] for r in rows] == list(SEEDS)
    for row in rows:
        cfg = ScheduleConfig(events_min=EVENTS[0], events_max=EVENTS[1], max_s=MAX_FAULT_S)
        want = make_schedule(row["seed"], STEPS, cfg)
        assert row["schedule"] == want.to_dict()  # the JSON re-runs the seed exactly
        assert sum(1 for f in row["fired"] if f["fired"]) >= 1
        assert row["counts"]["steps_run"] >= STEPS and row["counts"]["events_witnessed"] > STEPS
    broken = {(r["seed"], name): c["detail"] for r in rows for name, c in r["checks"].items() if c["count"]}
    assert broken == {}, proc.stdout[-30000:]
    assert result["totals"]["checks"] == {inv.name: 0 for inv in CHECKS}
    assert proc.returncode == 0
