"""Operator actions from the dashboard: token check, then an unsigned request for the controller.

A command from the page is never signed or sent from here: the dashboard holds no signing key.
``request_command`` writes one row into ``command_requests`` (who asked for what, and when) via
``controller.store.requests.submit_request``; the controller validates it, signs the command with
its own secret, topic and lifetime, records it with an audit row and queues it through its outbox,
or rejects the request with a reason. A wrong or missing token writes nothing at all.
"""

from __future__ import annotations

import hmac
from typing import Any

from cliffguard.controller.store.requests import RequestSource, submit_request
from cliffguard.core.enums import CommandType
from cliffguard.core.rank_arrays import MAX_DETAIL_STEPS
from cliffguard.dashboard.config import DashboardConfig
from cliffguard.dashboard.store_access import request_writer

OPERATOR_ACTIONS = (CommandType.PAUSE, CommandType.RESUME, CommandType.VALIDATE, CommandType.ROLLBACK,
                    CommandType.DETAIL)


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


def detail_args(steps: int) -> dict[str, Any]:
    if not 1 <= steps <= MAX_DETAIL_STEPS:
        raise ActionDenied(f"steps: must be in [1, {MAX_DETAIL_STEPS}]")
    return {"steps": int(steps)}


def request_command(
    cfg: DashboardConfig,
    *,
    run_id: str,
    ctype: CommandType,
    args: dict[str, Any],
    actor: str,
    token: str | None,
) -> int:
    """Check the token, then insert the unsigned request; its id (the controller decides it)."""
    if not cfg.operator_token:
        raise ActionDenied("operator actions are disabled: no operator token is configured (CLIFFGUARD_OPERATOR_TOKEN)")
    if not token_ok(token, cfg.operator_token):
        raise ActionDenied("wrong operator token")
    if ctype not in OPERATOR_ACTIONS:
        raise ActionDenied(f"{ctype} is not an operator action here")
    actor = actor.strip() or "anonymous"
    try:
        with request_writer(cfg.db_url) as engine:
            return submit_request(engine, run_id=run_id, type=ctype, args=args, requested_by=f"dashboard:{actor}",
                                  source=RequestSource.DASHBOARD, reason=args.get("reason"))
    except ValueError as exc:
        raise ActionDenied(str(exc)) from None
