"""Operator commands: the controller decides each request and signs what it accepts.

The dashboard and ``cliffguard command`` only insert an unsigned request
(``controller.store.requests.submit_request``). The controller's service loop calls
``decide_request`` for each pending one; in one transaction it claims the request, validates it
(known run, run not ended, a command the run declared it can apply, request not older than a
command's lifetime, type and arguments per ``core.events.make_command``) and either writes the signed command row, its audit row and its
outbox row, marking the request ``accepted``, or marks it ``rejected`` with the reason and writes
nothing else. The outbox publisher sends the command to ``<prefix>.commands`` after commit,
exactly like the controller's own commands.

The trainer cannot tell operator commands apart except by ``source`` in the store, which the
recovery machine uses too: operator commands are not the machine's own (``RecoveryState.issued``),
so an applied operator ``resume``/``rollback`` takes a halted run back to running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AuditRow, CommandRequestRow, CommandRow, OutboxRow, RunRow
from cliffguard.controller.store.requests import RequestStatus
from cliffguard.core.enums import CommandType
from cliffguard.core.events import encode_command, make_command
from cliffguard.core.floats import to_json
from cliffguard.core.policy import COMMAND_TTL_S
from cliffguard.core.signing import SigningKey, sign_command

log = logging.getLogger(__name__)

ENDED = ("finished", "failed")
REQUESTS_PER_PASS = 50


class UnknownRun(LookupError):
    pass


class RequestRejected(ValueError):
    """A request the controller refuses; the message is recorded as the request's detail."""


def enqueue_command(
    session: Session,
    *,
    run_id: str,
    type: CommandType | str,
    args: dict[str, Any],
    secret: SigningKey,
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
    secret: SigningKey,
    commands_topic: str,
    ttl_s: float = COMMAND_TTL_S,
    now: float | None = None,
    request_id: int | None = None,
) -> CommandRow:
    """An operator's command for ``run_id``, with its audit row; raises UnknownRun / SchemaError
    (a ValueError) before writing anything."""
    if session.get(RunRow, run_id) is None:
        raise UnknownRun(f"run {run_id!r} is not in the store")
    now = time.time() if now is None else now
    row = enqueue_command(session, run_id=run_id, type=type, args=args, secret=secret,
                          commands_topic=commands_topic, ttl_s=ttl_s, source="operator", now=now)
    detail: dict[str, Any] = {"args": row.args, "ttl_s": ttl_s}
    if request_id is not None:
        detail["request"] = request_id
    session.add(AuditRow(ts=now, actor=actor[:128], action=f"command.{row.type}", run_id=run_id, command_id=row.id,
                         detail=detail))
    return row


def pending_requests(session: Session, limit: int) -> list[int]:
    """Ids of the oldest pending requests (first come, first decided)."""
    return list(session.scalars(
        select(CommandRequestRow.id).where(CommandRequestRow.status == str(RequestStatus.PENDING))
        .order_by(CommandRequestRow.requested_at, CommandRequestRow.id).limit(limit)
    ))


def decide_request(
    session: Session,
    request_id: int,
    *,
    secret: SigningKey,
    commands_topic: str,
    ttl_s: float,
    now: float,
) -> CommandRequestRow | None:
    """Accept (sign, audit, queue) or reject one pending request in the caller's transaction.

    None when the request is gone or no longer pending: another controller instance decided it.
    The claim is a conditional UPDATE, so two instances on one store never both accept it."""
    claimed = session.execute(
        update(CommandRequestRow)
        .where(CommandRequestRow.id == request_id, CommandRequestRow.status == str(RequestStatus.PENDING))
        .values(status=str(RequestStatus.ACCEPTED), decided_at=now)
    ).rowcount
    if claimed != 1:
        return None
    req = session.get(CommandRequestRow, request_id)
    assert req is not None
    try:
        _check(session, req, now=now, ttl_s=ttl_s)
        row = issue_operator_command(session, run_id=req.run_id, type=req.type, args=dict(req.args),
                                     actor=req.requested_by, secret=secret, commands_topic=commands_topic,
                                     ttl_s=ttl_s, now=now, request_id=req.id)
    except (LookupError, ValueError) as exc:  # every check runs before anything is written
        req.status = str(RequestStatus.REJECTED)
        req.detail = str(exc)
        log.warning("request %s (%s %s for run %s by %s) rejected: %s", req.id, req.source, req.type, req.run_id,
                    req.requested_by, exc)
        return req
    req.command_id = row.id
    req.detail = f"signed and queued as command {row.id}"
    log.info("request %s (%s %s for run %s by %s) accepted as command %s", req.id, req.source, req.type,
             req.run_id, req.requested_by, row.id)
    return req


def _check(session: Session, req: CommandRequestRow, *, now: float, ttl_s: float) -> None:
    run = session.get(RunRow, req.run_id)
    if run is None:
        raise UnknownRun(f"run {req.run_id!r} is not in the store")
    if run.status in ENDED:
        raise RequestRejected(f"run {req.run_id!r} has ended ({run.status})")
    if run.capabilities is not None and req.type not in run.capabilities:
        can = ", ".join(run.capabilities) or "no command"
        raise RequestRejected(f"run {req.run_id!r} cannot apply {req.type} (it declared: {can})")
    age = now - req.requested_at
    # A request the controller only sees long after it was made (the controller was down) would
    # act on a run the operator no longer sees as they did: it expires like a command would.
    if age > ttl_s:
        raise RequestRejected(f"request is {age:.0f}s old, older than a command's lifetime ({ttl_s:g}s)")


@dataclass(slots=True)
class RequestPass:
    accepted: int = 0
    rejected: int = 0
    errors: int = 0


def decide_pending_requests(
    engine: Engine,
    *,
    secret: SigningKey,
    commands_topic: str,
    ttl_s: float,
    clock: Callable[[], float] = time.time,
    limit: int = REQUESTS_PER_PASS,
) -> RequestPass:
    """One pass of the service loop: every pending request decided in a transaction of its own
    (one that fails unexpectedly is rejected with the error rather than retried forever)."""
    done = RequestPass()
    try:
        with session_scope(engine) as s:
            ids = pending_requests(s, limit)
    except Exception:  # noqa: BLE001 - the next pass looks again
        done.errors += 1
        log.exception("reading pending command requests failed")
        return done
    for request_id in ids:
        try:
            with session_scope(engine) as s:
                req = decide_request(s, request_id, secret=secret, commands_topic=commands_topic, ttl_s=ttl_s,
                                     now=clock())
                status = None if req is None else req.status
        except Exception as exc:  # noqa: BLE001
            done.errors += 1
            log.exception("deciding command request %s failed; rejecting it", request_id)
            status = _reject_after_error(engine, request_id, exc, clock())
        done.accepted += status == RequestStatus.ACCEPTED
        done.rejected += status == RequestStatus.REJECTED
    return done


def _reject_after_error(engine: Engine, request_id: int, exc: Exception, now: float) -> str | None:
    try:
        with session_scope(engine) as s:
            req = s.get(CommandRequestRow, request_id)
            if req is None or req.status != RequestStatus.PENDING:
                return None
            req.status = str(RequestStatus.REJECTED)
            req.decided_at = now
            req.detail = f"controller error: {type(exc).__name__}: {exc}"[:1000]
            return req.status
    except Exception:  # noqa: BLE001 - still pending: the next pass tries again
        log.exception("could not record the rejection of command request %s", request_id)
        return None
