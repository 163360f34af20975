"""``cliffguard alerts``: alert endpoints' delivery state, and re-enabling one after an HTTP 410.

An endpoint that answered 410 Gone is disabled (its pending rows marked ``disabled``) so a
decommissioned receiver is not hammered for a day; once it is back, ``cliffguard alerts enable
NAME`` lets new alerts through again (old rows stay as they were: they are history). The change
is audited like every other operator action.
"""

from __future__ import annotations

import argparse
import json
import time

from cliffguard.commands.controller import add_common, resolve_common
from cliffguard.commands.json_stdout import emit
from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("alerts", help="alert endpoints' delivery state; re-enable one disabled by HTTP 410")
    p.add_argument("action", nargs="?", choices=["list", "enable", "disable"], default="list",
                   help="list (default), enable NAME or disable NAME")
    p.add_argument("name", nargs="?", help="endpoint name (as in [[alerts.endpoints]])")
    p.add_argument("--actor", default="cli", help="who is acting, for the audit row (default cli)")
    p.add_argument("--reason", default=None, help="why (disable); kept with the endpoint's state")
    add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.store_open import open_recorded_store
    from cliffguard.controller.alerts.enqueue import set_endpoint_disabled
    from cliffguard.controller.store import read
    from cliffguard.controller.store.models import AuditRow

    try:
        store_cfg = resolve_common(args, ["store"])["store"]
    except ConfigError as exc:
        print(f"cliffguard alerts: {exc}")
        return 2
    if args.action != "list" and not args.name:
        print(f"cliffguard alerts: {args.action} needs an endpoint NAME")
        return 2
    store = open_recorded_store(store_cfg, "alerts")
    if store is None:
        return 2
    try:
        with store.session() as s:
            if args.action != "list":
                now = time.time()
                disabled = args.action == "disable"
                reason = (args.reason or "disabled by an operator") if disabled else None
                set_endpoint_disabled(s, args.name, disabled=disabled, reason=reason, now=now)
                s.add(AuditRow(ts=now, actor=args.actor, action=f"alerts.{args.action}", run_id=None,
                               detail={"endpoint": args.name, "reason": reason}))
            table = read.alert_endpoints(s)
    finally:
        store.close()
    if args.json:
        emit(json.dumps(table, indent=2))
        return 0
    if not table:
        print("no alert endpoints have been used yet")
    for row in table:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(row["counts"].items()))
        state = f"DISABLED ({row['reason']})" if row.get("disabled") else "enabled"
        print(f"{row['endpoint']:<24} {state:<40} {counts or 'no deliveries'}")
    return 0
