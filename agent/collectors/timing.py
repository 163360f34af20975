"""Step time split into data_wait / compute / comm_exposed.

- ``data_wait_s``: time the loop spent getting the next batch, measured around the data fetch
  (``Agent.data_wait()`` or ``Agent.wrap_loader``).
- ``comm_exposed_s``: communication the step had to *wait* for, from two sources:

  1. A DDP communication hook (``CommTimer.hook``) that wraps the gradient all-reduce of each
     bucket and records when the last bucket was handed to the process group. DDP launches a
     bucket as soon as its gradients are ready, so by the time the last bucket is launched the
     backward computation is finished; whatever time ``backward()`` still takes after that is
     spent waiting for all-reduces to finish — the exposed (non-overlapped) part. Overlapped
     communication is, correctly, not counted. We chose the hook over timing the collectives
     from outside because DDP issues them from inside autograd where the loop cannot see them,
     and the hook costs two ``perf_counter`` calls per bucket with no device sync.
  2. The step's own small all-reduce (global loss + command flag + norms), which is blocking and
     therefore fully exposed; the agent times it directly.

  On a GPU the hook's clock sees launch times, not kernel times, so the figure is the host-side
  wait; on the gloo/CPU path the collectives are host work and the figure is exact.
- ``compute_s`` = ``step_time_s`` − ``data_wait_s`` − ``comm_exposed_s`` (never below 0).
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.distributed as dist


class CommTimer:
    """DDP communication hook state: the default all-reduce, with launch times recorded, and (when
    ``want_grad_norm``) each reduced bucket's norm.

    The bucket norms give the step's global gradient norm from memory the all-reduce has just
    written, so it is still in cache: one pass per bucket, where a norm over the parameters'
    ``.grad`` after the backward reads every gradient back from memory (measured 0.07 ms vs
    0.3-0.6 ms per step for a 0.8M-parameter model on a loaded CPU)."""

    def __init__(self, process_group: Any = None) -> None:
        self.process_group = process_group
        self.last_launch: float | None = None
        self.buckets = 0
        self.want_grad_norm = False
        """Set by the agent before the backward of a step whose norm it publishes."""
        self.bucket_norms: list[torch.Tensor | float] = []

    def reset(self) -> None:
        self.last_launch = None
        self.buckets = 0
        self.bucket_norms = []

    def grad_norm_sq(self) -> torch.Tensor | float | None:
        """Squared norm of the reduced gradients of this step's buckets (a float for buckets on a
        CPU, else a float64 ``(1,)`` tensor on their device: no host sync); None unless every
        launched bucket reported one (no bucket, or ``want_grad_norm`` was off)."""
        norms = self.bucket_norms
        if not norms or len(norms) != self.buckets:
            return None
        if all(isinstance(n, float) for n in norms):
            return math.fsum(n * n for n in norms)
        return torch.stack([torch.as_tensor(n) for n in norms]).double().square().sum().reshape(1)

    def exposed_since(self, backward_end: float) -> float:
        """Exposed gradient-communication time of the backward that ended at ``backward_end``."""
        if self.last_launch is None:
            return 0.0
        return max(0.0, backward_end - self.last_launch)

    @staticmethod
    def hook(state, bucket):  # no annotations: DDP checks them at runtime against its own types
        """Same arithmetic as torch's default ``allreduce_hook`` (mean over ranks)."""
        state.last_launch = time.perf_counter()
        state.buckets += 1
        group = state.process_group if state.process_group is not None else dist.group.WORLD
        world = dist.get_world_size(group)
        tensor = bucket.buffer().div_(world)
        fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
        if not state.want_grad_norm:
            return fut.then(lambda f: f.value()[0])

        # The callback runs on a gloo worker thread and is released there: it must not hold the
        # timer (and through it the process group), or a release after the group was destroyed
        # would run the group's destructor on its own worker, which then joins itself and aborts
        # the process ("Resource deadlock avoided"). It holds only this step's list.
        norms = state.bucket_norms

        def reduced(f):
            buf = f.value()[0]
            norm = torch.linalg.vector_norm(buf, dtype=torch.float32)
            # on a CPU the number is here already: read it on this thread, not with more kernels on the training thread
            norms.append(float(norm) if buf.device.type == "cpu" else norm)
            return buf

        return fut.then(reduced)


def attach_comm_timer(model: torch.nn.Module) -> CommTimer | None:
    """Register the timing hook on a DDP model (must precede the first backward); None otherwise."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(model, DDP):
        return None
    timer = CommTimer(model.process_group)
    model.register_comm_hook(timer, CommTimer.hook)
    return timer


class StepClock:
    """Accumulates one step's time components; ``split`` closes the step."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.data_wait = 0.0
        self.comm_exposed = 0.0

    def restart(self) -> None:
        self.start = time.perf_counter()
        self.data_wait = 0.0
        self.comm_exposed = 0.0

    def split(self, now: float | None = None) -> tuple[float, float, float, float]:
        """(step_time, data_wait, comm_exposed, compute) for the step started at ``start``."""
        now = time.perf_counter() if now is None else now
        total = max(0.0, now - self.start)
        data = min(self.data_wait, total)
        comm = min(self.comm_exposed, total - data)
        return total, data, comm, max(0.0, total - data - comm)
