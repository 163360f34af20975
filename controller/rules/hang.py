"""Hangs: every rank's evidence of one stall gathered, then the culprit named (pure; the clock
comes in via tick).

The agent's watchdog (agent/hang/watchdog.py) on each live rank of a stalled group sends a
``hang.evidence`` event within a moment of the others; a rank whose collective failed sends one
as it ends. The rule gathers one *episode* per life of the worker group: the first report opens
it, and it is decided when every rank of the world has reported or ``evidence_wait_s`` after the
first report (a dead rank never reports: that is the evidence). ``controller/hang_culprit.py``
then names the culprit, the collective and the frame, and the rule says:

- a culprit named: ``hang`` critical, ``Action.RESTART`` (the recovery table decides how:
  restart in place, without the node, or halt), with the per-rank sequence table as evidence;
- no culprit: ``hang`` warn (an alert: the collective timeout will end the stall);

once per episode. A warn while ranks of the world have not reported leaves the episode open: a
rank stalled outside any collective reports within ``dump_after_s``, while a peer waiting in one
may report only when its collective fails (a starved watchdog, a slow dump); that report then
names the culprit (a warn is said once an episode). A ``resolved`` report (the training thread moved again) withdraws that rank;
an episode left with none is dropped undecided. A new life (``run.started`` with a higher
``life``) starts afresh; evidence of an older life than the newest seen is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cliffguard.controller.hang_culprit import name_culprit
from cliffguard.controller.rules.base import RankScope
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event

VERDICT = "hang"
_KEPT = ("reason", "stalled_s", "node", "local_world", "pid", "life", "collective", "pg_status", "in_flight",
         "frame", "error", "gone")
"""What a report keeps of the event (the stacks stay in the store's evidence rows)."""


@dataclass(kw_only=True, slots=True)
class HangRuleConfig:
    enabled: bool = True
    """Name culprits from the ranks' hang evidence."""
    evidence_wait_s: float = bounded(4.0, gt=0)
    """Seconds after the first report of a stall before deciding without the ranks that did not
    report (the agents' watchdogs report within ``[agent.hang] check_every_s`` of one another)."""

    def __post_init__(self) -> None:
        check_declared(self)


class HangRule:
    name = "hang"
    consumes = frozenset({EventType.HANG_EVIDENCE, EventType.RUN_STARTED})
    scope = RankScope.EVERY_RANK

    def __init__(self, config: HangRuleConfig | None = None) -> None:
        self.config = config or HangRuleConfig()
        self.life = 0
        self.world = 1
        self.reports: dict[int, dict[str, Any]] = {}
        self.steps: dict[int, int] = {}
        self.first_ts: float | None = None
        self.decided_life = -1
        self.warned = False  # this episode's no-culprit warn was said (the episode stays open for the rest)

    def on_event(self, event: Event) -> list[Verdict]:
        if not self.config.enabled:
            return []
        d = event.data
        if event.type is EventType.RUN_STARTED:
            life = int(d.get("life", 0))
            if life > self.life or life == 0:
                self._new_life(life)
            self.world = event.world
            return []
        life = int(d["life"])
        if life < self.life or life <= self.decided_life:
            return []  # an older life's, or one already decided
        if life > self.life:
            self._new_life(life)
        self.world = max(self.world, event.world)
        if d["reason"] == "resolved":
            self.reports.pop(event.rank, None)
            self.steps.pop(event.rank, None)
            if not self.reports:
                self.first_ts, self.warned = None, False
            return []
        have = self.reports.get(event.rank)
        if have is None:
            self.reports[event.rank] = {k: d[k] for k in _KEPT if k in d}
            self.steps[event.rank] = event.step
        elif d.get("error") and not have.get("error"):
            have["error"] = d["error"]  # the stall's snapshot stays; the collective's end is added
        if self.first_ts is None:
            self.first_ts = event.ts
        if len(self.reports) >= self.world:
            return self._decide()
        return []

    def tick(self, now: float) -> list[Verdict]:
        if self.first_ts is None or not self.reports or now - self.first_ts < self.config.evidence_wait_s:
            return []
        return self._decide()

    def _new_life(self, life: int) -> None:
        if life <= self.decided_life:
            self.decided_life = -1  # a fresh launch of the job: its lives count from 0 again
        self.life = life
        self.reports, self.steps, self.first_ts, self.warned = {}, {}, None, False

    def _decide(self) -> list[Verdict]:
        c = name_culprit(self.reports, self.world)
        open_for_more = not c.named and len(self.reports) < self.world
        if open_for_more and self.warned:
            return []
        step = min(self.steps.values()) if self.steps else 0
        evidence: dict[str, Any] = {
            "cause": "hang", "culprit": list(c.ranks), "kind": c.kind, "pg": c.pg, "seq": c.seq, "collective": c.op,
            "frame": c.frame, "nodes": list(c.nodes), "life": self.life, "world": self.world,
            "reported": sorted(self.reports), "table": c.table, "first_report_ts": self.first_ts,
            "errors": {str(r): rep["error"][:300] for r, rep in self.reports.items() if rep.get("error")},
        }
        said = self.warned
        if open_for_more:
            self.warned = True
        else:
            self.decided_life = self.life
            self.reports, self.steps, self.first_ts, self.warned = {}, {}, None, False
        if not c.named and said:
            return []  # still no culprit with every rank in: the warn said it already
        if not c.named:
            return [Verdict(rule=VERDICT, level=Level.WARN, step=step, message=c.message, action=Action.ALERT,
                            evidence=evidence)]
        return [Verdict(rule=VERDICT, level=Level.CRITICAL, step=step, rank=c.ranks[0], onset_step=step,
                        message=c.message, action=Action.RESTART, evidence=evidence)]

    def state_dict(self) -> dict[str, Any]:
        return {"life": self.life, "world": self.world, "reports": {str(r): v for r, v in self.reports.items()},
                "steps": {str(r): s for r, s in self.steps.items()}, "first_ts": self.first_ts,
                "decided_life": self.decided_life, "warned": self.warned}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.life = int(state.get("life", 0))
        self.world = int(state.get("world", 1))
        self.reports = {int(r): dict(v) for r, v in (state.get("reports") or {}).items()}
        self.steps = {int(r): int(s) for r, s in (state.get("steps") or {}).items()}
        self.first_ts = state.get("first_ts")
        self.decided_life = int(state.get("decided_life", -1))
        self.warned = bool(state.get("warned", False))
