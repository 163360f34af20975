"""Elastic runs: what the trainer does when torchrun restarts it at another world size.

Under torchrun's elastic agent (``--nnodes MIN:MAX``, c10d rendezvous, ``--max-restarts``), a
lost node makes the surviving agents restart their workers in a smaller world, and a node that
joins makes every agent restart them in a larger one. Each start resumes from the newest stable
checkpoint (any world size loads it: ``trainer/checkpoint.py``), and this module decides what the
new world trains with:

- **global batch** (``batch_policy``), from the batch declared for ``base_world``:
  ``proportional`` keeps the per-rank batch (B x new/base world); ``halve`` halves B whenever
  the world is below ``base_world``; ``keep`` keeps B and raises gradient accumulation so the
  per-rank micro-batch is unchanged. A batch that does not split over the new world is a
  ``ValueError`` naming it, never a silently different batch.
- **learning rate** (``lr_rule``): a factor ``sqrt`` (B'/B)^0.5 (the default: Adam's rule, and the
  one that held up at both lengths of the halved stretch bench/elastic_loss.py was measured at),
  ``linear`` B'/B, or ``none``. A higher factor (a scale-up) is reached by a linear warm-up over
  ``rescale_warmup_steps`` from the factor the run had (a jump up in LR is what the warm-up
  avoids); a lower one applies at once.
- **data**: the sampler starts a new segment at the restored step (``trainer/data.py``): stream
  positions stay contiguous, so no sample of an epoch is seen twice or skipped.
- **report**: an ``elastic.scaled_down`` / ``elastic.scaled_up`` event (``ScaleEvent``) with the
  worlds, batches, LR, the steps redone and the seconds lost since the last progress mark.
- **flapping**: more than ``max_changes`` scale changes within ``flap_window_s`` and the new
  world waits ``flap_backoff_s`` before training (declared in the event), instead of thrashing.

Rank 0 keeps a progress mark (``<checkpoint dir>/elastic-progress[-tag].json``: step, time, the
last loss and the mean of the last ``loss_window``) at most once a second; the next start reads it
to count what was lost. A completed run adds ``val_loss``, its loss on ``final_eval_batches`` fixed
held-out batches (the same at every world size): what an elastic run is compared by.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from cliffguard.core.declared import bounded, check_declared, one_of

BATCH_POLICIES = ("halve", "keep", "proportional")
LR_RULES = ("sqrt", "linear", "none")


@dataclass(kw_only=True, slots=True)
class ElasticConfig:
    enabled: bool = False
    """Resume at whatever world torchrun gives and rescale batch and LR (else a world change is an error)."""
    base_world: int = bounded(0, ge=0)
    """The world size the run's global_batch and lr are declared for (0 = the first start's world)."""
    batch_policy: str = one_of("proportional", BATCH_POLICIES)
    """halve | keep (gradient accumulation) | proportional (per-rank batch constant)."""
    lr_rule: str = one_of("sqrt", LR_RULES)
    """sqrt | linear | none: the LR factor for the new global batch."""
    rescale_warmup_steps: int = bounded(10, ge=0)
    """Steps over which a higher LR factor (a larger batch) is reached (0 = at once); a lower one
    applies at once."""
    rdzv_timeout_s: float = bounded(120.0, gt=0)
    """Rendezvous join timeout: a rendezvous that never completes ends the launch with a clear error."""
    max_restarts: int = 10
    """torchrun --max-restarts: worker-group restarts allowed (each membership change is one)."""
    flap_window_s: float = bounded(600.0, gt=0)
    """Window in which scale changes are counted for the flapping back-off."""
    max_changes: int = 4
    """Scale changes allowed within flap_window_s before the back-off applies."""
    flap_backoff_s: float = 30.0
    """Pause before training when a node flaps (declared in the scale event)."""
    final_eval_batches: int = bounded(16, ge=0)
    """Held-out batches (``val_batch_size`` each, the same on every world) evaluated when the run
    completes, written to the progress mark as ``val_loss``: the loss to compare an elastic run with
    an uninterrupted one by (bench/elastic_loss.py); 0 = none."""
    loss_window: int = bounded(20, ge=1)
    """The progress mark's ``loss_mean``: the mean training loss of this many last steps."""

    MOVED: ClassVar[dict[str, str]] = {"collective_timeout_s": "[agent.hang] collective_timeout_s"}
    """Every run's process group has the declared timeout now, not only an elastic one's."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.max_restarts < 0 or self.max_changes < 1 or self.flap_backoff_s < 0:
            raise ValueError("max_restarts: must be >= 0 (max_changes >= 1, flap_backoff_s >= 0)")


@dataclass(frozen=True, slots=True)
class BatchPlan:
    world: int
    global_batch: int
    grad_accum: int
    micro_batch: int
    lr_factor: float


def plan_batch(cfg: ElasticConfig, base_world: int, base_batch: int, base_accum: int, world: int) -> BatchPlan:
    """The batch and LR factor for ``world``; ValueError when the policy's batch does not split."""
    if world < 1 or base_world < 1:
        raise ValueError("world: must be >= 1")
    accum = base_accum
    if cfg.batch_policy == "proportional":
        batch, rem = divmod(base_batch * world, base_world)
        if rem:
            raise ValueError(f"global_batch: {base_batch} x {world}/{base_world} ranks is not a whole batch "
                             f"(batch_policy proportional)")
    elif cfg.batch_policy == "halve":
        batch = base_batch if world >= base_world else base_batch // 2
    else:  # keep: the same global batch, more accumulation per rank
        batch = base_batch
        per_rank_micro = base_batch // (base_world * base_accum)
        accum, rem = divmod(base_batch, world * max(per_rank_micro, 1))
        if rem or accum < 1:
            raise ValueError(f"global_batch: {base_batch} does not split into {world} ranks x micro-batches of "
                             f"{per_rank_micro} (batch_policy keep)")
    micro, rem = divmod(batch, world * accum)
    if rem or micro < 1:
        raise ValueError(f"global_batch: {batch} does not split into {world} ranks x {accum} micro-batches "
                         f"(batch_policy {cfg.batch_policy}, declared {base_batch} at world {base_world})")
    ratio = batch / base_batch
    factor = {"sqrt": math.sqrt(ratio), "linear": ratio, "none": 1.0}[cfg.lr_rule]
    return BatchPlan(world=world, global_batch=batch, grad_accum=accum, micro_batch=micro, lr_factor=factor)


@dataclass(slots=True)
class ScaleEvent:
    step: int
    from_world: int
    to_world: int
    from_global_batch: int
    global_batch: int
    grad_accum: int
    lr_factor: float
    steps_lost: int
    seconds_lost: float
    backoff_s: float
    policy: str
    lr_rule: str

    @property
    def scaled_up(self) -> bool:
        return self.to_world > self.from_world

    def data(self, lr: float) -> dict[str, Any]:
        """The ``elastic.scaled_*`` event payload (core/payloads.py ElasticScaleData)."""
        return {"from_world": self.from_world, "to_world": self.to_world, "from_global_batch": self.from_global_batch,
                "global_batch": self.global_batch, "grad_accum": self.grad_accum, "lr": lr,
                "lr_factor": self.lr_factor, "steps_lost": self.steps_lost, "seconds_lost": self.seconds_lost,
                "backoff_s": self.backoff_s, "policy": self.policy, "lr_rule": self.lr_rule}


class Elastic:
    """The run's elastic state: the plan for this world, the LR ramp, the scale history."""

    def __init__(self, cfg: ElasticConfig, base_batch: int, base_accum: int, world: int,
                 progress_path: Path | None = None) -> None:
        self.cfg = cfg
        self.base_batch, self.base_accum = base_batch, base_accum
        self.base_world = cfg.base_world or world
        self.world = world
        self.plan = (plan_batch(cfg, self.base_world, base_batch, base_accum, world) if cfg.enabled
                     else BatchPlan(world, base_batch, base_accum, _split(base_batch, world, base_accum), 1.0))
        self.ramp = (0, self.plan.lr_factor, self.plan.lr_factor)  # (start step, from, to)
        self.changes: list[float] = []  # wall times of scale changes (flapping)
        self.progress_path = progress_path
        self._last_mark = 0.0
        self._losses: deque[float] = deque(maxlen=cfg.loss_window)  # this start's last steps

    def lr_factor(self, step: int) -> float:
        start, old, new = self.ramp
        n = self.cfg.rescale_warmup_steps
        if n == 0 or step >= start + n:
            return new
        return old + (new - old) * max(step - start, 0) / n

    def state_dict(self) -> dict[str, Any]:
        return {"base_world": self.base_world, "world": self.world, "global_batch": self.plan.global_batch,
                "grad_accum": self.plan.grad_accum, "ramp": list(self.ramp), "changes": list(self.changes)}

    def on_restore(self, saved: dict[str, Any] | None, step: int, now: float | None = None) -> ScaleEvent | None:
        """Adopt a checkpoint's elastic state at ``step``; a ScaleEvent when it was saved at another world.
        The caller moves the sampler to ``self.plan.global_batch`` from ``step``."""
        if not saved:
            return None
        now = time.time() if now is None else now
        self.base_world = int(saved["base_world"])
        self.changes = [float(t) for t in saved.get("changes", [])]
        old_world, old_batch = int(saved["world"]), int(saved["global_batch"])
        ramp = saved.get("ramp") or [0, 1.0, 1.0]
        self.ramp = (int(ramp[0]), float(ramp[1]), float(ramp[2]))
        if old_world == self.world:
            return None
        if not self.cfg.enabled:
            raise ValueError(f"world: checkpoint step {step} was saved at world {old_world}, this start has "
                             f"{self.world} ranks and [train.elastic] enabled is false")
        self.plan = plan_batch(self.cfg, self.base_world, self.base_batch, self.base_accum, self.world)
        current, new = self.lr_factor(step), self.plan.lr_factor
        # A warm-up only where the LR rises (the larger batch after a scale-up): a lower LR is safe at
        # once, and ramping it down would train the smaller, noisier batch at the larger one's LR.
        self.ramp = (step, current, new) if new > current else (step, new, new)
        self.changes = [t for t in self.changes if now - t < self.cfg.flap_window_s] + [now]
        backoff = self.cfg.flap_backoff_s if len(self.changes) > self.cfg.max_changes else 0.0
        mark = self.read_progress()
        steps_lost = max(int(mark["step"]) - step, 0) if mark else 0
        seconds_lost = max(now - float(mark["time"]), 0.0) if mark else 0.0
        return ScaleEvent(step=step, from_world=old_world, to_world=self.world, from_global_batch=old_batch,
                          global_batch=self.plan.global_batch, grad_accum=self.plan.grad_accum,
                          lr_factor=self.plan.lr_factor, steps_lost=steps_lost, seconds_lost=round(seconds_lost, 3),
                          backoff_s=backoff, policy=self.cfg.batch_policy, lr_rule=self.cfg.lr_rule)

    # -- the progress mark (rank 0) ---------------------------------------------------------
    def mark_progress(self, step: int, loss: float | None = None, now: float | None = None,
                      force: bool = False, val_loss: float | None = None) -> None:
        """Called after every step with its loss (``loss_mean`` counts each step once); written at most
        once a second unless ``force``. ``val_loss``: the completed run's held-out loss."""
        now = time.time() if now is None else now
        if loss is not None and math.isfinite(loss) and not force:
            self._losses.append(loss)
        if self.progress_path is None or (now - self._last_mark < 1.0 and not force):
            return
        self._last_mark = now
        tmp = self.progress_path.with_name(self.progress_path.name + ".tmp")
        mark = {"step": step, "time": now, "world": self.world, "global_batch": self.plan.global_batch}
        if loss is not None and math.isfinite(loss):
            mark["loss"] = loss
        if self._losses:
            mark["loss_mean"] = sum(self._losses) / len(self._losses)
            mark["loss_mean_steps"] = len(self._losses)
        if val_loss is not None and math.isfinite(val_loss):
            mark["val_loss"] = val_loss
        try:
            tmp.write_text(json.dumps(mark))
            os.replace(tmp, self.progress_path)
        except OSError:
            pass  # a lost mark only makes the next report of seconds lost less exact

    def log_event(self, event: ScaleEvent, lr: float) -> None:
        """Append the scale event to ``elastic-events[-tag].jsonl`` beside the mark (rank 0; for runs
        without a monitoring stream, e.g. ``cliffguard demo --elastic``)."""
        if self.progress_path is None:
            return
        path = self.progress_path.with_name(self.progress_path.name.replace("progress", "events") + "l")
        try:
            with path.open("a") as fh:
                fh.write(json.dumps({"step": event.step, **event.data(lr)}) + "\n")
        except OSError:
            pass

    def read_progress(self) -> dict[str, Any] | None:
        try:
            mark = json.loads(self.progress_path.read_text()) if self.progress_path else None
        except (OSError, ValueError):
            return None
        ok = isinstance(mark, dict) and isinstance(mark.get("step"), int) and isinstance(mark.get("time"), int | float)
        return mark if ok else None


def progress_mark_path(checkpoint_dir: str | Path, run: str) -> Path:
    """Where rank 0 of run ``run`` keeps its progress mark (beside the run's checkpoints)."""
    from cliffguard.trainer.checkpoint_io import run_tag

    tag = run_tag(run)
    return Path(checkpoint_dir) / (f"elastic-progress-{tag}.json" if tag else "elastic-progress.json")


def _split(batch: int, world: int, accum: int) -> int:
    per_rank, rem = divmod(batch, world * accum)
    if rem or per_rank < 1:
        raise ValueError(f"global_batch: {batch} does not split into {world} ranks x {accum} micro-batches")
    return per_rank
