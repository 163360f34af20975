"""Heartbeat loss and hung ranks (pure; the clock comes in via tick).

Any event from a rank counts as a sign of life (heartbeats arrive every few seconds, also while
paused); a node heartbeat (agent/node_beats.py) speaks for each of its node's ranks, alive
``ages_s`` before the beat, at its step, inside its collective; a ``ranks`` event for every rank
it carries (they all reached its all-reduce). ``tick(now)`` compares ``now`` with each rank's
newest sign of life — the agent's clock; the timeouts are far above any sane clock skew — and
reports a rank once per silence at each level (a dead or frozen process). A rank that speaks
again re-arms.

Hung ranks: while the run's newest heartbeat says ``running``, a rank that is alive but has not
moved off its step for ``hung_after_s`` is stalled. When every stalled rank waits in a collective
but one does not, that one holds the others up; the rule names the stalled ranks outside a
collective (else, once every live rank is stalled, those at the lowest step), once per episode, with the step and what the others
wait in. After ``run.finished`` or ``run.failed`` nothing is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.rules.base import ALL_EVENTS, RankScope
from controller.verdict import Action, Verdict
from core.enums import EventType, Level, TrainerMode
from core.events import Event
from core.rank_arrays import rank_entries

_REARM_S = 1.0
"""A sign of life must be this much newer than the one a silence was reported on to re-arm it: a
node heartbeat re-states a dead rank's last time, measured a moment before the beat's ts."""
_NAMED_MAX = 16

@dataclass(kw_only=True, slots=True)
class HeartbeatConfig:
    """Defaults: the agent beats every 5 s (agent heartbeat_s); 30 s is six missed beats, which a
    GC pause or a slow checkpoint write does not reach; 120 s of silence means a dead or hung rank."""

    enabled: bool = True
    """Run the rule at all."""
    warn_after_s: float = 30.0
    """Silence that warns."""
    critical_after_s: float = 120.0
    """Silence that is critical (an alert; the state machine decides what else)."""
    hung_after_s: float = 45.0
    """A running rank alive but on the same step this long is stalled (0 = never judged); raise
    it above the run's longest step or synchronous checkpoint write."""

    def __post_init__(self) -> None:
        if self.hung_after_s < 0:
            raise ValueError("hung_after_s: must be >= 0")
        if not 0 < self.warn_after_s <= self.critical_after_s:
            raise ValueError("warn_after_s: must be > 0 and <= critical_after_s")


class HeartbeatRule:
    name = "heartbeat"
    consumes = ALL_EVENTS
    scope = RankScope.EVERY_RANK

    def __init__(self, config: HeartbeatConfig | None = None) -> None:
        self.config = config or HeartbeatConfig()
        self._last: dict[int, tuple[float, int]] = {}  # rank -> (ts, step)
        self._reported: dict[int, str] = {}
        self._reported_ts: dict[int, float] = {}  # rank -> the sign of life its silence was reported on
        self._progress: dict[int, tuple[int, float]] = {}  # rank -> (step, when it reached it)
        self._collective: dict[int, str] = {}
        self._running = True  # the newest heartbeat's state is running
        self._hung: set[int] = set()  # ranks reported hung in the current episode
        self._ended = False

    def seen(self, rank: int, ts: float, step: int, collective: str | None = None) -> None:
        prev = self._last.get(rank)
        if prev is None or ts >= prev[0]:
            self._last[rank] = (ts, max(step, prev[1]) if prev else step)
            if collective is not None:
                self._collective[rank] = collective
            if ts > self._reported_ts.get(rank, -float("inf")) + _REARM_S:
                self._reported.pop(rank, None)
                self._reported_ts.pop(rank, None)
        moved = self._progress.get(rank)
        if moved is None or (step != moved[0] and ts >= moved[1]):
            self._progress[rank] = (step, ts)
            self._hung.discard(rank)

    def ended(self) -> None:
        """run.finished/failed: nothing to report any more."""
        self._ended = True

    def started(self) -> None:
        """run.started: a new life of the run; ranks count from when they speak again."""
        self._ended = False
        self._last.clear()
        self._reported.clear()
        self._reported_ts.clear()
        self._progress.clear()
        self._collective.clear()
        self._hung.clear()
        self._running = True

    def tick(self, now: float) -> list[Verdict]:
        cfg = self.config
        if not cfg.enabled or self._ended:
            return []
        out: list[Verdict] = []
        for rank, (ts, step) in sorted(self._last.items()):
            silent = now - ts
            level = (Level.CRITICAL if silent >= cfg.critical_after_s
                     else Level.WARN if silent >= cfg.warn_after_s else None)
            if level is None or self._reported.get(rank) in (str(level), str(Level.CRITICAL)):
                continue
            self._reported[rank] = str(level)
            self._reported_ts[rank] = ts
            collective = self._collective.get(rank, "")
            inside = f", inside {collective}" if collective else ""
            out.append(Verdict(rule="heartbeat", level=level, step=step, rank=rank, onset_step=step,
                               action=Action.ALERT,
                               evidence={"rank": rank, "last_seen_ts": ts, "silent_s": silent, "collective": collective},
                               message=f"rank {rank} silent for {silent:.0f}s (last step {step}{inside})"))
        return out + self._hung_ranks(now)

    def _hung_ranks(self, now: float) -> list[Verdict]:
        cfg = self.config
        if not cfg.hung_after_s or not self._running:
            return []
        alive = {r for r, (ts, _) in self._last.items() if now - ts < cfg.warn_after_s}
        stalled = {r: p for r, p in self._progress.items() if r in alive and now - p[1] >= cfg.hung_after_s}
        if not stalled:
            return []
        outside = [r for r in stalled if not self._collective.get(r)]
        if not outside and len(stalled) < len(alive):
            # Node heartbeats arrive spread over heartbeat_s, so ranks pass hung_after_s a few
            # seconds apart: the rank holding the others up may not have passed it yet. Naming
            # the waiting ranks now would name thousands of the wrong ranks on a large run.
            return []
        if not outside:
            low = min(step for step, _ in stalled.values())
            outside = [r for r, (step, _) in stalled.items() if step == low]
        named = sorted(r for r in outside if r not in self._hung)
        if not named:
            return []
        self._hung.update(named)
        rank = named[0]
        step, since = stalled[rank]
        waits = sorted({self._collective[r] for r in stalled if self._collective.get(r)})
        waiting = sum(1 for r in stalled if self._collective.get(r))
        where = self._collective.get(rank) or "not in a collective"
        others = f"; {waiting} ranks wait in {', '.join(waits)}" if waiting else ""
        ranks = ", ".join(map(str, named[:_NAMED_MAX])) + (" ..." if len(named) > _NAMED_MAX else "")
        return [Verdict(rule="rank_hung", level=Level.WARN, step=step, rank=rank, onset_step=step,
                        action=Action.ALERT,
                        evidence={"ranks": named[:_NAMED_MAX], "step": step, "stalled_s": now - since,
                                  "collective": self._collective.get(rank, ""), "waiting": waiting,
                                  "waiting_in": waits},
                        message=f"rank{'s' if len(named) > 1 else ''} {ranks} hung at step {step} for "
                        f"{now - since:.0f}s ({where}){others}")]

    def on_event(self, event: Event) -> list[Verdict]:
        """Every event is a sign of life; run.started wakes the rule, run.finished/failed silence it."""
        if event.type is EventType.RUN_STARTED:
            self.started()
        data = event.data
        if event.type is EventType.HEARTBEAT:
            self._running = data["state"] == TrainerMode.RUNNING
            if data.get("ranks") is not None:
                for rank, step, age, coll in zip(data["ranks"], data["steps"], data["ages_s"], data["collectives"],
                                                 strict=True):
                    self.seen(rank, event.ts - age, step, coll)
        elif event.type is EventType.RANKS:
            for rank, _ in rank_entries(data):
                self.seen(rank, event.ts, event.step)
        self.seen(event.rank, event.ts, event.step)
        if event.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED):
            self.ended()
        return []

    def state_dict(self) -> dict[str, Any]:
        # ``last`` and ``progress`` hold every rank (16k on a large run, saved with every batch):
        # columns, not {rank: [ts, step]} objects, so saving them is a few list copies.
        return {"last": _columns(self._last), "reported": {str(r): v for r, v in self._reported.items()},
                "ended": self._ended, "reported_ts": {str(r): v for r, v in self._reported_ts.items()},
                "progress": _columns(self._progress),
                "collective": {str(r): v for r, v in self._collective.items() if v},
                "running": self._running, "hung": sorted(self._hung)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = {r: (float(a), int(b)) for r, (a, b) in _rows(state["last"]).items()}
        self._reported = {int(r): str(v) for r, v in state.get("reported", {}).items()}
        self._ended = bool(state.get("ended", False))
        self._reported_ts = {int(r): float(v) for r, v in state.get("reported_ts", {}).items()}
        self._progress = {r: (int(a), float(b)) for r, (a, b) in _rows(state.get("progress", {})).items()}
        self._collective = {int(r): str(v) for r, v in state.get("collective", {}).items()}
        self._running = bool(state.get("running", True))
        self._hung = {int(r) for r in state.get("hung", [])}


def _columns(pairs: dict[int, tuple[Any, Any]]) -> dict[str, list[Any]]:
    firsts, seconds = (list(c) for c in zip(*pairs.values(), strict=True)) if pairs else ([], [])
    return {"ranks": list(pairs), "a": firsts, "b": seconds}


def _rows(stored: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    """``_columns``' layout, or the {rank: [a, b]} one stored before it."""
    if "ranks" in stored and "a" in stored:
        return {int(r): (a, b) for r, a, b in zip(stored["ranks"], stored["a"], stored["b"], strict=True)}
    return {int(r): (v[0], v[1]) for r, v in stored.items()}
