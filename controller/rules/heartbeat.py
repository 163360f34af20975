"""Heartbeat loss: a rank that has sent nothing for too long (pure; the clock comes in via tick).

Any event from a rank counts as a sign of life (heartbeats arrive every few seconds, also while
paused). ``tick(now)`` compares ``now`` with each rank's newest event timestamp — the agent's
clock; the timeouts are far above any sane clock skew — and reports a rank once per silence at
each level. A rank that speaks again re-arms. After ``run.finished`` or ``run.failed`` nothing is
reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.rules.base import ALL_EVENTS, RankScope
from controller.verdict import Action, Verdict
from core.enums import EventType, Level
from core.events import Event


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

    def __post_init__(self) -> None:
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
        self._ended = False

    def seen(self, rank: int, ts: float, step: int) -> None:
        prev = self._last.get(rank)
        if prev is None or ts >= prev[0]:
            self._last[rank] = (ts, max(step, prev[1]) if prev else step)
            self._reported.pop(rank, None)

    def ended(self) -> None:
        """run.finished/failed: nothing to report any more."""
        self._ended = True

    def started(self) -> None:
        """run.started: a new life of the run; ranks count from when they speak again."""
        self._ended = False
        self._last.clear()
        self._reported.clear()

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
            out.append(Verdict(rule="heartbeat", level=level, step=step, rank=rank, onset_step=step,
                               action=Action.ALERT, evidence={"rank": rank, "last_seen_ts": ts, "silent_s": silent},
                               message=f"rank {rank} silent for {silent:.0f}s (last step {step})"))
        return out

    def on_event(self, event: Event) -> list[Verdict]:
        """Every event is a sign of life; run.started wakes the rule, run.finished/failed silence it."""
        if event.type is EventType.RUN_STARTED:
            self.started()
        self.seen(event.rank, event.ts, event.step)
        if event.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED):
            self.ended()
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"last": {str(r): list(v) for r, v in self._last.items()}, "reported": {str(r): v for r, v in self._reported.items()},
                "ended": self._ended}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._last = {int(r): (float(v[0]), int(v[1])) for r, v in state["last"].items()}
        self._reported = {int(r): str(v) for r, v in state.get("reported", {}).items()}
        self._ended = bool(state.get("ended", False))
