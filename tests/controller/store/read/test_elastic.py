"""Elastic scale events: stored once each (a re-delivery changes nothing), read oldest first, and
the world / global batch timeline they imply."""

from __future__ import annotations

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.core.enums import EventType
from testing import store_factory as f

DOWN = {"from_world": 4, "to_world": 2, "from_global_batch": 16, "global_batch": 8, "grad_accum": 1, "lr": 2.1e-3,
        "lr_factor": 0.7071, "steps_lost": 3, "seconds_lost": 41.5, "backoff_s": 0.0, "policy": "proportional",
        "lr_rule": "sqrt"}
UP = {**DOWN, "from_world": 2, "to_world": 4, "from_global_batch": 8, "global_batch": 16, "lr": 3e-3, "lr_factor": 1.0,
      "steps_lost": 1, "seconds_lost": 12.0}


def test_scale_events_stored_once_and_timeline(engine):
    down = f.event(EventType.ELASTIC_SCALED_DOWN, 20, DOWN, world=2)
    up = f.event(EventType.ELASTIC_SCALED_UP, 60, UP, world=4)
    with session_scope(engine) as s:
        assert ingest_events(s, [f.run_started(world=4), down, up]) >= 2
    with session_scope(engine) as s:
        assert ingest_events(s, [down, up]) == 0  # a re-delivery
    with session_scope(engine) as s:
        events = read.elastic_events(s, "run-a")
        assert [(e["direction"], e["step"], e["to_world"], e["global_batch"]) for e in events] == [
            ("down", 20, 2, 8), ("up", 60, 4, 16)]
        assert events[0]["seconds_lost"] == 41.5 and events[0]["steps_lost"] == 3 and events[0]["lr_rule"] == "sqrt"
        assert [(p["step"], p["world"], p["global_batch"]) for p in read.scale_timeline(s, "run-a")] == [
            (0, 4, 16), (20, 2, 8), (60, 4, 16)]
        assert read.elastic_events(s, "other") == [] and read.scale_timeline(s, "other") == []


def test_timeline_without_scale_events_is_the_run_start(engine):
    with session_scope(engine) as s:
        ingest_events(s, [f.run_started(world=2, global_batch=32)])
    with session_scope(engine) as s:
        assert [(p["step"], p["world"], p["global_batch"]) for p in read.scale_timeline(s, "run-a")] == [(0, 2, 32)]
