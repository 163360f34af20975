"""The demo summary's facts, read back from the store recorded by a real demo run: they are what
that run's summary said (``tests/dashboard/data/demo_store.json``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cliffguard.commands.demo import collect
from cliffguard.controller.store.db import Store

DATA = Path(__file__).resolve().parents[1] / "dashboard" / "data"


@pytest.fixture
def recorded(tmp_path):
    db = tmp_path / "demo_store.db"
    shutil.copy(DATA / "demo_store.db", db)
    store = Store.open(f"sqlite:///{db}")
    yield store, json.loads((DATA / "demo_store.json").read_text())
    store.close()


def test_collect_reproduces_the_recorded_summary(recorded):
    store, summary = recorded
    facts = collect(store, summary["run"])
    assert facts["incidents"] == summary["incidents"]
    assert facts["steps_lost"] == summary["steps_lost"] > 0
    assert facts["flagged_samples"] == summary["flagged_samples"]
    assert facts["initial_loss"] == pytest.approx(summary["initial_loss"])
    assert facts["final_loss"] == pytest.approx(summary["final_loss"])
    assert (facts["run_status"], facts["lr_scale"]) == (summary["run_status"], summary["lr_scale"])


def test_collect_of_an_unknown_run_is_empty(recorded):
    store, _ = recorded
    facts = collect(store, "no-such-run")
    assert facts["incidents"] == [] and facts["steps_lost"] == 0 and facts["final_loss"] is None
