"""``cliffguard nodes``: the suspect-node store (issue 22). A node the controller evicted (a bad rank,
a rank out of transient budget, a hang's culprit that hung again, a failed node check) is not
admitted to any run until cleared: a run it beats in restarts without it, or halts for a human
naming it.

- ``cliffguard nodes [--all] [--json]``: the suspect nodes, why, since when, the run and incident that
  evicted them; ``--all`` adds the cleared records (how and by whom);
- ``cliffguard nodes clear NODE --reason TEXT``: admit it again now;
- ``cliffguard nodes recheck NODE``: admit it on probation; the next node check that passes with it
  (a restarted worker group's pre-flight check) clears it, one that finds it slow evicts it again.

Both are audited (the store's ``audit`` table, actor ``--actor``). The controller sees a change within
``REFRESH_S`` (10 s, controller/suspects.py).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime

from cliffguard.commands.controller import add_common, open_store_quietly
from cliffguard.commands.json_stdout import emit


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("nodes", help="the suspect nodes kept out of every run; clear or recheck one",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=["list", "clear", "recheck"], default="list",
                   help="list (default), clear NODE or recheck NODE")
    p.add_argument("node", nargs="?", help="the node's id (as the launcher's --node-id, or its host name)")
    p.add_argument("--reason", help="why it may come back (clear: required; kept with the record)")
    p.add_argument("--actor", default="cli", help="who is acting, for the audit row (default cli)")
    p.add_argument("--all", action="store_true", help="list cleared records too")
    add_common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def run(args: argparse.Namespace) -> int:
    from cliffguard.controller.store import read
    from cliffguard.controller.store.suspects import ask_recheck, clear_suspect

    if args.action != "list" and not args.node:
        print(f"cliffguard nodes: {args.action} needs a NODE")
        return 2
    if args.action == "clear" and not args.reason:
        print("cliffguard nodes: clear needs --reason (why the node may train again; it is audited)")
        return 2
    store = open_store_quietly(args, "nodes")
    if store is None:
        return 2
    try:
        with store.session() as s:
            if args.action == "clear":
                n = clear_suspect(s, args.node, by=args.actor, reason=args.reason, now=time.time())
            elif args.action == "recheck":
                n = ask_recheck(s, args.node, by=args.actor, now=time.time())
            rows = read.suspect_nodes(s, cleared=args.all, limit=None)
    finally:
        store.close()
    if args.action != "list":
        if not n:
            print(f"cliffguard nodes: {args.node} is not suspect; nothing to {args.action}")
            return 1
        done = ("cleared: admitted to runs again" if args.action == "clear"
                else "on probation: admitted, and cleared by the next node check that passes with it")
        print(f"node {args.node}: {n} record(s) {done}")
        return 0
    if args.json:
        emit(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no suspect nodes" + ("" if args.all else " (--all lists the cleared ones)"))
        return 0
    for r in rows:
        state = ("cleared " + _when(r["cleared_at"]) + f" by {r['cleared_by']}: {r['clear_reason']}" if r["cleared_at"]
                 else "on probation (recheck asked " + _when(r["recheck_at"]) + ")" if r["recheck_at"]
                 else "SUSPECT: not admitted")
        print(f"{r['node']:<24} {r['cause']:<18} since {_when(r['since'])}  run {r['run_id']}  "
              f"incident {(r['incident_id'] or '-')[:8]}  records {r['records']}  {state}")
        print(f"{'':<24} why: {r['reason']}")
    return 0
