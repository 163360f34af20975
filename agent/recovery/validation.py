"""The recovery kit's validations: on command, periodic, and the held-back slice.

Every validation runs forward-only with the global RNGs put back afterwards (a validation must not
shift the training run's random stream); the periodic ones run only while they cost at most
``val_max_share`` of training (agent/recovery/cadence.py). Rank 0 emits the ``validation`` event the
controller's baseline and its validate step read.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.recovery.state import rng_untouched
from cliffguard.core.enums import EventType

log = logging.getLogger("cliffguard.agent.recovery.kit")
RecoveryKit = Any
"""agent/recovery/kit.py's ``RecoveryKit`` (not imported: the kit imports this module)."""


def periodic(kit: RecoveryKit, step: int) -> None:
    """A ``val_every`` validation at a boundary, while its cost stays within ``val_max_share``."""
    t0 = time.monotonic()
    try:
        val = run(kit)  # the controller's baseline
    except Exception as exc:  # noqa: BLE001 - a periodic validation never stops training
        log.warning("periodic validation at step %d failed: %s", step, exc)
        return
    finally:
        why = kit.cadence.over_budget(step, time.monotonic() - t0)
        if not kit.all_ranks(not why):  # every rank stops together (a validation may be collective)
            kit.cadence.turn_off(why or "another rank's validation was over [agent.recovery] val_max_share")
            log.warning("cliffguard: periodic validation is off from step %d: %s; validations on command "
                        "still run (set [agent.recovery] val_max_share = 0 to keep it)", step, kit.cadence.off)
    if kit.on_periodic_validation is not None:
        kit.on_periodic_validation(step, val)


def run(kit: RecoveryKit, cmd_id: str | None = None, batches: int | None = None) -> float:
    """Forward-only validation on frozen weights, the global RNGs untouched; rank 0 emits the
    ``validation`` event. ``cmd_id`` None: a periodic one (its time counts for the cadence)."""
    t0 = time.monotonic()
    try:
        with kit.agent.modes.validating(), rng_untouched():
            if kit.validate_fn is not None:
                out = kit.validate_fn(batches)
                val, n = out if isinstance(out, tuple) else (out, batches or 0)
            else:
                val, n = held_back(kit, batches)
    finally:
        kit.cadence.record(time.monotonic() - t0, periodic=cmd_id is None)
    if kit.agent.rank == 0:
        payload: dict[str, Any] = {"val_loss": float(val), "batches": int(n)}
        if cmd_id is not None:
            payload["cmd"] = cmd_id
        kit.agent.emit(EventType.VALIDATION, payload)
    return float(val)


@torch.no_grad()
def held_back(kit: RecoveryKit, batches: int | None = None) -> tuple[float, int]:
    """``loss_fn`` on the held-back slice (the newest ``batches``), mean over every rank: (loss, n)."""
    if kit.loss_fn is None:
        raise RuntimeError("no validation: give the kit a validate_fn, or a loss_fn and remember() batches")
    data = list(kit.kept)[-batches:] if batches else list(kit.kept)
    was_training = kit.model.training
    kit.model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=kit.agent.device)
    try:
        for batch in data:
            total[0] += kit.loss_fn(batch).double().to(total.device)
            total[1] += 1.0
        if kit.agent.distributed:
            dist.all_reduce(total)
    finally:
        kit.model.train(was_training)
    if total[1] == 0:
        raise RuntimeError("no validation data yet: no training batch was remembered")
    return float(total[0] / total[1]), int(total[1])
