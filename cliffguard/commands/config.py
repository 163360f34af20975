"""``cliffguard config``: validate a configuration file and print what every component would use."""

from __future__ import annotations

import argparse
import json

from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("config", help="validate a TOML config (+ CLIFFGUARD_* env) and print the resolved values")
    p.add_argument("--config", help="TOML file (sections: kafka, spike, policy, secrets, store, retention, controller, "
                                    "recovery, rules, alerts, dashboard, train, model, data, checkpoint, agent)")
    p.add_argument("--section", action="append", help="only this section (repeatable)")
    return p


def run(args: argparse.Namespace) -> int:
    from cliffguard.config import load_all, resolved

    try:
        configs = load_all(args.config, sections=args.section)
    except ConfigError as exc:
        print(f"cliffguard config: {exc}")
        return 2
    print(json.dumps(resolved(configs), indent=2, sort_keys=True, default=str))
    return 0
