"""Real batches for the data-watch and data-rule tests: byte windows of the standard library's
code (the bundled trainer's default corpus), the faults' prose and garbling
(trainer/data_faults.py), and the ``data.stats`` events the real ``DataWatch`` makes of them.
No training: a few hundred batches in well under a second per scenario."""

from __future__ import annotations

import functools
import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from cliffguard.agent.data_watch.config import DataWatchConfig
from cliffguard.agent.data_watch.watcher import DataWatch
from cliffguard.agent.drafts import EventDraft
from cliffguard.core.enums import EventType
from cliffguard.core.events import Event
from cliffguard.trainer import data_faults
from cliffguard.trainer.byte_lm import ByteTrigramLM
from cliffguard.trainer.data_rules import DataRules

Batch = tuple[int, torch.Tensor, list[int]]
"""(step, [B, T] int64 byte tokens, sample ids)."""


@functools.cache
def code_tokens(max_bytes: int = 2_000_000) -> torch.Tensor:
    """The standard library's .py sources (directories walked in sorted order, tests left out), capped."""
    parts: list[bytes] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(sysconfig.get_paths()["stdlib"]):
        dirnames[:] = sorted(d for d in dirnames if d not in {"site-packages", "test", "tests", "__pycache__"})
        for name in sorted(f for f in filenames if f.endswith(".py")):
            data = (Path(dirpath) / name).read_bytes()
            parts.append(data + b"\n")
            total += len(data) + 1
        if total >= max_bytes:
            break
    return torch.frombuffer(bytearray(b"".join(parts)[:max_bytes]), dtype=torch.uint8)


def code_batches(steps: range, batch: int = 8, seq_len: int = 64, seed: int = 0) -> Iterator[Batch]:
    """Random code windows, seeded per step; sample id = the window's index in the corpus."""
    tokens = code_tokens()
    n = (tokens.numel() - 1) // seq_len
    for step in steps:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        ids = torch.randint(0, n, (batch,), generator=gen)
        x = tokens[ids.unsqueeze(1) * seq_len + torch.arange(seq_len).unsqueeze(0)].long()
        yield step, x, ids.tolist()


Fault = Callable[[Batch], Batch]


def shift(step: int, x: torch.Tensor, ids: list[int]) -> Batch:
    """The batch's sequences replaced by prose (the data_shift fault's content)."""
    return step, data_faults.shifted(x, x, step, 0, 1)[0], ids


def garble(step: int, x: torch.Tensor, ids: list[int]) -> Batch:
    """Every other sequence garbled (the garble fault's content)."""
    return step, data_faults.garbled(x, x, step, 0, 1)[0], ids


@functools.cache
def reference_model() -> ByteTrigramLM:
    """The byte-trigram model trained on the code corpus (what the trainer builds from its split)."""
    lm = ByteTrigramLM()
    lm.train_tokens(code_tokens().numpy())
    return lm


def watch(batches: Iterator[Batch], config: DataWatchConfig | None = None, *, run: str = "data-run",
          rank: int = 0, scorers: bool = True) -> list[Event]:
    """The ``data.stats`` events the real ``DataWatch`` sends for ``batches`` (validated)."""
    out: list[EventDraft] = []

    def emit(etype: EventType, data: dict[str, Any], *, step: int) -> None:
        out.append(EventDraft(etype, run, step, data, rank=rank, world=max(rank + 1, 1)))

    lm = reference_model() if scorers else None
    w = DataWatch(config or DataWatchConfig(queue=100_000), emit,
                  garbled=DataRules().garbled if scorers else None,
                  perplexity=(lambda x: lm.sequence_scores(x.numpy())) if lm is not None else None).start()
    for step, x, ids in batches:
        w.observe(step, x, ids)
    w.close()
    assert w.dropped == 0 and w.errors == 0
    return [d.build() for d in out]


def fill_data_stats(engine: Any, run_id: str, steps: int = 120, garbled: range = range(100, 104), *,
                    world: int = 2) -> list[Event]:
    """Rank 0's ``data.stats`` of a run already in the store (testing/dashboard_fill.py's), garbled
    text at ``garbled``; timestamped before the run's own events, so its last step and time stay."""
    from cliffguard.controller.store.db import session_scope
    from cliffguard.controller.store.ingest import ingest_events
    from cliffguard.core.events import make_event

    def batches() -> Iterator[Batch]:
        for step, x, ids in code_batches(range(steps)):
            yield garble(step, x, ids) if step in garbled else (step, x, ids)

    events = [make_event(e.type, run_id, e.step, e.data, rank=0, world=world, ts=1.0 + e.step / 1000)
              for e in watch(batches(), run=run_id)]
    with session_scope(engine) as s:
        ingest_events(s, events)
    return events
