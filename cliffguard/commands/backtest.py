"""``cliffguard backtest``: replay a ``step,loss`` CSV, a folder of them, or a stored run through the controller's rules.

The rules and their defaults are exactly the controller's: the same resolution of ``--config``
(``cliffguard/config.py``: ``[spike]`` and ``[rules]``, then ``CLIFFGUARD_SPIKE__*`` /
``CLIFFGUARD_RULES__*`` variables), then the options below. For one CSV it prints one line per step where the controller would warn or act
(``critical`` = it would pause the run) with the window stats and the logging interval it
inferred; ``--json`` prints one JSON object instead. For a folder with ``--labels`` it scores
every curve (``controller.backtest_score``): recall per labelled window, criticals per 10k points
on negatives and on hard negatives, rollbacks on data-outlier curves, detection delay, the
per-curve table; ``--sweep FIELD=V1,V2`` prints the trade-off table over one rule field
(``--sweep budget=0.3,1,3``: recall against false alarms over the spike rule's budget). A CSV it cannot read is
an error naming the line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from cliffguard.commands.json_stdout import emit
from cliffguard.controller.rules.divergence import METHODS

# Option -> (section path, field). Only options given on the command line override the controller's.
_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "k_warn": (("spike",), "k_warn"),
    "k_crit": (("spike",), "k_crit"),
    "window": (("spike",), "window"),
    "min_history": (("spike",), "min_history"),
    "sigma_floor_rel": (("spike",), "sigma_floor_rel"),
    "budget": (("spike",), "budget"),
    "evidence_points": (("spike",), "evidence_points"),
    "window_steps": (("spike",), "window_steps"),
    "divergence_method": (("rules", "divergence"), "method"),
    "cusum_drift": (("rules", "divergence"), "drift"),
    "divergence_threshold": (("rules", "divergence"), "threshold"),
    "divergence_grace_steps": (("rules", "divergence"), "grace_steps"),
}


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("backtest", help="replay a step,loss CSV (or a stored run) through the controller's rules",
                       description=__doc__)
    p.add_argument("csv", nargs="?", metavar="CSV_OR_DIR",
                   help="CSV with step,loss rows (a header naming them is optional; extra columns are ignored "
                        "but grad_norm), or a folder of them to score with --labels")
    p.add_argument("--labels", help="labels JSON for a folder (default: labels.json in it)")
    p.add_argument("--sweep", metavar="FIELD=V1,V2,...",
                   help="folder only: the trade-off table over one rule field, e.g. budget=0.3,1,3 (section spike) "
                        "or divergence.confirm_points=1,3")
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
    g.add_argument("--budget", type=float, help="spike: false criticals per 10k points the threshold is set for")
    g.add_argument("--evidence-points", type=int, help="spike: logged points over which evidence adds up")
    g.add_argument("--window-steps", type=int, help="spike: steps of history the statistics use")
    g.add_argument("--divergence-method", choices=METHODS, help="divergence test")
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


def rules_maker(config: str | None, flags: dict[str, dict[str, Any]],
                env: dict[str, str] | None = None) -> Callable[[dict[str, dict[str, Any]]], Any]:
    """A function from ``{section: {field: value}}`` overrides (``spike`` or a rules section such as
    ``divergence``) to the controller's rules as ``config`` < ``env`` (the process environment when
    None) < ``flags`` < the overrides resolve them."""
    from cliffguard.config import load_all

    def make(extra: dict[str, dict[str, Any]]) -> Any:
        merged: dict[str, Any] = {"spike": dict(flags.get("spike", {})),
                                  "rules": {k: dict(v) for k, v in flags.get("rules", {}).items()}}
        for section, fields in extra.items():
            target = merged["spike"] if section == "spike" else merged["rules"].setdefault(section, {})
            target.update(fields)
        return load_all(config, env=env, flags=merged, sections=["rules"])["rules"]
    return make


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from cliffguard.controller import backtest as bt
    from cliffguard.core.settings import ConfigError, config_to_dict

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
    if args.csv is not None and Path(args.csv).is_dir():
        return _folder(args, rules, fail)
    if args.sweep or args.labels:
        return fail("--labels and --sweep need a folder of CSVs")
    extra: dict[str, Any] = {}
    try:
        if args.csv is not None:
            parsed = bt.parse_loss_csv_file(args.csv)
            points = parsed.points
            events, n, source = bt.replay_points(points, rules, parsed.grad_norms), len(points), args.csv
            extra = {"interval": bt.cadence([s for s, _ in points]), "skipped_rows": parsed.skipped_empty,
                     "grad_norm": parsed.grad_norms is not None}
        else:
            stored = bt.load_run_events(args.db, args.run)
            if not stored:
                return fail(f"run {args.run!r}: no step metrics in {args.db}")
            events, n, source = bt.replay_events(stored, rules), len(stored), f"run {args.run}"
            extra = {"interval": bt.cadence([e.step for e in stored])}
    except bt.CsvError as exc:
        return fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read: say why, do not trace
        return fail(f"{type(exc).__name__}: {exc}")
    summary = bt.summary(events, n)
    if args.json:
        emit(json.dumps({"source": source, "points": n, "events": [e.to_dict() for e in events],
                          "summary": summary, **extra, "config": bt.to_json(config_to_dict(rules))},
                         allow_nan=False))
        return 0
    every = extra["interval"]["interval_steps"]
    notes = [f"logged every {every:g} steps" + (" (irregular gaps)" if extra["interval"]["irregular"] else "")]
    if extra.get("skipped_rows"):
        notes.append(f"{extra['skipped_rows']} rows with an empty loss skipped")
    print(f"{source}: {n} points, {summary['warn']} warn, {summary['critical']} critical; " + "; ".join(notes))
    for e in events:
        print(_line(e))
    return 0


def _line(e) -> str:
    """One event as a text line; window stats only where the rule's evidence has them."""
    ev = e.evidence
    stats = ""
    med, sigma = ev.get("median"), ev.get("sigma", ev.get("log_sigma"))
    if isinstance(med, int | float) and isinstance(sigma, int | float):
        stats = f"  [median {med:.4g}, σ {sigma:.3g}, n {ev.get('n')}]"
    onset = f" (onset {e.onset_step})" if e.onset_step is not None and e.onset_step != e.step else ""
    return f"step {e.step:>8}  {e.level:<8} {e.rule:<16} {e.message}{onset}{stats}"


def _folder(args: argparse.Namespace, rules: Any, fail) -> int:
    from pathlib import Path

    from cliffguard.controller import backtest as bt
    from cliffguard.controller import backtest_score as sc
    from cliffguard.core.settings import ConfigError

    labels_path = Path(args.labels) if args.labels else Path(args.csv) / "labels.json"
    if not labels_path.is_file():
        return fail(f"{labels_path}: no labels file (give --labels FILE)")
    try:
        labels = sc.load_labels(labels_path)
        if args.sweep:
            key, sep, values = args.sweep.partition("=")
            if not sep or not values:
                return fail(f"--sweep {args.sweep!r}: expected FIELD=V1,V2,...")
            make = rules_maker(args.config, _flags(args))
            results = sc.sweep(args.csv, labels, key.strip(), [v.strip() for v in values.split(",") if v.strip()], make)
            if args.json:
                emit(json.dumps({"source": args.csv, "sweep": results}, allow_nan=False))
            else:
                print("\n".join(sc.sweep_table(results)))
            return 0
        rows = sc.replay_folder(args.csv, labels, rules)
    except bt.CsvError as exc:
        return fail(str(exc))
    except (ConfigError, ValueError, KeyError) as exc:
        return fail(f"{type(exc).__name__}: {exc}")
    doc = sc.to_dict(rows)
    if args.json:
        emit(json.dumps({"source": args.csv, **doc}, allow_nan=False))
        return 0
    print("\n".join(sc.table(rows)))
    print(sc.summary_line(doc["summary"]))
    return 0
