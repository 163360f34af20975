"""Final loss of the elastic demo (world 4 -> 2 -> 4) vs the same steps uninterrupted at world 4.

    python -m bench.elastic_loss --json OUT.json [--steps 150 --kill-at 20 --rejoin-at 30]

Both runs are ``cliffguard train`` under torchrun on CPUs with the same model, data, seed, LR
schedule and declared global batch; the elastic one trains ``rejoin_at - kill_at`` (plus the
steps redone after the kill) at half the batch with the sqrt-rule LR. ``ratio`` = elastic final
loss / uninterrupted final loss; the goal is within 5 % (``within_5pct``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from cliffguard.demo_elastic import ElasticDemoConfig, run_elastic_demo, run_uninterrupted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    d = ElasticDemoConfig()
    ap.add_argument("--steps", type=int, default=d.steps)
    ap.add_argument("--kill-at", type=int, default=d.kill_at)
    ap.add_argument("--rejoin-at", type=int, default=d.rejoin_at)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = dict(steps=args.steps, kill_at=args.kill_at, rejoin_at=args.rejoin_at)
        plain = run_uninterrupted(ElasticDemoConfig(**base, out_dir=str(Path(tmp) / "plain")))
        elastic = run_elastic_demo(ElasticDemoConfig(**base, out_dir=str(Path(tmp) / "elastic")))
    ratio = (elastic["final_loss"] / plain["final_loss"]
             if elastic.get("final_loss") and plain.get("final_loss") else None)
    out = {"steps": args.steps, "uninterrupted": plain, "elastic": {k: v for k, v in elastic.items() if k != "logs"},
           "ratio": ratio, "within_5pct": ratio is not None and abs(ratio - 1) <= 0.05}
    print(f"{'run':<14} {'final loss':>10} {'seconds':>8}")
    print(f"{'uninterrupted':<14} {plain['final_loss'] or float('nan'):>10.4f} {plain['seconds']:>8.1f}")
    print(f"{'elastic':<14} {elastic['final_loss'] or float('nan'):>10.4f} {elastic['seconds']:>8.1f}")
    for e in elastic["scale_events"]:
        print(f"  step {e['step']}: world {e['from_world']} -> {e['to_world']}, batch {e['global_batch']}, "
              f"lr {e['lr']:.2e}, {e['steps_lost']} steps / {e['seconds_lost']:.1f} s lost")
    print(f"ratio {ratio if ratio is None else round(ratio, 4)} (goal within 5 %: {out['within_5pct']})")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
