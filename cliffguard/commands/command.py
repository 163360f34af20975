"""``cliffguard command RUN TYPE [...]``: an operator command through the controller's outbox.

The command is signed, stored with an audit row and queued in the outbox in one transaction; the
running controller's outbox publisher sends it to ``<prefix>.commands``. Prints the command id;
``cliffguard status RUN`` shows whether the trainer acked it.
"""

from __future__ import annotations

import argparse
import getpass
import logging

from cliffguard.commands.controller import add_common
from core.enums import CommandType
from core.events import SchemaError
from core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("command", help="send an operator command to a run through the controller's outbox")
    p.add_argument("run", metavar="RUN", help="run id")
    p.add_argument("type", choices=[c.value for c in CommandType], help="command type")
    add_common(p)
    p.add_argument("--to-step", type=int, help="rollback: the checkpoint step to restore")
    p.add_argument("--lr-scale", type=float, help="rollback / set_lr_scale: absolute LR scale")
    p.add_argument("--skip-data", type=int, nargs=2, metavar=("FIRST", "END"),
                   help="rollback: skip sample indices [FIRST, END)")
    p.add_argument("--batches", type=int, help="validate: number of held-out batches")
    p.add_argument("--kind", choices=["memory", "incremental", "full"], help="checkpoint_now: kind")
    p.add_argument("--reason", help="pause/resume/stop: free text recorded with the command")
    p.add_argument("--actor", default=None, help="who is acting (default: the login name)")
    p.add_argument("--ttl", type=float, default=60.0, help="seconds the command stays valid (default 60)")
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
    if args.reason and ctype in (CommandType.PAUSE, CommandType.RESUME, CommandType.STOP):
        out["reason"] = args.reason
    return out


def run(args: argparse.Namespace) -> int:
    from cliffguard.commands.controller import command_secret
    from controller.operator import UnknownRun, issue_operator_command
    from controller.store.db import Store, StoreConfig
    from core.kafka_config import KafkaConfig
    from core.settings import build_config, load_toml

    logging.getLogger("alembic").setLevel(logging.WARNING)  # migrations are not news here
    try:
        toml = load_toml(args.config)
        kafka = build_config(KafkaConfig, "kafka", toml=toml, flags={"topic_prefix": args.topic_prefix})
        store_cfg = build_config(StoreConfig, "store", toml=toml, flags={"url": args.db})
        secret = command_secret(toml)
        cmd_args = command_args(args)
    except (ConfigError, ValueError) as exc:
        print(f"cliffguard command: {exc}")
        return 2
    store = Store.open(store_cfg)
    try:
        with store.session() as s:
            row = issue_operator_command(s, run_id=args.run, type=args.type, args=cmd_args,
                                         actor=args.actor or getpass.getuser(), secret=secret,
                                         commands_topic=kafka.commands_topic, ttl_s=args.ttl)
            cmd_id = row.id
    except (UnknownRun, SchemaError) as exc:
        print(f"cliffguard command: {exc}")
        return 1
    finally:
        store.close()
    print(f"queued {args.type} for run {args.run}: command {cmd_id} (the controller's outbox sends it)")
    return 0
