"""The one place the agent's parts are made and wired (``build_agent``); ``Agent`` (agent/hooks.py)
is their facade.

The parts, each its own module: ``Ranks`` (agent/ranks.py), the ``Emitter`` to the sink
(agent/emitter.py), the ``CommandChannel`` (agent/command_channel.py: listener, inbox, acks), the
``StepProbe`` (agent/step_probe.py: what the training thread calls each step), the
``Lifecycle`` (agent/lifecycle.py: start, heartbeats, close) and the ``HangPart``
(agent/hang/part.py: the watchdog, its evidence and the restart command). Without a sink the agent publishes
to Kafka when given ``kafka`` (else nowhere); rank 0 listens for commands when given ``kafka``
and a command key (else none are listened for).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.collectors.timing import StepClock
from cliffguard.agent.command_channel import CommandChannel, CommandSource
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.detail import DetailWindow
from cliffguard.agent.emitter import Emitter
from cliffguard.agent.guard import Guard
from cliffguard.agent.hang.part import HangPart
from cliffguard.agent.lifecycle import Lifecycle
from cliffguard.agent.lr_scale import LRScale
from cliffguard.agent.modes import ModeMachine
from cliffguard.agent.publisher import ProducerFactory, Publisher, PublisherConfig, kafka_producer
from cliffguard.agent.ranks import AcceleratorLike, Ranks
from cliffguard.agent.sinks import EventSink, NullSink
from cliffguard.agent.step_probe import StepProbe
from cliffguard.core.deployment import (
    AGENT_SECRET_ENV,
    EVENT_KEY_ENV,
    PUBLIC_KEY_ENV,
    SECRET_ENV,
    agent_event_signer,
    agent_verifying_key,
)
from cliffguard.core.events import Command
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.keys import CommandPublicKey, EventSigner
from cliffguard.core.signing import VerifyingKey

log = logging.getLogger(__name__)

ProducerWrapper = Callable[[ProducerFactory], ProducerFactory]
"""Decorates the publisher's producer factory (trainer/fault_wrappers.py's broker outage switch)."""


@dataclass(frozen=True, slots=True)
class AgentParts:
    config: AgentConfig
    instance: str
    """This start of this process: names its spill file (agent/spill.py), so no other start replays it."""
    ranks: Ranks
    sink: EventSink
    emitter: Emitter
    guard: Guard
    modes: ModeMachine
    lr_scale: LRScale
    channel: CommandChannel
    probe: StepProbe
    lifecycle: Lifecycle
    hang: HangPart


def load_secret(value: str | None = None) -> VerifyingKey | None:
    """The key commands are verified with, by the deployment's one rule (``core/deployment.py``):
    the Ed25519 public key (``CLIFFGUARD_COMMAND_PUBLIC_KEY[_FILE]``) when set, else the HMAC
    secret, ``value`` (what a config file says) < ``CLIFFGUARD_COMMAND_SECRET``; None when unset."""
    return agent_verifying_key(secret=value)


def build_agent(accelerator: AcceleratorLike | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                config: AgentConfig, *, shape: ModelShape | None = None, seq_len: int | None = None,
                sink: EventSink | None = None, kafka: KafkaConfig | None = None,
                publisher_config: PublisherConfig | None = None, secret: VerifyingKey | None = None,
                command_source: CommandSource | None = None, event_signer: EventSigner | None = None,
                wrap_producer: ProducerWrapper | None = None) -> AgentParts:
    """Every part of one process's agent, wired (see the module docstring)."""
    instance = uuid.uuid4().hex[:12]
    ranks = Ranks.of(accelerator, model)
    if shape is None and seq_len is not None:
        shape = ModelShape.infer(model, seq_len)
    if sink is None and kafka is not None:
        if event_signer is None:
            event_signer = agent_event_signer(config.run)
        if event_signer is None and ranks.rank == 0:
            _say_unsigned(config.run, secret if secret is not None else load_secret())
    if sink is None:
        sink = _publisher(config, ranks, instance, kafka, publisher_config, event_signer, wrap_producer)
    probe: StepProbe | None = None
    emitter = Emitter(config.run, ranks, sink, step=lambda: probe.step if probe is not None else 0)
    guard, lr_scale, modes, detail, clock = Guard(config.guard), LRScale(), ModeMachine(), DetailWindow(), StepClock()
    if config.detail_steps:
        detail.open(0, config.detail_steps)
    channel = CommandChannel(ranks, emitter, detail, clock, step=lambda: probe.step if probe is not None else 0,
                             source=command_source)
    hang = HangPart(config.hang, config.run, ranks, emitter, modes, step=lambda: probe.step if probe is not None else 0,
                    base_dir=_hang_dir(config),
                    progress=lambda: ((probe.closed_steps, max(probe.marked_at, modes.changed_at)) if probe is not None
                                      else (0, modes.changed_at)))
    hang.ack = channel.ack
    hang.flush = sink.close
    if command_source is None and ranks.rank == 0 and kafka is not None:
        secret = secret if secret is not None else load_secret()
        if secret is not None:
            channel.source = _listener(config, kafka, secret, channel, hang.urgent)
        else:
            log.warning("no command key (%s or %s): commands are not listened for", PUBLIC_KEY_ENV, SECRET_ENV)
    # the global norm from the DDP hook's reduced buckets, unless an Accelerator's scaler unscales later
    bucket_norms = config.grad_norm_from_buckets and getattr(accelerator, "scaler", None) is None
    probe = StepProbe(config, ranks, model, optimizer, guard=guard, lr_scale=lr_scale, emitter=emitter, channel=channel,
                      detail=detail, clock=clock, shape=shape, bucket_norms=bucket_norms)
    lifecycle = Lifecycle(config, ranks, emitter, probe, channel, modes, sink, hang)
    return AgentParts(config=config, instance=instance, ranks=ranks, sink=sink, emitter=emitter, guard=guard,
                      modes=modes, lr_scale=lr_scale, channel=channel, probe=probe, lifecycle=lifecycle, hang=hang)


def _hang_dir(config: AgentConfig) -> Path:
    """Where a rank keeps its hang evidence and (by default) a restart plan: beside its spill."""
    from cliffguard.agent.spill import default_spill_dir

    return Path(config.spill_dir or default_spill_dir()) / f"hang-{config.run}"


def _say_unsigned(run: str, command_key: VerifyingKey | None) -> None:
    """One loud line at start when this run's events go out unsigned: a controller holding the
    agent secret dead-letters every one of them (``unsigned``), so nothing of the run would reach
    it and the trainer would otherwise never know."""
    fix = (f"set {AGENT_SECRET_ENV}_FILE (a trainer that is its own launcher: a plain, Accelerate, Hugging Face or "
           f"Lightning script, every rank) or {EVENT_KEY_ENV} (a worker, handed it by its launcher)")
    if isinstance(command_key, CommandPublicKey):  # a deployment with `cliffguard keys generate` keys
        log.error("cliffguard: run %s cannot sign its events: its controller (which holds the agent secret) will "
                  "dead-letter every one as unsigned, so the run never reaches it; %s", run, fix)
    else:
        log.warning("cliffguard: run %s sends its events unsigned: a controller holding an agent secret dead-letters "
                    "them; %s", run, fix)


def _publisher(config: AgentConfig, ranks: Ranks, instance: str, kafka: KafkaConfig | None,
               publisher_config: PublisherConfig | None, signer: EventSigner | None,
               wrap_producer: ProducerWrapper | None) -> EventSink:
    if kafka is None:
        return NullSink()
    # ``signer``: the run's event key (CLIFFGUARD_EVENT_KEY, or derived from CLIFFGUARD_AGENT_SECRET),
    # resolved by build_agent, which says so loudly when there is none
    if publisher_config is None:
        from cliffguard.agent.spill import default_spill_dir, spill_path, stale_spills

        # a per-user directory: agent/spill.py refuses one owned by someone else (like /tmp)
        spill_dir = config.spill_dir or default_spill_dir()
        publisher_config = PublisherConfig(spill_path=str(spill_path(spill_dir, config.run, ranks.rank, instance)))
        stale = stale_spills(spill_dir, config.run, ranks.rank, instance)
        if stale:
            log.warning("%d spill file(s) of earlier starts of run %s are not replayed into this one: %s",
                        len(stale), config.run, ", ".join(map(str, stale)))
    factory = functools.partial(kafka_producer, kafka, publisher_config)
    p = Publisher(kafka, publisher_config, signer=signer,
                  producer_factory=wrap_producer(factory) if wrap_producer is not None else None)
    p.start()
    return p


def _listener(config: AgentConfig, kafka: KafkaConfig, secret: VerifyingKey, channel: CommandChannel,
              urgent: Callable[[Command], bool]) -> CommandSource:
    from cliffguard.agent.listener import CommandListener
    from cliffguard.core.signing import CommandVerifier

    listener = CommandListener(kafka, config.run, CommandVerifier(config.run, secret), channel.on_reject,
                               urgent=urgent)
    listener.start(timeout=0)  # construction never blocks (a wrong bootstrap cost ~10 s); start() waits a little
    return listener
