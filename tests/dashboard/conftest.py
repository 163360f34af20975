"""Fixtures: a store filled through the real write paths (see fill.py) and an AppTest over it."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from sqlalchemy import Engine
from streamlit.testing.v1 import AppTest

from cliffguard.controller.store.db import make_engine
from testing.dashboard_fill import FilledRun, fill_store

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
TOKEN = "operator-token-for-tests"


@dataclass
class Filled:
    url: str
    engine: Engine
    run: FilledRun


@pytest.fixture
def filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Filled]:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    run = fill_store(engine)
    monkeypatch.setenv("CLIFFGUARD_DASHBOARD__DB_URL", url)
    for var in ("CLIFFGUARD_OPERATOR_TOKEN", "CLIFFGUARD_COMMAND_SECRET", "CLIFFGUARD_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    yield Filled(url, engine, run)
    engine.dispose()


def run_app() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def charts(at: AppTest) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Every Vega-Lite chart on the page: (spec, main data frame)."""
    out = []
    for el in at.get("vega_lite_chart"):
        spec = json.loads(el.proto.spec)
        raw = el.proto.data.data
        df = pa.ipc.open_stream(io.BytesIO(raw)).read_pandas() if raw else pd.DataFrame()
        out.append((spec, df))
    return out


def chart_with(at: AppTest, needle: str) -> tuple[dict[str, Any], pd.DataFrame]:
    """The one chart whose spec mentions ``needle`` (a field name)."""
    found = [(s, d) for s, d in charts(at) if needle in json.dumps(s)]
    assert len(found) == 1, f"{len(found)} charts mention {needle!r}"
    return found[0]


def texts(at: AppTest) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [s.value for s in at.subheader]
    parts += [w.value for w in at.warning] + [i.value for i in at.info] + [e.value for e in at.error]
    parts += [s.value for s in at.success] + [e.label for e in at.expander]
    return "\n".join(str(p) for p in parts)
