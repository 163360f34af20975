"""``cliffguard backtest``: replay a ``step,loss`` CSV (or a stored run) through the controller's rules.

The rules and their defaults are exactly the controller's: the same resolution of ``--config``
(``cliffguard/config.py``: ``[spike]`` and ``[rules]``, then ``CLIFFGUARD_SPIKE__*`` /
``CLIFFGUARD_RULES__*`` variables), then the options below. Prints one line per step where the
controller would warn or act (``critical`` = it would pause the run) with the window stats;
``--json`` prints one JSON object instead. A CSV it cannot read is an error naming the line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# Option -> (section path, field). Only options given on the command line override the controller's.
_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "k_warn": (("spike",), "k_warn"),
    "k_crit": (("spike",), "k_crit"),
    "window": (("spike",), "window"),
    "min_history": (("spike",), "min_history"),
    "sigma_floor_rel": (("spike",), "sigma_floor_rel"),
    "patience": (("spike",), "patience"),
    "divergence_method": (("rules", "divergence"), "method"),
    "cusum_drift": (("rules", "divergence"), "drift"),
    "divergence_threshold": (("rules", "divergence"), "threshold"),
    "divergence_grace_steps": (("rules", "divergence"), "grace_steps"),
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("backtest", help="replay a step,loss CSV (or a stored run) through the controller's rules",
                       description=__doc__)
    p.add_argument("csv", nargs="?", help="CSV with step,loss rows (a header naming them is optional)")
    p.add_argument("--run", help="replay this stored run instead of a CSV (needs --db)")
    p.add_argument("--db", help="store URL for --run (e.g. sqlite:///cliffguard.db)")
    p.add_argument("--config", help="TOML file whose [spike] and [rules] sections the controller uses")
    p.add_argument("--json", action="store_true", help="print one JSON object: {source, points, events, summary, config}")
    g = p.add_argument_group("rule options (default: the controller's)")
    g.add_argument("--k-warn", type=float, help="spike: σ above the median that warns")
    g.add_argument("--k-crit", type=float, help="spike: σ above the median that is critical")
    g.add_argument("--window", type=int, help="spike: healthy losses in the window")
    g.add_argument("--min-history", type=int, help="spike: points before the rule decides")
    g.add_argument("--sigma-floor-rel", type=float, help="spike: σ floor as a fraction of the median")
    g.add_argument("--patience", type=int, help="spike: consecutive points above k_crit for critical")
    g.add_argument("--divergence-method", choices=("cusum", "runmin"), help="divergence test")
    g.add_argument("--cusum-drift", type=float, help="divergence: CUSUM allowance per step (σ)")
    g.add_argument("--divergence-threshold", type=float, help="divergence: alarm threshold")
    g.add_argument("--divergence-grace-steps", type=int, help="divergence: steps ignored at the start")
    g.add_argument("--no-divergence", action="store_true", help="turn the divergence rule off")
    return p


def _flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Flags for the resolver: {"spike": {...}, "rules": {"divergence": {...}}}."""
    out: dict[str, Any] = {"spike": {}, "rules": {"divergence": {}}}
    for opt, (path, field) in _FLAGS.items():
        value = getattr(args, opt, None)
        if value is not None:
            table = out
            for part in path:
                table = table[part]
            table[field] = value
    if args.no_divergence:
        out["rules"]["divergence"]["enabled"] = False
    return out


def resolve(args: argparse.Namespace):
    """The controller's rules (with the deployment's [spike]) as this backtest runs them."""
    from cliffguard.config import load_all

    return load_all(args.config, flags=_flags(args), sections=["rules"])


def run(args: argparse.Namespace) -> int:
    from controller import backtest as bt
    from core.settings import ConfigError, config_to_dict

    def fail(msg: str) -> int:
        print(f"cliffguard backtest: {msg}", file=sys.stderr)
        return 2

    if (args.csv is None) == (args.run is None):
        return fail("give either a CSV file or --run ID (with --db URL)")
    if args.run is not None and not args.db:
        return fail("--run needs --db URL")
    try:
        rules = resolve(args)["rules"]
    except (ConfigError, ValueError) as exc:
        return fail(str(exc))
    try:
        if args.csv is not None:
            points = bt.read_loss_csv_file(args.csv)
            events, n, source = bt.replay_points(points, rules), len(points), args.csv
        else:
            stored = bt.load_run_events(args.db, args.run)
            if not stored:
                return fail(f"run {args.run!r}: no step metrics in {args.db}")
            events, n, source = bt.replay_events(stored, rules), len(stored), f"run {args.run}"
    except bt.CsvError as exc:
        return fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read: say why, do not trace
        return fail(f"{type(exc).__name__}: {exc}")
    summary = bt.summary(events, n)
    if args.json:
        print(json.dumps({"source": source, "points": n, "events": [e.to_dict() for e in events],
                          "summary": summary, "config": bt.to_json(config_to_dict(rules))},
                         allow_nan=False))
        return 0
    print(f"{source}: {n} points, {summary['warn']} warn, {summary['critical']} critical")
    for e in events:
        ev = e.evidence
        stats = ""
        if ev.get("median") is not None:
            stats = f"  [median {ev['median']:.4g}, σ {ev['sigma']:.3g}, n {ev.get('n')}]"
        onset = f" (onset {e.onset_step})" if e.onset_step is not None and e.onset_step != e.step else ""
        print(f"step {e.step:>8}  {e.level:<8} {e.rule:<16} {e.message}{onset}{stats}")
    return 0
