"""The bundled training loop: Accelerate + the agent + checkpoints + faults + commands.

One optimizer step (``Trainer.train_step``), in order::

    lr = schedule(step) * lr_scale * elastic_lr_factor(step)    # recomputed every step
    reweighter.at_step(step)                                    # live reweighting, when on (every N steps)
    x, y = sampler.batch(step)                                  # data_wait_s
    agent.observe_batch(x, sample_ids)                          # the data watch's thread takes it
    for each of grad_accum micro-batches (no_sync but the last):
        loss = model(x, y)      -> agent.after_forward(loss)
        accelerator.backward(loss / grad_accum)
    agent.after_backward()                                      # exposed comm from the DDP hook
    if kit.before_optimizer_step():                             # the one all-reduce + read; the guard;
        clip per layer; optimizer.step()                        # a skipped step re-run (trainer/rerun.py)
    optimizer.zero_grad(); agent.after_step()                   # step event (every rank)

At each step boundary (``Trainer.run``) the loop calls ``kit.at_boundary()`` like every other
loop (the recovery kit, agent/recovery/kit.py, over the trainer's parts: trainer/commands.py):
commands, a hold if the guard asked for one, the paused wait and its timeouts, then before the
next step: memory snapshot every ``snapshot_every``, disk checkpoints every
``ckpt_every``/``full_every`` (their copy overlaps the next forward/backward; ``optimizer.step``
waits for it: ``CheckpointManager.fence_before``), validation every ``val_every``. Faults
(``--fault``) are wrappers around the sampler, the schedule, the model and the publisher's
producers (trainer/fault_wrappers.py); this loop has no fault branch. The mode (agent/modes.py) and the LR scale (agent/lr_scale.py) are the agent's:
the loop moves and reads them there, so the heartbeats and step events report the same values. A checkpoint labelled ``s`` is the state *before* step ``s`` runs, so rolling
back to ``s`` replays step ``s`` onwards exactly (same data, same RNG, same parameters).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import random
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from cliffguard.agent.collectors.mfu import ModelShape
from cliffguard.agent.command_channel import CommandSource
from cliffguard.agent.command_target import Outcome
from cliffguard.agent.hooks import Agent
from cliffguard.agent.recovery.kit import RollbackUnavailable
from cliffguard.agent.recovery.timeouts import Timeout
from cliffguard.agent.sinks import EventSink
from cliffguard.core.enums import CheckpointKind, EventType
from cliffguard.core.events import Command
from cliffguard.core.signing import VerifyingKey
from cliffguard.trainer.checkpoint import CheckpointManager
from cliffguard.trainer.commands import TrainerCommands
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import Sampler, load_corpus
from cliffguard.trainer.data_watch import attach_data_watch
from cliffguard.trainer.elastic import Elastic, progress_mark_path
from cliffguard.trainer.fault_wrappers import wire_faults
from cliffguard.trainer.loss_scale import AdaptiveLossScaler, LossScaleConfig
from cliffguard.trainer.model import GPT
from cliffguard.trainer.record import RECORD_NAME, SAMPLES_NAME, SampleLog, TrainerRecord
from cliffguard.trainer.rerun import StepRerun
from cliffguard.trainer.reweight import SourceReweighter
from cliffguard.trainer.schedule import WarmupCosine

if TYPE_CHECKING:
    from accelerate import Accelerator

log = logging.getLogger(__name__)


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


class Trainer:
    """Builds every part from a ``TrainConfig`` and runs; ``run()`` always closes what it opened."""

    def __init__(self, cfg: TrainConfig, accelerator: Accelerator, *, sink: EventSink | None = None,
                 command_source: CommandSource | None = None, secret: VerifyingKey | None = None) -> None:
        self.cfg = cfg
        self.accelerator = accelerator
        self.rank, self.world = accelerator.process_index, accelerator.num_processes
        self.distributed = self.world > 1 and dist.is_initialized()
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        # An elastic run's batch for this world (its policy); else the declared one, which must split.
        self.elastic = Elastic(cfg.elastic, cfg.global_batch, cfg.grad_accum, self.world,
                               progress_path=self._progress_mark_path(cfg) if cfg.elastic.enabled and self.rank == 0 else None)
        self.micro_batch = self.elastic.plan.micro_batch
        self.corpus = load_corpus(cfg.data)
        # a manifest's curriculum phases are fractions of the run unless a length is configured
        data_cfg = cfg.data if cfg.data.curriculum_steps else dataclasses.replace(cfg.data, curriculum_steps=cfg.steps)
        self.faults = wire_faults(cfg.faults, self.rank, cfg.seed, state_dir=cfg.run_dir / "faults")  # identities without --fault
        self.sampler = self.faults.sampler(Sampler(self.corpus, data_cfg, self.elastic.plan.global_batch, self.rank,
                                                   self.world))
        raw = GPT(cfg.model)
        decay = [p for n, p in raw.named_parameters() if p.dim() >= 2]
        no_decay = [p for n, p in raw.named_parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=(0.9, 0.95),
        )
        self.model, self.optimizer = accelerator.prepare(raw, optimizer)
        self.raw_model: GPT = accelerator.unwrap_model(self.model)
        self.faults.attach(self.model)
        self.schedule = self.faults.schedule(WarmupCosine(cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps))
        self.scaler = AdaptiveLossScaler(LossScaleConfig(enabled=True)) if cfg.loss_scaling else None
        c = cfg.model
        shape = ModelShape(n_params=self.raw_model.num_params(non_embedding=True), n_layers=c.n_layer,
                           n_heads=c.n_head, head_dim=c.n_embd // c.n_head, seq_len=cfg.data.seq_len)
        # the loss scaler unscales after the backward: the reduced buckets hold scaled gradients
        agent_cfg = cfg.agent if self.scaler is None else dataclasses.replace(cfg.agent, grad_norm_from_buckets=False)
        if not agent_cfg.hang.plan_dir:  # a restart's plan beside the checkpoints: one directory for the job
            agent_cfg = dataclasses.replace(agent_cfg, hang=dataclasses.replace(agent_cfg.hang,
                                                                                plan_dir=str(cfg.checkpoint.dir)))
        self.agent = Agent(accelerator, self.model, self.optimizer, agent_cfg, shape=shape, sink=sink,
                           kafka=cfg.kafka, secret=secret, command_source=command_source,
                           wrap_producer=self.faults.producers)
        self.data_watch = attach_data_watch(self.agent, self.corpus, cfg.data)
        self.reweighter = (SourceReweighter(cfg.data.reweight, self.sampler, cfg.data.weights_manifest)
                           if cfg.data.reweight.enabled else None)
        self.ckpt = CheckpointManager(cfg.checkpoint, self.rank, self.world, self._on_checkpoint, run_id=cfg.agent.run)
        # overlap_copy: a snapshot's copy runs beside the next forward/backward; the fence on the torch
        # optimizer (the one Accelerate wraps) waits for it right before step() first changes the state.
        self.ckpt.fence_before(optimizer)
        self.val_data = self.sampler.val_batches(cfg.val_batches, cfg.val_batch_size)
        self.scale_event: Any = None  # set by load_state when a checkpoint of another world was restored
        self.step = 0
        self.last_loss = float("nan")
        self.rerun = StepRerun(self, comm=self.agent.probe.comm)
        """The kit's re-run of a critical step (trainer/rerun.py: triage, [agent.recovery] triage_max_steps)."""
        self.kit = TrainerCommands(self, on_restore=self.restart_progress, rerun=self.rerun)
        """The recovery kit over this trainer's parts: every command, the boundary, the timeouts."""
        self.kit.node_check_hook = self.faults.node_check
        self.faults.watch(lambda: self.agent.parts.ranks.collective)
        self.record = self._open_record() if self.rank == 0 else None
        """Rank 0's own account of the commands it applied and the LR scale (trainer/record.py)."""
        self.samples = SampleLog(cfg.run_dir / SAMPLES_NAME) if cfg.sample_log and self.rank == 0 else None
        """Rank 0's line per step: every rank's sample ids and the loss ([train] sample_log)."""
        self._t_progress = (time.perf_counter(), 0)  # the progress line's rate: since (time, step)

    def _open_record(self) -> TrainerRecord:
        record = TrainerRecord(self.cfg.run_dir / RECORD_NAME)
        scale = self.agent.lr_scale

        def on_command(cmd: Command, outcome: Outcome, before: int) -> None:
            record.command(cmd, outcome, before, self.kit.step, scale.value)

        def on_timeout(timeout: Timeout, before: int) -> None:
            record.timeout(timeout, before, self.kit.step, scale.value)

        self.kit.on_command, self.kit.on_timeout = on_command, on_timeout
        return record

    @staticmethod
    def _progress_mark_path(cfg: TrainConfig) -> Any:
        return progress_mark_path(cfg.checkpoint.dir, cfg.run)

    # ------------------------------------------------------------------ events
    def _on_checkpoint(self, payload: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        data = {k: v for k, v in payload.items() if k != "step"}
        self.agent.emit(EventType.CHECKPOINT, data, step=int(payload["step"]))

    # ------------------------------------------------------------------ state
    def capture_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "step": self.step,
            "model": self.raw_model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.schedule.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng,
            "agent": self.agent.state_dict(),
            "loss_scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "elastic": self.elastic.state_dict(),
            "config": self.cfg.to_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Everything a rollback restores. The LR scale comes from the checkpoint here (in the agent's
        state); a rollback's own scale is applied by the caller *after* this (never overwritten by it)."""
        self.raw_model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        if self.reweighter is None:
            self.sampler.live.clear()  # live reweighting off: factors a checkpoint saved are not applied
        # Saved at another world: the elastic policy's batch from the restored step on (trainer/elastic.py).
        self.scale_event = self.elastic.on_restore(state.get("elastic"), int(state["step"]))
        if self.sampler.global_batch != self.elastic.plan.global_batch:
            self.sampler.rebatch(int(state["step"]), self.elastic.plan.global_batch, self.world, self.rank)
        self.micro_batch = self.elastic.plan.micro_batch
        if "rng" in state:
            torch.set_rng_state(state["rng"]["torch"])
            random.setstate(state["rng"]["python"])
            if "cuda" in state["rng"] and torch.cuda.is_available():
                torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        else:  # a rank the checkpoint's (smaller) world did not have: seeded, reproducibly
            torch.manual_seed(self.cfg.seed + 1_000_003 * self.rank + int(state["step"]))
            random.seed(self.cfg.seed + 1_000_003 * self.rank + int(state["step"]))
        self.agent.load_state_dict(state["agent"])
        if self.scaler is not None and state.get("loss_scaler"):
            self.scaler.load_state_dict(state["loss_scaler"])
        self.step = int(state["step"])

    def checkpoint(self, kind: CheckpointKind | str) -> None:
        self.ckpt.save(self.step, self.capture_state(), kind)

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def val_loss(self, batches: int | None = None) -> tuple[float, int]:
        """Forward-only on the fixed held-out batches with frozen weights; every rank takes a share."""
        data = self.val_data if batches is None else self.sampler.val_batches(batches, self.cfg.val_batch_size)
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)
        try:
            for i in range(self.rank, len(data), self.world):
                x, y = data[i]
                with self._autocast():
                    _, loss = self.raw_model(x.to(self.accelerator.device), y.to(self.accelerator.device))
                total[0] += loss.double()
                total[1] += 1.0
            if self.distributed:
                dist.all_reduce(total)
        finally:
            self.model.train(was_training)
        return (float(total[0] / total[1]) if total[1] > 0 else float("nan")), len(data)

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.cfg.bf16:
            return torch.autocast(device_type=self.accelerator.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ one step
    def _lr(self, step: int) -> float:
        return self.kit.scaled_lr(self.schedule.lr_at(step) * self.elastic.lr_factor(step))

    def train_step(self) -> dict[str, Any]:
        step, cfg, agent = self.step, self.cfg, self.agent
        lr = self._lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        extra: dict[str, Any] = {}
        if cfg.debug_digests:
            extra["rng_digest"] = digest_tensors([torch.get_rng_state()])
        if self.reweighter is not None:
            self._reweight(step)
        with agent.data_wait():
            x, y, ids = self.sampler.batch(step)
        agent.observe_batch(x, ids, step=step)  # the data watch (a queue put; its thread does the work)
        with agent.data_wait():
            x, y = x.to(self.accelerator.device), y.to(self.accelerator.device)
        xs, ys = x.split(self.micro_batch), y.split(self.micro_batch)
        n = len(xs)
        for i, (xb, yb) in enumerate(zip(xs, ys, strict=True)):
            sync = contextlib.nullcontext() if i == n - 1 else self.accelerator.no_sync(self.model)
            with sync:
                with self._autocast():
                    _, loss = self.model(xb, yb)
                agent.after_forward(loss, tokens=xb.numel())
                scaled = loss / n if self.scaler is None else self.scaler.scale_loss(loss / n)
                self.accelerator.backward(scaled)
        agent.after_backward()
        # Gradients are all-reduced by now, so the scaler's overflow verdict is the same on every rank.
        finite = self.scaler is None or self.scaler.unscale_(self.raw_model.parameters())
        clipped = 0
        # the ids as fed, before triage may list them (a listed sample is redrawn: sample_ids changes)
        fed = [self.sampler.sample_ids(step, rank=r) for r in range(self.world)] if self.samples is not None else []
        ok = self.kit.before_optimizer_step()  # a transient fault's retry (triage) rewrote the gradients
        applied = self.rerun.finite_after_retry(finite) and ok
        if applied:
            if cfg.clip_layer_norm > 0:
                clipped = self._clip()
            self.optimizer.step()  # waits first for a pending snapshot copy (CheckpointManager.fence_before)
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if cfg.debug_digests:
            extra["param_digest"] = self.param_digest()
        data = agent.after_step(lr=lr, clipped_layers=clipped, sample_range=list(self.sampler.step_range(step)),
                                extra=extra, skipped=not applied,
                                loss_scale=self.scaler.scale if self.scaler is not None else 1.0)
        self.last_loss = data["loss"]
        if self.samples is not None:
            self.samples.step(step, fed, self.last_loss, extra.get("param_digest"))
        self.step += 1
        return data

    def _reweight(self, step: int) -> None:
        """Live reweighting's decision at this step (the same on every rank); rank 0 reports each change."""
        assert self.reweighter is not None
        for change in self.reweighter.at_step(step):
            log.warning("data: source %r weight x%.3g -> x%.3g at step %d (%.0f %% of %d sequences scored bad)",
                        change["category"], change["from"], change["to"], step, 100 * change["bad_share"],
                        change["sequences"])
            if self.rank == 0:
                self.agent.emit(EventType.DATA_FLAG, self.reweighter.event(change), step=step)

    def _clip(self) -> int:
        from cliffguard.trainer.clipping import clip_per_layer

        return int(clip_per_layer(self.raw_model.named_parameters(), self.cfg.clip_layer_norm))

    def param_digest(self) -> str:
        return digest_tensors([p for _, p in sorted(self.raw_model.named_parameters())])

    # ------------------------------------------------------------------ the run
    def resume_latest(self) -> None:
        """Start from the newest disk checkpoint that loads (a restarted job)."""
        state: dict[str, Any] | None = None
        try:
            _step, state, _source, detail = self.ckpt.restore_latest()
        except KeyError as exc:
            detail = str(exc)
        restarted = self.agent.hang.life.restarted
        if (self.cfg.elastic.enabled or restarted) and self.kit.all_ranks(state is None):
            if restarted:  # torchrun restarted the group before the first disk checkpoint
                log.warning("restarted worker group (life %d): no checkpoint yet, starting again at step 0 (%s)",
                            self.agent.hang.life.life, detail)
            else:
                log.info("elastic run: no checkpoint yet, starting at step 0 (%s)", detail)  # its first start
            return
        if not self.kit.all_ranks(state is not None):
            raise RollbackUnavailable(f"cannot resume on every rank: {detail}")
        self.load_state(state)
        self.agent.set_step(self.step)
        log.info("resumed: %s", detail)
        self._report_scale()

    def _report_scale(self) -> None:
        """After a resume at another world: the scale event (rank 0) and a flapping node's back-off."""
        event = self.scale_event
        if event is None:
            return
        self.scale_event = None
        if self.rank == 0:
            kind = EventType.ELASTIC_SCALED_UP if event.scaled_up else EventType.ELASTIC_SCALED_DOWN
            self.agent.emit(kind, event.data(self._lr(self.step)), step=self.step)
            self.elastic.log_event(event, self._lr(self.step))
            print(f"elastic: world {event.from_world} -> {event.to_world} at step {event.step}, global batch "
                  f"{event.from_global_batch} -> {event.global_batch}, lr x{event.lr_factor:.3f}, "
                  f"{event.steps_lost} steps and {event.seconds_lost:.1f} s lost", flush=True)
        if event.backoff_s:
            log.warning("elastic: %d scale changes within %.0f s (a flapping node): pausing %.0f s",
                        len(self.elastic.changes), self.cfg.elastic.flap_window_s, event.backoff_s)
            time.sleep(event.backoff_s)

    def restart_progress(self, step: int) -> None:
        """The progress line's tokens/s counts from here (the kit calls it after a restore)."""
        self._t_progress = (time.perf_counter(), step)

    def _progress(self, data: dict[str, Any]) -> None:
        every = self.cfg.progress_every
        if self.rank != 0 or not every or self.step % every:
            return
        t0, s0 = self._t_progress
        now = time.perf_counter()
        tok_s = data["tokens"] * self.world * (self.step - s0) / max(now - t0, 1e-9)
        self._t_progress = (now, self.step)
        print(f"step {self.step:>6}/{self.cfg.steps}  loss {data['loss']:.4f}  lr {data['lr']:.2e}  "
              f"tokens/s {tok_s:,.0f}  mfu {100 * data['mfu']:.2f}%  guard {data['guard']}", flush=True)

    def run(self) -> int:
        error: BaseException | None = None
        try:
            self.kit.start(global_batch=self.elastic.plan.global_batch, lr_schedule=self.schedule.describe(),
                           config=self.cfg.to_dict())
            if self.cfg.resume or self.agent.hang.life.restarted:  # a restarted group resumes from disk
                self.resume_latest()
            self.restart_progress(self.step)
            if self.record is not None:
                self.record.start(self.step, self.cfg.steps, self.agent.lr_scale.value)
            if self.rank == 0:
                for flag in self.corpus.flags:
                    self.agent.emit(EventType.DATA_FLAG, flag.event_data())
            while self.step < self.cfg.steps and self.kit.at_boundary():
                data = self.train_step()
                self._progress(data)
                self.elastic.mark_progress(self.step, self.last_loss)
            self.ckpt.wait()
            if self.kit.exit_code is not None:  # saved at the boundary for a preemption or torchrun's regroup
                return self.kit.exit_code
            self.elastic.mark_progress(self.step, self.last_loss, force=True, val_loss=self._final_eval())
            return 0 if not self.kit.stop_reason.startswith("failed") else 1
        except BaseException as exc:
            error = exc
            raise
        finally:
            if error is None and self.kit.stop_reason.startswith("failed"):
                error = RuntimeError(self.kit.stop_reason)
            if self.record is not None:
                reason = self.kit.stop_reason or (f"error: {type(error).__name__}" if error is not None else "")
                self.record.end(self.step, reason, self.agent.lr_scale.value, preempted=self.kit.preempted)
                self.record.close()
            ended = self.kit.exit_code is None  # preempted (run.preempted said so) or regrouped: the run goes on
            for closer in (self.ckpt.close, self.samples.close if self.samples is not None else lambda: None,
                           lambda: self.agent.close(error, final_loss=self._final_loss(), ended=ended)):
                try:
                    closer()
                except Exception:  # noqa: BLE001 - close the rest anyway
                    log.exception("close failed")

    def _final_eval(self) -> float | None:
        """A completed elastic run's held-out loss (every rank reaches the last step together)."""
        n = self.cfg.elastic.final_eval_batches
        if not (self.cfg.elastic.enabled and n and self.step >= self.cfg.steps):
            return None
        return self.val_loss(batches=n)[0]

    def _final_loss(self) -> float | None:
        return self.last_loss if math.isfinite(self.last_loss) else None
