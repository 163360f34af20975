"""The goodput ledger alone: µs per event of ``Ledger.on_event``, and what saving it costs.

    python -m bench.goodput --json OUT.json [--steps 20000] [--repeat 3]

A run of ``--steps`` run-level ``step`` events (world 8) with a memory snapshot every 50 steps, a
heartbeat every 20, a pause and a validation every 1,000 steps and a rollback of 30 steps every
5,000 (``testing.goodput_script.Script`` writes them; built and decoded first, not timed) goes
through a fresh ledger ``--repeat`` times; the best is reported with ``os.getloadavg()``. Then
what the controller does with a ledger per batch: ``state_dict()`` and its JSON (saved with the
run's state), and ``summarize`` with its JSON (the ``goodput`` row), in µs and bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.summary import summarize
from testing.goodput_script import Script


def stream(steps: int) -> list:
    s = Script(world=8, step_s=0.5, wait_s=0.01)
    s.start()
    done: set[int] = set()
    while s.step < steps:
        if s.step % 50 == 0:
            s.snapshot(0.02)
        if s.step % 1000 == 999 and s.step not in done:
            done.add(s.step)
            s.ack("p" * 32, "pause", 0.1, "pause_validation")
            s.validation("v" * 32, 2.0, 2.0)
            s.ack("r" * 32, "resume", 0.5, "pause_validation")
        if s.step % 5000 == 4998 and s.step not in done:
            done.add(s.step)
            s.ack("b" * 32, "rollback", 1.0, "checkpoint_restore")
            s.rewind(s.step - 30)
        s.steps(1)
        if s.step % 20 == 0:
            s.emit("heartbeat", {"state": "running"})
    return s.events()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    events = stream(args.steps)
    best, ledger = float("inf"), Ledger()
    for _ in range(args.repeat):
        ledger = Ledger()
        t0 = time.perf_counter()
        for ev in events:
            ledger.on_event(ev)
        best = min(best, time.perf_counter() - t0)
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        state = json.dumps(ledger.state_dict())
    t1 = time.perf_counter()
    for _ in range(n):
        row = json.dumps(summarize(ledger))
    t2 = time.perf_counter()
    out = {"events": len(events), "us_per_event": 1e6 * best / len(events),
           "state_us": 1e6 * (t1 - t0) / n, "state_bytes": len(state), "row_us": 1e6 * (t2 - t1) / n,
           "row_bytes": len(row), "ettr": summarize(ledger)["ettr"], "load": os.getloadavg()[0]}
    print(f"{'events':>8} {'µs/event':>9} {'state µs':>9} {'state B':>8} {'row µs':>7} {'row B':>6} {'load':>5}")
    print(f"{out['events']:>8} {out['us_per_event']:>9.2f} {out['state_us']:>9.0f} {out['state_bytes']:>8} "
          f"{out['row_us']:>7.0f} {out['row_bytes']:>6} {out['load']:>5.2f}")
    with open(args.json, "w") as fh:
        json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
