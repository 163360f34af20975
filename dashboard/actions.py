"""Operator actions from the dashboard: token check, then the controller's own command path.

A command from the page is never sent to Kafka from here. It is written, in one transaction, as
a signed command row (source="operator"), an audit row and an outbox row by
``controller.operator.issue_operator_command``; the controller's outbox publisher sends it after
commit, exactly like the commands the controller decides itself. A wrong or missing token writes
nothing at all.
"""

from __future__ import annotations

import hmac
from typing import Any

from sqlalchemy import Engine

from controller.operator import UnknownRun, issue_operator_command
from controller.store.db import session_scope
from core.enums import CommandType
from core.events import SchemaError
from core.signing import Secret
from dashboard.config import DashboardConfig

OPERATOR_ACTIONS = (CommandType.PAUSE, CommandType.RESUME, CommandType.VALIDATE, CommandType.ROLLBACK)


class ActionDenied(Exception):
    """The action was refused before anything was written (the message says why)."""


def token_ok(given: str | None, expected: str | None) -> bool:
    """Constant-time comparison; no configured token means nobody may act."""
    if not expected or not given:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def rollback_args(to_step: int, lr_scale: float) -> dict[str, Any]:
    if to_step < 0:
        raise ActionDenied("to_step: must be >= 0")
    if not 0 < lr_scale <= 1:
        raise ActionDenied("lr_scale: must be in (0, 1]")
    return {"to_step": int(to_step), "lr_scale": float(lr_scale)}


def issue_command(
    engine: Engine,
    cfg: DashboardConfig,
    *,
    run_id: str,
    ctype: CommandType,
    args: dict[str, Any],
    actor: str,
    token: str | None,
) -> str:
    """Check the token, then write command + audit + outbox rows in one transaction; the command id."""
    if not cfg.operator_token:
        raise ActionDenied("operator actions are disabled: no operator token is configured (CLIFFGUARD_OPERATOR_TOKEN)")
    if not token_ok(token, cfg.operator_token):
        raise ActionDenied("wrong operator token")
    if not cfg.command_secret:
        raise ActionDenied("no command secret is configured (CLIFFGUARD_COMMAND_SECRET): commands could not be signed")
    if ctype not in OPERATOR_ACTIONS:
        raise ActionDenied(f"{ctype} is not an operator action here")
    actor = actor.strip() or "anonymous"
    try:
        secret = Secret(cfg.command_secret)
    except ValueError as exc:
        raise ActionDenied(str(exc)) from None
    try:
        with session_scope(engine) as session:
            row = issue_operator_command(
                session,
                run_id=run_id,
                type=ctype,
                args=args,
                actor=f"dashboard:{actor}",
                secret=secret,
                commands_topic=cfg.commands_topic,
                ttl_s=cfg.command_ttl_s,
            )
            return str(row.id)
    except (UnknownRun, SchemaError) as exc:  # nothing was committed
        raise ActionDenied(str(exc)) from None
