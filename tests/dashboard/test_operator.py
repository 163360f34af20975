"""Operator actions on the page: a wrong token writes nothing; the right one writes a signed
command, an audit row and an outbox row through the controller's operator path."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from controller.store.models import AuditRow, CommandRow, OutboxRow
from core.events import decode_command
from core.signing import CommandVerifier, Secret
from dashboard.actions import ActionDenied, issue_command, token_ok
from dashboard.config import DashboardConfig
from tests.dashboard.conftest import SECRET, TOKEN, run_app

pytestmark = pytest.mark.timeout(180)


def _counts(engine) -> tuple[int, int, int]:
    with Session(engine) as s:
        return (
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
    monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", SECRET)
    return filled


def test_wrong_token_writes_no_command_and_no_outbox_row(with_token):
    before = _counts(with_token.engine)
    at = run_app()
    _submit(at, "pause", "not-the-token")
    assert any("wrong operator token" in e.value for e in at.error)
    assert _counts(with_token.engine) == before


def test_right_token_rollback_to_a_stable_checkpoint_writes_command_audit_and_outbox(with_token):
    before = _counts(with_token.engine)
    at = run_app()
    targets = list(at.selectbox(key="op_to_step").options)
    assert [int(t) for t in targets] == sorted(with_token.run.stable_steps, reverse=True)  # stable only
    _submit(at, "rollback", TOKEN, to_step=with_token.run.rollback_to, lr_scale=0.25)
    assert any("queued in the controller's outbox" in s.value for s in at.success)
    assert _counts(with_token.engine) == (before[0] + 1, before[1] + 1, before[2] + 1)
    with Session(with_token.engine) as s:
        cmd = s.scalars(select(CommandRow).where(CommandRow.source == "operator")).one()
        audit = s.scalars(select(AuditRow)).one()
        out = s.scalars(select(OutboxRow).where(OutboxRow.kind == "command")).one()
    assert cmd.type == "rollback" and cmd.args == {"to_step": with_token.run.rollback_to, "lr_scale": 0.25}
    assert cmd.status == "pending" and cmd.run_id == with_token.run.run_id
    assert audit.actor == "dashboard:alice" and audit.command_id == cmd.id
    assert out.target == "cliffguard.commands" and out.key == with_token.run.run_id
    # the outbox payload is a correctly signed command the trainer would accept
    signed = decode_command(out.payload)
    assert signed.id == cmd.id
    assert CommandVerifier(with_token.run.run_id, Secret(SECRET)).verify(signed).ok


def test_right_token_pause_resume_validate(with_token):
    at = run_app()
    for action in ("pause", "validate", "resume"):
        _submit(at, action, TOKEN)
    with Session(with_token.engine) as s:
        types = list(s.scalars(select(CommandRow.type).where(CommandRow.source == "operator")
                               .order_by(CommandRow.issued_at)))
    assert types == ["pause", "validate", "resume"]


def test_token_compare():
    assert token_ok("abc", "abc")
    assert not token_ok("abd", "abc")
    assert not token_ok("", "abc")
    assert not token_ok("abc", None)  # no configured token: nobody may act


def test_issue_command_refuses_without_secret_and_writes_nothing(filled):
    cfg = DashboardConfig(db_url=filled.url, operator_token=TOKEN)
    before = _counts(filled.engine)
    with pytest.raises(ActionDenied, match="command secret"):
        issue_command(filled.engine, cfg, run_id=filled.run.run_id, ctype="pause", args={}, actor="x", token=TOKEN)
    assert _counts(filled.engine) == before


def test_issue_command_for_unknown_run_is_refused(filled):
    cfg = DashboardConfig(db_url=filled.url, operator_token=TOKEN, command_secret=SECRET)
    with pytest.raises(ActionDenied, match="not in the store"):
        issue_command(filled.engine, cfg, run_id="nope", ctype="pause", args={}, actor="x", token=TOKEN)
    assert _counts(filled.engine)[0] == 0
