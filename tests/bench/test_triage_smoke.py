"""``python -m bench.triage``'s CI smoke: one fault of each class on a 3-process run (the bench
runs 4): the class right, the controller's answer the one that fits it (cured, evicted or halted for
a human, rolled back before the SDC), no LR cut, no bad update in the weights, no listed batch fed
again, the SDC named within its check period."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_fault_of_each_class_is_classified_and_answered_by_what_fits_it(tmp_path):
    out = tmp_path / "triage.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "bench.triage", "--world", "3", "--json", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = {r["fault"]: r for r in res["rows"]}
    assert set(rows) == {"data", "transient", "bad_rank", "sdc"}
    assert {f: r["class"] for f, r in rows.items()} == {f: f for f in rows}
    assert rows["data"]["remedy"] == "skip_batch" and rows["transient"]["remedy"] == "retry_step"
    assert rows["bad_rank"]["controller"] == "restart_unavailable -> halted"  # no torchrun here to evict with
    assert rows["sdc"]["controller"] == "sdc -> rolling_back" and rows["sdc"]["rank"] == 2
    assert rows["sdc"]["remedy"] == "rollback to 20, lr_scale 1" and rows["sdc"]["detect_steps"] <= res["check_every"]
    assert not any(r["lr_cut"] or r["bad_update_applied"] or r["skipped_replayed"] for r in rows.values())
    assert res["totals"] == {"faults": 4, "correct_class": 4, "bad_updates_applied": 0, "skipped_replayed": 0,
                             "ok": True}
    assert "fault | class" in proc.stdout  # the table
