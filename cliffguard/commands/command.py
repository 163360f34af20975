"""``cliffguard command RUN TYPE [...]``: ask the controller to send an operator command.

The CLI holds no signing key: it inserts an unsigned request (who, what, when) into the store
(``controller.store.requests``). The running controller validates it, signs the command with its
own secret, topic and lifetime, stores it with an audit row and queues it through its outbox, or
rejects the request with a reason. By default the CLI waits (``--timeout`` seconds) for that
decision and prints it; ``--no-wait`` prints the request id and returns. Exit status: 0 accepted
(or queued with ``--no-wait``), 1 rejected, 2 bad arguments or configuration, 3 no decision in
time (is the controller running?). ``cliffguard status RUN`` shows whether the trainer acked it.
"""

from __future__ import annotations

import argparse
import getpass

from cliffguard.commands.controller import add_common
from cliffguard.core.enums import CommandType
from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("command", help="ask the controller to sign and send an operator command to a run")
    p.add_argument("run", metavar="RUN", help="run id")
    p.add_argument("type", choices=[c.value for c in CommandType], help="command type")
    add_common(p)
    p.add_argument("--to-step", type=int, help="rollback: the checkpoint step to restore")
    p.add_argument("--lr-scale", type=float, help="rollback / set_lr_scale: absolute LR scale")
    p.add_argument("--skip-data", type=int, nargs=2, metavar=("FIRST", "END"),
                   help="rollback: skip sample indices [FIRST, END)")
    p.add_argument("--batches", type=int, help="validate: number of held-out batches")
    p.add_argument("--kind", choices=["memory", "incremental", "full"], help="checkpoint_now: kind")
    p.add_argument("--steps", type=int, help="detail: per-rank step events for this many steps (default 20)")
    p.add_argument("--reason", help="pause/resume/stop: free text recorded with the command")
    p.add_argument("--actor", default=None, help="who is acting (default: the login name)")
    p.add_argument("--wait", action=argparse.BooleanOptionalAction, default=True,
                   help="wait for the controller's decision and print it (default: wait)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the decision (default 15)")
    return p


def command_args(args: argparse.Namespace) -> dict:
    ctype = CommandType(args.type)
    out: dict = {}
    if ctype is CommandType.ROLLBACK:
        if args.to_step is None:
            raise ValueError("--to-step is required for rollback")
        out = {"to_step": args.to_step, "lr_scale": 1.0 if args.lr_scale is None else args.lr_scale}
        if args.skip_data:
            out["skip_data"] = list(args.skip_data)
    elif ctype is CommandType.SET_LR_SCALE:
        if args.lr_scale is None:
            raise ValueError("--lr-scale is required for set_lr_scale")
        out = {"lr_scale": args.lr_scale}
    elif ctype is CommandType.VALIDATE and args.batches is not None:
        out = {"batches": args.batches}
    elif ctype is CommandType.CHECKPOINT_NOW and args.kind:
        out = {"kind": args.kind}
    elif ctype is CommandType.DETAIL:
        out = {"steps": 20 if args.steps is None else args.steps}
    if args.reason and ctype in (CommandType.PAUSE, CommandType.RESUME, CommandType.STOP):
        out["reason"] = args.reason
    return out


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.store_open import open_recorded_store
    from cliffguard.controller.store.db import StoreConfig
    from cliffguard.controller.store.requests import (
        RequestSource,
        RequestStatus,
        submit_request,
        wait_for_decision,
    )
    from cliffguard.core.settings import build_config, load_toml

    try:
        toml = load_toml(args.config)
        store_cfg = build_config(StoreConfig, "store", toml=toml, flags={"url": args.db})
        cmd_args = command_args(args)
        if args.timeout <= 0:
            raise ValueError("--timeout must be > 0")
    except (ConfigError, ValueError) as exc:
        print(f"cliffguard command: {exc}")
        return 2
    store = open_recorded_store(store_cfg, "command")
    if store is None:
        return 2
    try:
        request_id = submit_request(store.engine, run_id=args.run, type=args.type, args=cmd_args,
                                    requested_by=args.actor or getpass.getuser(), source=RequestSource.CLI,
                                    reason=args.reason)
        print(f"requested {args.type} for run {args.run}: request {request_id} (the controller signs and queues it)")
        if not args.wait:
            return 0
        state = wait_for_decision(store.engine, request_id, args.timeout)
    finally:
        store.close()
    if state.status is RequestStatus.ACCEPTED:
        print(f"accepted: command {state.command_id} is in the controller's outbox")
        return 0
    if state.status is RequestStatus.REJECTED:
        print(f"rejected: {state.detail}")
        return 1
    print(f"no decision within {args.timeout:g}s: is the controller running? (request {request_id} stays pending)")
    return 3
