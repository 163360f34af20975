"""Operator command requests: the one thing the dashboard and ``cliffguard command`` write.

A requester holds no signing key. It inserts one unsigned row into ``command_requests`` saying
who asked for which command on which run, and when; the controller's service loop decides it
(``controller.operator.decide_request``): it validates the request, signs the command with the
deployment's secret, topic and lifetime and queues it through its outbox (``accepted``), or
refuses it with a reason (``rejected``). ``submit_request`` touches no other table, so a
requester's store access is read-only apart from this one insert.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import Engine, insert, select
from sqlalchemy.orm import Session

from cliffguard.controller.store.fit import fit_row
from cliffguard.controller.store.models import CommandRequestRow
from cliffguard.core.enums import CommandType
from cliffguard.core.floats import to_json


class RequestStatus(StrEnum):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class RequestSource(StrEnum):
    DASHBOARD = "dashboard"
    CLI = "cli"


@dataclass(frozen=True, slots=True)
class RequestState:
    """A request as its requester sees it: still pending, or what the controller decided."""

    id: int
    run_id: str
    type: str
    status: RequestStatus
    detail: str | None
    command_id: str | None
    decided_at: float | None


def submit_request(
    engine: Engine,
    *,
    run_id: str,
    type: CommandType | str,
    args: dict[str, Any],
    requested_by: str,
    source: RequestSource | str,
    reason: str | None = None,
    now: float | None = None,
) -> int:
    """Insert one pending request in a transaction of its own; its id. Only the shape is checked
    here (the controller validates the arguments against the command schema)."""
    source = RequestSource(source)
    ctype = CommandType(type)
    if not run_id:
        raise ValueError("run_id: must not be empty")
    who = requested_by.strip()
    if not who:
        raise ValueError("requested_by: must not be empty")
    values = {
        "run_id": run_id, "type": str(ctype), "args": to_json(dict(args)), "source": str(source),
        "requested_by": who, "reason": reason,
        "requested_at": time.time() if now is None else now, "status": str(RequestStatus.PENDING),
    }
    with engine.begin() as conn:
        return int(conn.execute(insert(CommandRequestRow).values(**fit_row(CommandRequestRow, values))).inserted_primary_key[0])


def request_state(session: Session, request_id: int) -> RequestState | None:
    row = session.execute(
        select(CommandRequestRow.id, CommandRequestRow.run_id, CommandRequestRow.type, CommandRequestRow.status,
               CommandRequestRow.detail, CommandRequestRow.command_id, CommandRequestRow.decided_at)
        .where(CommandRequestRow.id == request_id)
    ).first()
    if row is None:
        return None
    return RequestState(id=row.id, run_id=row.run_id, type=row.type, status=RequestStatus(row.status),
                        detail=row.detail, command_id=row.command_id, decided_at=row.decided_at)


def wait_for_decision(
    engine: Engine,
    request_id: int,
    timeout_s: float,
    *,
    poll_s: float = 0.2,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RequestState:
    """Poll until the controller decided the request or ``timeout_s`` passed (then still pending)."""
    deadline = clock() + timeout_s
    while True:
        with Session(engine) as session:
            state = request_state(session, request_id)
        if state is None:
            raise LookupError(f"request {request_id} is not in the store")
        if state.status is not RequestStatus.PENDING or clock() >= deadline:
            return state
        sleep(poll_s)
