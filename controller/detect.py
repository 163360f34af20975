"""One run's detector: every rule, fed every event of the run in order (pure, no I/O).

``RunDetector.on_event(event) -> list[Verdict]`` is the pure detector, ``detect(window, event)``,
with the window kept inside the object (``state_dict``/``load_state_dict`` persist it with the
run's controller state); ``tick(now)`` is the only place the wall clock comes in.

Which events feed which rule:

* loss (spike, divergence, non-finite), global grad norm, per-layer grad norms, loss scale: the
  all-reduced values, identical on every rank, so one ``step`` event per step is used — the one
  from the *loss rank*, the lowest rank seen so far (rank 0 in practice). If a lower rank turns
  up later, the detector switches to it and skips its steps up to the newest one already judged.
* step time, MFU and memory are per rank: every rank's ``step`` events feed the straggler, MFU
  and memory rules.
* every event from a rank is a sign of life for the heartbeat rule; ``run.finished``/``failed``
  silence it, ``run.started`` wakes it.

Rollbacks: a rank's events arrive in order (one producer, one partition), so a step number from
the loss rank at or below the previous one means the trainer restored an earlier step and is
replaying. The loss rules then ``rewind`` (excursion state and CUSUM reset, healthy window kept);
the replayed steps are judged afresh, and ``rewinds`` counts how often it happened.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from controller.rules.divergence import DivergenceConfig
from controller.rules.grad_norm import GradNormConfig, GradNormRule
from controller.rules.heartbeat import HeartbeatConfig, HeartbeatRule
from controller.rules.loss import LossRules, LossSpikeConfig
from controller.rules.loss_scale import LossScaleConfig, LossScaleRule
from controller.rules.memory import MemoryConfig, MemoryRule
from controller.rules.mfu import MfuConfig, MfuRule
from controller.rules.straggler import StragglerConfig, StragglerRule
from controller.verdict import Verdict
from core.enums import EventType
from core.events import Event
from core.settings import shared_field
from core.spike import SpikeConfig


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
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Growth of reserved-but-unallocated memory (alerts)."""
    evidence_last_n: int = 20
    """Newest losses carried in every loss verdict's evidence."""

    def __post_init__(self) -> None:
        if self.evidence_last_n < 0:
            raise ValueError("evidence_last_n: must be >= 0")
        try:
            self.loss_spike()
        except ValueError as exc:  # only rebaseline_after can be wrong: the spike rule was checked
            raise ValueError(f"spike_{exc}") from None

    def loss_spike(self) -> LossSpikeConfig:
        """The spike rule as the controller's loss rules run it."""
        shared = {f.name: getattr(self.spike, f.name) for f in fields(SpikeConfig)}
        return LossSpikeConfig(**shared, rebaseline_after=self.spike_rebaseline_after)


class RunDetector:
    def __init__(self, config: RulesConfig | None = None) -> None:
        self.config = cfg = config or RulesConfig()
        self.loss = LossRules(cfg.loss_spike(), cfg.divergence, last_n=cfg.evidence_last_n)
        self.grad_norm = GradNormRule(cfg.grad_norm)
        self.loss_scale = LossScaleRule(cfg.loss_scale)
        self.straggler = StragglerRule(cfg.straggler)
        self.mfu = MfuRule(cfg.mfu)
        self.heartbeat = HeartbeatRule(cfg.heartbeat)
        self.memory = MemoryRule(cfg.memory)
        self._loss_rank: int | None = None
        self._last_step: int | None = None  # newest step judged by the loss rules
        self._catching_up = False
        self.rewinds = 0

    # -- events ------------------------------------------------------------------------------

    def on_event(self, event: Event) -> list[Verdict]:
        if event.type is EventType.RUN_STARTED:
            self.heartbeat.started()
        self.heartbeat.seen(event.rank, event.ts, event.step)
        if event.type in (EventType.RUN_FINISHED, EventType.RUN_FAILED):
            self.heartbeat.ended()
            return []
        if event.type is not EventType.STEP:
            return []
        data = event.data
        out: list[Verdict] = []
        out += self.straggler.observe(event.step, event.rank, data)
        out += self.mfu.observe(event.step, event.rank, data)
        out += self.memory.observe(event.step, event.rank, int(data.get("mem_reserved", 0)),
                                   int(data.get("mem_allocated", 0)))
        if self._loss_rank is None or event.rank < self._loss_rank:
            self._catching_up = self._loss_rank is not None
            self._loss_rank = event.rank
        if event.rank != self._loss_rank:
            return out
        if self._catching_up:
            if self._last_step is not None and event.step <= self._last_step:
                return out
            self._catching_up = False
        out += self.observe_loss(event.step, float(data["loss"]))
        out += self.grad_norm.observe(event.step, data)
        out += self.loss_scale.observe(event.step, float(data.get("loss_scale", 1.0)))
        return out

    def observe_loss(self, step: int, loss: float) -> list[Verdict]:
        """The loss rules alone, for one global loss (the backtest's entry point)."""
        if self._last_step is not None and step <= self._last_step:
            self.loss.rewind()
            self.rewinds += 1
        self._last_step = step
        return self.loss.observe(step, loss)

    def tick(self, now: float) -> list[Verdict]:
        return self.heartbeat.tick(now)

    def window_evidence(self) -> dict[str, Any]:
        """The loss window now: median, sigma, n and the newest losses as [step, loss]."""
        return self.loss.window_evidence()

    # -- persistence -------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss.state_dict(),
            "grad_norm": self.grad_norm.state_dict(),
            "loss_scale": self.loss_scale.state_dict(),
            "straggler": self.straggler.state_dict(),
            "mfu": self.mfu.state_dict(),
            "heartbeat": self.heartbeat.state_dict(),
            "memory": self.memory.state_dict(),
            "loss_rank": self._loss_rank,
            "last_step": self._last_step,
            "catching_up": self._catching_up,
            "rewinds": self.rewinds,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loss.load_state_dict(state["loss"])
        self.grad_norm.load_state_dict(state["grad_norm"])
        self.loss_scale.load_state_dict(state["loss_scale"])
        self.straggler.load_state_dict(state["straggler"])
        self.mfu.load_state_dict(state["mfu"])
        self.heartbeat.load_state_dict(state["heartbeat"])
        self.memory.load_state_dict(state["memory"])
        self._loss_rank = state.get("loss_rank")
        self._last_step = state.get("last_step")
        self._catching_up = bool(state.get("catching_up", False))
        self.rewinds = int(state.get("rewinds", 0))
