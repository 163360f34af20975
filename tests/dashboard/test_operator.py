"""Operator actions on the page: a wrong token writes nothing; the right one writes one unsigned
request and nothing else (no command, audit or outbox row: the controller signs and queues it).
The page itself reads through an engine that cannot write."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from cliffguard.controller.operator import decide_pending_requests
from cliffguard.controller.store.models import AuditRow, CommandRequestRow, CommandRow, OutboxRow, RunRow
from cliffguard.core.events import decode_command
from cliffguard.core.signing import CommandVerifier, Secret
from cliffguard.dashboard.actions import ActionDenied, request_command, token_ok
from cliffguard.dashboard.config import DashboardConfig
from cliffguard.dashboard.store_access import read_only_engine
from tests.dashboard.conftest import TOKEN, run_app

pytestmark = pytest.mark.timeout(180)

SECRET = Secret("the-controllers-own-secret-0123")  # only the controller side of these tests has it


def _counts(engine) -> tuple[int, int, int, int]:
    with Session(engine) as s:
        return (
            s.scalar(select(func.count()).select_from(CommandRequestRow)),
            s.scalar(select(func.count()).select_from(CommandRow).where(CommandRow.source == "operator")),
            s.scalar(select(func.count()).select_from(AuditRow)),
            s.scalar(select(func.count()).select_from(OutboxRow).where(OutboxRow.kind == "command")),
        )


def _submit(at, action: str, token: str, **fields):
    at.selectbox(key="op_action").set_value(action)
    if "to_step" in fields:
        at.selectbox(key="op_to_step").set_value(fields["to_step"])
    if "lr_scale" in fields:
        at.number_input(key="op_lr_scale").set_value(fields["lr_scale"])
    at.text_input(key="op_actor").input("alice")
    at.text_input(key="op_token").input(token)
    next(b for b in at.button if b.label == "send command").click().run()
    assert not at.exception


@pytest.fixture
def with_token(filled, monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_OPERATOR_TOKEN", TOKEN)
    return filled


def test_wrong_token_writes_nothing(with_token):
    before = _counts(with_token.engine)
    at = run_app()
    _submit(at, "pause", "not-the-token")
    assert any("wrong operator token" in e.value for e in at.error)
    assert _counts(with_token.engine) == before


def test_right_token_rollback_writes_only_a_request_which_the_controller_signs(with_token):
    before = _counts(with_token.engine)
    at = run_app()
    targets = list(at.selectbox(key="op_to_step").options)
    assert [int(t) for t in targets] == sorted(with_token.run.stable_steps, reverse=True)  # stable only
    _submit(at, "rollback", TOKEN, to_step=with_token.run.rollback_to, lr_scale=0.25)
    assert any("the controller signs and queues it" in s.value for s in at.success)
    assert _counts(with_token.engine) == (before[0] + 1, *before[1:])  # the request, nothing signed
    with Session(with_token.engine) as s:
        req = s.scalars(select(CommandRequestRow)).one()
    assert (req.run_id, req.type, req.args) == (with_token.run.run_id, "rollback",
                                                {"to_step": with_token.run.rollback_to, "lr_scale": 0.25})
    assert (req.requested_by, req.source, req.status) == ("dashboard:alice", "dashboard", "pending")
    # the controller's side: it signs with its secret, audits and queues
    done = decide_pending_requests(with_token.engine, secret=SECRET, commands_topic="prod.commands", ttl_s=60)
    assert done.accepted == 1
    assert _counts(with_token.engine) == (before[0] + 1, before[1] + 1, before[2] + 1, before[3] + 1)
    with Session(with_token.engine) as s:
        out = s.scalars(select(OutboxRow).where(OutboxRow.kind == "command")).one()
        audit = s.scalars(select(AuditRow)).one()
    assert out.target == "prod.commands"  # the controller's deployment topic, not a dashboard copy
    signed = decode_command(out.payload)
    assert CommandVerifier(with_token.run.run_id, SECRET).verify(signed).ok
    assert audit.actor == "dashboard:alice" and audit.command_id == signed.id
    at.run()  # the page shows the decision
    frame = next(d.value for d in at.dataframe if "requested_by" in d.value.columns)
    assert list(frame["status"]) == ["accepted"] and list(frame["command_id"]) == [signed.id]


def test_right_token_pause_validate_resume_are_requests_in_order(with_token):
    at = run_app()
    for action in ("pause", "validate", "resume", "detail"):
        _submit(at, action, TOKEN)
    with Session(with_token.engine) as s:
        rows = list(s.execute(select(CommandRequestRow.type, CommandRequestRow.args).order_by(CommandRequestRow.id)))
    assert [t for t, _ in rows] == ["pause", "validate", "resume", "detail"]
    assert rows[-1][1] == {"steps": 20}  # the form's default number of steps
    assert _counts(with_token.engine)[1:] == (0, 0, 0)


def test_detail_steps_are_bounded():
    from cliffguard.dashboard.actions import detail_args

    assert detail_args(5) == {"steps": 5}
    for bad in (0, 10**6):
        with pytest.raises(ActionDenied, match="steps"):
            detail_args(bad)


def test_token_compare():
    assert token_ok("abc", "abc")
    assert not token_ok("abd", "abc")
    assert not token_ok("", "abc")
    assert not token_ok("abc", None)  # no configured token: nobody may act


def test_request_command_refuses_non_operator_actions_and_bad_tokens(filled):
    cfg = DashboardConfig(db_url=filled.url, operator_token=TOKEN)
    with pytest.raises(ActionDenied, match="not an operator action"):
        request_command(cfg, run_id=filled.run.run_id, ctype="stop", args={}, actor="x", token=TOKEN)
    with pytest.raises(ActionDenied, match="no operator token"):
        request_command(DashboardConfig(db_url=filled.url), run_id="r", ctype="pause", args={}, actor="x", token="t")
    assert _counts(filled.engine)[0] == 0


def test_the_dashboard_engine_reads_and_cannot_write(filled):
    engine = read_only_engine(filled.url)
    try:
        with Session(engine) as s:
            assert s.get(RunRow, filled.run.run_id) is not None
        for stmt in (insert(CommandRequestRow).values(run_id="r", type="pause", args={}, requested_by="x", source="cli",
                                                   requested_at=time.time(), status="pending"),
                     RunRow.__table__.update().values(lr_scale=0.1)):
            with pytest.raises(DBAPIError, match="readonly|read-only"):
                with engine.begin() as conn:
                    conn.execute(stmt)
    finally:
        engine.dispose()
    assert _counts(filled.engine)[0] == 0


@pytest.mark.postgres
def test_the_dashboard_engine_cannot_write_postgresql(pg_url, tmp_path):
    from testing.controller_service import store_engine

    with store_engine("postgres", tmp_path, pg_url) as (writer, url):
        with writer.begin() as conn:
            conn.execute(insert(RunRow).values(id="r", controller_state={}, config={}))
        engine = read_only_engine(url)
        try:
            for _ in range(2):  # a pooled connection keeps refusing after its first transaction
                with Session(engine) as s:
                    assert s.get(RunRow, "r") is not None
                with pytest.raises(DBAPIError, match="read-only"):
                    with engine.begin() as conn:
                        conn.execute(RunRow.__table__.update().values(lr_scale=0.1))
        finally:
            engine.dispose()


def test_only_the_commands_the_run_applies_are_offered(with_token):
    from sqlalchemy import update

    with Session(with_token.engine) as s:
        s.execute(update(RunRow).values(capabilities=["pause", "resume", "validate"]))
        s.commit()
    at = run_app()
    assert at.selectbox(key="op_action").options == ["pause", "resume", "validate"]
    with Session(with_token.engine) as s:
        s.execute(update(RunRow).values(capabilities=[]))
        s.commit()
    at = run_app()
    assert at.selectbox(key="op_action").disabled
    before = _counts(with_token.engine)
    next(b for b in at.button if b.label == "send command").click().run()
    assert any("applies no command" in e.value for e in at.error) and _counts(with_token.engine) == before
