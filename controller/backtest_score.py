"""Score backtests of a folder of curves against labels (pure apart from reading the folder).

The labels file has the format of a development set of labelled curves::

    {"positives": {name: [[first_step, last_step], ...]},   # windows an alarm must fall in
     "ignore": {name: [[a, b], ...]},                          # alarms here count for nothing
     "negatives": [name, ...],       # healthy: every critical is a false alarm
     "hard_negatives": [name, ...],  # ambiguous or heavy-tailed: criticals only counted
     "data_outliers": [name, ...]}   # single-batch outliers: rollbacks must be 0

An *act* is a critical event (the controller would pause). A *rollback* is an act whose
validation proxy (``controller.backtest.outcomes``) says the weights were damaged. A window is
caught when an act falls inside it; the delay is from the window's first step to that act, in steps
and in logged points. False alarms on positive curves are acts outside every window and ignore range.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

from cliffguard.controller.backtest import (
    BacktestEvent,
    infer_interval,
    outcomes,
    parse_loss_csv_file,
    replay_points,
)
from cliffguard.controller.detect import RulesConfig
from cliffguard.core.enums import Level

CATEGORIES = ("positive", "negative", "hard_negative", "data_outlier", "unlabelled")
Window = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Labels:
    positives: dict[str, list[Window]] = field(default_factory=dict)
    ignore: dict[str, list[Window]] = field(default_factory=dict)
    negatives: frozenset[str] = frozenset()
    hard_negatives: frozenset[str] = frozenset()
    data_outliers: frozenset[str] = frozenset()

    def category(self, name: str) -> str:
        if name in self.positives:
            return "positive"
        for cat, names in (("negative", self.negatives), ("hard_negative", self.hard_negatives),
                           ("data_outlier", self.data_outliers)):
            if name in names:
                return cat
        return "unlabelled"


def load_labels(path: str | Path) -> Labels:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))

    def windows(d: dict[str, Any]) -> dict[str, list[Window]]:
        return {k: [(int(a), int(b)) for a, b in v] for k, v in (d or {}).items()}

    return Labels(positives=windows(raw.get("positives", {})), ignore=windows(raw.get("ignore", {})),
                  negatives=frozenset(raw.get("negatives", [])), hard_negatives=frozenset(raw.get("hard_negatives", [])),
                  data_outliers=frozenset(raw.get("data_outliers", [])))


@dataclass(slots=True)
class CurveScore:
    name: str
    category: str
    points: int
    interval: float
    warns: int
    criticals: int
    rollbacks: int
    windows: int = 0
    caught: int = 0
    missed: list[int] = field(default_factory=list)
    """First steps of the windows no act fell in."""
    delays_steps: list[int] = field(default_factory=list)
    delays_points: list[int] = field(default_factory=list)
    false_criticals: int = 0
    """Acts outside every window and ignore range (positives) or every act (negatives)."""
    act_steps: list[int] = field(default_factory=list)


def _inside(step: int, windows: Sequence[Window]) -> bool:
    return any(a <= step <= b for a, b in windows)


def score_curve(name: str, points: Sequence[tuple[int, float]], events: Sequence[BacktestEvent],
                labels: Labels, band_sigmas: float | None = None) -> CurveScore:
    """One curve's score; ``band_sigmas`` is the replayed spike rule's ``k_warn`` (``outcomes``)."""
    cat = labels.category(name)
    acts = [e for e in events if e.level is Level.CRITICAL]
    act_steps = [e.step for e in acts]
    rollbacks = sum(1 for o in outcomes(points, events, band_sigmas) if o == "rollback")
    row = CurveScore(name=name, category=cat, points=len(points), interval=infer_interval([s for s, _ in points]),
                     warns=len(events) - len(acts), criticals=len(acts), rollbacks=rollbacks, act_steps=act_steps)
    steps = [s for s, _ in points]
    wins = labels.positives.get(name, [])
    for a, b in wins:
        row.windows += 1
        hit = [s for s in act_steps if a <= s <= b]
        if not hit:
            row.missed.append(a)
            continue
        row.caught += 1
        row.delays_steps.append(hit[0] - a)
        row.delays_points.append(sum(1 for s in steps if a <= s < hit[0]))
    if cat == "positive":
        ign = labels.ignore.get(name, [])
        row.false_criticals = sum(1 for s in act_steps if not _inside(s, wins) and not _inside(s, ign))
    elif cat == "negative":
        row.false_criticals = len(act_steps)
    return row


Replay = Callable[[Sequence[tuple[int, float]], Sequence[float] | None], list[BacktestEvent]]
"""A detector over one curve: (points, grad norms or None) -> its events (``bench/anchors.py``'s
rules, or the controller's: the default)."""


def replay_folder(folder: str | Path, labels: Labels, config: RulesConfig | None = None,
                  names: Sequence[str] | None = None, replay: Replay | None = None) -> list[CurveScore]:
    """Replay every ``*.csv`` in ``folder`` (or the given names) through the controller's rules (or
    ``replay``) and score each against ``labels``."""
    base = Path(folder)
    paths = [base / f"{n}.csv" for n in names] if names else sorted(base.glob("*.csv"))
    rows = []
    for p in paths:
        parsed = parse_loss_csv_file(p)
        pts = parsed.points
        events = replay(pts, parsed.grad_norms) if replay else replay_points(pts, config, parsed.grad_norms)
        rows.append(score_curve(p.stem, pts, events, labels, config.spike.k_warn if config else None))
    return rows


def _median(xs: Sequence[float]) -> float | None:
    return float(median(xs)) if xs else None


def summarize(rows: Sequence[CurveScore]) -> dict[str, Any]:
    def of(cat: str) -> list[CurveScore]:
        return [r for r in rows if r.category == cat]

    pos, neg, hard, outl = of("positive"), of("negative"), of("hard_negative"), of("data_outlier")
    total = sum(r.windows for r in pos)
    caught = sum(r.caught for r in pos)
    neg_points = sum(r.points for r in neg)
    neg_crit = sum(r.criticals for r in neg)
    hard_points = sum(r.points for r in hard)
    return {
        "recall": caught / total if total else None,
        "caught": caught,
        "windows": total,
        "missed": [f"{r.name}@{a}" for r in pos for a in r.missed],
        "median_delay_steps": _median([d for r in pos for d in r.delays_steps]),
        "median_delay_points": _median([d for r in pos for d in r.delays_points]),
        "false_criticals_on_positive_curves": sum(r.false_criticals for r in pos),
        "negative_points": neg_points,
        "negative_criticals": neg_crit,
        "criticals_per_10k_negative_points": 1e4 * neg_crit / neg_points if neg_points else None,
        "hard_negative_points": hard_points,
        "hard_negative_criticals": sum(r.criticals for r in hard),
        "hard_negative_criticals_per_10k": 1e4 * sum(r.criticals for r in hard) / hard_points if hard_points else None,
        "hard_negative_rollbacks": sum(r.rollbacks for r in hard),
        "data_outlier_criticals": sum(r.criticals for r in outl),
        "data_outlier_rollbacks": sum(r.rollbacks for r in outl),
    }


def to_dict(rows: Sequence[CurveScore]) -> dict[str, Any]:
    return {"summary": summarize(rows), "curves": [asdict(r) for r in rows]}


def table(rows: Sequence[CurveScore]) -> list[str]:
    """The per-curve table as text lines (no trailing newlines)."""
    out = [f"{'curve':32} {'category':13} {'points':>6} {'every':>6} {'warn':>5} {'crit':>5} {'rollb':>5} "
           f"{'windows':>8} {'delay steps (points)':>22} {'false':>5}"]
    for r in rows:
        wins = f"{r.caught}/{r.windows}" if r.windows else "-"
        delay = ", ".join(f"{s}({p})" for s, p in zip(r.delays_steps, r.delays_points, strict=True)) or "-"
        out.append(f"{r.name:32} {r.category:13} {r.points:>6} {r.interval:>6.3g} {r.warns:>5} {r.criticals:>5} "
                   f"{r.rollbacks:>5} {wins:>8} {delay:>22} {r.false_criticals:>5}")
    return out


def summary_line(s: dict[str, Any]) -> str:
    def f(x: float | None, fmt: str = ".2f") -> str:
        return "-" if x is None else format(x, fmt)

    return (f"recall {f(s['recall'])} ({s['caught']}/{s['windows']}), "
            f"{f(s['criticals_per_10k_negative_points'])} criticals/10k points on negatives "
            f"({s['negative_criticals']}), {s['false_criticals_on_positive_curves']} false on positive curves, "
            f"data outliers: {s['data_outlier_rollbacks']} rollbacks / {s['data_outlier_criticals']} criticals, "
            f"hard negatives: {s['hard_negative_rollbacks']} rollbacks / {s['hard_negative_criticals']} criticals "
            f"({f(s['hard_negative_criticals_per_10k'])}/10k points), "
            f"median delay {f(s['median_delay_steps'], 'g')} steps ({f(s['median_delay_points'], 'g')} points)")


def sweep(folder: str | Path, labels: Labels, field_path: str, values: Sequence[str],
          make: Callable[[dict[str, dict[str, Any]]], RulesConfig]) -> list[dict[str, Any]]:
    """One summary per value of ``section.field`` (a bare field means ``spike``)."""
    section, _, name = field_path.rpartition(".")
    section = section or "spike"
    out = []
    for v in values:
        rows = replay_folder(folder, labels, make({section: {name: v}}))
        out.append({"field": f"{section}.{name}", "value": v, **summarize(rows)})
    return out


def sweep_table(results: Sequence[dict[str, Any]], label: str = "setting") -> list[str]:
    """One line per summary: ``field=value`` (a sweep's) or ``name`` (``bench.detection``'s anchors)."""
    width = max([28, *(len(r["name"]) + 1 for r in results if "name" in r)])
    out = [f"{label:{width}} {'recall':>11} {'crit/10k neg':>12} {'hard /10k':>9} {'false pos':>9} {'outlier rb/crit':>15} "
           f"{'hard rb/crit':>12} {'delay steps (pts)':>18}"]
    for r in results:
        rec = "-" if r["recall"] is None else f"{r['recall']:.2f} {r['caught']}/{r['windows']}"
        fa = "-" if r["criticals_per_10k_negative_points"] is None else f"{r['criticals_per_10k_negative_points']:.2f}"
        hard = r.get("hard_negative_criticals_per_10k")
        hard_s = "-" if hard is None else f"{hard:.2f}"
        delay = f"{r['median_delay_steps']} ({r['median_delay_points']})"
        name = r["name"] if "name" in r else f"{r['field']}={r['value']}"
        out.append(f"{name:{width}} {rec:>11} {fa:>12} {hard_s:>9} {r['false_criticals_on_positive_curves']:>9} "
                   f"{str(r['data_outlier_rollbacks']) + '/' + str(r['data_outlier_criticals']):>15} "
                   f"{str(r['hard_negative_rollbacks']) + '/' + str(r['hard_negative_criticals']):>12} {delay:>18}")
    return out
