"""Loss of the elastic run (world 4 -> 2 -> 4) vs the same steps uninterrupted at world 4, for each
declared batch policy / LR rule.

    python -m bench.elastic_loss --json OUT.json [--steps 150 --kill-at 20 --rejoin-at 30]
        [--policies proportional:sqrt proportional:linear ...]

Runtime: one ``cliffguard train`` launch per run (the uninterrupted one, then one per policy), each
~2-3 minutes on 2 loaded cores (150 steps paced at 0.4 s, ~45 s lost at the scale-down's
rendezvous, ~15 s at the scale-up's); ``--policies`` with fewer entries or ``--steps`` shorten it.

Every run is ``cliffguard train`` under torchrun on CPUs with the same model, data, seed, LR
schedule, declared global batch and number of steps (the issue's comparison: "an uninterrupted run
of the same steps"); no broker and no spike faults (the loss is the elastic mechanics' alone).
``proportional`` (= ``halve`` from world 4 to 2) trains the steps between the scale-down and the
scale-up at half the global batch, so it sees fewer samples (``samples_ratio``); ``keep`` keeps the
batch by gradient accumulation and sees the same samples.

What is compared (from each run's progress mark, trainer/elastic.py):

- ``ratio`` = elastic ``val_loss`` / uninterrupted ``val_loss``: the loss of the finished model on
  the same fixed held-out batches (``final_eval_batches`` x ``val_batch_size`` sequences, the same
  seeded choice at every world size). The goal is within 5 % (``within_5pct``: ratio <= 1.05).
- ``ratio_mean`` = the mean training loss of the last ``loss_window`` steps, elastic / uninterrupted
  (after the scale-up the two runs train on different batches, so a single step's loss — the
  ``ratio_last`` the earlier version compared — differs by the batch as much as by the model).

The seeds are the same; the step at which the rejoining agent scales the run back up depends on the
machine's load (``scale_events``), so the stretch at half the batch varies between runs.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from cliffguard.demo_elastic import ElasticDemoConfig, run_elastic_demo, run_uninterrupted
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.elastic import ElasticConfig, progress_mark_path

DEFAULT_POLICIES = ("proportional:sqrt", "proportional:linear", "proportional:none", "keep:sqrt")


def samples_ratio(steps: int, batch: int, scale_events: list[dict[str, Any]]) -> float:
    """Samples the elastic run trained on / the uninterrupted run's, from its scale events (steps
    redone count once: their first pass was lost with the killed world)."""
    total, step, b = 0, 0, batch
    for e in scale_events:
        total += (e["step"] - step) * b
        step, b = e["step"], e["global_batch"]
    total += (steps - step) * b
    return total / (steps * batch)


def losses(cfg: ElasticDemoConfig) -> dict[str, float | None]:
    """The finished run's held-out loss, mean of its last steps' training loss and last step's loss."""
    try:
        run = TrainConfig(run=cfg.run, out_dir=cfg.out_dir)  # the demo's runs keep the default checkpoint dir
        mark = json.loads(progress_mark_path(run.checkpoint.dir, run.run).read_text())
    except (OSError, ValueError):
        mark = {}
    return {"val_loss": mark.get("val_loss"), "loss_mean": mark.get("loss_mean"), "loss_last": mark.get("loss")}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a and b else None


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
        plain_cfg = ElasticDemoConfig(**base, out_dir=str(Path(tmp) / "plain"))
        plain = run_uninterrupted(plain_cfg) | losses(plain_cfg)
        for spec in args.policies:
            policy, rule = spec.split(":")
            cfg = ElasticDemoConfig(**base, batch_policy=policy, lr_rule=rule, out_dir=str(Path(tmp) / spec.replace(":", "-")))
            r = run_elastic_demo(cfg) | losses(cfg)
            ratio = _ratio(r["val_loss"], plain["val_loss"])
            runs[spec] = {**{k: v for k, v in r.items() if k != "logs"}, "ratio": ratio,
                          "ratio_mean": _ratio(r["loss_mean"], plain["loss_mean"]),
                          "ratio_last": _ratio(r["loss_last"], plain["loss_last"]),
                          "within_5pct": ratio is not None and ratio <= 1.05,
                          "samples_ratio": round(samples_ratio(args.steps, cfg.global_batch, r["scale_events"]), 4)}
    default = ElasticConfig()
    default_spec = f"{default.batch_policy}:{default.lr_rule}"
    out = {"steps": args.steps, "kill_at": args.kill_at, "rejoin_at": args.rejoin_at, "uninterrupted": plain,
           "elastic": runs, "default": default_spec,
           "default_within_5pct": runs[default_spec]["within_5pct"] if default_spec in runs else None}
    nan = float("nan")
    print(f"{'run':<22} {'val loss':>9} {'ratio':>7} {'mean K':>8} {'ratio':>7} {'last':>8} {'ratio':>7} "
          f"{'samples':>8} {'seconds':>8}  scale events")
    print(f"{'uninterrupted':<22} {plain['val_loss'] or nan:>9.4f} {1.0:>7.3f} {plain['loss_mean'] or nan:>8.4f} "
          f"{1.0:>7.3f} {plain['loss_last'] or nan:>8.4f} {1.0:>7.3f} {1.0:>8.3f} {plain['seconds']:>8.1f}")
    for spec, r in runs.items():
        events = "; ".join(f"@{e['step']} {e['from_world']}->{e['to_world']} B={e['global_batch']} lr {e['lr']:.2e} "
                           f"({e['seconds_lost']:.0f} s)" for e in r["scale_events"])
        print(f"{spec + (' (default)' if spec == default_spec else ''):<22} {r['val_loss'] or nan:>9.4f} "
              f"{r['ratio'] or nan:>7.3f} {r['loss_mean'] or nan:>8.4f} {r['ratio_mean'] or nan:>7.3f} "
              f"{r['loss_last'] or nan:>8.4f} {r['ratio_last'] or nan:>7.3f} {r['samples_ratio']:>8.3f} "
              f"{r['seconds']:>8.1f}  {events}{'' if r['ok'] else '  NOT OK'}")
    print(f"ratio = held-out val loss, elastic / uninterrupted (goal <= 1.05); mean K = mean training loss of the "
          f"last {default.loss_window} steps; last = the last step's loss; default rule {default_spec}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
