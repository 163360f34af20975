"""The cliffguard dashboard (Streamlit): ``streamlit run dashboard/app.py``, or
``cliffguard dashboard --db URL``.

Reads the store through a read-only engine (``dashboard.store_access``); operator actions only
insert an unsigned request, which the controller signs and queues. Each section is a Streamlit
fragment with ``run_every``, so a live update re-runs that section alone, never the whole page.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # `streamlit run dashboard/app.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import streamlit as st
from sqlalchemy import Engine

from cliffguard.controller.store import read
from cliffguard.controller.store.db import schema_at_head
from cliffguard.core.settings import ConfigError
from cliffguard.dashboard.config import DashboardConfig, load_config
from cliffguard.dashboard.sections import (
    alerts,
    checkpoints,
    data_quality,
    elastic,
    goodput,
    gradients,
    hangs,
    header,
    incidents,
    loss,
    operator,
    preemptions,
    queue,
    ranks,
    suspects,
)
from cliffguard.dashboard.sections.context import Context
from cliffguard.dashboard.store_access import read_only_engine


@st.cache_resource(show_spinner=False)
def _engine(url: str) -> Engine:
    return read_only_engine(url)


def _pick_run(ctx_engine: Engine) -> str | None:
    from sqlalchemy.orm import Session

    with Session(ctx_engine) as session:
        runs = read.list_runs(session, limit=None)
    if not runs:
        return None
    ids = [r["id"] for r in runs]
    labels = {r["id"]: f"{r['id']} · {r['status']} · {r['recovery_state']} · step {r['last_step']}" for r in runs}
    wanted = st.query_params.get("run")
    index = ids.index(wanted) if wanted in ids else 0
    run_id = st.sidebar.selectbox("run", ids, index=index, format_func=labels.get, key="run_picker")
    st.query_params["run"] = run_id
    return run_id


def main() -> None:
    st.set_page_config(page_title="cliffguard", layout="wide")
    try:
        cfg: DashboardConfig = load_config()
    except (ConfigError, ValueError) as exc:
        st.error(f"configuration error: {exc}")
        return
    engine = _engine(cfg.db_url)
    st.sidebar.title("cliffguard")
    view = st.sidebar.radio("view", ["runs", "data quality", "queue"], key="view", horizontal=True)
    st.sidebar.caption(f"store: `{engine.url.render_as_string(hide_password=True)}`")
    if view == "queue":
        queue.render(cfg, cfg.refresh_s)
        return
    data_view = view == "data quality"
    at_head = schema_at_head(engine)
    if data_view:
        run = _pick_run(engine) if at_head else None
        data_quality.render(cfg, Context(engine=engine, cfg=cfg, run_id=run) if run else None, every=cfg.refresh_s)
        return
    if not at_head:
        # the dashboard only reads: the controller owns the schema and migrates it when it starts
        st.title("cliffguard")
        st.error("this store's schema is not the one this dashboard reads: start `cliffguard controller "
                 "--db <the same URL>` of this version once (it migrates the store), then reload")
        return
    run_id = _pick_run(engine)
    if run_id is None:
        st.title("cliffguard")
        st.info("no runs in the store yet — start a run with the agent attached (or `cliffguard demo`)")
        return
    live = st.sidebar.toggle("live updates", value=True, key="live")
    refresh = st.sidebar.number_input("refresh every (s)", 0.5, 60.0, float(cfg.refresh_s), 0.5, key="refresh_s")
    every = refresh if live else None
    ctx = Context(engine=engine, cfg=cfg, run_id=run_id)

    st.title(f"Run `{run_id}`")
    _live(header.render, ctx, every)
    _live(loss.render, ctx, every)
    _live(goodput.render, ctx, every)
    _live(incidents.render, ctx, every)
    _live(hangs.render, ctx, every)
    _live(suspects.render, ctx, every)
    _live(checkpoints.render, ctx, every)
    _live(elastic.render, ctx, every)
    _live(preemptions.render, ctx, every)
    _live(gradients.render, ctx, every)
    _live(ranks.render, ctx, every)
    _live(alerts.render, ctx, every)
    st.divider()
    operator.render(ctx)


def _live(render, ctx: Context, every: float | None) -> None:
    st.fragment(render, run_every=every)(ctx)


main()
