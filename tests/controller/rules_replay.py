"""Recorded verdicts of the whole rule set on fixed event streams: the faster rules must judge alike.

``streams()`` builds deterministic event streams that reach the corners of the per-rank and loss
rules: ``ranks`` arrays with a straggler that recovers, an MFU drop, a memory leak, NaN/inf/0
timings and non-positive MFU, chunks out of order and a lower rank turning up late, a rollback
replay, an elastic scale change (rebaseline), per-rank ``step`` events of older agents, and loss
curves logged every step and every 10 steps. ``replay`` feeds one to a ``RunDetector`` (restored
from its JSON state half-way, as the controller does) and records every verdict and a digest of
every rule's state at checkpoints.

``tests/controller/rules_replay.json`` holds what the code before the vectorised rules recorded
(``python tests/controller/rules_replay.py --write tests/controller/rules_replay.json`` run with
that checkout first on ``PYTHONPATH``); ``test_rules_replay.py`` compares the current code to it.
The loss rules' verdicts and state were recorded again when the spike rule became budget-driven, and its state again when the cold start measured against the median
(issue 26: its tail model, evidence counted in points); every other rule's verdicts and state
digests were checked identical to the earlier recording before it was replaced.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.rules.memory import MemoryConfig
from cliffguard.controller.rules.mfu import MfuConfig
from cliffguard.controller.rules.straggler import StragglerConfig
from cliffguard.controller.verdict import Verdict
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, decode_event, encode_event, make_event
from cliffguard.core.rank_arrays import summarize_losses
from cliffguard.core.spike import SpikeConfig

RUN = "replay"
GIB = 2**30


def _ev(type_: EventType, step: int, data: dict[str, Any], rank: int = 0, world: int = 1, ts: float = 0.0) -> Event:
    return decode_event(encode_event(make_event(type_, RUN, step, data, rank=rank, world=world, ts=ts)))


def _loss(step: int, rng: random.Random) -> float:
    x = 3.0 / (1 + step / 300) + 0.5 + 0.01 * rng.gauss(0, 1)
    if step == 300:
        x *= 1.6
    if step >= 560:
        x *= 1 + 0.004 * (step - 560)
    return float("nan") if step == 420 else x


def _step_data(step: int, loss: float, world: int, run_level: bool, **perf: Any) -> dict[str, Any]:
    data = {"loss": loss, "loss_local": loss, "lr": 1e-3, "lr_scale": 1.0, "grad_norm": 1.0 + 0.05 * (step % 7),
            "tokens": 1024, "step_time_s": 0.5, "data_wait_s": 0.01, "comm_exposed_s": 0.05, "compute_s": 0.44,
            "tokens_per_s": 2e4, "mfu": 0.5, "mem_allocated": 1000, "mem_reserved": 1200,
            "loss_scale": 1.0, "skipped": False, "clipped_layers": 0, "guard": "ok",
            "sample_range": [step * 8, step * 8 + 8]}
    data.update(perf)
    if run_level:
        data["rank_losses"] = summarize_losses([loss if math.isfinite(loss) else 0.0] * min(world, 8))
    return data


def _perf(step: int, rank: int, rng: random.Random) -> dict[str, Any]:
    busy = 0.4 * math.exp(0.1 * rng.gauss(0, 1))
    if rank == 37 and 200 <= step < 330:
        busy *= 2.2  # a straggler that recovers
    data_wait = 0.01 + (0.4 if step >= 450 else 0.0)  # the MFU drop: data wait grows
    comm = 0.05 + 0.01 * rng.random()
    st = busy + data_wait + comm
    mfu = 0.5 * 0.46 / st
    alloc = 30 * GIB + int(GIB * 0.01 * rng.random())
    cached = 2 * GIB + int(0.05 * GIB * rng.random()) + (int(40e6) * max(0, step - 100) if rank == 5 else 0)
    if step % 50 == 0 and rank == 6:
        cached += GIB  # a burst
    odd = {(250, 10): ("step_time_s", math.nan), (260, 11): ("step_time_s", math.inf), (270, 12): ("step_time_s", 0.0),
           (280, 14): ("mfu", math.nan), (290, 15): ("mfu", 0.0), (300, 16): ("mfu", -1.0),
           (310, 17): ("mfu", math.inf)}
    out = {"step_time_s": st, "data_wait_s": data_wait, "comm_exposed_s": comm, "mfu": mfu,
           "tokens_per_s": 8000.0, "mem_allocated": alloc, "mem_reserved": alloc + cached, "loss_local": 3.0}
    if rank == 13 and step % 20 == 0:
        out["comm_exposed_s"] = st * 1.5  # exposed communication beyond the step time
    if rank == 18 and 240 <= step < 260:
        out["step_time_s"] = math.inf  # inf timings: the MFU rule still uses this rank's points
    if (step, rank) in odd:
        name, value = odd[(step, rank)]
        out[name] = value
    return out


def array_stream(seed: int = 1, world: int = 48, chunk: int = 16, every: int = 5, n: int = 700) -> Iterator[Event]:
    rng = random.Random(seed)
    elastic = {"from_world": world, "to_world": world, "from_global_batch": 64, "global_batch": 32,
               "grad_accum": 1, "lr": 1e-3, "lr_factor": 0.7, "steps_lost": 3, "seconds_lost": 12.0,
               "backoff_s": 0.0, "policy": "halve", "lr_rule": "sqrt"}
    steps = list(range(0, 600)) + list(range(580, n))  # a rollback to 580 at 600, replayed
    for k in steps:
        loss = _loss(k, rng)
        yield _ev(EventType.STEP, k, _step_data(k, loss, world, True), 0, world)
        if k == 500:
            yield _ev(EventType.ELASTIC_SCALED_DOWN, k, elastic, 0, world)
        if k and k % every == 0:
            firsts = list(range(0, world, chunk))
            if k < 100:
                firsts = firsts[1:]  # rank 0's chunk turns up late: a lower speaker then
            elif k % 3 == 0:
                firsts = firsts[::-1]  # chunks out of order
            for first in firsts:
                rows = [_perf(k, r, rng) for r in range(first, min(world, first + chunk))]
                data: dict[str, Any] = {"first_rank": first, "steps": every}
                for name in rows[0]:
                    data[name] = [row[name] for row in rows]
                yield _ev(EventType.RANKS, k, data, first, world)


def per_rank_stream(seed: int = 2, world: int = 4, n: int = 560) -> Iterator[Event]:
    """Older agents: every rank's own ``step`` event (no loss summary); rank 0 silent at first."""
    rng = random.Random(seed)
    for k in range(n):
        loss = _loss(k, rng)
        for r in range(world - 1, -1, -1):
            if r == 0 and k < 40:
                continue
            perf = _perf(k, {1: 5, 2: 37}.get(r, r), rng)
            perf.pop("loss_local")
            yield _ev(EventType.STEP, k, _step_data(k, loss, world, False, **perf), r, world)


def loss_stream(seed: int = 3, every: int = 1, n: int = 3000) -> Iterator[Event]:
    rng = random.Random(seed)
    for k in range(0, n, every):
        loss = 2.0 / (1 + k / 800) + 0.8 + 0.02 * rng.gauss(0, 1) + (0.5 if k in (1200, 1210, 1220) else 0.0)
        if k >= 2400:
            loss += 0.0004 * (k - 2400)
        if k == 1800:
            loss = math.inf
        yield _ev(EventType.STEP, k, _step_data(k, loss, 8, True, grad_norm=1.0 + (40.0 if k == 900 else 0.01 * (k % 9)),
                                                loss_scale=2.0 ** (12 - (k - 1500) // 10 if 1500 <= k < 1600 else 12)),
                  0, 8)


def suite_streams() -> dict[str, list[Event]]:
    """The labelled per-rank suites of the rule tests, as older agents' per-rank step events."""
    from tests.controller.synthetic_metrics import memory_suite, rank_suite

    out = {}
    for run in rank_suite(1, 1, seed=9) + memory_suite(1, 2, seed=9):
        rng = random.Random(run.name)
        out[run.name] = [_ev(EventType.STEP, s, _step_data(s, _loss(s, rng), run.world, False, **d), r, run.world)
                         for s, r, d in run.events]
    return out


def small_config() -> RulesConfig:
    """Short windows, so the window boundaries are crossed often (an odd memory window: int medians)."""
    return RulesConfig(spike=SpikeConfig(window=20, min_history=10, window_steps=40),
                       straggler=StragglerConfig(window=8, confirm=2),
                       mfu=MfuConfig(window=8), memory=MemoryConfig(window=7))


def streams() -> dict[str, tuple[list[Event], RulesConfig | None]]:
    arrays = list(array_stream())
    per_rank = list(per_rank_stream())
    return {
        "arrays": (arrays, None), "arrays_small": (arrays, small_config()),
        "per_rank": (per_rank, None), "per_rank_small": (per_rank, small_config()),
        "loss_every_step": (list(loss_stream()), None), "loss_every_10": (list(loss_stream(every=10)), None),
        "loss_small": (list(loss_stream(n=1500)), small_config()),
        **{name: (events, None) for name, events in suite_streams().items()},
    }


def _verdict(v: Verdict) -> dict[str, Any]:
    return {"rule": v.rule, "level": str(v.level), "step": v.step, "message": v.message, "action": str(v.action),
            "onset_step": v.onset_step, "rank": v.rank, "evidence": v.evidence}


def _digest(state: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(state, allow_nan=True).encode()).hexdigest()[:16]


def content(rule: Any) -> dict[str, Any]:
    """What a rule's stored state holds, in the JSON-list layout the recording was made in: a
    packed state (controller/rules/packed.py) is loaded through JSON into a twin and read back as
    lists, so the digest checks the packing too."""
    if not hasattr(rule, "list_state_dict"):
        return rule.state_dict()
    twin = type(rule)(rule.config)
    twin.load_state_dict(json.loads(json.dumps(rule.state_dict(), allow_nan=True)))
    return twin.list_state_dict()


def replay(events: list[Event], config: RulesConfig | None) -> dict[str, Any]:
    """Every verdict (with the index of its event) and rule-state digests every 250 events; the
    detector is rebuilt from its JSON state half-way."""
    det = RunDetector(config)
    verdicts: list[list[Any]] = []
    digests: list[dict[str, str]] = []
    for i, ev in enumerate(events):
        if i == len(events) // 2:
            state = json.loads(json.dumps(det.state_dict(), allow_nan=True))
            det = RunDetector(config)
            det.load_state_dict(state)
        verdicts += [[i, _verdict(v)] for v in det.on_event(ev)]
        if i % 250 == 249 or i == len(events) - 1:
            digests.append({name: _digest(content(rule)) for name, rule in det.rules.items()})
    # through JSON, as the fixture is: the comparison is of what would be stored and sent
    return json.loads(json.dumps({"verdicts": verdicts, "digests": digests}, allow_nan=True))


def record() -> dict[str, Any]:
    return {name: replay(events, cfg) for name, (events, cfg) in streams().items()}


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"] or len(sys.argv) != 3:
        raise SystemExit("usage: python tests/controller/rules_replay.py --write OUT.json")
    with open(sys.argv[2], "w") as f:
        json.dump(record(), f, allow_nan=True, separators=(",", ":"))
        f.write("\n")
