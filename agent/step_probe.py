"""The step probe: what the training thread calls each optimizer step, and the one host sync.

``before_optimizer_step`` packs, on the device, one small float64 tensor —
``[per-rank loss slots (world) | pending-command flag | norm contributors | global grad-norm² |
per-layer grad-norm² (every layer_norms_every steps)]``, plus every ``ranks_every`` steps the
per-rank performance block (agent/rank_perf.py) — all-reduces it once (SUM) and reads it once
(``.tolist()``); the tensor is a kept buffer filled in place (agent/packed_step.py). Each rank
writes its own loss into its own slot, so after the sum every rank holds every rank's loss (its
``loss_local`` and the global mean) without a second read; rank 0 writes the number of commands
it has queued into the flag (agent/command_channel.py), so every rank learns at the same step
that a command body is to be broadcast. Under DDP the gradients are identical on every rank, so
only the ranks that publish a step event (rank 0, and a rank in a detail window) compute norms;
each that does counts 1 in the contributors slot and the norms are the sum over it. Rank 0 alone
turns the loss slots into the run-level ``step`` event's loss summary (core/rank_arrays.py): one
step event per step whatever the world. That is the only per-step host sync; a ``grad_hist``
emission adds one on rank 0 every ``hist_every`` steps. The guard decides on the all-reduced
loss (identical on every rank), see agent/guard.py.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.collectors.grad_hist import GradHistogram, layer_name
from cliffguard.agent.collectors.memory import memory_stats
from cliffguard.agent.collectors.mfu import ModelShape, mfu
from cliffguard.agent.collectors.timing import StepClock, attach_comm_timer
from cliffguard.agent.command_channel import CommandChannel
from cliffguard.agent.config import AgentConfig
from cliffguard.agent.detail import DetailWindow
from cliffguard.agent.emitter import Emitter
from cliffguard.agent.guard import Guard
from cliffguard.agent.lr_scale import LRScale
from cliffguard.agent.packed_step import PackedStep
from cliffguard.agent.param_check import ParamCheck, param_hash
from cliffguard.agent.rank_perf import PERF_FIELDS, PerfAccumulator, publishes_chunk, ranks_payload
from cliffguard.agent.ranks import Ranks
from cliffguard.agent.replica_groups import ReplicaLayout, layout_of
from cliffguard.core.enums import EventType, GuardDecision
from cliffguard.core.rank_arrays import summarize_losses

log = logging.getLogger(__name__)


class StepProbe:
    """See the module docstring. One per process; ``step`` is the run's one step counter."""

    def __init__(self, config: AgentConfig, ranks: Ranks, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer | None, *, guard: Guard, lr_scale: LRScale, emitter: Emitter,
                 channel: CommandChannel, detail: DetailWindow, clock: StepClock, shape: ModelShape | None,
                 bucket_norms: bool) -> None:
        self.config = config
        self.ranks = ranks
        self.optimizer = optimizer
        self.guard = guard
        self.lr_scale = lr_scale
        self.emitter = emitter
        self.channel = channel
        self.detail = detail
        self.clock = clock
        self.shape = shape
        self.step = 0
        self.closed_steps = 0
        """Steps this process closed (the hang watchdog's mark: the first step of a life is not judged)."""
        self.marked_at = time.monotonic()
        """When the training thread last closed a step or restarted the step clock (the watchdog's
        mark: it may be starved of the GIL while the training thread is busy)."""
        self.peak_flops = 0.0
        self.peak_source = ""
        """The device's peak FLOP/s and where it came from (set at start, agent/lifecycle.py)."""
        self.last: dict[str, Any] = {}
        """The last step event's data."""
        self._params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self._layer_names = [layer_name(n) for n, _ in self._params]
        self._with_grad: list[int] = []  # indices into _params that had a gradient at the last norms
        self._hist = GradHistogram(config.hist)  # keeps its layout and buffers from read to read
        self._packed: PackedStep | None = None  # the step's all-reduced tensor, built on the first step
        self.comm = attach_comm_timer(model)
        self._grads_identical = self.comm is not None
        """Under DDP every rank holds the same (all-reduced) gradients, so only the ranks that
        publish a step event compute their norms; otherwise every rank's count in the mean."""
        self._bucket_norms = bucket_norms
        """The global norm from the DDP hook's reduced buckets (an Accelerator's scaler unscales later)."""
        self._perf = PerfAccumulator()
        self._losses: list[float] = []  # every rank's loss at this step (from the packed all-reduce)
        self.param_check = ParamCheck()
        """The SDC watch's record (agent/param_check.py): the last step the replicas agreed."""
        self._layout: ReplicaLayout | None = None
        self._reset_step_accumulators()

    @property
    def n_params(self) -> int:
        return sum(p.numel() for _, p in self._params)

    @property
    def saw_loss(self) -> bool:
        """Whether ``after_forward`` was called in the current step."""
        return self._loss_sum is not None

    def note(self, key: str, value: Any) -> None:
        """A field for this step's event (the kit's triage class), dropped once the step is closed."""
        self._notes[key] = value

    def _reset_step_accumulators(self) -> None:
        self._notes: dict[str, Any] = {}
        self._loss_sum: torch.Tensor | None = None
        self._micro = 0
        self._tokens = 0
        self._decision = GuardDecision.OK
        self._global_loss = float("nan")
        self._local_loss = float("nan")
        self._grad_norm = float("nan")
        self._layer_norms: dict[str, float] = {}
        self._bucket_norm_sq: torch.Tensor | float | None = None  # from the DDP hook, at the last backward
        if self.comm is not None:
            self.comm.reset()

    def set_step(self, step: int) -> None:
        """The optimizer step the next ``after_step`` closes (after a rollback or a resume)."""
        self.step = step
        self._reset_step_accumulators()
        self._perf.reset()
        self.param_check.rewound(step)
        self.clock.restart()
        self.marked_at = time.monotonic()

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.clock.data_wait += time.perf_counter() - t0

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
        if self.ranks.distributed and self.comm is not None:
            self.ranks.collective = "backward"  # DDP's gradient all-reduce runs (and waits) inside it

    def after_backward(self) -> None:
        """Closes the backward: exposed gradient communication from the DDP hook."""
        self.ranks.collective = ""
        if self.comm is not None and self.comm.last_launch is not None:
            self.clock.comm_exposed += self.comm.exposed_since(time.perf_counter())
            # the last synchronising backward's buckets hold the step's (accumulated) gradients
            self._bucket_norm_sq = self.comm.grad_norm_sq()
            self.comm.reset()

    def before_optimizer_step(self) -> bool:
        """The step's one all-reduce and host read, then the guard. True = apply the update."""
        if self._loss_sum is None:
            raise RuntimeError("before_optimizer_step: call after_forward(loss) first")
        w = self.ranks.world
        publishes = self._publishes()
        layers_due = self._layer_norms_due()
        sq = None
        if publishes or not self._grads_identical:
            sq = None if layers_due else self._bucket_norm_sq
            if sq is None:
                sq = self._norms_sq(layers_due)
        ranks_due = self._ranks_due()
        check_due = self._param_check_due()
        if self._packed is None or self._packed.device != self._loss_sum.device:
            self._packed = PackedStep(world=w, rank=self.ranks.rank, n_layers=len(self._params), device=self._loss_sum.device)
        # every rank's performance rides on the same all-reduce (agent/rank_perf.py)
        packed = self._packed.fill(loss_sum=self._loss_sum, micro=self._micro,
                                   flag=self.channel.flag(), sq=sq, layers=layers_due,
                                   perf=self._perf.slot() if ranks_due else None,
                                   param_hash=param_hash([p for _, p in self._params]) if check_due else None)
        if self.ranks.distributed:
            t0 = time.perf_counter()
            self.ranks.collective = "all_reduce"
            dist.all_reduce(packed)
            values = packed.tolist()  # the one per-step host sync
            self.ranks.collective = ""
            self.clock.comm_exposed += time.perf_counter() - t0
        else:
            values = packed.tolist()
        losses_host = values[:w]
        self._losses = losses_host
        self._local_loss = losses_host[self.ranks.rank]
        self._global_loss = sum(losses_host) / w
        self.channel.saw_flag(values[w])
        contributors = values[w + 1]
        if contributors > 0:  # the mean over the ranks that computed norms (identical ones under DDP)
            self._grad_norm = (values[w + 2] / contributors) ** 0.5
            if layers_due and publishes:
                layer_sq = values[w + 3 : w + 3 + len(self._params)]
                self._layer_norms = {self._layer_names[i]: (layer_sq[i] / contributors) ** 0.5 for i in self._with_grad}
        if ranks_due:
            at = self._packed.perf_at(layers_due)
            self._emit_ranks(values[at : at + len(PERF_FIELDS) * w], losses_host)
        if check_due:
            at = self._packed.hashes_at(layers_due, ranks_due)
            self.note("param_check", self.param_check.judge(self.step, values[at : at + w], rank=self.ranks.rank,
                                                             groups=self.replica_layout.groups))
        self._decision = self.guard.decide(self._global_loss, self.step, self._grad_norm)
        if self.ranks.rank == 0 and self.config.hist_every and self.step % self.config.hist_every == 0:
            self._emit_histograms()
        return Guard.applies_update(self._decision)

    def _publishes(self) -> bool:
        """Whether this rank publishes a step event for the current step."""
        return self.ranks.rank == 0 or self.detail.active(self.step)

    def _ranks_due(self) -> bool:
        """The same answer on every rank: they all close the same steps."""
        every = self.config.ranks_every
        return bool(every) and self.step % every == 0 and self._perf.n > 0

    @property
    def replica_layout(self) -> ReplicaLayout:
        """Which ranks must hold identical parameters (agent/replica_groups.py), read once: DDP
        replicas, FSDP2's DTensor layout, or (``param_check = "on"``) the user's word."""
        if self._layout is None:
            self._layout = layout_of([p for _, p in self._params], self.ranks.world,
                                     replicated=self._grads_identical or self.config.param_check == "on")
        return self._layout

    def declare_layout(self, layout: ReplicaLayout) -> None:
        """An integration that knows its engine's layout says it (DeepSpeed's ZeRO stage)."""
        self._layout = layout

    @property
    def param_check_every(self) -> int:
        """Steps between the SDC watch's checks on this run (0: it does not check)."""
        return self.config.param_check_every if self._checks(0) else 0

    @property
    def param_check_off(self) -> str:
        """Why a multi-rank run asked to check cannot (``run.started`` says it); "" otherwise."""
        if self.config.param_check == "off" or not self.config.param_check_every or self.ranks.world < 2:
            return ""
        layout = self.replica_layout
        return "" if layout.has_witnesses or not layout.sharded else layout.why_none

    def _param_check_due(self) -> bool:
        return self._checks(self.step)

    def _checks(self, step: int) -> bool:
        layout = self.replica_layout
        return self.param_check.due(step, every=self.config.param_check_every, mode=self.config.param_check,
                                    world=self.ranks.world, replicated=layout.has_witnesses) and layout.has_witnesses

    def _layer_norms_due(self) -> bool:
        """Per-layer norms (work and bytes proportional to the layers) every ``layer_norms_every``
        steps; the same answer on every rank, so the packed tensor has the same layout on all."""
        every = self.config.layer_norms_every
        return self.config.layer_norms and bool(every) and self.step % every == 0 and bool(self._params)

    def _emit_ranks(self, block: list[float], losses: list[float]) -> None:
        per_event = self.config.ranks_per_event
        if publishes_chunk(self.ranks.rank, per_event):
            self.emitter.emit(EventType.RANKS, ranks_payload(block, losses, world=self.ranks.world, rank=self.ranks.rank,
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
            self.emitter.emit(EventType.GRAD_HIST, {"edges": self.config.hist.edges(), "layers": layers})

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
        total, data_wait, comm, compute = self.clock.split()
        if lr is None:
            lr = float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0
        fpt = self.shape.flops_per_token() if self.shape is not None else 0.0
        alloc, reserved = memory_stats(self.ranks.device)
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
        data.update(self._notes)
        self._perf.add(data)
        if self.ranks.rank == 0:
            if len(self._losses) == self.ranks.world:  # not from report_step on a multi-rank loop
                data["rank_losses"] = summarize_losses(self._losses)
            self.emitter.emit(EventType.STEP, data)
        elif self.detail.active(self.step):
            data["detail"] = True
            self.emitter.emit(EventType.STEP, data)
        self.last = data
        self.step += 1
        self.closed_steps += 1
        self.marked_at = time.monotonic()
        self._reset_step_accumulators()
        self.clock.restart()
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
        self._losses = [self._local_loss] if self.ranks.world == 1 else []
        self._grad_norm = float(grad_norm) if grad_norm is not None else float("nan")
        self._tokens = int(tokens)
        decision = self.guard.decide(self._global_loss, self.step, self._grad_norm)
        self._decision = decision if Guard.applies_update(decision) else GuardDecision.WARN
        return self.after_step(lr=lr, skipped=False)
