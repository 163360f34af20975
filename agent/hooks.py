"""The ``Agent``: observers on any Accelerate (or plain DDP / single-process) training loop.

Attach in five lines::

    agent = Agent(accelerator, model, optimizer, AgentConfig(run="my-run"), kafka=kafka_cfg, secret=secret)
    agent.start()
    ...  loss = model(x); agent.after_forward(loss, tokens=x.numel()); accelerator.backward(loss)
    ...  agent.after_backward(); if agent.before_optimizer_step(): optimizer.step()
    ...  agent.after_step(); for cmd in agent.poll_commands(): ...   # then agent.close()

The single host sync. ``before_optimizer_step`` packs, on the device, one small float64 tensor —
``[per-rank loss slots (world) | pending-command flag | norm contributors | global grad-norm² |
per-layer grad-norm² (every layer_norms_every steps)]``, plus every ``ranks_every`` steps the
per-rank performance block (agent/rank_perf.py) — all-reduces it once (SUM) and reads it once
(``.tolist()``); the tensor is a kept buffer filled in place (agent/packed_step.py). Each rank
writes its own loss into its own slot, so after the sum every rank holds every rank's loss (its
``loss_local`` and the global mean) without a second read; rank 0 writes the number of commands
it has queued into the flag, so every rank learns at the same step that a command body is to be
broadcast. Under DDP the gradients are identical on every rank, so
only the ranks that publish a step event (rank 0, and a rank in a detail window) compute norms;
each that does counts 1 in the contributors slot and the norms are the sum over it. Rank 0 alone
turns the loss slots into the run-level ``step`` event's loss summary (core/rank_arrays.py): one
step event per step whatever the world. That is the only per-step host sync; a ``grad_hist``
emission adds one on rank 0 every ``hist_every`` steps.

Off the training thread: events go to a ``Publisher`` as drafts (agent/drafts.py), which its
thread validates, encodes and signs; the training thread builds a plain dict of numbers.

Commands: rank 0 polls the ``CommandListener`` (non-blocking) right before that all-reduce. When
the flag is set, ``poll_commands()`` broadcasts the verified commands from rank 0
(``broadcast_object_list``) and returns the same list on every rank; the caller applies them at
that step boundary and rank 0 acks (``Agent.ack``). While paused or held there is no forward
pass to carry the flag, so ``exchange()`` does a broadcast per tick instead.

The guard decides on the all-reduced loss (identical on every rank), see ``agent/guard.py``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from cliffguard.agent.collectors.grad_hist import GradHistogram, layer_name
from cliffguard.agent.collectors.memory import memory_stats
from cliffguard.agent.collectors.mfu import ModelShape, mfu, resolve_peak
from cliffguard.agent.collectors.timing import StepClock, attach_comm_timer
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.detail import DetailWindow, detail_steps
from cliffguard.agent.drafts import EventDraft
from cliffguard.agent.guard import Guard
from cliffguard.agent.heartbeat import Heartbeat
from cliffguard.agent.lr_scale import LRScale
from cliffguard.agent.modes import STOPPING, ModeMachine
from cliffguard.agent.node_beats import NodeBeats, NodeLayout
from cliffguard.agent.packed_step import PackedStep
from cliffguard.agent.rank_perf import PERF_FIELDS, PerfAccumulator, publishes_chunk, ranks_payload
from cliffguard.agent.sinks import NullSink
from cliffguard.core.capabilities import normalize as normalize_capabilities
from cliffguard.core.deployment import PUBLIC_KEY_ENV, SECRET_ENV, agent_event_signer, agent_verifying_key
from cliffguard.core.enums import AckStatus, CommandType, EventType, GuardDecision
from cliffguard.core.events import Command
from cliffguard.core.rank_arrays import summarize_losses

if TYPE_CHECKING:
    from cliffguard.agent.publisher import ProducerFactory

log = logging.getLogger(__name__)

LISTENER_WAIT_S = 2.0
"""At ``start``: how long to wait for the command listener to reach the end of the topic."""


def load_secret(value: str | None = None) -> Any:
    """The key commands are verified with, by the deployment's one rule (``core/deployment.py``):
    the Ed25519 public key (``CLIFFGUARD_COMMAND_PUBLIC_KEY[_FILE]``) when set, else the HMAC
    secret, ``value`` (what a config file says) < ``CLIFFGUARD_COMMAND_SECRET``; None when unset."""
    return agent_verifying_key(secret=value)


class Agent:
    """See the module docstring. One per process; every rank builds one."""

    def __init__(
        self,
        accelerator: Any,
        model: torch.nn.Module,
        optimizer: Any,
        config: AgentConfig,
        *,
        shape: ModelShape | None = None,
        seq_len: int | None = None,
        sink: Any = None,
        kafka: Any = None,
        publisher_config: Any = None,
        secret: Any = None,
        command_source: Any = None,
        event_signer: Any = None,
        wrap_producer: Callable[[ProducerFactory], ProducerFactory] | None = None,
    ) -> None:
        self.config = config
        self.instance = uuid.uuid4().hex[:12]
        """This start of this process: names its spill file (agent/spill.py), so no other start replays it."""
        self.model = model
        self.optimizer = optimizer
        if accelerator is not None:
            self.rank, self.world, self.device = accelerator.process_index, accelerator.num_processes, accelerator.device
        else:
            self.rank = dist.get_rank() if dist.is_initialized() else 0
            self.world = dist.get_world_size() if dist.is_initialized() else 1
            self.device = next(model.parameters()).device
        self.distributed = self.world > 1 and dist.is_available() and dist.is_initialized()
        self.shape = shape
        if self.shape is None and seq_len is not None:
            self.shape = ModelShape.infer(model, seq_len)
        self.guard = Guard(config.guard)
        self.step = 0
        self.modes = ModeMachine()
        """The trainer's mode (agent/modes.py): the loop moves it, the heartbeats report it."""
        self.lr_scale = LRScale()
        """The run's one LR scale: the loop reads it, the step event reports it, rollbacks set it."""
        self.peak_flops = 0.0
        self.peak_source = ""
        self.sink = sink if sink is not None else self._make_publisher(kafka, publisher_config, event_signer,
                                                                          wrap_producer)
        self.commands = command_source
        if self.commands is None and self.rank == 0 and kafka is not None:
            secret = secret if secret is not None else load_secret()
            if secret is not None:
                self.commands = self._make_listener(kafka, secret)
            else:
                log.warning("no command key (%s or %s): commands are not listened for", PUBLIC_KEY_ENV, SECRET_ENV)
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._layer_names = [layer_name(n) for n, _ in self._params]
        self._with_grad: list[int] = []  # indices into _params that had a gradient at the last norms
        self._hist = GradHistogram(config.hist)  # keeps its layout and buffers from read to read
        self._packed: PackedStep | None = None  # the step's all-reduced tensor, built on the first step
        self.comm = attach_comm_timer(model)
        self._grads_identical = self.comm is not None
        """Under DDP every rank holds the same (all-reduced) gradients, so only the ranks that
        publish a step event compute their norms; otherwise every rank's count in the mean."""
        self._bucket_norms = config.grad_norm_from_buckets and getattr(accelerator, "scaler", None) is None
        """The global norm from the DDP hook's reduced buckets (an Accelerator's scaler unscales later)."""
        self._clock = StepClock()
        self._heartbeat: Heartbeat | None = None
        self._node: NodeBeats | None = None
        self._collective = ""  # the agent collective the training thread is inside (node heartbeats)
        self._perf = PerfAccumulator()
        self._detail = DetailWindow()
        if config.detail_steps:
            self._detail.open(0, config.detail_steps)
        self._losses: list[float] = []  # every rank's loss at this step (from the packed all-reduce)
        self._pending: list[Command] = []
        self._flag_seen = False
        self._reset_step_accumulators()
        self.last: dict[str, Any] = {}
        self._closed = False

    # ------------------------------------------------------------------ wiring
    def _make_publisher(self, kafka: Any, publisher_config: Any, signer: Any,
                        wrap_producer: Callable[[ProducerFactory], ProducerFactory] | None) -> Any:
        from cliffguard.agent import publisher as pub

        if kafka is None:
            return NullSink()
        # The run's event key (CLIFFGUARD_EVENT_KEY, or derived from CLIFFGUARD_AGENT_SECRET):
        # a controller holding the agent secret dead-letters unsigned events.
        signer = signer if signer is not None else agent_event_signer(self.config.run)
        if publisher_config is None:
            from cliffguard.agent.spill import default_spill_dir, spill_path, stale_spills

            # a per-user directory: agent/spill.py refuses one owned by someone else (like /tmp)
            spill_dir = self.config.spill_dir or default_spill_dir()
            publisher_config = pub.PublisherConfig(
                spill_path=str(spill_path(spill_dir, self.config.run, self.rank, self.instance)))
            stale = stale_spills(spill_dir, self.config.run, self.rank, self.instance)
            if stale:
                log.warning("%d spill file(s) of earlier starts of run %s are not replayed into this one: %s",
                            len(stale), self.config.run, ", ".join(map(str, stale)))
        # wrap_producer: a decorated producer (trainer/fault_wrappers.py's broker outage switch)
        factory = functools.partial(pub.kafka_producer, kafka, publisher_config)
        p = pub.Publisher(kafka, publisher_config, signer=signer,
                          producer_factory=wrap_producer(factory) if wrap_producer is not None else None)
        p.start()
        return p

    def _make_listener(self, kafka: Any, secret: Any) -> Any:
        from cliffguard.agent.listener import CommandListener
        from cliffguard.core.signing import CommandVerifier

        listener = CommandListener(kafka, self.config.run, CommandVerifier(self.config.run, secret), self._on_reject)
        listener.start(timeout=0)  # construction never blocks (a wrong bootstrap cost ~10 s); start() waits a little
        return listener

    def _on_reject(self, cmd_id: str, cmd_type: str, status: AckStatus, detail: str) -> None:
        log.warning("command %s (%s) %s: %s", cmd_id, cmd_type, status, detail)
        self.emit(EventType.COMMAND_ACK, {"cmd": cmd_id, "cmd_type": cmd_type, "status": str(status), "detail": detail})

    def emit(self, type: EventType, data: dict[str, Any], *, step: int | None = None) -> None:
        """Hand one event's draft to the sink, which builds it (the publisher on its thread,
        agent/drafts.py; never raises: a bad event is logged and dropped, and the sink counts it)."""
        self.sink.publish(EventDraft(type, self.config.run, self.step if step is None else step, dict(data),
                                     rank=self.rank, world=self.world))

    # ------------------------------------------------------------------ lifecycle
    def start(self, *, global_batch: int = 0, lr_schedule: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
              capabilities: Iterable[CommandType | str] | None = None) -> None:
        """Resolve the MFU peak (same on every rank), emit ``run.started`` (rank 0), start heartbeats.

        ``capabilities``: the commands this loop applies (``core/capabilities.py``); the controller
        sends no other. None declares nothing, which the controller reads as every command."""
        peak, source = resolve_peak(self.device, self.config.peak_flops, self.config.calibration_s)
        if self.distributed and source == "calibration":
            # Ranks calibrate concurrently and differ a little; all use the highest (a conservative MFU).
            t = torch.tensor([peak], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            peak = float(t.item())
        self.peak_flops, self.peak_source = peak, source
        if self.rank == 0:
            shape = self.shape or ModelShape(n_params=sum(p.numel() for _, p in self._params), n_layers=0, n_heads=0, head_dim=0, seq_len=0)
            self.emit(EventType.RUN_STARTED, {
                "n_params": shape.n_params, "n_layers": shape.n_layers, "n_heads": shape.n_heads,
                "head_dim": shape.head_dim, "seq_len": shape.seq_len, "global_batch": global_batch,
                "peak_flops": peak, "peak_source": source, "lr_schedule": lr_schedule or {},
                "world_size": self.world, "config": config or {},
                **({} if capabilities is None else {"capabilities": list(normalize_capabilities(capabilities))}),
            })
        self._node = self._make_node_beats()
        wait_ready = getattr(self.commands, "wait_ready", None)
        if wait_ready is not None:
            wait_ready(LISTENER_WAIT_S)  # commands sent before the listener is positioned are re-sent by the controller
        self._heartbeat = Heartbeat(self.config.heartbeat_s, self._beat, name=f"cliffguard-heartbeat-r{self.rank}").start()
        self._clock.restart()

    def _make_node_beats(self) -> NodeBeats | None:
        from cliffguard.agent.spill import default_spill_dir

        base = Path(self.config.spill_dir or default_spill_dir())
        try:
            return NodeBeats(base / f"beats-{self.config.run}", NodeLayout.from_env(self.rank, self.world))
        except (OSError, ValueError):
            log.exception("node heartbeats unavailable; this rank beats for itself")
            return None

    def _beat(self) -> None:
        """Every rank says it is alive in its node file; the node's leader publishes the node's
        heartbeat (agent/node_beats.py). Without the files a rank beats for itself."""
        if self._node is None:
            self.emit(EventType.HEARTBEAT, {"state": str(self.modes.mode)})
            return
        self._node.write(self.step, self._collective)
        if self._node.layout.leader:
            self.emit(EventType.HEARTBEAT, {"state": str(self.modes.mode), **self._node.read()})

    def close(self, error: BaseException | str | None = None, *, final_loss: float | None = None) -> None:
        """Emit run.finished/run.failed (rank 0) and close everything, each part even if another fails."""
        if self._closed:
            return
        self._closed = True
        self.modes.move(STOPPING)
        if self.rank == 0:
            if error is not None:
                self.emit(EventType.RUN_FAILED, {"error": str(error) or type(error).__name__})
            else:
                data: dict[str, Any] = {"steps": self.step}
                if final_loss is not None:
                    data["final_loss"] = final_loss
                self.emit(EventType.RUN_FINISHED, data)
        for part in (self._heartbeat, self.commands, self.sink):
            if part is None:
                continue
            try:
                part.close()
            except Exception:  # noqa: BLE001 - close the rest anyway
                log.exception("closing %s failed", type(part).__name__)

    # ------------------------------------------------------------------ per-step hooks
    def _reset_step_accumulators(self) -> None:
        self._loss_sum: torch.Tensor | None = None
        self._micro = 0
        self._tokens = 0
        self._decision = GuardDecision.OK
        self._global_loss = float("nan")
        self._local_loss = float("nan")
        self._grad_norm = float("nan")
        self._layer_norms: dict[str, float] = {}
        self._bucket_norm_sq: torch.Tensor | float | None = None  # from the DDP hook, at the last backward
        if getattr(self, "comm", None) is not None:
            self.comm.reset()

    def set_step(self, step: int) -> None:
        """The optimizer step the next ``after_step`` closes (after a rollback or a resume)."""
        self.step = step
        self._reset_step_accumulators()
        self._perf.reset()
        self._clock.restart()

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._clock.data_wait += time.perf_counter() - t0

    def wrap_loader(self, loader: Iterable[Any]) -> Iterator[Any]:
        """Yield from ``loader`` timing each fetch as data wait."""
        it = iter(loader)
        while True:
            with self.data_wait():
                try:
                    batch = next(it)
                except StopIteration:
                    return
            yield batch

    def after_forward(self, loss: torch.Tensor, *, tokens: int = 0) -> None:
        """Record one micro-batch's loss (stays on device) and its token count on this rank."""
        d = loss.detach()  # one kernel at most: each costs ~10-20 us here (agent/packed_step.py)
        if d.dtype != torch.float32:
            d = d.float()
        if d.dim() != 0:
            d = d.reshape(())
        self._loss_sum = d if self._loss_sum is None else self._loss_sum + d
        self._micro += 1
        self._tokens += int(tokens)
        if self.comm is not None:  # the DDP hook then takes the global norm from the reduced buckets
            self.comm.want_grad_norm = self._bucket_norms and self._publishes()
        if self.distributed and self.comm is not None:
            self._collective = "backward"  # DDP's gradient all-reduce runs (and waits) inside it

    def after_backward(self) -> None:
        """Closes the backward: exposed gradient communication from the DDP hook."""
        self._collective = ""
        if self.comm is not None and self.comm.last_launch is not None:
            self._clock.comm_exposed += self.comm.exposed_since(time.perf_counter())
            # the last synchronising backward's buckets hold the step's (accumulated) gradients
            self._bucket_norm_sq = self.comm.grad_norm_sq()
            self.comm.reset()

    def before_optimizer_step(self) -> bool:
        """The step's one all-reduce and host read, then the guard. True = apply the update."""
        if self._loss_sum is None:
            raise RuntimeError("before_optimizer_step: call after_forward(loss) first")
        if self.rank == 0 and self.commands is not None:
            self._pending.extend(self._poll_source())
        w = self.world
        publishes = self._publishes()
        layers_due = self._layer_norms_due()
        sq = None
        if publishes or not self._grads_identical:
            sq = None if layers_due else self._bucket_norm_sq
            if sq is None:
                sq = self._norms_sq(layers_due)
        ranks_due = self._ranks_due()
        if self._packed is None or self._packed.device != self._loss_sum.device:
            self._packed = PackedStep(world=w, rank=self.rank, n_layers=len(self._params), device=self._loss_sum.device)
        # every rank's performance rides on the same all-reduce (agent/rank_perf.py)
        packed = self._packed.fill(loss_sum=self._loss_sum, micro=self._micro,
                                   flag=float(len(self._pending)) if self.rank == 0 else 0.0, sq=sq, layers=layers_due,
                                   perf=self._perf.slot() if ranks_due else None)
        if self.distributed:
            t0 = time.perf_counter()
            self._collective = "all_reduce"
            dist.all_reduce(packed)
            values = packed.tolist()  # the one per-step host sync
            self._collective = ""
            self._clock.comm_exposed += time.perf_counter() - t0
        else:
            values = packed.tolist()
        losses_host = values[:w]
        self._losses = losses_host
        self._local_loss = losses_host[self.rank]
        self._global_loss = sum(losses_host) / w
        self._flag_seen = values[w] > 0
        contributors = values[w + 1]
        if contributors > 0:  # the mean over the ranks that computed norms (identical ones under DDP)
            self._grad_norm = (values[w + 2] / contributors) ** 0.5
            if layers_due and publishes:
                layer_sq = values[w + 3 : w + 3 + len(self._params)]
                self._layer_norms = {self._layer_names[i]: (layer_sq[i] / contributors) ** 0.5 for i in self._with_grad}
        if ranks_due:
            self._emit_ranks(values[len(values) - len(PERF_FIELDS) * w :], losses_host)
        self._decision = self.guard.decide(self._global_loss, self.step)
        if self.rank == 0 and self.config.hist_every and self.step % self.config.hist_every == 0:
            self._emit_histograms()
        return Guard.applies_update(self._decision)

    def _publishes(self) -> bool:
        """Whether this rank publishes a step event for the current step."""
        return self.rank == 0 or self._detail.active(self.step)

    def _ranks_due(self) -> bool:
        """The same answer on every rank: they all close the same steps."""
        every = self.config.ranks_every
        return bool(every) and self.step % every == 0 and self._perf.n > 0

    def _layer_norms_due(self) -> bool:
        """Per-layer norms (work and bytes proportional to the layers) every ``layer_norms_every``
        steps; the same answer on every rank, so the packed tensor has the same layout on all."""
        every = self.config.layer_norms_every
        return self.config.layer_norms and bool(every) and self.step % every == 0 and bool(self._params)

    def _emit_ranks(self, block: list[float], losses: list[float]) -> None:
        per_event = self.config.ranks_per_event
        if publishes_chunk(self.rank, per_event):
            self.emit(EventType.RANKS, ranks_payload(block, losses, world=self.world, rank=self.rank,
                                                     per_event=per_event, steps=self._perf.n))
        self._perf.reset()

    def _norms_sq(self, per_layer: bool) -> torch.Tensor | None:
        """float64 ``[global grad-norm² | per-layer grad-norm² (one slot per parameter, 0 without a
        gradient), when per_layer]``; None when no parameter has a gradient. Sets ``_with_grad``."""
        idx, grads = [], []
        for i, (_n, p) in enumerate(self._params):
            if p.grad is not None:
                idx.append(i)
                g = p.grad.detach()
                grads.append(g if g.dtype == torch.float32 else g.float())
        self._with_grad = idx
        if not grads:
            return None
        # one fused kernel for every layer, not a norm and a square per tensor from Python
        sq = torch.stack(torch._foreach_norm(grads)).double().square()
        if not per_layer:
            return sq.sum().reshape(1)
        if len(idx) < len(self._params):
            sq = torch.zeros(len(self._params), dtype=torch.float64, device=sq.device).index_copy_(
                0, torch.tensor(idx, device=sq.device), sq)
        return torch.cat([sq.sum().reshape(1), sq])

    def _emit_histograms(self) -> None:
        try:
            layers = self._hist.read(self._params)
        except Exception:  # noqa: BLE001 - never break the step for a metric
            log.exception("gradient histogram failed at step %d", self.step)
            return
        if layers:
            self.emit(EventType.GRAD_HIST, {"edges": self.config.hist.edges(), "layers": layers})

    @property
    def decision(self) -> GuardDecision:
        return self._decision

    @property
    def global_loss(self) -> float:
        return self._global_loss

    def _raise_calibrated_peak(self, achieved_flops: float) -> None:
        """A calibrated peak is a measurement, and one taken while other processes held the cores
        is too low (MFU read 250% in a loaded demo). The model cannot beat the device's real peak,
        so a step that does proves the calibration low: the peak becomes what was achieved and
        the source says so. Table and configured peaks are facts and are never moved."""
        if not self.peak_source.startswith("calibration") or achieved_flops <= self.peak_flops:
            return
        if self.peak_source == "calibration":
            log.warning("calibrated peak %.3g FLOP/s was beaten by the model (%.3g); raising it", self.peak_flops,
                        achieved_flops)
        self.peak_flops, self.peak_source = achieved_flops, "calibration+observed"

    def after_step(self, *, skipped: bool | None = None, loss_scale: float = 1.0, clipped_layers: int = 0,
                   sample_range: list[int] | None = None, lr: float | None = None,
                   extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """Close the step: rank 0 emits the run-level ``step`` event (with every rank's loss
        summarised, core/rank_arrays.py); other ranks emit theirs only while a detail command asks
        (``detail: true``). Then the step counter advances.

        ``loss`` is the global mean; ``loss_local``, ``tokens``, ``tokens_per_s``, ``mfu``, the
        timings and memory are the sender's own; every rank's reach the controller in ``ranks``
        events every ``ranks_every`` steps.

        ``extra`` adds fields to the event (the schema tolerates unknown fields)."""
        total, data_wait, comm, compute = self._clock.split()
        if lr is None:
            lr = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0
        fpt = self.shape.flops_per_token() if self.shape is not None else 0.0
        alloc, reserved = memory_stats(self.device)
        self._raise_calibrated_peak(self._tokens * fpt / total if total > 0 else 0.0)
        data: dict[str, Any] = {
            "loss": self._global_loss, "loss_local": self._local_loss, "lr": lr, "lr_scale": self.lr_scale.value,
            "grad_norm": self._grad_norm, "tokens": self._tokens, "step_time_s": total,
            "data_wait_s": data_wait, "comm_exposed_s": comm, "compute_s": compute,
            "tokens_per_s": self._tokens / total if total > 0 else 0.0,
            "mfu": mfu(self._tokens, fpt, total, self.peak_flops), "mem_allocated": alloc, "mem_reserved": reserved,
            "loss_scale": float(loss_scale),
            "skipped": bool(skipped) if skipped is not None else not Guard.applies_update(self._decision),
            "clipped_layers": int(clipped_layers), "guard": str(self._decision),
        }
        if self._layer_norms:
            data["layer_grad_norms"] = self._layer_norms
        if sample_range is not None:
            data["sample_range"] = list(sample_range)
        if extra:
            data.update(extra)
        self._perf.add(data)
        if self.rank == 0:
            if len(self._losses) == self.world:  # not from report_step on a multi-rank loop
                data["rank_losses"] = summarize_losses(self._losses)
            self.emit(EventType.STEP, data)
        elif self._detail.active(self.step):
            data["detail"] = True
            self.emit(EventType.STEP, data)
        self.last = data
        self.step += 1
        self._reset_step_accumulators()
        self._clock.restart()
        return data

    def report_step(self, loss: float, *, step: int | None = None, lr: float | None = None,
                    grad_norm: float | None = None, tokens: int = 0) -> dict[str, Any]:
        """A step event from scalars only, for loops the agent does not hook (trackers, callbacks).

        The guard judges the loss but cannot skip an update it never saw: a critical verdict is
        reported as ``warn`` with ``skipped=false`` (report-only). Use the hooks to enforce it.
        """
        if step is not None:
            self.step = step
        self._global_loss = self._local_loss = float(loss)
        self._losses = [self._local_loss] if self.world == 1 else []
        self._grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        self._tokens = int(tokens)
        decision = self.guard.decide(self._global_loss, self.step)
        self._decision = decision if Guard.applies_update(decision) else GuardDecision.WARN
        return self.after_step(lr=lr, skipped=False)

    # ------------------------------------------------------------------ commands
    def _poll_source(self) -> list[Command]:
        try:
            return list(self.commands.poll())
        except Exception:  # noqa: BLE001 - a broken listener must not stop training
            log.exception("command poll failed")
            return []

    def _broadcast(self, payload: Any) -> Any:
        if not self.distributed:
            return payload
        box = [payload if self.rank == 0 else None]
        self._collective = "broadcast"
        dist.broadcast_object_list(box, src=0)
        self._collective = ""
        return box[0]

    def _open_detail(self, cmds: list[Command]) -> None:
        """A detail command opens the per-rank step window on every rank at this boundary."""
        for cmd in cmds:
            if cmd.type is CommandType.DETAIL:
                try:
                    self._detail.open(self.step, detail_steps(cmd.args))
                except (ValueError, KeyError):
                    pass  # the dispatch table rejects it with the reason

    def poll_commands(self) -> list[Command]:
        """At the step boundary: the commands every rank applies now (same list on every rank)."""
        if not self._flag_seen:
            return []
        self._flag_seen = False
        cmds = self._broadcast(self._pending if self.rank == 0 else None)
        self._pending = []
        self._clock.restart()
        self._open_detail(list(cmds or []))
        return list(cmds or [])

    def exchange(self, rank0_value: Any = None) -> tuple[list[Command], Any]:
        """While paused/held (no step to carry the flag): rank 0's queued commands and a value
        it decides (e.g. "the hold timed out"), broadcast so every rank acts on the same tick."""
        if self.rank == 0 and self.commands is not None:
            self._pending.extend(self._poll_source())
        cmds, value = self._broadcast((self._pending, rank0_value) if self.rank == 0 else None)
        self._pending = []
        self._flag_seen = False
        self._open_detail(list(cmds or []))
        return list(cmds or []), value

    def ack(self, cmd: Command, status: AckStatus, detail: str = "") -> None:
        """Rank 0 reports a command's outcome (after applying it)."""
        if self.rank == 0:
            self.emit(EventType.COMMAND_ACK, {"cmd": cmd.id, "cmd_type": str(cmd.type), "status": str(status), "detail": detail})

    # ------------------------------------------------------------------ checkpointed state
    def state_dict(self) -> dict[str, Any]:
        return {"guard": self.guard.state_dict(), "lr_scale": self.lr_scale.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.guard.load_state_dict(state["guard"])
        self.lr_scale.load_state_dict(state["lr_scale"])
