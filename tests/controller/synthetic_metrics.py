"""Labelled synthetic series for the non-loss rules (companion of ``synthetic.py``).

* ``grad_norm_suite`` — power-law decaying gradient norms with log-Student-t noise (σ 0.05-0.2
  in log units) and benign x1.5-x3 single-step outliers; injected ``gspike`` (1-5 steps at
  x10-x100, expected critical at once) and ``gnan`` (a non-finite norm on an unskipped step).
* ``loss_scale_suite`` — a dynamic loss scaler that starts at 2^16, halves on overflow (overflows
  more likely above the model's working scale 2^8-2^14, so it settles there) and doubles after
  100-2000 clean steps; injected ``collapse``: 8-30 consecutive overflows (expected warn).
* ``rank_suite`` — 2-8 ranks with log-normal step-time noise (σ 5-20%), x3 single-step hiccups,
  healthy MFU 0.45-0.55; injected slowdowns from an onset to the end: ``data_wait``,
  ``comm_exposed``, ``straggler`` (one rank's compute x1.6-x4; the others wait in communication)
  and ``compute`` (every rank's compute x1.5-x2). Each label names the expected MFU cause.
* ``memory_suite`` — per-rank reserved/allocated on 8-80 GiB devices with ±5% noise and 1 GiB
  single-step bursts; injected ``leak``: reserved-but-unallocated grows 2-20 MiB per step.

All labelled with ``synthetic.Label`` (onset, deadline, end, expected level) and seeded.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from tests.controller.synthetic import Curve, Label, _student_t

GIB = 2**30
MIB = 2**20


def grad_norm_curve(seed: int, n: int = 1500, kind: str | None = None) -> Curve:
    rng = random.Random(seed)
    g0, g_inf, t0 = rng.uniform(2, 20), rng.uniform(0.2, 1.0), rng.uniform(10, 100)
    sigma, df, p_out = rng.uniform(0.05, 0.2), rng.uniform(3, 6), rng.uniform(0.001, 0.005)
    values, outliers = [], []
    for t in range(n):
        g = (g_inf + (g0 - g_inf) * (1 + t / t0) ** -0.5) * math.exp(sigma * _student_t(rng, df))
        if t > 0 and rng.random() < p_out:
            g *= rng.uniform(1.5, 3.0)
            outliers.append(t)
        values.append(g)
    labels = []
    if kind is not None:
        onset = rng.randrange(300, n - 300)
        if kind == "gspike":
            width, factor = rng.randrange(1, 6), rng.uniform(10, 100)
            for i in range(width):
                values[onset + i] *= factor
            labels.append(Label(kind, onset, onset, onset + width, "critical"))
        elif kind == "gnan":
            values[onset] = math.inf if rng.random() < 0.5 else math.nan
            labels.append(Label(kind, onset, onset, onset, "critical"))
        else:
            raise ValueError(f"kind: unknown {kind!r}")
        outliers = [s for s in outliers if not onset <= s <= labels[0].end]
    return Curve(f"gn-{kind or 'clean'}-{seed}", seed, values, labels, outliers, noise=sigma)


def grad_norm_suite(n_clean: int = 20, n_each: int = 10, seed: int = 0) -> list[Curve]:
    out = [grad_norm_curve(seed * 1009 + i) for i in range(n_clean)]
    for k, kind in enumerate(("gspike", "gnan")):
        out += [grad_norm_curve(seed * 1009 + 5000 * (k + 1) + i, kind=kind) for i in range(n_each)]
    return out


def loss_scale_curve(seed: int, n: int = 3000, collapse: bool = False) -> Curve:
    rng = random.Random(seed)
    working = 2.0 ** rng.randrange(8, 15)
    growth_every = rng.randrange(100, 2001)
    p0 = rng.uniform(0.001, 0.01)
    onset = rng.randrange(500, n - 500) if collapse else -1
    length = rng.randrange(8, 31)
    scale, clean, values = 2.0**16, 0, []
    for t in range(n):
        values.append(scale)
        forced = onset <= t < onset + length
        if forced or rng.random() < min(1.0, p0 * 4.0 ** math.log2(scale / working)):
            scale, clean = scale / 2, 0
        else:
            clean += 1
            if clean >= growth_every:
                scale, clean = min(scale * 2, 2.0**24), 0
    labels = [Label("collapse", onset, onset + length + 1, onset + length + 250, "warn")] if collapse else []
    return Curve(f"ls-{'collapse' if collapse else 'clean'}-{seed}", seed, values, labels)


def loss_scale_suite(n_clean: int = 20, n_collapse: int = 20, seed: int = 0) -> list[Curve]:
    return ([loss_scale_curve(seed * 1013 + i) for i in range(n_clean)]
            + [loss_scale_curve(seed * 1013 + 7000 + i, collapse=True) for i in range(n_collapse)])


@dataclass(slots=True)
class RankRun:
    name: str
    world: int
    events: list[tuple[int, int, dict[str, Any]]]
    """(step, rank, step-event data) in arrival order."""
    labels: list[Label] = field(default_factory=list)
    cause: str | None = None
    slow_rank: int | None = None


RANK_KINDS = ("data_wait", "comm_exposed", "straggler", "compute")


def rank_run(seed: int, n: int = 600, kind: str | None = None) -> RankRun:
    rng = random.Random(seed)
    world = rng.randrange(2, 9)
    base = rng.uniform(0.05, 0.5)
    sigma = rng.uniform(0.05, 0.2)
    mfu0 = rng.uniform(0.45, 0.55)
    data_f, comm_f = rng.uniform(0.01, 0.05), rng.uniform(0.03, 0.08)
    onset = rng.randrange(150, n - 250) if kind else n
    slow_rank = rng.randrange(world)
    extra = {"data_wait": rng.uniform(0.5, 2.0), "comm_exposed": rng.uniform(0.5, 2.0),
             "straggler": rng.uniform(1.6, 4.0), "compute": rng.uniform(1.5, 2.0)}
    # MFU is mfu0 at the healthy median step time (the slowest rank's compute sets the pace).
    pace = sorted(max(base * math.exp(sigma * rng.gauss(0, 1)) for _ in range(world)) for _ in range(201))[100]
    healthy_time = pace + base * (data_f + comm_f)
    events = []
    for t in range(n):
        hurt = kind is not None and t >= onset
        computes = []
        for _r in range(world):
            c = base * math.exp(sigma * rng.gauss(0, 1))
            if rng.random() < 0.005:
                c *= 3.0
            computes.append(c)
        if hurt and kind == "straggler":
            computes[slow_rank] *= extra["straggler"]
        if hurt and kind == "compute":
            computes = [c * extra["compute"] for c in computes]
        slowest = max(computes)
        for r in range(world):
            data_wait = base * data_f * (1 + (extra["data_wait"] / data_f if hurt and kind == "data_wait" else 0))
            comm = base * comm_f * (1 + (extra["comm_exposed"] / comm_f if hurt and kind == "comm_exposed" else 0))
            comm += slowest - computes[r]  # synchronous all-reduce: fast ranks wait for the slowest
            step_time = computes[r] + data_wait + comm
            mfu = mfu0 * healthy_time / (slowest + data_wait + comm - (slowest - computes[r]))
            events.append((t, r, {"step_time_s": step_time, "data_wait_s": data_wait, "comm_exposed_s": comm,
                                  "compute_s": computes[r], "mfu": mfu}))
    labels = [Label(kind, onset, onset + 60, n - 1, "warn")] if kind else []
    return RankRun(f"rank-{kind or 'clean'}-{seed}", world, events, labels, kind,
                   slow_rank if kind == "straggler" else None)


def rank_suite(n_clean: int = 20, n_each: int = 8, seed: int = 0) -> list[RankRun]:
    out = [rank_run(seed * 1019 + i) for i in range(n_clean)]
    for k, kind in enumerate(RANK_KINDS):
        out += [rank_run(seed * 1019 + 3000 * (k + 1) + i, kind=kind) for i in range(n_each)]
    return out


def memory_run(seed: int, n: int = 1500, leak: bool = False) -> RankRun:
    rng = random.Random(seed)
    world = rng.randrange(1, 5)
    device = rng.uniform(8, 80) * GIB
    onset = rng.randrange(200, n // 2) if leak else n
    rate = rng.uniform(2, 20) * MIB
    alloc0 = [rng.uniform(0.3, 0.7) * device for _ in range(world)]
    frag0 = [rng.uniform(0.02, 0.1) * device for _ in range(world)]
    events = []
    for t in range(n):
        for r in range(world):
            alloc = alloc0[r] * (1 + rng.uniform(-0.05, 0.05))
            frag = frag0[r] * (1 + rng.uniform(-0.05, 0.05)) + (rate * (t - onset) if t >= onset else 0)
            if rng.random() < 0.005:
                frag += GIB
            events.append((t, r, {"mem_allocated": int(alloc), "mem_reserved": int(alloc + frag)}))
    labels = []
    if leak:
        reserved = max(a + f for a, f in zip(alloc0, frag0, strict=True))
        need = max(256 * MIB, 0.05 * reserved * 1.1)
        deadline = onset + int(need / rate) + 100  # growth reaches the bar, plus the median's lag
        labels.append(Label("leak", onset, deadline, n - 1, "warn"))
    return RankRun(f"mem-{'leak' if leak else 'clean'}-{seed}", world, events, labels)


def memory_suite(n_clean: int = 20, n_leak: int = 20, seed: int = 0) -> list[RankRun]:
    return ([memory_run(seed * 1021 + i) for i in range(n_clean)]
            + [memory_run(seed * 1021 + 9000 + i, leak=True) for i in range(n_leak)])
