"""Which process this is in the job, and the one collective the agent's parts share a note of.

``Ranks`` is read by every part of the agent (agent/build.py wires them): the step probe's
all-reduce and the command channel's broadcast set ``collective`` while they are inside one, so
a node heartbeat (agent/node_beats.py) can say which collective a stuck rank is waiting in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


class AcceleratorLike(Protocol):
    """What the agent reads from an ``accelerate.Accelerator`` (None: plain DDP or one process)."""

    @property
    def process_index(self) -> int: ...

    @property
    def num_processes(self) -> int: ...

    @property
    def device(self) -> torch.device: ...


@dataclass(slots=True)
class Ranks:
    rank: int
    world: int
    device: torch.device
    distributed: bool
    collective: str = ""
    """The agent collective the training thread is inside now ("" when none)."""

    @classmethod
    def of(cls, accelerator: AcceleratorLike | None, model: torch.nn.Module) -> Ranks:
        if accelerator is not None:
            rank, world, device = accelerator.process_index, accelerator.num_processes, accelerator.device
        else:
            rank = dist.get_rank() if dist.is_initialized() else 0
            world = dist.get_world_size() if dist.is_initialized() else 1
            device = next(model.parameters()).device
        return cls(rank, world, device, world > 1 and dist.is_available() and dist.is_initialized())

    def broadcast(self, payload: T) -> T:
        """Rank 0's ``payload`` on every rank (``broadcast_object_list``)."""
        if not self.distributed:
            return payload
        box = [payload if self.rank == 0 else None]
        self.collective = "broadcast"
        dist.broadcast_object_list(box, src=0)
        self.collective = ""
        return box[0]  # type: ignore[return-value]
