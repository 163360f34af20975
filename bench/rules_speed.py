"""The detection rules alone: run-steps per second of ``RunDetector.on_event`` on decoded events.

    python -m bench.rules_speed --json OUT.json [--steps 3000] [--ranks 16384] [--repeat 3]

Two streams of one run, both decoded from their wire form first (decoding is not timed):

- ``step``: one run-level ``step`` event per step (rank 0, every rank's loss summarised), the
  O(1)-per-step stream of a healthy run;
- ``mix``: the same, plus every ``ranks_every`` steps the run's ``ranks`` events
  (``--ranks`` ranks in chunks of ``--chunk``), with per-rank timings and memory that vary;
- ``per_rank``: what older agents send, one per-rank ``step`` event per step from the one rank of
  a 1-rank run (no loss summary, so the straggler, MFU and memory rules judge every event):
  ``bench.controller_throughput``'s stream.

And ``state`` (``--only state``): what saving the straggler, MFU and memory rules' states costs
once their windows are full (``--warm`` steps of ``ranks`` sweeps): ``state_dict()`` plus the JSON
encode, bytes and ms per rule, packed (controller/rules/packed.py) and in the JSON-list layout
stored before (``list_state_dict``), in the same process. Two kinds of timings: the ``mix``
sweeps' (a few distinct values per rank) and ``noise`` (full-precision random timings and memory,
fresh every sweep: the low bytes of each number are incompressible, the floor of any packing).

The windows are filled by ``--warm`` steps first (not timed), then ``--steps`` steps are timed,
``--repeat`` times on fresh detectors; the best repeat is reported with ``os.getloadavg()``.
Figures are run-steps per second (a mix step counts once, whatever its events). No package of
this tree beyond ``controller``/``core`` is imported, so the same file can be run against
another checkout's code (``PYTHONPATH=OTHER python bench/rules_speed.py``) for a baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from typing import Any

from cliffguard.controller.detect import RULES, RunDetector
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, decode_event, encode_event, make_event
from cliffguard.core.rank_arrays import summarize_losses

RUN = "speed"
STREAMS = ("step", "mix", "per_rank")
STATE_KINDS = ("mix", "noise")


def healthy_loss(step: int) -> float:
    return 3.0 / (1 + step / 500) + 0.01 * ((step * 7919) % 11 - 5) / 5


def step_event(step: int, world: int, run_level: bool = True) -> Event:
    loss = healthy_loss(step)
    losses = [loss + 0.001 * ((r * 31 + step) % 7 - 3) for r in range(8)]
    data = {
        "loss": loss, "loss_local": loss, "lr": 1e-3, "lr_scale": 1.0, "grad_norm": 1.0 + 0.01 * (step % 5),
        "tokens": 1024, "step_time_s": 0.5, "data_wait_s": 0.01, "comm_exposed_s": 0.05, "compute_s": 0.44,
        "tokens_per_s": 20000.0, "mfu": 0.5, "mem_allocated": 1000, "mem_reserved": 1200, "loss_scale": 1.0,
        "skipped": False, "clipped_layers": 0, "guard": "ok", "sample_range": [step * 8, (step + 1) * 8],
    }
    if run_level:
        data["rank_losses"] = summarize_losses(losses)
    return decode_event(encode_event(make_event(EventType.STEP, RUN, step, data, rank=0, world=world)))


def ranks_chunks(variant: int, world: int, chunk: int, every: int, noise: bool = False) -> list[Event]:
    """One sweep of ``ranks`` events (step 0; the caller sets it), timings varying by rank and
    variant (``noise``: full-precision random ones, seeded by the variant)."""
    out = []
    rng = random.Random(variant)
    for first in range(0, world, chunk):
        n = min(chunk, world - first)
        rs = range(first, first + n)
        jitter = [rng.random() - 0.5 for _ in rs] if noise else [((r * 7919 + variant * 104729) % 97) / 97 - 0.5
                                                                 for r in rs]
        data: dict[str, Any] = {
            "first_rank": first, "steps": every,
            "step_time_s": [0.5 + 0.02 * j for j in jitter],
            "data_wait_s": [0.01 + 0.002 * j for j in jitter],
            "comm_exposed_s": [0.05 - 0.01 * j for j in jitter],
            "mfu": [0.45 - 0.01 * j for j in jitter],
            "tokens_per_s": [8000.0] * n,
            "mem_allocated": [40_000_000_000 + int(1e6 * j) for j in jitter],
            "mem_reserved": [60_000_000_000] * n,
            "loss_local": [3.0 + 0.001 * j for j in jitter],
        }
        out.append(decode_event(encode_event(make_event(EventType.RANKS, RUN, 0, data, rank=first, world=world))))
    return out


def stream(first: int, steps: int, *, world: int, chunk: int, every: int, kind: str,
           sweeps: list[list[Event]]) -> list[Event]:
    out: list[Event] = []
    for k in range(first, first + steps):
        out.append(step_event(k, 1, run_level=False) if kind == "per_rank" else step_event(k, world))
        if kind == "mix" and k and k % every == 0:
            out += [dataclasses.replace(ev, step=k) for ev in sweeps[(k // every) % len(sweeps)]]
    return out


def measure(args: argparse.Namespace, kind: str, sweeps: list[list[Event]]) -> dict[str, Any]:
    kw = {"world": args.ranks, "chunk": args.chunk, "every": args.ranks_every, "kind": kind, "sweeps": sweeps}
    warm = stream(0, args.warm, **kw)
    timed = stream(args.warm, args.steps, **kw)
    best = cpu = math.inf
    verdicts = 0
    registry = RULES
    for name in args.without:
        registry = registry.without(name)
    for _ in range(args.repeat):
        det = RunDetector(registry=registry)
        for ev in warm:
            det.on_event(ev)
        t0, c0 = time.perf_counter(), time.process_time()
        n = 0
        for ev in timed:
            n += len(det.on_event(ev))
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        verdicts = n
    # CPU seconds too: on a shared machine they move less than the wall clock
    return {"run_steps_per_s": args.steps / best, "run_steps_per_cpu_s": args.steps / cpu,
            "events_per_s": len(timed) / best, "events": len(timed), "steps": args.steps, "verdicts": verdicts,
            "loadavg": list(os.getloadavg())}


def measure_state(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    """Bytes and best-of-``--repeat`` ms of state_dict + JSON encode, packed and as lists."""
    from cliffguard.controller.rules.memory import MemoryRule
    from cliffguard.controller.rules.mfu import MfuRule
    from cliffguard.controller.rules.straggler import StragglerRule

    rules = [StragglerRule(), MfuRule(), MemoryRule()]
    sweeps = args.ranks_every
    for k in range(1, args.warm // sweeps + 1):
        variant = k if kind == "noise" else k % 4  # noise: no sweep repeats
        for ev in ranks_chunks(variant, args.ranks, args.chunk, sweeps, noise=kind == "noise"):
            ev = dataclasses.replace(ev, step=k * sweeps)
            for rule in rules:
                rule.on_event(ev)
    out: dict[str, Any] = {}
    for rule in rules:
        row: dict[str, Any] = {}
        stored = json.loads(json.dumps(rule.state_dict()))
        for layout in ("packed", "lists"):
            best = math.inf
            for _ in range(args.repeat):
                # a twin loaded from the stored state: its packed form is not cached yet, as after a new point
                twin = type(rule)(rule.config)
                twin.load_state_dict(stored)
                save = twin.state_dict if layout == "packed" else twin.list_state_dict
                t0 = time.perf_counter()
                text = json.dumps(save())
                best = min(best, time.perf_counter() - t0)
            row[layout] = {"bytes": len(text), "ms": best * 1e3}
        row["smaller"] = row["lists"]["bytes"] / row["packed"]["bytes"]
        row["faster"] = row["lists"]["ms"] / row["packed"]["ms"]
        out[rule.name] = row
    out["total"] = {layout: {m: sum(out[r.name][layout][m] for r in rules) for m in ("bytes", "ms")}
                    for layout in ("packed", "lists")}
    out["loadavg"] = list(os.getloadavg())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rules_speed", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=3000, help="timed steps per repeat")
    p.add_argument("--warm", type=int, default=600, help="steps fed before timing (fills the windows)")
    p.add_argument("--ranks", type=int, default=16_384)
    p.add_argument("--chunk", type=int, default=1024, help="ranks per ranks event")
    p.add_argument("--ranks-every", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--only", choices=(*STREAMS, "state"), help="measure one stream only (or the state saves)")
    p.add_argument("--without", action="append", default=[], metavar="RULE",
                   help="leave this rule out (e.g. heartbeat: its share of the mix); repeatable")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    sweeps = [ranks_chunks(v, args.ranks, args.chunk, args.ranks_every) for v in range(4)] if args.only in (
        None, "mix") else []
    out: dict[str, Any] = {"ranks": args.ranks, "chunk": args.chunk, "ranks_every": args.ranks_every,
                           "without": args.without}
    for name in STREAMS:
        if args.only in (None, name):
            out[name] = measure(args, name, sweeps)
    if args.only in (None, "state"):
        out["state"] = {kind: measure_state(args, kind) for kind in STATE_KINDS}
    print(f"{'stream':<9} {'run-steps/s':>12} {'per CPU-s':>10} {'events/s':>10} {'loadavg (1 min)':>16}")
    for name in STREAMS:
        if name in out:
            r = out[name]
            print(f"{name:<9} {r['run_steps_per_s']:>12,.0f} {r['run_steps_per_cpu_s']:>10,.0f} "
                  f"{r['events_per_s']:>10,.0f} {r['loadavg'][0]:>16.2f}")
    if "state" in out:
        print(f"\n{'state save':<18} {'packed MB':>10} {'ms':>8} {'lists MB':>10} {'ms':>8} {'smaller':>8} {'faster':>7}")
        for kind, rows in out["state"].items():
            for name in ("straggler", "mfu", "memory", "total"):
                r = rows[name]
                p_, l_ = r["packed"], r["lists"]
                print(f"{kind + ' ' + name:<18} {p_['bytes'] / 1e6:>10.2f} {p_['ms']:>8.0f} {l_['bytes'] / 1e6:>10.2f} "
                      f"{l_['ms']:>8.0f} {l_['bytes'] / p_['bytes']:>7.1f}x {l_['ms'] / p_['ms']:>6.1f}x")
            print(f"{kind + ' loadavg':<18} {rows['loadavg'][0]:>10.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
