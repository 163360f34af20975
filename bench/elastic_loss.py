"""Final loss of the elastic run (world 4 -> 2 -> 4) vs the same steps uninterrupted at world 4,
for each declared batch policy / LR rule.

    python -m bench.elastic_loss --json OUT.json [--steps 150 --kill-at 20 --rejoin-at 30]
        [--policies proportional:sqrt keep:sqrt ...]

Every run is ``cliffguard train`` under torchrun on CPUs with the same model, data, seed, LR
schedule, declared global batch and number of steps (the issue's comparison: "an uninterrupted run
of the same steps"); no broker and no spike faults (the loss is the elastic mechanics' alone).
``proportional`` (= ``halve`` from world 4 to 2) trains the steps between the scale-down and the
scale-up at half the global batch, so it sees fewer samples (``samples_ratio``); ``keep`` keeps the
batch by gradient accumulation and sees the same samples. ``ratio`` = elastic final loss /
uninterrupted final loss; the goal is within 5 % (``within_5pct``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from cliffguard.demo_elastic import ElasticDemoConfig, run_elastic_demo, run_uninterrupted

DEFAULT_POLICIES = ("proportional:sqrt", "proportional:linear", "keep:sqrt")


def samples_ratio(steps: int, batch: int, scale_events: list[dict[str, Any]]) -> float:
    """Samples the elastic run trained on / the uninterrupted run's, from its scale events (steps
    redone count once: their first pass was lost with the killed world)."""
    total, step, b = 0, 0, batch
    for e in scale_events:
        total += (e["step"] - step) * b
        step, b = e["step"], e["global_batch"]
    total += (steps - step) * b
    return total / (steps * batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--kill-at", type=int, default=20)
    ap.add_argument("--rejoin-at", type=int, default=30)
    ap.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES), metavar="POLICY:RULE")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    base = dict(steps=args.steps, kill_at=args.kill_at, rejoin_at=args.rejoin_at, monitor=False, faults=())
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = run_uninterrupted(ElasticDemoConfig(**base, out_dir=str(Path(tmp) / "plain")))
        for spec in args.policies:
            policy, rule = spec.split(":")
            cfg = ElasticDemoConfig(**base, batch_policy=policy, lr_rule=rule, out_dir=str(Path(tmp) / spec.replace(":", "-")))
            r = run_elastic_demo(cfg)
            ratio = r["final_loss"] / plain["final_loss"] if r.get("final_loss") and plain.get("final_loss") else None
            runs[spec] = {**{k: v for k, v in r.items() if k != "logs"}, "ratio": ratio,
                          "within_5pct": ratio is not None and abs(ratio - 1) <= 0.05,
                          "samples_ratio": round(samples_ratio(args.steps, cfg.global_batch, r["scale_events"]), 4)}
    out = {"steps": args.steps, "kill_at": args.kill_at, "rejoin_at": args.rejoin_at, "uninterrupted": plain,
           "elastic": runs}
    print(f"{'run':<22} {'final loss':>10} {'ratio':>7} {'samples':>8} {'seconds':>8}  scale events")
    print(f"{'uninterrupted':<22} {plain['final_loss'] or float('nan'):>10.4f} {1.0:>7.3f} {1.0:>8.3f} "
          f"{plain['seconds']:>8.1f}")
    for spec, r in runs.items():
        events = "; ".join(f"@{e['step']} {e['from_world']}->{e['to_world']} B={e['global_batch']} lr {e['lr']:.2e} "
                           f"({e['seconds_lost']:.0f} s)" for e in r["scale_events"])
        print(f"{spec:<22} {r['final_loss'] or float('nan'):>10.4f} {r['ratio'] or float('nan'):>7.3f} "
              f"{r['samples_ratio']:>8.3f} {r['seconds']:>8.1f}  {events}{'' if r['ok'] else '  NOT OK'}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
