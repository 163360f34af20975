"""Real events (``core.events.make_event``) with sensible defaults, for the store tests."""

from __future__ import annotations

from typing import Any

from cliffguard.core.enums import EventType
from cliffguard.core.events import Event, make_event

T0 = 1_764_480_000.0

RUN_STARTED_DATA: dict[str, Any] = {
    "n_params": 1_000_000,
    "n_layers": 2,
    "n_heads": 4,
    "head_dim": 32,
    "seq_len": 256,
    "global_batch": 8,
    "peak_flops": 1e12,
    "peak_source": "table",
    "lr_schedule": {"kind": "cosine", "lr": 3e-3},
    "world_size": 2,
}


def run_started(run: str = "run-a", *, ts: float = T0, world: int = 2, **extra: Any) -> Event:
    return make_event(
        EventType.RUN_STARTED, run, 0, {**RUN_STARTED_DATA, "world_size": world, **extra}, world=world, ts=ts
    )


def step(
    step: int,
    loss: float = 2.0,
    *,
    run: str = "run-a",
    rank: int = 0,
    world: int = 2,
    ts: float | None = None,
    **over: Any,
) -> Event:
    data: dict[str, Any] = {
        "loss": loss,
        "loss_local": loss,
        "lr": 3e-3,
        "lr_scale": 1.0,
        "grad_norm": 1.5,
        "tokens": 2048,
        "step_time_s": 0.1,
        "data_wait_s": 0.01,
        "comm_exposed_s": 0.02,
        "compute_s": 0.07,
        "tokens_per_s": 20480.0,
        "mfu": 0.45,
        "mem_allocated": 100 << 20,
        "mem_reserved": 150 << 20,
        "loss_scale": 65536.0,
        "skipped": False,
        "clipped_layers": 0,
        "guard": "ok",
        **over,
    }
    return make_event(
        EventType.STEP, run, step, data, rank=rank, world=world, ts=T0 + step if ts is None else ts
    )


def event(
    type: EventType | str,
    step: int,
    data: dict[str, Any],
    *,
    run: str = "run-a",
    rank: int = 0,
    world: int = 2,
    ts: float | None = None,
) -> Event:
    return make_event(type, run, step, data, rank=rank, world=world, ts=T0 + step if ts is None else ts)


def grad_hist(step: int, *, run: str = "run-a", rank: int = 0, p99: float = 1e-3) -> Event:
    layer = {
        "counts": [1, 5, 3],
        "zeros": 0,
        "nonfinite": 0,
        "p50": 1e-4,
        "p99": p99,
        "max": 1e-2,
        "norm": 0.5,
        "underflow": 0.0,
    }
    return event(
        EventType.GRAD_HIST,
        step,
        {"edges": [1e-6, 1e-4, 1e-2, 1.0], "layers": {"h.0": layer}},
        run=run,
        rank=rank,
    )


def checkpoint(
    step: int,
    *,
    kind: str = "full",
    verified: bool = True,
    ts: float | None = None,
    run: str = "run-a",
    detail: str | None = None,
) -> Event:
    data: dict[str, Any] = {
        "kind": kind,
        "path": f"/ckpt/{kind}-{step}.pt",
        "bytes": 1234,
        "sha256": "ab" * 32,
        "seconds": 0.5,
        "verified": verified,
    }
    if detail is not None:
        data["detail"] = detail
    return event(EventType.CHECKPOINT, step, data, run=run, ts=ts)


def ack(
    cmd_id: str, status: str, *, step: int = 10, ts: float | None = None, run: str = "run-a", detail: str = ""
) -> Event:
    return event(
        EventType.COMMAND_ACK, step, {"cmd": cmd_id, "status": status, "detail": detail}, run=run, ts=ts
    )
