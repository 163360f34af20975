"""The goodput ledger of one run: its events in, in the order the trainer sent them; buckets out.

Pure (no clock, no I/O): the time it books is the events' own (``ts``, ``step_time_s``,
``data_wait_s``), so a replay of the same events books the same seconds. The cursor moves only
forward: an event from before it (a re-delivery, a late spill) books nothing and is counted as
late. How each event books its time is the table of ``marks.py``; this module does the three
things a table cannot say:

- a ``step`` claims ``[ts - step_time_s, ts)``: data wait, then productive (or all of it skipped
  when the guard skipped the update); the gap before it is the phase's;
- a step at or below the highest step booked is a redo: the kept time of the steps from it on
  moves from productive (and data wait) to ``rolled_back``, charged to the open incident, else
  to the restart that caused it, else to an ``unexplained`` record. Kept time is remembered at
  marks (each checkpoint's step, every ``mark_every`` steps), interpolated in between;
- ``run.started`` opens the ledger (the first one) or ends a restart (a later one).

Costs are charged, for the buckets of ``buckets.CHARGED``, to the restart or scale change in
progress (from the new process's ``run.started`` to its first step, the steps it redoes
included), else to ``incident`` (the controller's open incident, passed with each event).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cliffguard.controller.goodput.buckets import BUCKETS, CHARGED, INDEX, RUNNING, Bucket
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.goodput.kept import KeptTimeline
from cliffguard.controller.goodput.marks import AFTER_PREEMPTION, MARKS, Mark, mark_key
from cliffguard.controller.goodput.record import Cost, LedgerAlert, Window
from cliffguard.controller.goodput.stalls import Beats, CheckpointStats
from cliffguard.core.enums import CheckpointKind, EventType
from cliffguard.core.events import Event
from cliffguard.core.ranks import RUN_RANK

N = len(BUCKETS)
_PROD, _WAIT, _SKIP, _LOST = (INDEX[b] for b in (Bucket.PRODUCTIVE, Bucket.DATA_WAIT, Bucket.SKIPPED,
                                                  Bucket.ROLLED_BACK))
_DISK = frozenset({str(CheckpointKind.INCREMENTAL), str(CheckpointKind.FULL)})
_KEEP_IDS = 16


class Ledger:
    """One run's ledger. ``on_event(event, incident)`` for every event of the run, in order."""

    def __init__(self, config: GoodputConfig | None = None) -> None:
        self.config = config or GoodputConfig()
        self.started_at: float | None = None
        self.cursor: float | None = None
        self.saw_start = False
        self.phase: Bucket = RUNNING
        self.world = 1
        self.ended = False
        self.starts = 0
        self.seconds = [0.0] * N
        self.gpu = [0.0] * N
        self.high_step = -1
        self.first_step: int | None = None
        self.kept = KeptTimeline(self.config.max_marks)
        self.counts = {"steps_lost": 0, "redos": 0, "approx_redos": 0, "late_events": 0, "missing_steps": 0,
                       "skipped_steps": 0, "rollbacks": 0, "restarts": 0, "scale_changes": 0, "bad_timings": 0,
                       "skip_episodes": 0, "skip_episodes_redone": 0, "clock_steps": 0}
        self.cause: str | None = None
        """The restart or scale change in progress (a cost key), until the first step after it."""
        self.costs: dict[str, Cost] = {}
        self.changed: set[str] = set()
        """Cost keys changed since the store last wrote them (``book.py`` clears it)."""
        self.row_at: float | None = None
        """The cursor when the store's ``goodput`` row was last written (``book.py``)."""
        self.ckpt = CheckpointStats()
        self.beats = Beats()
        self.last_skip = -2
        """The newest step the guard skipped (a skip right after it continues the episode)."""
        self.episode_open = False
        """The newest run of skips was not followed by a redo yet."""
        self.seen: list[str] = []
        self.start_ids: list[str] = []
        """The ids of the newest ``run.started`` events (a late copy of one is not a new process)."""
        """The ids of the newest events booked (a copy of one is skipped)."""
        self.window = Window(self.config.ettr_window_s, self.config.timeline_points)

    # ------------------------------------------------------------------ events
    def on_event(self, event: Event, incident: str | None = None) -> list[LedgerAlert]:
        """Book ``event``; returns the ETTR alerts it caused (crossing the floor, or back above it)."""
        if event.rank != RUN_RANK:
            return []
        t = event.type
        if t is EventType.HEARTBEAT:
            self.beats.add(event.ts, self.cursor)
            return []
        late = self.cursor is not None and (event.ts <= self.cursor if t is EventType.STEP else event.ts < self.cursor)
        if late and t is EventType.RUN_STARTED and event.id not in self.start_ids and self.cursor is not None:
            # a new process whose clock is behind the old one's (another host): it starts now
            self.counts["clock_steps"] += 1
            event, late = dataclasses.replace(event, ts=self.cursor), False
        if late or event.id in self.seen:
            self.counts["late_events"] += 1  # a re-sent copy, a late spill: its time is booked already
            return []
        if t is EventType.CHECKPOINT and str(event.data["kind"]) in _DISK:
            self._remember(event.id)
            self.ckpt.disk(event.step, float(event.data["seconds"]))
            return []
        if t is EventType.STEP and event.data.get("detail"):  # a per-rank copy for a detail command
            return []
        key = mark_key(event)
        if key is None:
            return []
        if t is EventType.RUN_STARTED:
            key = "run.started:first" if self.cursor is None else (
                "run.started:again" if self.high_step > 0 else "run.started:again_at_0")
        if self.cursor is None:
            self._open(event)
        self._remember(event.id)
        cause = self.cause or incident
        if t is EventType.STEP:
            self._step(event, MARKS[key], incident)
        else:
            self._point(event, key, MARKS[key], cause)
        return self.window.sample(self.cursor - (self.started_at or 0.0), self.seconds, self.config)

    def _open(self, event: Event) -> None:
        start = event.ts
        if event.type is EventType.STEP and math.isfinite(float(event.data["step_time_s"])):
            start -= float(event.data["step_time_s"])
        self.started_at = self.cursor = start
        self.saw_start = event.type is EventType.RUN_STARTED
        self.world = event.world

    def _point(self, event: Event, key: str, mark: Mark, cause: str | None) -> None:
        t = event.type
        if t is EventType.RUN_STARTED:
            self.start_ids = [*self.start_ids[-(_KEEP_IDS - 1):], event.id]
            if key != "run.started:first":
                self.counts["restarts"] += 1
                cause = self.cause = f"restart:{self.starts}"
                self._cost(cause, "restart", event.ts)
            self.starts += 1
            self.ended = False
        if t in (EventType.ELASTIC_SCALED_DOWN, EventType.ELASTIC_SCALED_UP):
            self.counts["scale_changes"] += 1
            if self.cause is not None:
                self.costs[self.cause].kind = "elastic"
        if t is EventType.RUN_STARTED and self.phase is Bucket.PREEMPTION:
            mark = AFTER_PREEMPTION.get(key, mark)  # requeued: the wait was the preemption's
        bucket, booked = self._gap_to(event.ts, mark, cause)
        if key == "checkpoint:memory":
            self._mark(event.step)
            if bucket is Bucket.CHECKPOINT_SAVE:  # not a snapshot taken while starting or restoring
                self.ckpt.stall(event.step, booked)
        if key == "command.ack:rollback:applied":
            self.counts["rollbacks"] += 1
        self.cursor = event.ts
        self.world = event.world
        then = mark.then
        if then is None and self.phase is Bucket.HOLD_WAIT and t is EventType.COMMAND_ACK \
                and str(event.data["status"]) == "applied":
            then = Bucket.PAUSE_VALIDATION  # a command answered while held ends the hold (agent/dispatch.py)
        if then is not None:
            self.phase = then
        if t in (EventType.RUN_FINISHED, EventType.RUN_FAILED):
            self.ended = True

    def _step(self, event: Event, mark: Mark, incident: str | None) -> None:
        d, step = event.data, event.step
        assert self.cursor is not None
        if self.first_step is None:
            self.first_step = step
        if step <= self.high_step:
            self._redo(step, self.cause or incident or f"unexplained:{self.counts['redos'] + 1}", event.ts)
        elif self.high_step >= 0 and step > self.high_step + 1:
            self.counts["missing_steps"] += step - self.high_step - 1
        if step % self.config.mark_every == 0:
            self._mark(step)
        step_s, wait_s = float(d["step_time_s"]), float(d["data_wait_s"])
        if not (math.isfinite(step_s) and math.isfinite(wait_s)):  # a broken timer: the gap stays the phase's
            self.counts["bad_timings"] += 1
            step_s = wait_s = 0.0
        start = event.ts - step_s
        self._gap_to(start, mark, self.cause or incident)
        a = max(self.cursor, start)
        span, world = event.ts - a, event.world
        if d.get("skipped"):
            self.counts["skipped_steps"] += 1
            if self.high_step < 0 or self.last_skip != self.high_step:  # the first of a run of skips
                self.counts["skip_episodes"] += 1
                self.episode_open = True
            self.last_skip = step
            self._book(span, _SKIP, world, incident)
        else:
            wait = min(max(wait_s, 0.0), span)
            prod = span - wait
            sec, gpu = self.seconds, self.gpu  # the common path, without _book's cost lookup
            sec[_WAIT] += wait
            sec[_PROD] += prod
            gpu[_WAIT] += wait * world
            gpu[_PROD] += prod * world
            self.kept.add(prod, wait, world)
        self.cursor = event.ts
        self.high_step = step
        self.world = world
        self.phase = mark.then if mark.then is not None else self.phase
        self.cause = None  # the restart (if any) ends at its first step

    # ------------------------------------------------------------------ booking
    def _gap_to(self, end: float, mark: Mark, cause: str | None) -> tuple[Bucket, float]:
        """Book [cursor, end); returns the mark's (or the phase's) bucket and the seconds it got."""
        assert self.cursor is not None
        a = self.cursor
        target = mark.gap if mark.gap is not None and (mark.force or self.phase is RUNNING) else self.phase
        if end <= a:
            return target, 0.0
        alive = self.beats.alive_until(a, end)
        if alive is not None and target in (RUNNING, Bucket.RESTART):
            before = self.phase
            if before is RUNNING:
                before = Bucket.HANG if alive - a >= self.config.hang_after_s else RUNNING
            self._book(alive - a, INDEX[before], self.world, cause)
            a = alive
        self._book(end - a, INDEX[target], self.world, cause)
        return target, end - a

    def _book(self, seconds: float, i: int, world: int, cause: str | None) -> None:
        if seconds <= 0:
            return
        self.seconds[i] += seconds
        self.gpu[i] += seconds * world
        if cause is not None and BUCKETS[i] in CHARGED:
            cost = self._cost(cause, "incident", self.cursor or 0.0)
            cost.seconds[i] += seconds
            cost.gpu[i] += seconds * world

    def _cost(self, key: str, kind: str, ts: float) -> Cost:
        cost = self.costs.get(key)
        if cost is None:
            kind = "unexplained" if key.startswith("unexplained:") else kind
            cost = self.costs[key] = Cost(kind=kind, ts=ts, seconds=[0.0] * N, gpu=[0.0] * N)
            if len(self.costs) > self.config.max_costs:  # the oldest is in the store already
                oldest = min((k for k in self.costs if k != key), key=lambda k: self.costs[k].ts)
                del self.costs[oldest]
                self.changed.discard(oldest)
        self.changed.add(key)
        return cost

    def _redo(self, step: int, key: str, ts: float) -> None:
        """Steps ``step..high_step`` are redone: their kept time is lost, charged to ``key``."""
        lost, exact = self.kept.rewind(step, self.first_step or 0, self.high_step + 1)
        self.counts["approx_redos"] += 0 if exact else 1
        n = self.high_step - step + 1
        for i, j, gpu_j in ((_PROD, 0, 2), (_WAIT, 1, 3)):
            self.seconds[i] = max(0.0, self.seconds[i] - lost[j])
            self.gpu[i] = max(0.0, self.gpu[i] - lost[gpu_j])
        self.seconds[_LOST] += lost[0] + lost[1]
        self.gpu[_LOST] += lost[2] + lost[3]
        self.counts["steps_lost"] += n
        self.counts["redos"] += 1
        if self.episode_open:  # the skips did not absorb it: the run went back past them
            self.counts["skip_episodes_redone"] += 1
            self.episode_open = False
        cost = self._cost(key, "incident", ts)
        cost.steps_lost += n
        cost.seconds[_LOST] += lost[0] + lost[1]
        cost.gpu[_LOST] += lost[2] + lost[3]
        self.high_step = step - 1

    def _mark(self, step: int) -> None:
        self.kept.mark(step, self.high_step + 1)

    def _remember(self, event_id: str) -> None:
        self.seen.append(event_id)
        del self.seen[:-_KEEP_IDS]

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "started_at": self.started_at, "cursor": self.cursor, "saw_start": self.saw_start,
            "phase": str(self.phase), "world": self.world, "ended": self.ended, "starts": self.starts,
            "seconds": list(self.seconds), "gpu": list(self.gpu), "high_step": self.high_step,
            "first_step": self.first_step, "kept": self.kept.state_dict(),
            "counts": dict(self.counts), "cause": self.cause,
            "costs": {k: c.to_dict() for k, c in self.costs.items()}, "ckpt": self.ckpt.state_dict(),
            "beats": list(self.beats.ts),
            "seen": list(self.seen), "start_ids": list(self.start_ids), "window": self.window.state_dict(), "row_at": self.row_at,
            "last_skip": self.last_skip, "episode_open": self.episode_open,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        names = {b.value: i for i, b in enumerate(BUCKETS)}
        self.started_at, self.cursor = state["started_at"], state["cursor"]
        self.saw_start = bool(state["saw_start"])
        self.phase = Bucket(state["phase"])
        self.world, self.ended, self.starts = int(state["world"]), bool(state["ended"]), int(state["starts"])
        self.seconds = [float(x) for x in state["seconds"]]
        self.gpu = [float(x) for x in state["gpu"]]
        if len(self.seconds) != N or len(self.gpu) != N:
            raise ValueError(f"goodput state has {len(self.seconds)} buckets, this ledger {N} ({', '.join(names)})")
        self.high_step, self.first_step = int(state["high_step"]), state["first_step"]
        self.kept.load_state_dict(state["kept"])
        self.counts.update({k: int(v) for k, v in state["counts"].items()})
        self.cause = state["cause"]
        self.costs = {k: Cost.from_dict(v) for k, v in state["costs"].items()}
        self.ckpt.load_state_dict(state["ckpt"])
        self.beats.ts = [float(x) for x in state["beats"]]
        self.seen = [str(x) for x in state["seen"]]
        self.start_ids = [str(x) for x in state["start_ids"]]
        self.window.load_state_dict(state["window"])
        self.row_at = state["row_at"]
        self.last_skip, self.episode_open = int(state["last_skip"]), bool(state["episode_open"])
