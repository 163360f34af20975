"""The events a fleet's agents would publish, tick by tick, built by the agent's own payload code.

One tick is one optimizer step of every run (``1 / steps_per_s`` seconds). Per run and tick, as
agent/hooks.py sends them: rank 0's run-level ``step`` event (its ``rank_losses`` from
``core.rank_arrays.summarize_losses`` over every rank's loss); every ``ranks_every`` steps the
``ranks`` events of ``agent.rank_perf.ranks_payload`` (one per ``ranks_per_event`` chunk, from
the chunk's first rank); and the node heartbeats of the nodes whose turn it is (each node's local
rank 0 beats every ``heartbeat_s``, the nodes spread evenly over that period), carrying the node's
ranks' steps, ages and collectives as agent/node_beats.py reads them.

Injected faults: a loss spike (every rank's loss doubled at one step: critical at once, an
"extreme" point) and one hung rank: from its step on, the run stops stepping — every other rank
waits in the step's all-reduce, the hung rank outside any collective — while every node keeps
beating, which is what the controller's heartbeat rule must name.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

from cliffguard.agent.rank_perf import PERF_FIELDS, publishes_chunk, ranks_payload
from cliffguard.core.enums import EventType, TrainerMode
from cliffguard.core.events import Event, make_event
from cliffguard.core.rank_arrays import summarize_losses


@dataclass(kw_only=True, slots=True)
class FleetSpec:
    ranks: int = 16_384
    """Ranks per run."""
    runs: int = 1
    steps_per_s: float = 1.0
    node_size: int = 8
    """Ranks per node (one heartbeat per node)."""
    ranks_every: int = 10
    """Steps between ``ranks`` events (agent ranks_every)."""
    ranks_per_event: int = 1024
    """Ranks per ``ranks`` event (agent ranks_per_event)."""
    heartbeat_s: float = 5.0
    """Seconds between a node's heartbeats (agent heartbeat_s)."""
    spikes: dict[int, list[int]] = field(default_factory=dict)
    """Run index -> steps whose loss is a spike."""
    hung: tuple[int, int, int] | None = None
    """(run index, rank, step): that rank hangs at that step."""

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.runs < 1:
            raise ValueError("ranks: runs and ranks must be >= 1")
        if self.steps_per_s <= 0:
            raise ValueError("steps_per_s: must be > 0")
        if self.node_size < 1:
            raise ValueError("node_size: must be >= 1")
        if self.ranks_every < 1 or self.ranks_per_event < 1:
            raise ValueError("ranks_every: ranks_every and ranks_per_event must be >= 1")
        if self.heartbeat_s <= 0:
            raise ValueError("heartbeat_s: must be > 0")

    @property
    def nodes(self) -> int:
        return math.ceil(self.ranks / self.node_size)

    @property
    def beat_ticks(self) -> int:
        """Ticks between two heartbeats of one node."""
        return max(1, round(self.heartbeat_s * self.steps_per_s))

    def events_per_run_step(self) -> float:
        """The steady rate, per run and step: step + ranks + heartbeats."""
        chunks = math.ceil(self.ranks / self.ranks_per_event)
        return 1 + chunks / self.ranks_every + self.nodes / self.beat_ticks


def healthy_loss(step: int) -> float:
    return 3.0 / (1 + step / 500)


class FleetStream:
    """``tick(k, now)`` -> every event the fleet publishes at step ``k`` (time ``now``)."""

    def __init__(self, spec: FleetSpec, run_names: list[str]) -> None:
        if len(run_names) != spec.runs:
            raise ValueError("run_names: one name per run")
        self.spec = spec
        self.names = run_names
        w = spec.ranks
        # per-rank spread of the loss and of the timings: fixed, so a step costs no random draws
        self._noise = [0.002 * (((r * 7919) % 101) / 50 - 1) for r in range(w)]
        self._block = ([0.5] * w + [0.01] * w + [0.05] * w + [0.45] * w + [8000.0] * w
                       + [40e9] * w + [60e9] * w)
        assert len(self._block) == len(PERF_FIELDS) * w

    def hung_at(self, run: int) -> int | None:
        h = self.spec.hung
        return h[2] if h is not None and h[0] == run else None

    def tick(self, k: int, now: float) -> Iterator[tuple[str, Event]]:
        """(key, event) pairs for step ``k``; the key is the run (one partition per run)."""
        for i, run in enumerate(self.names):
            hang = self.hung_at(i)
            stepping = hang is None or k <= hang
            if stepping:
                yield from self._step_events(i, run, k, now)
            yield from self._heartbeats(i, run, k, now, min(k, hang) if hang is not None else k)

    def _step_events(self, i: int, run: str, k: int, now: float) -> Iterator[tuple[str, Event]]:
        spec = self.spec
        base = healthy_loss(k) * (2.0 if k in spec.spikes.get(i, ()) else 1.0)
        losses = [base + n for n in self._noise]
        loss = math.fsum(losses) / len(losses)
        data = {
            "loss": loss, "loss_local": losses[0], "lr": 1e-4, "lr_scale": 1.0, "grad_norm": 1.0,
            "tokens": 8192, "step_time_s": 0.5, "data_wait_s": 0.01, "comm_exposed_s": 0.05, "compute_s": 0.44,
            "tokens_per_s": 16384.0, "mfu": 0.45, "mem_allocated": 40_000_000_000, "mem_reserved": 60_000_000_000,
            "loss_scale": 1.0, "skipped": False, "clipped_layers": 0, "guard": "ok",
            "sample_range": [k * 1024, (k + 1) * 1024], "rank_losses": summarize_losses(losses),
        }
        yield run, make_event(EventType.STEP, run, k, data, rank=0, world=spec.ranks, ts=now)
        if k and k % spec.ranks_every == 0:
            for rank in range(0, spec.ranks, spec.ranks_per_event):
                if publishes_chunk(rank, spec.ranks_per_event):
                    payload = ranks_payload(self._block, losses, world=spec.ranks, rank=rank,
                                            per_event=spec.ranks_per_event, steps=spec.ranks_every)
                    yield run, make_event(EventType.RANKS, run, k, payload, rank=rank, world=spec.ranks, ts=now)

    def _heartbeats(self, i: int, run: str, k: int, now: float, step: int) -> Iterator[tuple[str, Event]]:
        spec = self.spec
        hung = spec.hung if spec.hung is not None and spec.hung[0] == i else None
        stalled = hung is not None and k > hung[2]
        for node in range(k % spec.beat_ticks, spec.nodes, spec.beat_ticks):
            ranks = list(range(node * spec.node_size, min(spec.ranks, (node + 1) * spec.node_size)))
            colls = ["" if not stalled or (hung is not None and r == hung[1]) else "all_reduce" for r in ranks]
            data = {"state": str(TrainerMode.RUNNING), "ranks": ranks, "steps": [step] * len(ranks),
                    "ages_s": [0.2] * len(ranks), "collectives": colls}
            yield run, make_event(EventType.HEARTBEAT, run, step, data, rank=ranks[0], world=spec.ranks, ts=now)
