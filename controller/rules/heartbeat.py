"""Heartbeat loss and hung ranks (pure; the clock comes in via tick).

Any event from a rank counts as a sign of life (heartbeats arrive every few seconds, also while
paused); a node heartbeat (agent/node_beats.py) speaks for each of its node's ranks, alive
``ages_s`` before the beat, at its step, inside its collective; a ``ranks`` event for every rank
it carries (they all reached its all-reduce). ``tick(now)`` compares ``now`` with each rank's
newest sign of life — the agent's clock; the timeouts are far above any sane clock skew — and
reports a rank once per silence at each level (a dead or frozen process). A rank that speaks
again re-arms. The ranks a tick finds newly silent at one level make ONE verdict naming them as
ranges ("ranks 0-1023, 2048-4095"): a 16k-rank run that stops yields a handful of alerts (its
nodes' beats are spread over ``heartbeat_s``, so they pass the threshold over a few ticks), not
one per rank.

Persistence: the per-rank columns are stored packed (controller/rules/packed.py) and the
snapshot is rebuilt only when something reported changes (silences, hung ranks, the run's state)
or the run's time moved ``PERSIST_S`` past the last snapshot. The controller saves a rule's state with every batch it
touched (every event touches this rule): re-encoding 16k ranks' columns each batch cost more than
all the rest of the batch. A reload may so lag ``PERSIST_S`` behind the offsets, far below any
silence threshold; the next beats refresh what it missed.

Hung ranks: while the run's newest heartbeat says ``running``, a rank that is alive but has not
moved off its step for ``hung_after_s`` is stalled. When every stalled rank waits in a collective
but one does not, that one holds the others up; the rule names the stalled ranks outside a
collective (else, once every live rank is stalled, those at the lowest step), once per episode, with the step and what the others
wait in. After ``run.finished`` or ``run.failed`` nothing is reported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.controller.rules.base import ALL_EVENTS, RankScope
from cliffguard.controller.rules.packed import pack as _pack
from cliffguard.controller.rules.packed import unpack as _unpack
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import EventType, Level, TrainerMode
from cliffguard.core.events import Event
from cliffguard.core.ranks import rank_spans

_REARM_S = 1.0
# An enum member read through its class costs ~10x a module global; on_event reads them for every event.
_RUN_STARTED, _HEARTBEAT, _RANKS = EventType.RUN_STARTED, EventType.HEARTBEAT, EventType.RANKS
_RUN_FINISHED, _RUN_FAILED = EventType.RUN_FINISHED, EventType.RUN_FAILED
_RUN_PREEMPTED = EventType.RUN_PREEMPTED  # it exits to be requeued: its silence is expected too
"""A sign of life must be this much newer than the one a silence was reported on to re-arm it: a
node heartbeat re-states a dead rank's last time, measured a moment before the beat's ts."""
_NAMED_MAX = 16
PERSIST_S = 5.0
"""The run's time (newest sign of life) a stored snapshot may lag behind the rule's state."""

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
    hung_after_s: float = bounded(45.0, ge=0)
    """A running rank alive but on the same step this long is stalled (0 = never judged); raise
    it above the run's longest step or synchronous checkpoint write."""

    def __post_init__(self) -> None:
        check_declared(self)
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
        self._newest = -float("inf")  # the newest sign of life seen
        self._snapshot: dict[str, Any] | None = None
        self._snapshot_at = -float("inf")  # ``_newest`` when the snapshot was taken

    def _changed(self) -> None:
        """Something the next save must carry at once (not only a newer time)."""
        self._snapshot = None

    def seen(self, rank: int, ts: float, step: int, collective: str | None = None) -> None:
        if ts > self._newest:
            self._newest = ts
        prev = self._last.get(rank)
        if prev is None or ts >= prev[0]:
            self._last[rank] = (ts, step if prev is None or step >= prev[1] else prev[1])  # max(), without the call
            if collective is not None:
                self._collective[rank] = collective
            if rank in self._reported and ts > self._reported_ts.get(rank, -float("inf")) + _REARM_S:
                del self._reported[rank]
                self._reported_ts.pop(rank, None)
                self._changed()
        moved = self._progress.get(rank)
        if moved is None or (step != moved[0] and ts >= moved[1]):
            self._progress[rank] = (step, ts)
            if rank in self._hung:
                self._hung.discard(rank)
                self._changed()

    def seen_span(self, first: int, n: int, ts: float, step: int) -> None:
        """``seen(rank, ts, step)`` for ranks ``first .. first + n - 1`` (a ``ranks`` chunk: every
        rank in it took part in the step's all-reduce), with the per-rank work in one loop: a
        131,072-rank run's chunks cost ~240 ms a round as a call and a row object per rank."""
        if n <= 0:
            return
        if ts > self._newest:
            self._newest = ts
        last, progress, reported, hung = self._last, self._progress, self._reported, self._hung
        get_last, get_progress = last.get, progress.get
        fresh = (ts, step)
        for rank in range(first, first + n):
            prev = get_last(rank)
            if prev is None or ts >= prev[0]:
                last[rank] = fresh if prev is None or step >= prev[1] else (ts, prev[1])
                if reported and rank in reported and ts > self._reported_ts.get(rank, -float("inf")) + _REARM_S:
                    del reported[rank]
                    self._reported_ts.pop(rank, None)
                    self._changed()
            moved = get_progress(rank)
            if moved is None or (step != moved[0] and ts >= moved[1]):
                progress[rank] = (step, ts)
                if hung and rank in hung:
                    hung.discard(rank)
                    self._changed()

    def ended(self) -> None:
        """run.finished/failed: nothing to report any more."""
        self._ended = True
        self._changed()

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
        self._changed()

    def tick(self, now: float) -> list[Verdict]:
        cfg = self.config
        if not cfg.enabled or self._ended:
            return []
        newly: dict[Level, list[tuple[int, float, int]]] = {}
        for rank, (ts, step) in self._last.items():
            silent = now - ts
            if silent < cfg.warn_after_s:
                continue
            level = Level.CRITICAL if silent >= cfg.critical_after_s else Level.WARN
            if self._reported.get(rank) in (str(level), str(Level.CRITICAL)):
                continue
            self._reported[rank] = str(level)
            self._reported_ts[rank] = ts
            newly.setdefault(level, []).append((rank, ts, step))
        if newly:
            self._changed()
        out = [self._silence(level, sorted(found), now) for level, found in sorted(newly.items(), key=_by_level)]
        return out + self._hung_ranks(now)

    def _silence(self, level: Level, found: list[tuple[int, float, int]], now: float) -> Verdict:
        """One verdict for the ranks found silent at ``level`` in one tick (sorted by rank)."""
        rank, ts, step = found[0]
        collective = self._collective.get(rank, "")
        inside = f", inside {collective}" if collective else ""
        evidence: dict[str, Any] = {"rank": rank, "last_seen_ts": ts, "silent_s": now - ts, "collective": collective}
        if len(found) == 1:
            return Verdict(rule="heartbeat", level=level, step=step, rank=rank, onset_step=step, action=Action.ALERT,
                           evidence=evidence, message=f"rank {rank} silent for {now - ts:.0f}s (last step {step}{inside})")
        ranks = [r for r, _, _ in found]
        steps = [s for _, _, s in found]
        silent = [now - t for _, t, _ in found]
        colls = sorted({self._collective[r] for r in ranks if self._collective.get(r)})
        low, high = min(steps), max(steps)
        evidence.update(ranks=rank_spans(ranks), count=len(ranks), steps=[low, high],
                        silent_s=[min(silent), max(silent)], collectives=colls)
        where = f", inside {', '.join(colls)}" if colls else ""
        return Verdict(rule="heartbeat", level=level, step=low, rank=rank, onset_step=low, action=Action.ALERT,
                       evidence=evidence,
                       message=f"ranks {rank_spans(ranks)} ({len(ranks)} ranks) silent for {_span(silent, 's')} "
                       f"(last step {_span(steps)}{where})")

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
        self._changed()
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
        etype = event.type
        if etype is _RUN_STARTED:
            self.started()
        data = event.data
        if etype is _HEARTBEAT:
            running = data["state"] == TrainerMode.RUNNING
            if running != self._running:
                self._running = running
                self._changed()
            if data.get("ranks") is not None:
                for rank, step, age, coll in zip(data["ranks"], data["steps"], data["ages_s"], data["collectives"],
                                                 strict=True):
                    self.seen(rank, event.ts - age, step, coll)
        elif etype is _RANKS:
            self.seen_span(data["first_rank"], len(data["step_time_s"]), event.ts, event.step)
        self.seen(event.rank, event.ts, event.step)
        if etype is _RUN_FINISHED or etype is _RUN_FAILED or etype is _RUN_PREEMPTED:
            self.ended()
        return []

    def state_dict(self) -> dict[str, Any]:
        if self._snapshot is None or self._newest - self._snapshot_at >= PERSIST_S:
            self._snapshot = self._pack()
            self._snapshot_at = self._newest
        return self._snapshot

    def _pack(self) -> dict[str, Any]:
        levels: dict[str, list[int]] = {}
        for r, level in self._reported.items():
            levels.setdefault(level, []).append(r)
        by_name: dict[str, list[int]] = {}
        for r, name in self._collective.items():
            if name:
                by_name.setdefault(name, []).append(r)
        return {"packed": 1, "last": _pack_columns(self._last, "d", "q"),
                "progress": _pack_columns(self._progress, "q", "d"),
                "reported": {level: _pack("q", ranks) for level, ranks in levels.items()},
                "reported_ts": _pack_columns({r: (ts, 0) for r, ts in self._reported_ts.items()}, "d", "q"),
                "collective": {name: _pack("q", ranks) for name, ranks in by_name.items()},
                "ended": self._ended, "running": self._running, "hung": _pack("q", sorted(self._hung))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._snapshot = None
        self._ended = bool(state.get("ended", False))
        self._running = bool(state.get("running", True))
        if state.get("packed"):
            self._last = {r: (float(a), int(b)) for r, (a, b) in _unpack_columns(state["last"], "d", "q").items()}
            self._progress = {r: (int(a), float(b))
                              for r, (a, b) in _unpack_columns(state["progress"], "q", "d").items()}
            self._reported = {r: level for level, text in state["reported"].items() for r in _unpack("q", text)}
            self._reported_ts = {r: float(a) for r, (a, _) in _unpack_columns(state["reported_ts"], "d", "q").items()}
            self._collective = {r: name for name, text in state["collective"].items() for r in _unpack("q", text)}
            self._hung = set(_unpack("q", state["hung"]))
        else:  # the layouts stored before: per-rank objects, or plain columns
            self._last = {r: (float(a), int(b)) for r, (a, b) in _rows(state["last"]).items()}
            self._reported = {int(r): str(v) for r, v in state.get("reported", {}).items()}
            self._reported_ts = {int(r): float(v) for r, v in state.get("reported_ts", {}).items()}
            self._progress = {r: (int(a), float(b)) for r, (a, b) in _rows(state.get("progress", {})).items()}
            self._collective = {int(r): str(v) for r, v in state.get("collective", {}).items()}
            self._hung = {int(r) for r in state.get("hung", [])}
        self._newest = max((ts for ts, _ in self._last.values()), default=-float("inf"))
        if state.get("packed"):
            # what was loaded is the snapshot, until it must be re-taken: a reloaded rule then saves
            # what the rule it was saved from would have, given the same events
            self._snapshot, self._snapshot_at = state, self._newest


def _span(vals: list[float] | list[int], unit: str = "") -> str:
    low, high = min(vals), max(vals)
    fmt = (lambda v: f"{v:.0f}") if isinstance(low, float) else str
    return f"{fmt(low)}{unit}" if fmt(low) == fmt(high) else f"{fmt(low)}-{fmt(high)}{unit}"


def _by_level(item: tuple[Level, Any]) -> int:
    return 0 if item[0] is Level.WARN else 1


def _pack_columns(pairs: dict[int, tuple[Any, Any]], a: str, b: str) -> dict[str, str]:
    """Rank-sorted columns; the ranks as gaps (1, 1, 1, ...), which zlib folds to nothing."""
    ranks = sorted(pairs)
    gaps = [r - p for r, p in zip(ranks, [0, *ranks][:-1], strict=True)]
    return {"rank_gaps": _pack("q", gaps), "a": _pack(a, (pairs[r][0] for r in ranks)),
            "b": _pack(b, (pairs[r][1] for r in ranks))}


def _unpack_columns(stored: dict[str, str], a: str, b: str) -> dict[int, tuple[Any, Any]]:
    ranks, at = [], 0
    for gap in _unpack("q", stored["rank_gaps"]):
        at += gap
        ranks.append(at)
    return dict(zip(ranks, zip(_unpack(a, stored["a"]), _unpack(b, stored["b"]), strict=True), strict=True))


def _rows(stored: dict[str, Any]) -> dict[int, tuple[Any, Any]]:
    """Plain columns ({"ranks", "a", "b"} lists), or the {rank: [a, b]} layout stored before them."""
    if "ranks" in stored and "a" in stored:
        return {int(r): (a, b) for r, a, b in zip(stored["ranks"], stored["a"], stored["b"], strict=True)}
    return {int(r): (v[0], v[1]) for r, v in stored.items()}
