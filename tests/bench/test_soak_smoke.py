"""The combined-fault soak's CI smoke (``python -m bench.soak``): two short seeds of the real stack
(embedded broker, ``cliffguard controller``, a 2-process bundled trainer with the demo's faults)
under their schedules of combined faults, run from a directory outside the checkout, the second
with two controllers in one consumer group; every invariant must hold in both, and the JSON must
carry what re-runs a seed exactly."""

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
STEPS, EVENTS, MAX_FAULT_S = 200, (4, 6), 10.0
"""Short seeds: the demo's two training faults scaled to 200 steps (the least they work at, see
bench.soak's MIN_STEPS), 4-6 combined faults of at most 10 s each."""
SEEDS = {1: 1, 2: 2}
"""seed -> controllers: seed 1 with one controller, seed 2 with two in one consumer group (a kill or
stop of the one holding the partition hands it to the other)."""


def _soak(tmp_path: Path, seed: int, controllers: int) -> tuple[subprocess.CompletedProcess[str], dict]:
    out = tmp_path / f"soak-{seed}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "bench.soak", "--seeds", "1", "--seed-base", str(seed), "--steps", str(STEPS),
            "--events", f"{EVENTS[0]}:{EVENTS[1]}", "--max-fault-s", str(MAX_FAULT_S),
            "--controllers", str(controllers), "--json", str(out)]
    proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=430)
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_short_seeds_hold_every_invariant(tmp_path):
    for seed, controllers in SEEDS.items():
        proc, result = _soak(tmp_path, seed, controllers)
        rows = result["seeds"]
        assert [r["seed"] for r in rows] == [seed]
        row = rows[0]
        cfg = ScheduleConfig(events_min=EVENTS[0], events_max=EVENTS[1], max_s=MAX_FAULT_S, controllers=controllers)
        want = make_schedule(seed, STEPS, cfg)
        assert row["schedule"] == want.to_dict()  # the JSON re-runs the seed exactly
        assert sum(1 for f in row["fired"] if f["fired"]) >= 1
        assert row["counts"]["steps_run"] >= STEPS and row["counts"]["events_witnessed"] > STEPS
        broken = {name: c["detail"] for name, c in row["checks"].items() if c["count"]}
        assert broken == {}, proc.stdout[-30000:]
        assert result["totals"]["checks"] == {inv.name: 0 for inv in CHECKS}
        assert proc.returncode == 0
