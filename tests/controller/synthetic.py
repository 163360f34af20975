"""A labelled synthetic suite of training-loss curves, for choosing and testing the rules' defaults.

Real loss curves are heavy-tailed. Every curve here is built from the same parts:

* a power-law decay ``L(t) = L_inf + (L0 - L_inf) * (1 + t / t0) ** -alpha`` from ln(vocab);
* multiplicative Student-t noise (3-6 degrees of freedom, 0.5-2% scale);
* benign single-batch outliers of +15-70% (0.1-0.5% of steps) that must NOT be called critical;
* on some curves a warmup bump (a smooth +3-10% rise over ~50-150 steps) or a plateau (the
  curve holds flat for 200-500 steps, then continues) — benign too.

Injected events (at most one per curve, ``Label`` says where and what is expected):

* ``single`` — one step at x2-x4: expected to *warn*; critical there is tolerated, not required.
* ``few`` — 3-25 steps raised x1.3-x3, decaying back: expected critical within ``deadline``.
* ``stepup`` — the loss jumps x1.15-x1.6 and stays: expected critical.
* ``nan`` — a non-finite loss: critical at that very step.
* ``divergence`` — the loss climbs for hundreds of steps at a rate whose lag behind a trailing
  100-step median stays ~1-2.5 σ, so no single point stands out beyond 5 σ: expected critical
  within 400 steps of the onset.

``score`` counts recall (an alarm at least as severe as expected inside ``[onset, deadline]``)
and false alarms (a critical alarm outside every label's ``[onset, end]``; benign outliers,
bumps and plateaus are not labelled, so alarming on them counts against the rule). A critical
after which the loss is back to normal (``controller.backtest.outcomes`` says ``resume``: the
controller pauses, validates and resumes, flagging the batch as a data outlier) is level
``resumed``: as severe as a warn for recall, counted apart from false criticals. Real curves
(the extreme-point rule of ``core/spike.py``) made that distinction necessary: a single +35%
point is worth a pause and a validation, not a rollback.

Everything is seeded: ``suite(n_clean, n_each, seed)`` returns the same curves every time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median

KINDS = ("single", "few", "stepup", "nan", "divergence")


@dataclass(frozen=True, slots=True)
class Label:
    kind: str
    onset: int
    """First step of the excursion (what a rule's onset_step should name)."""
    deadline: int
    """Last step at which a detection still counts as on time."""
    end: int
    """Last step of the excursion: alarms in [onset, end] are never false alarms."""
    expect: str
    """The least severe level that counts as a detection: "warn" or "critical"."""


@dataclass(slots=True)
class Curve:
    name: str
    seed: int
    losses: list[float]
    labels: list[Label] = field(default_factory=list)
    outlier_steps: list[int] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    noise: float = 0.01
    """Relative scale of the Student-t noise."""

    @property
    def clean(self) -> bool:
        return not self.labels

    def points(self) -> list[tuple[int, float]]:
        return list(enumerate(self.losses))


def _student_t(rng: random.Random, df: float) -> float:
    z = rng.gauss(0.0, 1.0)
    chi2 = rng.gammavariate(df / 2.0, 2.0)
    # Unit variance, so `noise` is the standard deviation; clipped so the loss stays positive.
    t = z / math.sqrt(chi2 / df) * math.sqrt((df - 2.0) / df)
    return max(-12.0, min(12.0, t))


def base_curve(seed: int, n: int, *, features: Sequence[str] | None = None) -> Curve:
    """A healthy curve: power-law decay, heavy-tailed noise, outliers, maybe a bump/plateau."""
    rng = random.Random(seed)
    l0 = math.log(256.0)
    l_inf = rng.uniform(1.2, 2.8)
    alpha = rng.uniform(0.3, 0.8)
    t0 = rng.uniform(10.0, 80.0)
    noise = rng.uniform(0.005, 0.02)
    df = rng.uniform(3.0, 6.0)
    p_outlier = rng.uniform(0.001, 0.005)
    if features is None:
        features = [f for f, p in (("warmup_bump", 0.4), ("plateau", 0.4)) if rng.random() < p]
    bump_at = rng.uniform(80, 300)
    bump_h = rng.uniform(0.03, 0.10)
    bump_w = rng.uniform(15.0, 50.0)
    plat_start = rng.randrange(200, max(201, n // 2))
    plat_len = rng.randrange(200, 500)

    losses: list[float] = []
    outliers: list[int] = []
    for t in range(n):
        tt = float(t)
        if "plateau" in features and t >= plat_start:
            tt = float(plat_start) if t < plat_start + plat_len else float(t - plat_len)
        trend = l_inf + (l0 - l_inf) * (1.0 + tt / t0) ** -alpha
        if "warmup_bump" in features:
            trend *= 1.0 + bump_h * math.exp(-0.5 * ((t - bump_at) / bump_w) ** 2)
        loss = trend * (1.0 + noise * _student_t(rng, df))
        if t > 0 and rng.random() < p_outlier:
            loss *= 1.0 + rng.uniform(0.15, 0.70)
            outliers.append(t)
        losses.append(loss)
    return Curve(name=f"clean-{seed}", seed=seed, losses=losses, outlier_steps=outliers,
                 features=list(features), noise=noise)


def inject(curve: Curve, kind: str, seed: int) -> Curve:
    """A copy of ``curve`` with one labelled event of ``kind``."""
    rng = random.Random(seed * 7919 + KINDS.index(kind))
    n = len(curve.losses)
    losses = list(curve.losses)
    onset = rng.randrange(min(600, n // 3), n - min(800, n // 3))
    last = n - 1
    if kind == "single":
        losses[onset] *= rng.uniform(2.0, 4.0)
        label = Label(kind, onset, onset + 1, onset + 1, "warn")
    elif kind == "few":
        width = rng.randrange(3, 26)
        factor = rng.uniform(1.3, 3.0)
        for i in range(width):
            losses[onset + i] *= 1.0 + (factor - 1.0) * math.exp(-2.0 * i / width)
        label = Label(kind, onset, onset + 5, onset + width + 5, "critical")
    elif kind == "stepup":
        factor = rng.uniform(1.15, 1.6)
        for t in range(onset, n):
            losses[t] *= factor
        label = Label(kind, onset, onset + 5, last, "critical")
    elif kind == "nan":
        losses[onset] = math.nan
        label = Label(kind, onset, onset, onset, "critical")
    elif kind == "divergence":
        # Lag of a trailing 100-step median behind a linear climb is ~50 steps x slope; keep it
        # at c·σ with c in [1, 2.5] so no single point is a 5σ outlier.
        c = rng.uniform(1.0, 2.5)
        slope = c * curve.noise / 50.0
        for t in range(onset, n):
            losses[t] *= 1.0 + slope * (t - onset)
        label = Label(kind, onset, onset + 400, last, "critical")
    else:
        raise ValueError(f"kind: unknown {kind!r}")
    # Outliers inside the event are part of the event now.
    outliers = [s for s in curve.outlier_steps if not label.onset <= s <= label.end]
    return Curve(name=f"{kind}-{curve.seed}", seed=curve.seed, losses=losses, labels=[label],
                 outlier_steps=outliers, features=list(curve.features), noise=curve.noise)


def suite(n_clean: int = 30, n_each: int = 10, *, seed: int = 0, length: int = 2000) -> list[Curve]:
    """``n_clean`` healthy curves plus ``n_each`` curves of every injected kind."""
    curves = [base_curve(seed * 100_003 + i, length) for i in range(n_clean)]
    for k, kind in enumerate(KINDS):
        for i in range(n_each):
            s = seed * 100_003 + 10_000 * (k + 1) + i
            curves.append(inject(base_curve(s, length), kind, s))
    return curves


def max_trailing_z(curve: Curve, window: int = 100) -> float:
    """Largest excess of the *noise-free* trend over its trailing median, in units of σ.

    Used to check that divergence curves are slow: no point of the climb is itself an outlier.
    Approximated on the noisy curve by a 9-point running median (outliers removed).
    """
    xs = curve.losses
    smooth = [median(xs[max(0, i - 4): i + 5]) for i in range(len(xs))]
    worst = 0.0
    for i in range(window, len(xs)):
        ref = median(smooth[i - window: i])
        worst = max(worst, (smooth[i] - ref) / (curve.noise * ref))
    return worst


# ---------------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------------

_SEVERITY = {"warn": 1, "resumed": 1, "critical": 2}


@dataclass(slots=True)
class Score:
    curves: int = 0
    steps: int = 0
    labels: dict[str, int] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    delays: dict[str, list[int]] = field(default_factory=dict)
    false_critical: int = 0
    false_resumed: int = 0
    """Criticals outside every label that the loss recovered from at once (pause-validate-resume)."""
    false_warn: int = 0
    clean_curves: int = 0
    clean_curves_with_false_critical: int = 0
    outliers: int = 0
    outliers_called_critical: int = 0
    outliers_resumed: int = 0

    def recall(self, kind: str | None = None) -> float:
        kinds = [kind] if kind else list(self.labels)
        total = sum(self.labels.get(k, 0) for k in kinds)
        return sum(self.hits.get(k, 0) for k in kinds) / total if total else 1.0

    def false_critical_per_10k(self) -> float:
        return 1e4 * self.false_critical / max(1, self.steps)

    def false_warn_per_10k(self) -> float:
        return 1e4 * self.false_warn / max(1, self.steps)

    def median_delay(self, kind: str) -> float | None:
        d = self.delays.get(kind) or []
        return float(median(d)) if d else None

    def summary(self) -> dict[str, object]:
        return {
            "curves": self.curves,
            "steps": self.steps,
            "recall": {k: round(self.recall(k), 3) for k in sorted(self.labels)},
            "recall_all": round(self.recall(), 3),
            "median_delay": {k: self.median_delay(k) for k in sorted(self.labels)},
            "false_critical_per_10k_steps": round(self.false_critical_per_10k(), 3),
            "false_resumed_per_10k_steps": round(1e4 * self.false_resumed / max(1, self.steps), 2),
            "false_warn_per_10k_steps": round(self.false_warn_per_10k(), 2),
            "clean_curves_with_false_critical": f"{self.clean_curves_with_false_critical}/{self.clean_curves}",
            "outliers_called_critical": f"{self.outliers_called_critical}/{self.outliers}",
            "outliers_resumed": f"{self.outliers_resumed}/{self.outliers}",
        }


Alarms = Iterable[tuple[int, str]]
"""(step, level) pairs a rule raised on one curve; level is "warn", "resumed" or "critical"."""


def replay_alarms(curve: Curve, config: object = None) -> list[tuple[int, str]]:
    """The controller's rules (``controller.backtest``) on ``curve`` as alarms for ``score``."""
    from cliffguard.controller.backtest import outcomes, replay_points

    pts = curve.points()
    events = replay_points(pts, config)  # type: ignore[arg-type]
    return [(e.step, "resumed" if o == "resume" else e.level) for e, o in zip(events, outcomes(pts, events), strict=True)]


def score(curves: Sequence[Curve], run: Callable[[Curve], Alarms]) -> Score:
    out = Score()
    for curve in curves:
        alarms = [(int(s), str(lv)) for s, lv in run(curve)]
        out.curves += 1
        out.steps += len(curve.losses)
        for lab in curve.labels:
            out.labels[lab.kind] = out.labels.get(lab.kind, 0) + 1
            need = _SEVERITY[lab.expect]
            on_time = [s for s, lv in alarms if lab.onset <= s <= lab.deadline and _SEVERITY[lv] >= need]
            if on_time:
                out.hits[lab.kind] = out.hits.get(lab.kind, 0) + 1
                out.delays.setdefault(lab.kind, []).append(min(on_time) - lab.onset)
        crit_steps, resumed_steps = set(), set()
        for s, lv in alarms:
            if any(lab.onset <= s <= lab.end for lab in curve.labels):
                continue
            if lv == "critical":
                out.false_critical += 1
                crit_steps.add(s)
            elif lv == "resumed":
                out.false_resumed += 1
                resumed_steps.add(s)
            else:
                out.false_warn += 1
        if curve.clean:
            out.clean_curves += 1
            out.clean_curves_with_false_critical += bool(crit_steps)
        out.outliers += len(curve.outlier_steps)
        out.outliers_called_critical += len(crit_steps.intersection(curve.outlier_steps))
        out.outliers_resumed += len(resumed_steps.intersection(curve.outlier_steps))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the controller's loss rules (its defaults, or a TOML's [rules]) on a suite."""
    import argparse
    import json
    import time

    from cliffguard.controller.detect import RulesConfig
    from cliffguard.core.settings import build_config, load_toml

    p = argparse.ArgumentParser(prog="python -m tests.controller.synthetic", description=main.__doc__)
    p.add_argument("--clean", type=int, default=40)
    p.add_argument("--each", type=int, default=10)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--length", type=int, default=3000)
    p.add_argument("--config", help="TOML with a [rules] section (default: the controller's defaults)")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    rules = build_config(RulesConfig, "rules", toml=load_toml(args.config))
    curves = suite(args.clean, args.each, seed=args.seed, length=args.length)
    t0 = time.perf_counter()
    result = score(curves, lambda c: replay_alarms(c, rules))
    figures = {**result.summary(), "seconds": round(time.perf_counter() - t0, 1)}
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
