"""Which life of the worker group this is, the same on every rank.

torchrun's ``TORCHELASTIC_RESTART_COUNT`` is each node agent's own count of the restarts of its
failed workers: on a run of several nodes a restart for a membership change (another node's
workers failed and left the rendezvous) does not count, so the nodes of one worker group can
say different numbers. Here the node's local rank 0 counts the starts of the job's worker groups
on its node (a file beside the hang evidence, node-local) and every rank agrees on the highest
count with one all-reduce at start: each start of the group raises every present node's count
by one, so the agreed number rises by one per life, and a node that joins later (a lower
count) changes nothing. ``restarted`` is whether any node's torchrun restarted its workers.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist

from cliffguard.core.restart_plan import WorkerLife

log = logging.getLogger(__name__)


def count_start(directory: Path, job: str, node: str) -> int:
    """This node's starts of ``job``'s worker groups, this one counted (0 for the first). Keyed by
    the node's id: two launches on one host (a test of several nodes) keep their own counts."""
    path = directory / f"starts-{''.join(c if c.isalnum() or c in '-_.' else '_' for c in node)}.json"
    try:
        seen = json.loads(path.read_text())
        n = int(seen["starts"]) if seen.get("job") == job else -1
    except (OSError, ValueError, KeyError, TypeError):
        n = -1
    n += 1
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"job": job, "starts": n}))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("cannot count this node's worker-group starts in %s: %s", directory, exc)
    return n


def agree(life: WorkerLife, directory: Path, *, local_rank: int, device: torch.device,
          distributed: bool) -> WorkerLife:
    """The life every rank of the group agrees on (collective when ``distributed``)."""
    if not distributed:
        return life
    mine = count_start(directory, life.job, life.node) if local_rank == 0 else 0
    t = torch.tensor([mine, 1 if life.restarted else 0], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return life.agreed(int(t[0].item()), bool(t[1].item()))
