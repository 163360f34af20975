"""Detection on real loss curves: the controller's rules replayed over a labelled folder, beside the anchors.

    python -m bench.detection --curves ../shared/curves --json OUT.json [--config cliffguard.toml]
                              [--set spike.budget=3 ...] [--sweep spike.budget=0.3,1,3] [--no-anchors]

Each ``*.csv`` in the folder is replayed with ``controller.backtest`` (the controller's own
rules and defaults, or a TOML's ``[rules]``; a ``grad_norm`` column is read) and scored against
``labels.json`` there by ``controller.backtest_score``: recall of the labelled windows, criticals
per 10k points on the negatives and on the hard negatives, rollbacks and criticals on the
data-outlier curves, the median detection delay in steps and in logged points, and a per-curve
table. In the same run the anchors' rules (``bench/anchors.py``: this project's seed rule,
OLMo-core's and llm-foundry's) are scored on the same curves and printed side by side.
``--set`` overrides one rule field for this run; ``--sweep`` prints the trade-off table of one
field instead (the anchors beside it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.anchors import ANCHORS
from cliffguard.commands.backtest import rules_maker
from cliffguard.controller import backtest_score as sc


def parse_sets(items: list[str]) -> dict[str, dict[str, Any]]:
    """``section.field=value`` (a bare field is ``spike``) -> ``{"spike": {...}, "rules": {section: {...}}}``."""
    out: dict[str, Any] = {"spike": {}, "rules": {}}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        section, _, name = key.strip().rpartition(".")
        table = out["spike"] if section in ("", "spike") else out["rules"].setdefault(section, {})
        table[name] = value.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.detection", description=__doc__.split("\n\n")[0])
    p.add_argument("--curves", required=True, help="folder of step,loss CSVs with a labels.json")
    p.add_argument("--labels", help="labels file (default: labels.json in --curves)")
    p.add_argument("--config", help="TOML whose [rules] section is used (default: the controller's defaults)")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override one rule field")
    p.add_argument("--sweep", metavar="FIELD=V1,V2,...", help="print the trade-off table over these values")
    p.add_argument("--only", nargs="*", help="replay only these curve names")
    p.add_argument("--json", help="write the figures to this file")
    p.add_argument("--no-anchors", action="store_true", help="leave the anchors' rules out")
    args = p.parse_args(argv)

    folder = Path(args.curves)
    labels = sc.load_labels(args.labels or folder / "labels.json")
    make = rules_maker(args.config, parse_sets(args.set), env={})
    t0 = time.perf_counter()
    if args.sweep:
        key, _, values = args.sweep.partition("=")
        results = sc.sweep(folder, labels, key, [v for v in values.split(",") if v], make)
        print("\n".join(sc.sweep_table(results)))
        doc: dict[str, Any] = {"sweep": results}
    else:
        rows = sc.replay_folder(folder, labels, make({}), args.only)
        doc = sc.to_dict(rows)
        print("\n".join(sc.table(rows)))
        print(sc.summary_line(doc["summary"]))
    if not args.no_anchors:
        side = [] if args.sweep else [{"name": "cliffguard (defaults)" if not args.set and not args.config
                                       else "cliffguard (as set)", **doc["summary"]}]
        for name, rule in ANCHORS.items():
            summary = sc.summarize(sc.replay_folder(folder, labels, names=args.only, replay=rule))
            side.append({"name": name, **summary})
        print()
        print("\n".join(sc.sweep_table(side, label="rule")))
        doc["anchors"] = side
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
