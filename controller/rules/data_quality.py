"""Data quality while training (pure, no I/O): the ``data.stats`` windows of each watching rank
(agent/data_watch/) against that rank's own baseline, its first ``baseline_windows`` windows.

One declared table, ``STATISTICS``, says what is judged, under which verdict, and which of the
window's outlier sequences a verdict names by sample id:

- ``tokens`` -> ``data_drift``: the Jensen-Shannon divergence of the window's token sketch from the
  baseline's (names the window's most novel sequences);
- ``lengths`` -> ``data_drift``: the same of the sequence-length histogram (novel sequences);
- ``duplicates`` -> ``data_duplicates``: the window's share of near-duplicate sequences (the duplicates);
- ``garbled`` -> ``data_garbled``: its share of sequences the garbled-text rules flag (those);
- ``perplexity`` -> ``data_perplexity``: each batch's mean log-perplexity under the reference model,
  judged per step (the highest-perplexity sequences of the steps above the threshold).

Thresholds come from a false-alarm budget (controller/rules/budget.py): each statistic's baseline
values (the divergences leave-one-out: each baseline window against the other windows) set the level
clean data exceeds ``false_alarms_per_10k`` times in 10,000 judged windows (steps for the
perplexity), at least the statistic's floor above the baseline median. Nothing is judged while a
rank's baseline fills (200 steps at the default ``every`` of 10). A verdict fires once per excursion
(hysteresis: it re-arms when the value is back below halfway from the threshold to the median),
warn level by default (``level``), an alert only: the data rules never pause a run. An excursion
of a per-step statistic lasts while any step of a window stays above the re-arm level.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from cliffguard.controller.rules.base import RankScope
from cliffguard.controller.rules.budget import Threshold, calibrate, js_divergence
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared, one_of
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event

log = logging.getLogger(__name__)

DATA_EVENTS: frozenset[EventType] = frozenset({EventType.DATA_STATS})


@dataclass(kw_only=True, slots=True)
class DataQualityConfig:
    """``[rules.data]``. The floors were set on the bundled trainer's default corpus (the standard
    library's code, 8 sequences of 64 bytes per batch): its clean windows' token divergence from the
    baseline stays under 0.006 and a code-to-prose shift gives 0.03-0.05; a clean window holds up to
    2.5 % near-duplicates (license headers, boilerplate) and no garbled sequence."""

    enabled: bool = True
    baseline_windows: int = bounded(20, ge=4)
    """Each rank's first windows, which set its baseline (nothing of that rank is judged before)."""
    false_alarms_per_10k: float = bounded(1.0, gt=0, le=1000)
    """The budget: verdicts per 10,000 judged windows (steps for the perplexity) a clean run may raise."""
    drift_floor: float = bounded(0.005, ge=0)
    """Least token or length divergence (nats) above the baseline's median that alarms."""
    dup_floor: float = bounded(0.1, ge=0, le=1)
    """Least rise of the near-duplicate share above the baseline's median that alarms."""
    garbled_floor: float = bounded(0.05, ge=0, le=1)
    """Least rise of the garbled share above the baseline's median that alarms."""
    perplexity_floor: float = bounded(0.25, ge=0)
    """Least rise of a batch's mean log-perplexity (nats per token) above the baseline's median that alarms."""
    min_tokens_share: float = bounded(0.5, gt=0, le=1)
    """A window whose sketch holds fewer tokens than this share of the baseline's median window (a
    partial window sent at a rollback or the end, a burst of duplicates, which the sketch leaves
    out) is not judged for token drift: its divergence is mostly sampling noise."""
    max_ranks: int = bounded(64, ge=1)
    """Ranks whose baselines are kept per run (the first to report); a watching rank beyond is logged and left out."""
    level: str = one_of("warn", ("warn", "critical"))
    """The verdicts' level (an alert either way)."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, slots=True)
class Statistic:
    name: str
    verdict: str
    reason: str
    """The outlier reason whose sample ids a verdict names."""
    what: str
    floor: Callable[[DataQualityConfig], float]
    per_step: bool = False


STATISTICS: tuple[Statistic, ...] = (
    Statistic("tokens", "data_drift", "novelty", "token distribution divergence", lambda c: c.drift_floor),
    Statistic("lengths", "data_drift", "novelty", "sequence-length divergence", lambda c: c.drift_floor),
    Statistic("duplicates", "data_duplicates", "duplicate", "near-duplicate share", lambda c: c.dup_floor),
    Statistic("garbled", "data_garbled", "garbled", "garbled share", lambda c: c.garbled_floor),
    Statistic("perplexity", "data_perplexity", "perplexity", "batch log-perplexity", lambda c: c.perplexity_floor,
              per_step=True),
)


@dataclass(slots=True)
class _Baseline:
    """One rank's baseline windows until it is calibrated, then only their sums and the thresholds."""

    first_step: int | None = None
    last_step: int = 0
    windows: list[dict[str, Any]] = field(default_factory=list)
    sketch: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    tokens: float = 0.0
    """The baseline windows' median count of sketched tokens (a window's, duplicates left out)."""
    thresholds: dict[str, Threshold] = field(default_factory=dict)
    firing: dict[str, bool] = field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        return bool(self.sketch)

    def to_state(self) -> dict[str, Any]:
        return {"first_step": self.first_step, "last_step": self.last_step, "windows": self.windows,
                "sketch": self.sketch, "lengths": self.lengths, "tokens": self.tokens,
                "thresholds": {k: t.to_state() for k, t in self.thresholds.items()}, "firing": self.firing}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _Baseline:
        return cls(first_step=state["first_step"], last_step=int(state["last_step"]), windows=list(state["windows"]),
                   sketch=[float(v) for v in state["sketch"]], lengths=[float(v) for v in state["lengths"]],
                   tokens=float(state["tokens"]),
                   thresholds={k: Threshold.from_state(t) for k, t in state["thresholds"].items()},
                   firing={k: bool(v) for k, v in state["firing"].items()})


def _values(stat: str, d: dict[str, Any], sketch: list[float], lengths: list[float],
            min_tokens: float = 0.0) -> list[tuple[int, float]]:
    """(step, value) of one statistic in a window (the window's own step is its last)."""
    last = d["steps"][-1] if d["steps"] else d["first_step"]
    if stat == "tokens":  # the sketch leaves duplicates out: a burst of them leaves too few tokens to judge
        if len(d["sketch"]) != len(sketch) or sum(d["sketch"]) < min_tokens:
            return []
        return [(last, js_divergence(d["sketch"], sketch))]
    if stat == "lengths":
        return [(last, js_divergence(d["len_counts"], lengths))] if len(d["len_counts"]) == len(lengths) else []
    if stat == "duplicates":
        return [(last, float(d["dup_share"]))]
    if stat == "garbled":
        return [(last, float(d["garbled"]))] if "garbled" in d else []
    return [(s, float(v)) for s, v in zip(d["steps"], d.get("step_ppl", []), strict=False) if v == v]


class DataQualityRule:
    name = "data"
    consumes = DATA_EVENTS
    scope = RankScope.EVERY_RANK

    def __init__(self, config: DataQualityConfig | None = None) -> None:
        self.config = config or DataQualityConfig()
        self._ranks: dict[int, _Baseline] = {}
        self._left_out: set[int] = set()

    def on_event(self, event: Event) -> list[Verdict]:
        cfg = self.config
        if not cfg.enabled:
            return []
        base = self._ranks.get(event.rank)
        if base is None:
            if len(self._ranks) >= cfg.max_ranks:
                if event.rank not in self._left_out:
                    self._left_out.add(event.rank)
                    log.warning("data rules: rank %d of run %s left out (max_ranks %d are watched already)",
                                event.rank, event.run, cfg.max_ranks)
                return []
            base = self._ranks[event.rank] = _Baseline()
        if not base.calibrated:
            self._learn(base, event)
            return []
        out = []
        for stat in STATISTICS:
            found = self._judge(stat, base, event)
            if found is not None:
                out.append(found)
        return out

    # -- the baseline ---------------------------------------------------------------------------

    def _learn(self, base: _Baseline, event: Event) -> None:
        d = event.data
        if base.first_step is None:
            base.first_step = d["first_step"]
        base.last_step = event.step
        base.windows.append({"sketch": list(d["sketch"]), "len_counts": list(d["len_counts"]),
                             "dup_share": d["dup_share"], "tokens": d["tokens"], "steps": list(d["steps"]),
                             "first_step": d["first_step"], **({"garbled": d["garbled"]} if "garbled" in d else {}),
                             **({"step_ppl": list(d["step_ppl"])} if "step_ppl" in d else {})})
        if len(base.windows) >= self.config.baseline_windows:
            self._calibrate(base)

    def _calibrate(self, base: _Baseline) -> None:
        cfg, windows = self.config, base.windows
        target = cfg.false_alarms_per_10k / 10_000
        n_sketch = len(windows[0]["sketch"])
        same = [w for w in windows if len(w["sketch"]) == n_sketch]
        sketch = [sum(col) for col in zip(*(w["sketch"] for w in same), strict=True)]
        lengths = [sum(col) for col in zip(*(w["len_counts"] for w in same), strict=True)]
        for stat in STATISTICS:
            values: list[float] = []
            for w in same:
                if stat.name == "tokens":  # leave-one-out: a window against the others
                    values.append(js_divergence(w["sketch"], [a - b for a, b in zip(sketch, w["sketch"], strict=True)]))
                elif stat.name == "lengths":
                    values.append(js_divergence(w["len_counts"],
                                                [a - b for a, b in zip(lengths, w["len_counts"], strict=True)]))
                else:
                    values += [v for _, v in _values(stat.name, w, sketch, lengths)]
            if values:
                base.thresholds[stat.name] = calibrate(values, target, stat.floor(cfg))
        base.sketch, base.lengths = [float(v) for v in sketch], [float(v) for v in lengths]
        base.tokens = float(median(sum(w["sketch"]) for w in same))
        base.windows = []

    # -- judging ------------------------------------------------------------------------------

    def _judge(self, stat: Statistic, base: _Baseline, event: Event) -> Verdict | None:
        threshold = base.thresholds.get(stat.name)
        if threshold is None:
            return None
        values = _values(stat.name, event.data, base.sketch, base.lengths, self.config.min_tokens_share * base.tokens)
        if not values:
            return None
        over = [(s, v) for s, v in values if v > threshold.level]
        was = base.firing.get(stat.name, False)
        base.firing[stat.name] = bool(over) or (was and max(v for _, v in values) > threshold.rearm())
        if not over or was:
            return None
        return self._verdict(stat, base, threshold, event, over)

    def _verdict(self, stat: Statistic, base: _Baseline, threshold: Threshold, event: Event,
                 over: list[tuple[int, float]]) -> Verdict:
        d = event.data
        steps = {s for s, _ in over}
        outliers = [(s, i, score) for s, i, r, score in zip(d["outlier_steps"], d["outlier_ids"], d["outlier_reasons"],
                                                             d["outlier_scores"], strict=True)
                    if r == stat.reason and (not stat.per_step or s in steps)]
        ids = list(dict.fromkeys(i for _, i, _ in outliers))
        worst = max(v for _, v in over)
        window = [d["first_step"], event.step]
        names = ", ".join(map(str, ids[:8])) + (f" and {len(ids) - 8} more" if len(ids) > 8 else "")
        first, last = (min(steps), max(steps)) if stat.per_step else window
        where = f"step {first}" if first == last else f"steps {first}-{last}"
        message = (f"{stat.what} on rank {event.rank} at {where}: {worst:.4g} above {threshold.level:.4g} "
                   f"(baseline steps {base.first_step}-{base.last_step}, median {threshold.median:.4g})"
                   + (f"; samples {names}" if ids else ""))
        evidence = {"statistic": stat.name, "value": worst, "threshold": threshold.level, "median": threshold.median,
                    "window": window, "steps": sorted(steps), "baseline_steps": [base.first_step, base.last_step],
                    "sample_ids": ids, "outliers": [list(o) for o in outliers],
                    "false_alarms_per_10k": self.config.false_alarms_per_10k}
        return Verdict(rule=stat.verdict, level=Level(self.config.level), step=event.step, message=message,
                       action=Action.ALERT, onset_step=min(steps) if stat.per_step else window[0], rank=event.rank,
                       evidence=evidence)

    # -- persistence --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"ranks": {str(r): b.to_state() for r, b in self._ranks.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._ranks = {int(r): _Baseline.from_state(b) for r, b in state.get("ranks", {}).items()}
