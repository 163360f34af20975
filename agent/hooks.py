"""The ``Agent``: observers on any Accelerate (or plain DDP / single-process) training loop.

Attach in five lines::

    agent = Agent(accelerator, model, optimizer, AgentConfig(run="my-run"), kafka=kafka_cfg, secret=secret)
    agent.start()
    ...  loss = model(x); agent.after_forward(loss, tokens=x.numel()); accelerator.backward(loss)
    ...  agent.after_backward(); if agent.before_optimizer_step(): optimizer.step()
    ...  agent.after_step(); for cmd in agent.poll_commands(): ...   # then agent.close()

``Agent`` is the facade of its parts, built and wired by ``build_agent`` (agent/build.py): the
step probe (agent/step_probe.py: the per-step hooks and their one all-reduce and host read, the
guard's verdict), the command channel (agent/command_channel.py: rank 0's listener, the inbox,
the boundary broadcast, the acks) and the lifecycle (agent/lifecycle.py: the MFU peak, run
start and end, heartbeats). Events leave through the emitter as drafts (agent/drafts.py), which
the publisher's thread validates, encodes and signs; the training thread builds a plain dict.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from cliffguard.agent.build import ProducerWrapper, build_agent, load_secret
from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.collectors.timing import CommTimer
from cliffguard.agent.command_channel import CommandSource
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.data_watch.watcher import BatchReport, DataWatch, Scorer
from cliffguard.agent.lifecycle import LISTENER_WAIT_S
from cliffguard.agent.publisher import PublisherConfig
from cliffguard.agent.ranks import AcceleratorLike
from cliffguard.agent.sinks import EventSink
from cliffguard.core.enums import AckStatus, CommandType, EventType, GuardDecision
from cliffguard.core.events import Command
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.keys import EventSigner
from cliffguard.core.signing import VerifyingKey

__all__ = ["LISTENER_WAIT_S", "Agent", "AgentConfig", "load_secret"]

log = logging.getLogger(__name__)

V = TypeVar("V")


class Agent:
    """See the module docstring. One per process; every rank builds one."""

    def __init__(
        self,
        accelerator: AcceleratorLike | None,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None,
        config: AgentConfig,
        *,
        shape: ModelShape | None = None,
        seq_len: int | None = None,
        sink: EventSink | None = None,
        kafka: KafkaConfig | None = None,
        publisher_config: PublisherConfig | None = None,
        secret: VerifyingKey | None = None,
        command_source: CommandSource | None = None,
        event_signer: EventSigner | None = None,
        wrap_producer: ProducerWrapper | None = None,
    ) -> None:
        parts = build_agent(accelerator, model, optimizer, config, shape=shape, seq_len=seq_len, sink=sink,
                            kafka=kafka, publisher_config=publisher_config, secret=secret,
                            command_source=command_source, event_signer=event_signer, wrap_producer=wrap_producer)
        self.parts = parts
        self.config = config
        self.instance = parts.instance
        """This start of this process: names its spill file (agent/spill.py), so no other start replays it."""
        self.model = model
        self.optimizer = optimizer
        self.rank, self.world = parts.ranks.rank, parts.ranks.world
        self.device, self.distributed = parts.ranks.device, parts.ranks.distributed
        self.sink = parts.sink
        self.guard = parts.guard
        self.modes = parts.modes
        """The trainer's mode (agent/modes.py): the loop moves it, the heartbeats report it."""
        self.lr_scale = parts.lr_scale
        """The run's one LR scale: the loop reads it, the step event reports it, rollbacks set it."""
        self.probe = parts.probe
        self.channel = parts.channel
        self.lifecycle = parts.lifecycle
        self.hang = parts.hang
        """The watchdog, its evidence and the restart command (agent/hang/part.py)."""
        self.data_watch: DataWatch | None = None
        """The batch statistics' thread (``watch_data``), None where this rank does not watch."""

    # ------------------------------------------------------------------ what the parts know
    @property
    def step(self) -> int:
        """The optimizer step the next ``after_step`` closes (the run's one counter)."""
        return self.probe.step

    @property
    def commands(self) -> CommandSource | None:
        """Rank 0's command source (the listener), None elsewhere or when none listens."""
        return self.channel.source

    @property
    def shape(self) -> ModelShape | None:
        return self.probe.shape

    @property
    def comm(self) -> CommTimer | None:
        """The DDP communication hook's state (agent/collectors/timing.py), None without DDP."""
        return self.probe.comm

    @property
    def peak_flops(self) -> float:
        return self.probe.peak_flops

    @property
    def peak_source(self) -> str:
        return self.probe.peak_source

    @property
    def last(self) -> dict[str, Any]:
        """The last step event's data."""
        return self.probe.last

    @property
    def decision(self) -> GuardDecision:
        return self.probe.decision

    @property
    def global_loss(self) -> float:
        return self.probe.global_loss

    @property
    def saw_loss(self) -> bool:
        """Whether ``after_forward`` was called in the current step."""
        return self.probe.saw_loss

    @property
    def closed(self) -> bool:
        return self.lifecycle.closed

    # ------------------------------------------------------------------ events and lifecycle
    def emit(self, type: EventType, data: dict[str, Any], *, step: int | None = None) -> None:
        """Hand one event's draft to the sink, which builds it (the publisher on its thread,
        agent/drafts.py; never raises: a bad event is logged and dropped, and the sink counts it)."""
        self.parts.emitter.emit(type, data, step=step)

    def start(self, *, global_batch: int = 0, lr_schedule: dict[str, Any] | None = None,
              config: dict[str, Any] | None = None, capabilities: Iterable[CommandType | str] | None = None) -> None:
        """Resolve the MFU peak (same on every rank), emit ``run.started`` (rank 0), start heartbeats
        (agent/lifecycle.py). ``capabilities``: the commands this loop applies; None declares nothing."""
        self.lifecycle.start(global_batch=global_batch, lr_schedule=lr_schedule, config=config,
                             capabilities=capabilities)

    def close(self, error: BaseException | str | None = None, *, final_loss: float | None = None,
              ended: bool = True) -> None:
        """Emit run.finished/run.failed (rank 0) and close everything, each part even if another fails
        (the data watch first: its last window goes out before the run's end). ``ended=False``: a
        preempted run that will be requeued (``run.preempted`` said so): no run.finished."""
        if self.data_watch is not None:
            try:
                self.data_watch.close()
            except Exception:  # noqa: BLE001 - close the rest anyway
                log.exception("closing the data watch failed")
        self.lifecycle.close(error, final_loss=final_loss, ended=ended)

    # ------------------------------------------------------------------ the data watch
    def watch_data(self, *, garbled: Scorer | None = None, perplexity: Scorer | None = None,
                   prepare: Callable[[], None] | None = None,
                   on_batch: Callable[[BatchReport], None] | None = None) -> DataWatch | None:
        """Start the data watch (``[agent.data_watch]``) on this rank if it is one of the first
        ``ranks`` and the watch is enabled; ``observe_batch`` then hands it each batch. The scorers
        and ``prepare`` run on its thread (agent/data_watch/watcher.py). None where it does not watch."""
        cfg = self.config.data_watch
        if self.data_watch is not None or not cfg.enabled or self.rank >= cfg.ranks:
            return self.data_watch
        self.data_watch = DataWatch(cfg, self.emit, garbled=garbled, perplexity=perplexity, prepare=prepare,
                                    on_batch=on_batch, name=f"cliffguard-data-watch-r{self.rank}").start()
        return self.data_watch

    def observe_batch(self, tokens: torch.Tensor, sample_ids: Iterable[int] | None = None, *,
                      attention_mask: torch.Tensor | None = None, step: int | None = None) -> None:
        """This step's batch of token ids [B, T] to the data watch (a queue put; nothing where it
        does not watch). Hand it over before anything changes it in place."""
        if self.data_watch is not None:
            self.data_watch.observe(self.step if step is None else step, tokens,
                                    None if sample_ids is None else list(sample_ids), attention_mask)

    # ------------------------------------------------------------------ per-step hooks (the probe's)
    def set_step(self, step: int) -> None:
        """The optimizer step the next ``after_step`` closes (after a rollback or a resume)."""
        self.probe.set_step(step)

    def data_wait(self) -> contextlib.AbstractContextManager[None]:
        return self.probe.data_wait()

    def wrap_loader(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``loader`` timing each fetch as data wait."""
        return self.probe.wrap_loader(loader)

    def after_forward(self, loss: torch.Tensor, *, tokens: int = 0) -> None:
        self.probe.after_forward(loss, tokens=tokens)

    def after_backward(self) -> None:
        self.probe.after_backward()

    def before_optimizer_step(self) -> bool:
        """The step's one all-reduce and host read, then the guard. True = apply the update."""
        return self.probe.before_optimizer_step()

    def after_step(self, *, skipped: bool | None = None, loss_scale: float = 1.0, clipped_layers: int = 0,
                   sample_range: list[int] | None = None, lr: float | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the step (agent/step_probe.py); returns the step event's data."""
        return self.probe.after_step(skipped=skipped, loss_scale=loss_scale, clipped_layers=clipped_layers,
                                     sample_range=sample_range, lr=lr, extra=extra)

    def report_step(self, loss: float, *, step: int | None = None, lr: float | None = None,
                    grad_norm: float | None = None, tokens: int = 0) -> dict[str, Any]:
        """A step event from scalars only, for loops the agent does not hook (report-only)."""
        return self.probe.report_step(loss, step=step, lr=lr, grad_norm=grad_norm, tokens=tokens)

    # ------------------------------------------------------------------ commands (the channel's)
    def poll_commands(self) -> list[Command]:
        """At the step boundary: the commands every rank applies now (same list on every rank)."""
        return self.channel.poll_commands()

    def exchange(self, rank0_value: V | None = None) -> tuple[list[Command], V | None]:
        """While paused/held: rank 0's queued commands and a value it decides, on every rank."""
        return self.channel.exchange(rank0_value)

    def ack(self, cmd: Command, status: AckStatus, detail: str = "", available: tuple[int, ...] | None = None) -> None:
        """Rank 0 reports a command's outcome (after applying it)."""
        self.channel.ack(cmd, status, detail, available)

    # ------------------------------------------------------------------ checkpointed state
    def state_dict(self) -> dict[str, Any]:
        return {"guard": self.guard.state_dict(), "lr_scale": self.lr_scale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guard.load_state_dict(state["guard"])
        self.lr_scale.load_state_dict(state["lr_scale"])
