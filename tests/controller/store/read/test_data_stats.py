"""The data watch's windows in the store (ingest -> data_stats -> read API) and the data evidence of
a loss incident, on the events the real data watch makes of real code batches, garbled from step
250, with a rollback that replays steps 240-259."""

from __future__ import annotations

import math

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.controller.store.models import IncidentRow
from testing.data_watch import code_batches, garble, watch


@pytest.fixture(scope="module")
def events():
    def batches():
        for step, x, ids in code_batches(range(260)):
            yield garble(step, x, ids) if 250 <= step < 260 else (step, x, ids)
        yield from code_batches(range(240, 270))  # the rollback's replay: clean this time

    return watch(batches(), run="dq")


@pytest.fixture
def store(engine, events):
    with session_scope(engine) as s:
        assert ingest_events(s, events) == len(events)
    with session_scope(engine) as s:
        assert ingest_events(s, events) == 0  # a re-delivery changes nothing
    return engine


def test_windows_steps_and_the_baseline(store, events):
    with session_scope(store) as s:
        windows = read.data_windows(s, "dq", limit=None)
        base = read.data_baseline(s, "dq")
        newest = read.data_steps(s, "dq", first=250, last=259)
        first = read.data_steps(s, "dq", first=250, last=259, replayed="first")
        assert read.data_windows(s, "nope") == [] and read.data_evidence(s, "nope", 0, 1) is None
    assert len(windows) == len(events) and [w["step"] for w in windows[:2]] == [9, 19]
    assert base["steps"] == [0, 199] and base["complete"] and base["windows"] == 20 and base["rank"] == 0
    assert 1.0 < base["ppl"] < 2.5 and base["garbled"] == 0.0 and base["dup"] == 0.0 and base["pad"] == 0.0
    drift: dict[int, float] = {}
    for w in windows:
        drift.setdefault(w["step"], w["drift"])  # step 259's first window: the garbled pass
    assert max(drift[s] for s in range(9, 200, 10)) < 0.01 < drift[259]
    assert [r["step"] for r in newest] == list(range(250, 260))
    assert all(r["garbled"] == 0.5 for r in first) and all(r["garbled"] == 0.0 for r in newest)
    assert windows[0]["outliers"][0][2] == "novelty" and isinstance(windows[0]["per_step"]["ppl"][0], float)


def test_an_incident_shows_its_steps_batch_statistics_beside_the_baseline(store):
    with session_scope(store) as s:
        s.add(IncidentRow(id="inc", run_id="dq", opened_at=1.0, rule="loss_spike", level="critical",
                          spike_step=256, onset_step=252, outcome="open"))
    with session_scope(store) as s:
        data = read.incident_detail(s, "inc")["data"]
    assert [r["step"] for r in data["steps"]] == list(range(252, 257))
    assert all(r["garbled"] == 0.5 and r["ppl"] > data["baseline"]["ppl"] + 1 for r in data["steps"])
    assert [w["step"] for w in data["windows"]] == [259]  # the first pass's window, not the replay's
    garbled = [o for o in data["windows"][0]["outliers"] if o[2] == "garbled"]
    assert garbled and all(o[0] in range(250, 260) for o in garbled)
    assert "sketch" not in data["baseline"] and not math.isnan(data["windows"][0]["drift"])
