"""The elastic section: absent for a run that never changed size; for one that did, world size,
global batch and LR by step, a rule per change, and the goodput each change cost."""

from __future__ import annotations

import pandas as pd
import pytest

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.ingest import ingest_events
from cliffguard.core.enums import EventType
from cliffguard.core.events import make_event
from cliffguard.dashboard import charts
from cliffguard.dashboard.sections.elastic import timeline_to_end
from tests.controller.store.read.test_elastic import DOWN, UP
from tests.dashboard.conftest import chart_with, run_app, texts

pytestmark = pytest.mark.timeout(180)


def test_no_section_without_scale_changes(filled):
    assert "Elastic scale changes" not in texts(run_app())


def test_section_shows_worlds_batches_lr_and_goodput(filled):
    run = filled.run.run_id
    with session_scope(filled.engine) as s:
        ingest_events(s, [make_event(EventType.ELASTIC_SCALED_DOWN, run, 30, DOWN, world=2, ts=2e9),
                          make_event(EventType.ELASTIC_SCALED_UP, run, 80, UP, world=4, ts=2e9 + 60)])
    at = run_app()
    text = texts(at)
    assert "Elastic scale changes" in text
    assert "2 scale changes · now world 4, global batch 16" in text and "4 steps redone, 53.5 s" in text
    spec, df = chart_with(at, '"world"')
    points = list(zip(df["step"], df["world"], df["global_batch"], strict=True))
    assert points[:3] == [(0, 4, 16), (30, 2, 8), (80, 4, 16)]
    assert points[3][0] >= 80 and points[3][1:] == (4, 16)  # held to the run's last step
    lr_layer = next(layer for layer in spec["layer"] if layer["encoding"]["y"]["field"] == "lr")
    assert len(lr_layer["data"]["values"]) > 10
    rules = next(layer for layer in spec["layer"] if layer["mark"]["type"] == "rule")
    assert [v["step"] for v in rules["data"]["values"]] == [30, 80]
    table = next(d.value for d in at.dataframe if "direction" in d.value.columns)
    assert list(table["direction"]) == ["down", "up"] and list(table["seconds_lost"]) == [41.5, 12.0]


def test_timeline_held_to_the_last_step():
    tl = pd.DataFrame({"step": [0, 20], "ts": [None, 1.0], "world": [4, 2], "global_batch": [16, 8]})
    assert list(timeline_to_end(tl, 50)["step"]) == [0, 20, 50]
    assert list(timeline_to_end(tl, 10)["step"]) == [0, 20, 20]  # never before the last change
    assert timeline_to_end(tl.iloc[0:0], 50).empty
    chart = charts.scale_chart(timeline_to_end(tl, 50), pd.DataFrame({"step": [0, 1], "lr": [1e-3, None]}))
    assert chart.spec["layer"][2]["data"]["values"] == [{"step": 0, "lr": 1e-3}]
