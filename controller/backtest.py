"""Replay a loss curve (a ``step,loss`` CSV or a stored run) through the controller's rules.

The replay uses ``controller.detect.RunDetector`` — the same code and, unless told otherwise, the
same defaults as ``cliffguard controller`` — and reports every verdict. In the output, ``level``
is ``critical`` exactly when the controller would pause the run (a verdict whose action is
``recover``); every other verdict is ``warn``, with the rule's own level in ``rule_level``.

What a replay cannot do: the controller would pause, validate and maybe roll back after a
critical verdict; the replay goes on as if validation had come back normal and the run resumed.
Steps going backwards in the input are treated as the trainer's rollbacks (see detect.py).
Heartbeat loss needs a clock and is not replayed.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from cliffguard.controller.detect import RulesConfig, RunDetector
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event
from cliffguard.core.floats import to_json
from cliffguard.core.spike_config import SpikeConfig


class CsvError(ValueError):
    """A CSV the backtest cannot read; ``line`` is 1-based."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{source}: line {line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LossCsv:
    points: list[tuple[int, float]]
    grad_norms: list[float] | None = None
    """One per point when the CSV has a ``grad_norm`` column (NaN where that cell is empty)."""
    skipped_empty: int = 0
    """Rows whose loss cell was empty (evaluation rows of an exported Trainer log history)."""


def parse_loss_csv(text: str, source: str = "<csv>") -> LossCsv:
    """``step,loss`` rows -> points. A header naming ``step`` and ``loss`` columns (any order,
    extra columns ignored, an optional ``grad_norm`` column read) is optional; blank lines and
    ``#`` comments are skipped; rows with an empty loss cell are skipped and counted; ``nan`` and
    ``inf`` are valid losses (they are what the rules must catch)."""
    points: list[tuple[int, float]] = []
    norms: list[float] = []
    step_col, loss_col, norm_col = 0, 1, None
    seen_data = False
    skipped = 0
    for lineno, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in row]
        if not cells or all(not c for c in cells) or cells[0].startswith("#"):
            continue
        if not seen_data and not points and not _is_int(cells[0]):
            names = [c.lower() for c in cells]
            if "step" not in names or "loss" not in names:
                raise CsvError(source, lineno, f"header must name 'step' and 'loss' columns, got {row!r}")
            step_col, loss_col = names.index("step"), names.index("loss")
            norm_col = names.index("grad_norm") if "grad_norm" in names else None
            seen_data = True  # only one header, and only first
            continue
        seen_data = True
        if len(cells) <= max(step_col, loss_col):
            raise CsvError(source, lineno, f"expected at least {max(step_col, loss_col) + 1} columns, got {len(cells)}")
        if not _is_int(cells[step_col]):
            raise CsvError(source, lineno, f"step {cells[step_col]!r} is not a non-negative integer")
        if not cells[loss_col]:
            skipped += 1
            continue
        try:
            loss = float(cells[loss_col])
        except ValueError:
            raise CsvError(source, lineno, f"loss {cells[loss_col]!r} is not a number") from None
        points.append((int(cells[step_col]), loss))
        if norm_col is not None:
            cell = cells[norm_col] if norm_col < len(cells) else ""
            try:
                norms.append(float(cell) if cell else math.nan)
            except ValueError:
                raise CsvError(source, lineno, f"grad_norm {cell!r} is not a number") from None
    if not points:
        raise CsvError(source, 1, "no data rows" if not skipped else f"no data rows ({skipped} with an empty loss)")
    return LossCsv(points, norms if norm_col is not None else None, skipped)


def read_loss_csv(text: str, source: str = "<csv>") -> list[tuple[int, float]]:
    """The points of ``parse_loss_csv``."""
    return parse_loss_csv(text, source).points


def _is_int(text: str) -> bool:
    return text.isdigit()


def read_loss_csv_file(path: str | Path) -> list[tuple[int, float]]:
    return parse_loss_csv_file(path).points


def parse_loss_csv_file(path: str | Path) -> LossCsv:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CsvError(str(p), 0, "no such file") from None
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        raise CsvError(str(p), line, "not UTF-8 text") from None
    return parse_loss_csv(text, str(p))


@dataclass(frozen=True, slots=True)
class BacktestEvent:
    step: int
    level: Level
    """``critical`` = the controller would pause the run; otherwise ``warn``."""
    rule: str
    rule_level: str
    action: str
    onset_step: int | None
    rank: int | None
    message: str
    evidence: dict[str, Any]

    @classmethod
    def from_verdict(cls, v: Verdict) -> BacktestEvent:
        return cls(step=v.step, level=Level.CRITICAL if v.action is Action.RECOVER else Level.WARN, rule=v.rule,
                   rule_level=str(v.level), action=str(v.action), onset_step=v.onset_step, rank=v.rank,
                   message=v.message, evidence=v.evidence)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "level": self.level, "rule": self.rule, "rule_level": self.rule_level,
                "action": self.action, "onset_step": self.onset_step, "rank": self.rank,
                "message": self.message, "evidence": to_json(self.evidence)}


def replay_points(points: Iterable[tuple[int, float]], config: RulesConfig | None = None,
                  grad_norms: Sequence[float | None] | None = None) -> list[BacktestEvent]:
    """The loss rules over ``points``; with ``grad_norms`` (one per point, None or NaN = not
    logged) the grad-norm rule too, and the loss rule weighs each step's norm beside its loss."""
    det = RunDetector(config)
    out: list[BacktestEvent] = []
    for i, (step, loss) in enumerate(points):
        g = grad_norms[i] if grad_norms is not None else None
        if g is not None and math.isnan(g):
            g = None  # an empty cell: this step's norm was not logged
        verdicts = det.rules["grad_norm"].observe(step, {"grad_norm": g}) if g is not None else []
        out += [BacktestEvent.from_verdict(v) for v in verdicts + det.observe_loss(step, loss, g)]
    return out


def infer_interval(steps: Sequence[int]) -> float:
    """The logging interval in steps: the median gap between consecutive logged steps (1 if fewer
    than two points). A W&B-sampled export has irregular gaps; the median is its typical one."""
    gaps = sorted(b - a for a, b in zip(steps, steps[1:], strict=False) if b > a)
    return float(median(gaps)) if gaps else 1.0


def cadence(steps: Sequence[int]) -> dict[str, Any]:
    """What ``backtest`` reports about the logging: interval, largest gap, whether gaps vary."""
    gaps = [b - a for a, b in zip(steps, steps[1:], strict=False) if b > a]
    interval = infer_interval(steps)
    return {"interval_steps": interval, "max_gap_steps": max(gaps, default=0),
            "irregular": bool(gaps) and max(gaps) > 2 * interval}


VALIDATION_POINTS = 3
"""Logged points after a critical whose median stands in for the controller's validation."""


def outcomes(points: Sequence[tuple[int, float]], events: Sequence[BacktestEvent],
             band_sigmas: float | None = None) -> list[str | None]:
    """What the controller would most likely do after each event: ``rollback``, ``resume`` (a
    transient, recorded as a data outlier) or None (not critical).

    A replay has no validation set; the loss of the next ``VALIDATION_POINTS`` logged points
    stands in for it (new batches through the weights the spike left behind). Their median
    within the recovery's validation margin of the window median means validation would have come
    back normal: the controller resumes and flags the samples, as for a single bad batch. A
    divergence is a sustained rise, never a bad batch: rollback. So is a critical with no window
    median (non-finite loss before any history) or no point after it.

    A validation loss averages many batches; a training point is one batch, with the curve's
    per-batch noise. So the stand-in calls the weights damaged only when the excursion persists
    by the rule's own measure too: the median of those points at or above the band the spike rule
    calls healthy (``band_sigmas`` σ over the window median, the rule's ``k_warn``), that is, at
    least two of the three still in the excursion. On a smooth curve the relative margin is the
    larger and decides as before; on a noisy one, three ordinary points after a one-batch outlier
    are not read as damage (with the margin alone, the median of the next three points of a
    healthy stretch of a batch-8 log is above it after one point in five)."""
    rec = RecoveryConfig()
    k = SpikeConfig().k_warn if band_sigmas is None else band_sigmas
    index = {s: i for i, (s, _) in enumerate(points)}
    out: list[str | None] = []
    for e in events:
        if e.level is not Level.CRITICAL:
            out.append(None)
            continue
        ref = e.evidence.get("median")
        i = index.get(e.step)
        after = [x for _, x in points[i + 1: i + 1 + VALIDATION_POINTS]] if i is not None else []
        if e.rule == "divergence" or ref is None or not after or not all(math.isfinite(x) for x in after):
            out.append("rollback")
            continue
        normal = ref * (1 + rec.val_margin_rel) + rec.val_margin_abs
        sigma = e.evidence.get("sigma")
        if sigma is not None and math.isfinite(sigma):
            normal = max(normal, ref + k * sigma)
        out.append("resume" if median(after) <= normal else "rollback")
    return out


def replay_events(events: Iterable[Event], config: RulesConfig | None = None) -> list[BacktestEvent]:
    det = RunDetector(config)
    return [BacktestEvent.from_verdict(v) for ev in events for v in det.on_event(ev)]


def load_run_events(url: str, run_id: str) -> list[Event]:
    """The stored step events of a run, every rank, in the order the controller ingested them
    (full resolution only: rows retention folded are not events)."""
    from cliffguard.controller.store import read
    from cliffguard.controller.store.db import Store

    store = Store.open(url, migrate=False)
    try:
        with store.session() as session:
            rows = read.step_rows(session, run_id, all_ranks=True, full_resolution=True, order="ingested")
    finally:
        store.close()
    return [_row_event(run_id, r) for r in rows]


def _row_event(run_id: str, r: dict[str, Any]) -> Event:
    """A ``read.step_rows`` row as the step event it was ingested from (missing values neutral)."""
    data = {
        "loss": math.nan if r["loss"] is None else float(r["loss"]),
        "grad_norm": r["grad_norm"] if r["grad_norm"] is not None else 0.0,
        "loss_scale": r["loss_scale"] if r["loss_scale"] is not None else 1.0,
        "mfu": r["mfu"] or 0.0,
        "step_time_s": r["step_time_s"] or 0.0,
        "data_wait_s": r["data_wait_s"] or 0.0,
        "comm_exposed_s": r["comm_exposed_s"] or 0.0,
        "mem_allocated": r["mem_allocated"] or 0,
        "mem_reserved": r["mem_reserved"] or 0,
        "skipped": bool(r["skipped"]),
        "layer_grad_norms": dict(r["layer_grad_norms"] or {}),
    }
    return Event(type=EventType.STEP, run=run_id, step=r["step"], rank=r["rank"], world=max(1, r["rank"] + 1),
                 ts=r["ts"], data=data)


def summary(events: Sequence[BacktestEvent], n_points: int) -> dict[str, Any]:
    crit = [e for e in events if e.level is Level.CRITICAL]
    return {"points": n_points, "warn": len(events) - len(crit), "critical": len(crit),
            "first_critical_step": crit[0].step if crit else None}


