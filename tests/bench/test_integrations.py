"""bench.integrations' pure parts: one trainer's row from its faulted and clean summaries, the table."""

from __future__ import annotations

import pytest

from bench.integrations import main, row, table


def _summary(final_loss, *, ok=True, incidents=(), commands=0, applied=0.5, alerts=0):
    return {"ok": ok, "final_loss": final_loss, "incidents": list(incidents), "commands_sent": commands,
            "lr_scale_applied": applied, "alerts": alerts, "steps_lost": 50, "wall_s": 100.0}


def test_a_row_compares_the_faulted_final_loss_with_the_clean_run():
    incs = [{"outcome": "resumed", "spike_step": 79, "rollback_to": None, "lr_scale": 1.0, "id": "a"},
            {"outcome": "rolled_back", "spike_step": 149, "rollback_to": 100, "lr_scale": 0.5, "id": "b"}]
    r = row("plain", _summary(2.58, incidents=incs, commands=6), _summary(2.50, applied=1.0))
    assert r["ratio"] == pytest.approx(1.032) and r["within_5pct"] and r["ok"] and r["clean_ok"]
    assert r["incidents"][1] == {"outcome": "rolled_back", "spike_step": 149, "rollback_to": 100, "lr_scale": 0.5}
    assert r["commands_sent"] == 6 and r["lr_scale_applied"] == 0.5
    far = row("hf", _summary(2.80), _summary(2.50))
    assert not far["within_5pct"]
    broken = row("hf", {"ok": False, "error": "timed out"}, _summary(2.5))
    assert broken["ratio"] is None and not broken["within_5pct"] and broken["error"] == "timed out"
    text = table([r, far, broken])
    assert "rolled_back 149->100 x0.5" in text and "1.032" in text and "error: timed out" in text


def test_an_unknown_trainer_is_refused():
    with pytest.raises(SystemExit):
        main(["--trainers", "keras"])
