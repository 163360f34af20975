"""Operator commands (CLI, dashboard): a signed command row, an audit row and an outbox row.

All three are written in the caller's transaction; the running controller's outbox publisher
sends the command to ``<prefix>.commands`` after commit, exactly like the controller's own
commands. The trainer cannot tell them apart except by ``source`` in the store, which the
recovery machine uses too: an applied operator ``resume``/``rollback`` takes a halted run back to
running.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import Session

from controller.store.models import AuditRow, CommandRow, OutboxRow, Run
from core.enums import CommandType
from core.events import encode_command, make_command
from core.floats import to_json
from core.policy import COMMAND_TTL_S
from core.signing import Secret, sign_command


class UnknownRun(LookupError):
    pass


def enqueue_command(
    session: Session,
    *,
    run_id: str,
    type: CommandType | str,
    args: dict[str, Any],
    secret: Secret,
    commands_topic: str,
    ttl_s: float,
    source: str,
    incident_id: str | None = None,
    cmd_id: str | None = None,
    attempt: int = 1,
    now: float | None = None,
) -> CommandRow:
    """Sign a command and write its command row and outbox row (shared with the controller)."""
    issued = time.time() if now is None else now
    cmd = make_command(type, run_id, args, ttl_s=ttl_s, now=issued)  # validates type and args
    if cmd_id is not None:
        cmd = replace(cmd, id=cmd_id)
    signed = sign_command(cmd, secret)
    row = CommandRow(id=signed.id, run_id=run_id, incident_id=incident_id, type=str(signed.type),
                     args=to_json(signed.args), issued_at=signed.issued_at, expires_at=signed.expires_at,
                     source=source, status="pending", attempt=attempt)
    session.add(row)
    session.add(OutboxRow(id=f"cmd_{signed.id}", kind="command", target=commands_topic, key=run_id,
                          payload=encode_command(signed), created_at=issued, status="pending", attempts=0,
                          next_attempt_at=issued))
    return row


def issue_operator_command(
    session: Session,
    *,
    run_id: str,
    type: CommandType | str,
    args: dict[str, Any],
    actor: str,
    secret: Secret,
    commands_topic: str,
    ttl_s: float = COMMAND_TTL_S,
) -> CommandRow:
    """An operator's command for ``run_id``, with its audit row; raises UnknownRun / SchemaError."""
    if session.get(Run, run_id) is None:
        raise UnknownRun(f"run {run_id!r} is not in the store")
    now = time.time()
    row = enqueue_command(session, run_id=run_id, type=type, args=args, secret=secret,
                          commands_topic=commands_topic, ttl_s=ttl_s, source="operator", now=now)
    session.add(AuditRow(ts=now, actor=actor[:128], action=f"command.{row.type}", run_id=run_id, command_id=row.id,
                         detail={"args": row.args, "ttl_s": ttl_s}))
    return row
