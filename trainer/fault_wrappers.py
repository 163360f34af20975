"""Fault injection from outside the product: wrappers around the bundled trainer's parts.

``FaultInjector`` (trainer/faults.py) decides *which* fault fires at which step; this module puts
it around the objects the loop already uses, so trainer/loop.py, the agent and the publisher
carry no fault branch. ``wire_faults(specs, rank, seed)`` gives one ``FaultWiring`` whose
wrappers are identities when no fault is configured:

==================  ===================================================================
wrapper             faults
==================  ===================================================================
``sampler``         ``kill_rank`` (at the step's first batch), ``corrupt`` (the batch), the
                    data faults ``data_shift``, ``dup_burst``, ``garble`` (the batch's content:
                    trainer/data_faults.py), and it is the step clock of the others
``schedule``        ``lr_blowup`` (the scheduled LR times the factor)
``attach(model)``   ``slow_rank`` (a forward pre-hook sleeps once per step, outside the
                    data wait), ``nan`` (a forward hook makes the training loss NaN),
                    ``bad_rank`` (the same hook scales the bad node's training loss at every
                    forward, the kit's re-runs included)
``producers``       ``broker_outage`` (the publisher's producers refuse to connect or
                    send: the publisher's own outage path spills and later replays)
==================  ===================================================================

The hang injectors (trainer/hang_faults.py: ``hang_rank``, ``kill_in_collective``,
``stuck_loader``, ``slow_node_check``) ride on the same wrappers: the sampler (the loader's
deadlock, the kill's watcher), the forward pre-hook (the sleep before the all-reduce) and the
kit's ``node_check_hook`` (``node_check``).
"""

from __future__ import annotations

from typing import Any

import torch

from cliffguard.agent.publisher import ProducerFactory
from cliffguard.trainer import data_faults
from cliffguard.trainer.data import Sampler
from cliffguard.trainer.faults import FaultInjector, FaultSpec
from cliffguard.trainer.hang_faults import HangFault, HangFaults, is_hang_fault
from cliffguard.trainer.schedule import WarmupCosine

OUTAGE = "simulated outage (fault injection)"


class OutageSwitch:
    """While ``down``, producers cannot be built and the ones built cannot send (broker_outage)."""

    def __init__(self) -> None:
        self.down = False

    def producers(self, inner: ProducerFactory) -> ProducerFactory:
        def factory() -> Any:
            if self.down:
                raise ConnectionError(OUTAGE)
            return _SwitchedProducer(inner(), self)

        return factory


class _SwitchedProducer:
    """A producer that refuses to send while its switch is down; everything else is the inner one's."""

    def __init__(self, inner: Any, switch: OutageSwitch) -> None:
        self._inner = inner
        self._switch = switch

    def send(self, *args: Any, **kwargs: Any) -> Any:
        if self._switch.down:
            raise ConnectionError(OUTAGE)
        return self._inner.send(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _Clock:
    """The step the loop is in: set by the faulty sampler, read by the model hooks."""

    step = -1
    slept = False
    """Whether this step's straggler sleep happened (once per batch, so also on a replayed step)."""


class FaultySampler:
    """A ``Sampler`` whose ``batch(step)`` first applies the step's faults; the rest is the inner one's."""

    def __init__(self, inner: Sampler, faults: FaultInjector, clock: _Clock, switch: OutageSwitch,
                 hangs: HangFaults | None = None) -> None:
        self._inner = inner
        self._faults = faults
        self._clock = clock
        self._switch = switch
        self._hangs = hangs
        self._bursts: dict[int, tuple[torch.Tensor, torch.Tensor, Any]] = {}  # dup_burst spec -> its first batch

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        self._clock.step, self._clock.slept = step, False
        self._faults.maybe_kill(step)
        if self._hangs is not None:
            self._hangs.at_batch(step)
        self._switch.down = self._faults.broker_down(step)
        # what fed every shard, for shard_batch's re-runs (a stand-in sampler with no ranks is world 1)
        self._faults.note_content(step, getattr(self._inner, "world", 1))
        x, y, ids = self._inner.batch(step)
        x, y = self._faults.corrupt_pair(step, x, y)
        for spec in self._faults.data_faults(step):
            x, y, ids = self._data_fault(spec, step, x, y, ids)
        return x, y, ids

    def shard_batch(self, step: int, shard: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Rank ``shard``'s batch of ``step`` as its sampler fed it, content faults included, on any
        rank and with no side effect (no kill, hang, outage or window moved): a re-run of the step
        (trainer/rerun.py) sees bad data wherever it runs it. A ``dup_burst`` shard is rebuilt as the
        plain batch of the burst's first step."""
        x, y, ids = self._inner.shard_batch(step, shard)
        f = self._faults
        for spec in f.content_of(step, shard):
            if spec.kind == "corrupt":
                x, y = f.corrupted_pair(step, x, y, shard)
            elif spec.kind == "data_shift":
                x, y = data_faults.shifted(x, y, step, shard, f.seed)
            elif spec.kind == "garble":
                x, y = data_faults.garbled(x, y, step, shard, f.seed)
            else:
                x, y, ids = self._inner.shard_batch(spec.step, shard)
        return x, y, ids

    def _data_fault(self, spec: FaultSpec, step: int, x: torch.Tensor, y: torch.Tensor,
                    ids: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        f = self._faults
        if spec.kind == "data_shift":
            return (*data_faults.shifted(x, y, step, f.rank, f.seed), ids)
        if spec.kind == "garble":
            return (*data_faults.garbled(x, y, step, f.rank, f.seed), ids)
        first = self._bursts.setdefault(id(spec), (x, y, ids))  # dup_burst: the burst's first batch, again
        return first[0].clone(), first[1].clone(), list(first[2])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultySchedule:
    """A ``WarmupCosine`` whose ``lr_at`` carries the LR blow-ups; the rest is the inner one's."""

    def __init__(self, inner: WarmupCosine, faults: FaultInjector) -> None:
        self._inner = inner
        self._faults = faults

    def lr_at(self, step: int) -> float:
        return self._inner.lr_at(step) * self._faults.lr_factor(step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class FaultWiring:
    """The wrappers of one process's faults (``wire_faults``); identities without faults."""

    def __init__(self, faults: FaultInjector | None, hangs: HangFaults | None = None) -> None:
        self.injector = faults
        self.hangs = hangs
        self.switch = OutageSwitch()
        self._clock = _Clock()

    def sampler(self, sampler: Sampler) -> Sampler:
        if self.injector is None:
            return sampler
        return FaultySampler(sampler, self.injector, self._clock, self.switch, self.hangs)  # type: ignore[return-value]

    def watch(self, collective: Any) -> None:
        """The agent's note of the collective the training thread is inside (kill_in_collective)."""
        if self.hangs is not None:
            self.hangs.collective = collective

    @property
    def node_check(self) -> Any:
        """The kit's ``node_check_hook`` (slow_node_check), None without one."""
        return self.hangs.node_check_round if self.hangs is not None and self.hangs.specs else None

    def schedule(self, schedule: WarmupCosine) -> WarmupCosine:
        if self.injector is None:
            return schedule
        return FaultySchedule(schedule, self.injector)  # type: ignore[return-value]

    def producers(self, inner: ProducerFactory) -> ProducerFactory:
        return inner if self.injector is None else self.switch.producers(inner)

    def attach(self, model: torch.nn.Module) -> None:
        """The straggler's sleep before the step's first forward, the NaN loss after each training
        forward (a model in eval mode, validating, is left alone)."""
        faults = self.injector
        if faults is None:
            return

        clock = self._clock

        hangs = self.hangs

        def before(module: torch.nn.Module, args: Any) -> None:
            if module.training and not clock.slept:
                clock.slept = True
                faults.delay(clock.step)
                faults.flip_param(clock.step, module)
                if hangs is not None:
                    hangs.before_forward(clock.step)

        def after(module: torch.nn.Module, args: Any, output: Any) -> Any:
            if not module.training:
                return None
            if faults.nan_loss(clock.step):
                logits, loss = output
                return logits, loss * float("nan")
            if (factor := faults.bad_rank_factor(clock.step)) != 1.0:
                logits, loss = output
                return logits, loss * factor
            return None

        model.register_forward_pre_hook(before)
        model.register_forward_hook(after)


def wire_faults(specs: list[str], rank: int, seed: int = 0, state_dir: Any = None) -> FaultWiring:
    """The wrappers for ``--fault`` specs on ``rank`` (identities when ``specs`` is empty); the hang
    faults count their firings across restarts in ``state_dir``."""
    if not specs:
        return FaultWiring(None)
    hang = [HangFault.parse(s) for s in specs if is_hang_fault(s)]
    classic = [s for s in specs if not is_hang_fault(s)]
    if hang and state_dir is None:
        raise ValueError("faults: the hang faults need a state_dir (they count across restarts)")
    return FaultWiring(FaultInjector(classic, rank, seed=seed, state_dir=state_dir),
                       HangFaults(hang, rank, state_dir) if hang else None)
