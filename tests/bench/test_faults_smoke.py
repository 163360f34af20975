"""The fault-injection suite's smoke subset (``python -m bench.faults --smoke``): real broker,
real controller processes, SQLite. Every total must be zero and every row well-formed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.faults.registry import scenarios

REPO = Path(__file__).resolve().parents[2]
ROW_KEYS = {"name", "hole", "status", "passed", "seconds", "detail", "events_produced", "events_stored",
            "lost_events", "commands_sent", "commands_obeyed", "forged_sent", "forged_obeyed",
            "duplicate_commands", "rollbacks", "recover_s", "crashes", "hangs"}


def test_the_registry_covers_every_hole_with_unique_names():
    known = scenarios()
    assert len(known) >= 20
    holes = {sc.hole.split(":")[0] for sc in known.values()}
    assert {str(n) for n in range(1, 16)} <= {h.split("/")[0] for h in holes}
    assert sum(sc.smoke for sc in known.values()) >= 3
    assert all(not sc.postgres for sc in known.values() if sc.smoke)  # CI's smoke needs no PostgreSQL


@pytest.mark.broker
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_subset_runs_clean(tmp_path):
    out = tmp_path / "faults.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench.faults", "--smoke", "--json", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    totals = result["totals"]
    assert {k: totals[k] for k in ("lost_events", "duplicate_commands", "forged_obeyed", "crashes", "hangs")} == {
        "lost_events": 0, "duplicate_commands": 0, "forged_obeyed": 0, "crashes": 0, "hangs": 0}
    rows = result["scenarios"]
    assert len(rows) >= 3 and totals["passed"] == len(rows) == totals["scenarios"]
    for row in rows:
        assert row.keys() >= ROW_KEYS, ROW_KEYS - row.keys()
        assert row["status"] == "passed" and row["passed"] is True
        assert row["lost_events"] == max(0, row["events_produced"] - row["events_stored"])
    assert sum(r["forged_sent"] for r in rows) > 0  # the smoke attacks something
