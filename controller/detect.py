"""One run's detector: every rule, fed every event of the run in order (pure, no I/O).

``RunDetector.on_event(event) -> list[Verdict]`` is the pure detector, ``detect(window, event)``,
with the window kept inside the object (``state_dict``/``load_state_dict`` persist it with the
run's controller state); ``tick(now)`` is the only place the wall clock comes in.

The rules are the ones registered in ``RULES`` (below), called in that order; each rule says
which event types it reads and whether it wants every rank's events or the loss rank's (see
controller/rules/base.py). Each call is isolated: a rule that raises loses its verdicts for that
input, is counted in ``rule_errors`` and reported as a ``rule_error`` alert verdict, and the other
rules still run.

Which events feed which rule:

* loss (spike, divergence, non-finite), what the guard decided (held), global grad norm, per-layer
  grad norms, loss scale: the all-reduced values, identical on every rank, so one ``step`` event per step is used — the one
  from the *loss rank*, the rank that speaks for the run (``core.ranks``: the lowest rank seen so
  far, rank 0 in practice). If a lower rank turns up later, the detector switches to it and
  skips its steps up to the newest one already judged.
  Agents send that one as a run-level event (rank 0 alone, with every rank's loss summarised,
  core/rank_arrays.py); older agents send one per rank, and the speaker rule picks rank 0's.
  Per-rank ``step`` events sent for a detail command (``detail: true``) feed no rule.
* step time, MFU and memory are per rank: the ``ranks`` events' arrays (every ``ranks_every``
  steps), or every rank's ``step`` events from older agents, feed the straggler, MFU and memory
  rules (``rules.base.rank_columns``). Their windows count samples, so with arrays every 10
  steps a window of 50 spans 500 steps.
* every event from a rank is a sign of life for the heartbeat rule, a node heartbeat for each of
  its ranks (with how long ago each was alive, and its step); ``run.finished``/``failed``
  silence it, ``run.started`` wakes it.

Rollbacks: a rank's events arrive in order (one producer, one partition), so a step number from
the loss rank at or below the previous one means the trainer restored an earlier step and is
replaying. The loss rules then ``rewind`` (excursion state and CUSUM reset, healthy window kept);
the replayed steps are judged afresh, and ``rewinds`` counts how often it happened.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from cliffguard.controller.rules.base import (
    RANK_METRIC_EVENTS,
    RankScope,
    RewindingRule,
    Rule,
    TickingRule,
    carries_rank_samples,
)
from cliffguard.controller.rules.data_quality import DataQualityConfig, DataQualityRule
from cliffguard.controller.rules.divergence import DivergenceConfig
from cliffguard.controller.rules.elastic import SCALE_EVENTS, ElasticScaleRule
from cliffguard.controller.rules.grad_norm import GradNormConfig, GradNormRule
from cliffguard.controller.rules.hang import HangRule, HangRuleConfig
from cliffguard.controller.rules.heartbeat import HeartbeatConfig, HeartbeatRule
from cliffguard.controller.rules.held import GuardHoldRule, HeldConfig
from cliffguard.controller.rules.loss import LossRules, LossSpikeConfig
from cliffguard.controller.rules.loss_scale import LossScaleConfig, LossScaleRule
from cliffguard.controller.rules.memory import MemoryConfig, MemoryRule
from cliffguard.controller.rules.mfu import MfuConfig, MfuRule
from cliffguard.controller.rules.registry import RuleRegistry
from cliffguard.controller.rules.sdc import SdcConfig, SdcRule
from cliffguard.controller.rules.straggler import StragglerConfig, StragglerRule
from cliffguard.controller.verdict import Action, Verdict
from cliffguard.core.declared import bounded, check_declared
from cliffguard.core.enums import EventType, Level
from cliffguard.core.events import Event
from cliffguard.core.rank_arrays import is_detail, is_run_level
from cliffguard.core.ranks import takes_over
from cliffguard.core.settings import shared_field
from cliffguard.core.spike import SpikeConfig

log = logging.getLogger(__name__)

RULE_ERROR = "rule_error"
"""``Verdict.rule`` of the alert that reports a rule raising (see ``RunDetector._rule_failed``)."""
ERROR_MAX = 300
DETECTOR_STATE_KEYS = frozenset({"loss_rank", "last_step", "catching_up", "rewinds", "rule_errors"})
"""The detector's own keys in its state, so no rule may be named like one."""
# An enum member read through its class costs ~10x a module global (the enum's metaclass).
_STEP = EventType.STEP
_CHECKPOINT = EventType.CHECKPOINT


@dataclass(kw_only=True, slots=True)
class RulesConfig:
    """Every rule's settings (``[rules.<name>]`` in TOML, ``CLIFFGUARD_RULES__<NAME>__<FIELD>``),
    except the spike rule's, which the guard shares: that is the deployment's ``[spike]``."""

    spike: SpikeConfig = shared_field("spike", SpikeConfig)
    """Loss spike and non-finite loss (critical -> recover): the deployment's ``[spike]``."""
    spike_rebaseline_after: int = LossSpikeConfig().rebaseline_after
    """Steps a reported loss excursion may last before it becomes the new baseline (0 = never)."""
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    """Slow divergence of the loss (critical -> recover)."""
    grad_norm: GradNormConfig = field(default_factory=GradNormConfig)
    """Global and per-layer gradient-norm spikes (alerts)."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    """Loss-scale collapse (alerts)."""
    mfu: MfuConfig = field(default_factory=MfuConfig)
    """Sustained low MFU with its likely cause (alerts)."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """Ranks far slower than the others (alerts)."""
    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    """Silent ranks (alerts)."""
    hang: HangRuleConfig = field(default_factory=HangRuleConfig)
    """Hung worker groups named from the ranks' evidence (critical -> restart)."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Growth of reserved-but-unallocated memory (alerts)."""
    held: HeldConfig = field(default_factory=HeldConfig)
    """The trainer's guard holding (or skipping on and on): critical -> recover."""
    data: DataQualityConfig = field(default_factory=DataQualityConfig)
    """Data quality of the batches the run trains on: drift, duplicates, garbled text, perplexity (alerts)."""
    sdc: SdcConfig = field(default_factory=SdcConfig)
    """The data-parallel replicas' parameters differ (the SDC watch): critical -> roll back to before."""
    evidence_last_n: int = bounded(20, ge=0)
    """Newest losses carried in every loss verdict's evidence."""

    def __post_init__(self) -> None:
        check_declared(self)
        try:
            self.loss_spike()
        except ValueError as exc:  # only rebaseline_after can be wrong: the spike rule was checked
            raise ValueError(f"spike_{exc}") from None

    def loss_spike(self) -> LossSpikeConfig:
        """The spike rule as the controller's loss rules run it."""
        shared = {f.name: getattr(self.spike, f.name) for f in fields(SpikeConfig)}
        return LossSpikeConfig(**shared, rebaseline_after=self.spike_rebaseline_after)


RULES: RuleRegistry[RulesConfig] = (
    RuleRegistry[RulesConfig](reserved=DETECTOR_STATE_KEYS)
    .with_rule("heartbeat", lambda c: HeartbeatRule(c.heartbeat))
    .with_rule("straggler", lambda c: StragglerRule(c.straggler))
    .with_rule("mfu", lambda c: MfuRule(c.mfu))
    .with_rule("memory", lambda c: MemoryRule(c.memory))
    .with_rule("loss", lambda c: LossRules(c.loss_spike(), c.divergence, last_n=c.evidence_last_n))
    .with_rule("held", lambda c: GuardHoldRule(c.held))
    .with_rule("grad_norm", lambda c: GradNormRule(c.grad_norm))
    .with_rule("loss_scale", lambda c: LossScaleRule(c.loss_scale))
    .with_rule("elastic", lambda c: ElasticScaleRule())
    .with_rule("hang", lambda c: HangRule(c.hang))
    .with_rule("data", lambda c: DataQualityRule(c.data))
    .with_rule("sdc", lambda c: SdcRule(c.sdc))
)
"""The controller's rules in calling order (a new rule: its module, a ``RulesConfig`` field and
one entry here)."""


class RunDetector:
    def __init__(self, config: RulesConfig | None = None, registry: RuleRegistry[RulesConfig] | None = None) -> None:
        self.config = cfg = config or RulesConfig()
        self.rules: dict[str, Rule] = (registry if registry is not None else RULES).build(cfg)
        self._loss_rank: int | None = None
        self._last_step: int | None = None  # newest step judged by the loss rules
        self._catching_up = False
        self.rewinds = 0
        self.rule_errors: Counter[str] = Counter()
        """Exceptions per rule name (persisted); see ``_rule_failed``."""
        self._run_id: str | None = None  # for logs only: the detector is built before it sees its run
        self.changed: set[str] = set(self.rules)
        """Rules called since their state was last saved (controller/runstate.py saves only those)."""
        # Which rules each event reaches, worked out on first use per (event type, loss rank's
        # turn, carries per-rank samples): (names, [(name, bound on_event)]) in registry order.
        # On first use, not here: a controller builds a detector for every run it meets.
        self._routes: dict[tuple[EventType, bool, bool], tuple[frozenset[str], list[tuple[str, Callable[[Event], list[Verdict]]]]]] = {}
        self._has_loss = "loss" in self.rules

    def _route(self, key: tuple[EventType, bool, bool]) -> tuple[frozenset[str], list[tuple[str, Callable[[Event], list[Verdict]]]]]:
        etype, loss_turn, samples = key
        route = [(name, rule.on_event) for name, rule in self.rules.items()
                 if etype in rule.consumes
                 and (loss_turn or rule.scope is not RankScope.LOSS_RANK)
                 and (samples or rule.consumes != RANK_METRIC_EVENTS)]
        found = self._routes[key] = (frozenset(n for n, _ in route), route)
        return found

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> list[Verdict]:
        self._run_id = event.run
        etype = event.type
        out: list[Verdict]
        if etype is _STEP and not is_detail(data := event.data):
            samples = not is_run_level(data)  # carries_rank_samples, for a step event that is not a detail one
            if event.rank == self._loss_rank and not self._catching_up:  # _loss_turn's usual case
                last = self._last_step
                if last is not None and event.step <= last:
                    out = self._advance(event.step)
                else:
                    self._last_step, out = event.step, []
                loss_turn = True
            else:
                loss_turn, out = self._loss_turn(event)
        else:
            loss_turn, out, samples = False, [], carries_rank_samples(event)
            if etype is _CHECKPOINT and self._has_loss:
                self.loss.mark(event.step, self._last_step)  # a rollback target: what the loss rules knew there
            if etype in SCALE_EVENTS and self._has_loss:
                # A new global batch changes the loss's noise: the jump is not a spike (controller/rules/elastic.py).
                out += self._call("loss", event.step, self.loss.rebaseline)
        try:
            names, route = self._routes[etype, loss_turn, samples]
        except KeyError:
            names, route = self._route((etype, loss_turn, samples))
        self.changed |= names
        for name, on_event in route:
            try:  # _call, inlined: this loop runs for every event
                found = on_event(event)
            except Exception as exc:  # noqa: BLE001 - one broken rule must not silence the others
                found = self._rule_failed(name, event.step, exc)
            if found:
                out += found
        return out

    def _loss_turn(self, event: Event) -> tuple[bool, list[Verdict]]:
        """Whether the loss-rank rules judge this step event (rewound first on a replay), and the
        verdicts of a rewind that raised."""
        if takes_over(event.rank, self._loss_rank):
            self._catching_up = self._loss_rank is not None
            self._loss_rank = event.rank
        if event.rank != self._loss_rank:
            return False, []
        if self._catching_up:
            if self._last_step is not None and event.step <= self._last_step:
                return False, []
            self._catching_up = False
        return True, self._advance(event.step)

    def _advance(self, step: int) -> list[Verdict]:
        out: list[Verdict] = []
        if self._last_step is not None and step <= self._last_step:
            if self._has_loss:  # the window as it was at the rollback's target, when a mark holds it
                out += self._call("loss", step, self.loss.restore_mark, step)
            for name, rule in self.rules.items():
                if rule.scope is RankScope.LOSS_RANK and isinstance(rule, RewindingRule):
                    out += self._call(name, step, rule.rewind)
            self.rewinds += 1
        self._last_step = step
        return out

    def observe_loss(self, step: int, loss: float, grad_norm: float | None = None) -> list[Verdict]:
        """The loss rules alone, for one global loss and the step's grad norm where one is logged
        (the backtest's entry point)."""
        out = self._advance(step)
        return out + self._call("loss", step, self.loss.observe, step, loss, grad_norm)

    def tick(self, now: float) -> list[Verdict]:
        out: list[Verdict] = []
        for name, rule in self.rules.items():
            if isinstance(rule, TickingRule):
                out += self._call(name, self._last_step or 0, rule.tick, now)
        return out

    @property
    def loss(self) -> LossRules:
        rule = self.rules.get("loss")
        if not isinstance(rule, LossRules):
            raise LookupError("this detector's registry has no loss rule")
        return rule

    def window_evidence(self) -> dict[str, Any]:
        """The loss window now: median, sigma, n and the newest losses as [step, loss]."""
        return self.loss.window_evidence()

    # -- rule isolation ----------------------------------------------------------------------

    def _call(self, name: str, step: int, fn: Callable[..., list[Verdict] | None], *args: Any) -> list[Verdict]:
        self.changed.add(name)
        try:
            return fn(*args) or []
        except Exception as exc:  # noqa: BLE001 - one broken rule must not silence the others
            return self._rule_failed(name, step, exc)

    def _rule_failed(self, name: str, step: int, exc: Exception) -> list[Verdict]:
        """Count the failure; on the 1st, 10th, 100th ... one, log it and report a ``rule_error``
        verdict (an alert: warn, so suppressed per run like any repeating alert), so a rule that
        raises on every event neither floods the log nor goes unnoticed."""
        n = self.rule_errors[name] = self.rule_errors[name] + 1
        if not _is_power_of_ten(n):
            return []
        error = f"{type(exc).__name__}: {exc}"[:ERROR_MAX]
        log.error("rule %s raised on run %s at step %d (%d times so far); its verdicts for this input "
                  "are lost, the other rules go on", name, self._run_id, step, n, exc_info=exc)
        return [Verdict(rule=RULE_ERROR, level=Level.WARN, step=step, action=Action.ALERT,
                        message=f"rule {name} raised {error} ({n} times so far); it judged nothing then",
                        evidence={"rule": name, "error": error, "errors": n})]

    # -- persistence -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        # Rule states sit at the top level under the rule's name, beside the detector's own keys
        # (DETECTOR_STATE_KEYS): the layout stored before rules were registered, kept as is.
        return {**{name: rule.state_dict() for name, rule in self.rules.items()}, **self.own_state_dict()}

    def own_state_dict(self) -> dict[str, Any]:
        """The detector's own keys, without the rules' states."""
        return {
            "loss_rank": self._loss_rank,
            "last_step": self._last_step,
            "catching_up": self._catching_up,
            "rewinds": self.rewinds,
            "rule_errors": dict(self.rule_errors),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, rule in self.rules.items():
            if name in state:  # a rule registered since the state was stored starts fresh
                rule.load_state_dict(state[name])
        self._loss_rank = state.get("loss_rank")
        self._last_step = state.get("last_step")
        self._catching_up = bool(state.get("catching_up", False))
        self.rewinds = int(state.get("rewinds", 0))
        self.rule_errors = Counter({str(k): int(v) for k, v in state.get("rule_errors", {}).items()})


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
