"""Operator actions: pause, resume, validate, roll back to a chosen stable checkpoint, ask for
per-rank step events (detail).

Outside the live fragments on purpose: a refresh must not disturb someone typing a token. A click
writes an unsigned request; the controller signs and queues it (or rejects it), and the table of
this run's recent requests shows which.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cliffguard.controller.store import read
from cliffguard.core.enums import CommandType
from cliffguard.dashboard import actions, derive
from cliffguard.dashboard.sections.context import Context


def render(ctx: Context) -> None:
    st.subheader("Operator actions")
    cfg = ctx.cfg
    if not cfg.operator_token:
        st.info("read-only: set CLIFFGUARD_OPERATOR_TOKEN to enable actions")
        return
    targets = derive.stable_targets(ctx.frame(read.checkpoints, ctx.run_id, keys=derive.CHECKPOINT_COLUMNS))
    run = ctx.read(read.get_run, ctx.run_id)
    with st.form("operator_form", clear_on_submit=False):
        cols = st.columns([2, 2, 2, 1, 2, 2])
        # only what the run declared it applies: the controller would refuse the rest
        can = None if run is None else run.get("capabilities")
        offered = [a.value for a in actions.OPERATOR_ACTIONS if can is None or a.value in can]
        action = cols[0].selectbox("action", offered or ["(this run applies no command)"], key="op_action",
                                   disabled=not offered)
        to_step = cols[1].selectbox("roll back to (stable)", targets or [None], key="op_to_step",
                                    help="verified and stable checkpoints, newest first")
        default_scale = min(1.0, max(0.01, (run["lr_scale"] if run else 1.0) * 0.5))
        lr_scale = cols[2].number_input("lr_scale after rollback", 0.01, 1.0, float(default_scale), 0.05, key="op_lr_scale")
        detail_steps = cols[3].number_input("detail steps", 1, 1000, 20, 10, key="op_detail_steps",
                                           help="detail: per-rank step events for this many steps")
        actor = cols[4].text_input("your name", key="op_actor")
        token = cols[5].text_input("operator token", type="password", key="op_token")
        submitted = st.form_submit_button("send command")
    if submitted:
        _submit(ctx, action, to_step, lr_scale, actor, token, int(detail_steps))
    requests = ctx.read(read.recent_requests, ctx.run_id)
    if requests:
        st.caption("recent requests for this run (the controller signs and queues accepted ones)")
        st.dataframe(pd.DataFrame(requests, columns=read.REQUEST_COLUMNS), hide_index=True, key="op_requests")


def _submit(ctx: Context, action: str, to_step: object, lr_scale: float, actor: str, token: str,
            detail_steps: int = 20) -> None:
    if action not in {c.value for c in CommandType}:
        st.error("refused: this run applies no command (it only reports)")
        return
    ctype = CommandType(action)
    try:
        args: dict = {"reason": f"operator via dashboard ({actor or 'anonymous'})"} if ctype in (
            CommandType.PAUSE, CommandType.RESUME) else {}
        if ctype is CommandType.ROLLBACK:
            if to_step is None:
                raise actions.ActionDenied("no stable checkpoint to roll back to")
            args = actions.rollback_args(int(to_step), float(lr_scale))
        if ctype is CommandType.DETAIL:
            args = actions.detail_args(detail_steps)
        request_id = actions.request_command(ctx.cfg, run_id=ctx.run_id, ctype=ctype, args=args, actor=actor,
                                             token=token)
    except actions.ActionDenied as exc:
        st.error(f"refused: {exc}")
        return
    st.success(f"{ctype} requested (request {request_id}): the controller signs and queues it, or says why not")
