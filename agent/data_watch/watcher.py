"""``DataWatch``: the training loop hands it each batch; a thread of its own computes the batch's
statistics and sends a ``data.stats`` event per window of ``every`` steps.

The training thread's part (``observe``) is a queue put: no copy, no host sync, no numpy. The
watcher's thread moves a device batch to the host itself (``.cpu()`` waits there, not in the
loop) and holds the window's batches; at the window's end it measures them together (numpy's
per-call cost is paid once a window, not once a batch): the token slots and lengths,
near-duplicates against the batch and the recent window, row by row in order (near_dup.py), the
sketch (each duplicate's tokens left out: a repeated batch is a duplicate burst, not a drift) and
each sequence's novelty against the frequencies before the window (agent/data_watch/batch.py),
and the loop's optional scorers: ``garbled`` ([N, T] tokens -> [N] scores, > 1 = flagged) and
``perplexity`` ([N, T] -> [N] log-perplexity per token). A ``prepare`` callable runs
on the thread before the first batch (the bundled trainer builds its reference model there).

Never blocks or breaks training: a batch handed over while ``queue`` batches wait is skipped and
counted (``dropped`` in the next event, and a warning); a scorer or batch that raises is logged
(the first time and every power of ten) and the statistics go on without it. A step at or below
the last one seen means the loop went back (a rollback): the window so far is sent, and the
near-duplicate index forgets the steps to be replayed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cliffguard.agent.data_watch.batch import TokenSketch, token_slots
from cliffguard.agent.data_watch.config import DataWatchConfig
from cliffguard.agent.data_watch.near_dup import Duplicates, NearDuplicates
from cliffguard.agent.data_watch.window import Window
from cliffguard.core.enums import EventType

log = logging.getLogger(__name__)

Scorer = Callable[[torch.Tensor], Any]
"""[B, T] token tensor (host) -> [B] scores (numpy or torch)."""
Emit = Callable[..., None]
"""``emit(EventType.DATA_STATS, data, step=...)``: the agent's ``Agent.emit``."""


@dataclass(frozen=True, slots=True)
class BatchReport:
    """What the watcher found in one batch, for ``on_batch`` (e.g. a sampler's live reweighting)."""

    step: int
    sample_ids: list[int]
    duplicates: Duplicates
    garbled: np.ndarray | None
    perplexity: np.ndarray | None


class DataWatch:
    def __init__(self, config: DataWatchConfig, emit: Emit, *, garbled: Scorer | None = None,
                 perplexity: Scorer | None = None, prepare: Callable[[], None] | None = None,
                 on_batch: Callable[[BatchReport], None] | None = None, name: str = "cliffguard-data-watch") -> None:
        self.config = config
        self._emit = emit
        self._garbled = garbled
        self._perplexity = perplexity
        self._prepare = prepare
        self._on_batch = on_batch
        self._queue: queue.Queue[tuple[int, torch.Tensor, list[int] | None, torch.Tensor | None] | None] = (
            queue.Queue(maxsize=config.queue))
        self._sketch = TokenSketch(config.buckets)
        self._dups = NearDuplicates(config)
        self._window = Window(config.buckets, config.top_k)
        self._pending: list[tuple[int, torch.Tensor, list[int], np.ndarray]] = []
        """The current window's batches (step, host tokens, sample ids, token slots), measured at its end."""
        self._last_step: int | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._closed = False
        self.dropped = 0
        """Batches skipped because the watcher was behind (training thread's count)."""
        self._dropped_sent = 0
        self.batches = 0
        """Batches the watcher's thread has processed."""
        self.events = 0
        self.errors = 0
        self.cpu_s = 0.0
        """CPU seconds the watcher's thread spent on batches (``bench.agent_overhead`` reads it)."""

    def start(self) -> DataWatch:
        self._thread.start()
        return self

    # ------------------------------------------------------------------ the training thread
    def observe(self, step: int, tokens: torch.Tensor, sample_ids: Sequence[int] | None = None,
                attention_mask: torch.Tensor | None = None) -> None:
        """Hand over one batch of token ids [B, T] (and the ids of its samples, the positions
        ``step * B + i`` when None); the caller must not change the tensors in place afterwards."""
        if self._closed:
            return
        ids = None if sample_ids is None else list(sample_ids)
        try:
            self._queue.put_nowait((step, tokens, ids, attention_mask))
        except queue.Full:
            self.dropped += 1
            if _is_power_of_ten(self.dropped):
                log.warning("data watch: %d batch(es) skipped so far, the watcher is behind (step %d); "
                            "the next data.stats event counts them", self.dropped, step)

    def close(self, timeout: float = 10.0) -> None:
        """Process what is queued, send the last window, stop the thread."""
        if self._closed:
            return
        self._closed = True
        if not self._thread.is_alive():
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            log.warning("data watch: could not stop the watcher within %.0f s; its last window is lost", timeout)
            return
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the watcher's thread
    def _run(self) -> None:
        if self._prepare is not None:
            try:
                self._prepare()
            except Exception:  # noqa: BLE001 - the statistics go on without what it prepared
                log.exception("data watch: preparing the scorers failed; going on without the perplexity score")
                self._perplexity = None
        while True:
            item = self._queue.get()
            if item is None:
                break
            c0 = time.thread_time()
            try:
                self._batch(*item)
            except Exception:  # noqa: BLE001 - never let one batch stop the watch
                self._pending = []
                self._error("a batch", item[0])
            self.cpu_s += time.thread_time() - c0
        c0 = time.thread_time()
        try:
            self._flush()
        except Exception:  # noqa: BLE001
            self._error("the last window", self._last_step or 0)
        self.cpu_s += time.thread_time() - c0

    def _batch(self, step: int, tokens: torch.Tensor, ids: list[int] | None, mask: torch.Tensor | None) -> None:
        """Take one batch to the host and hold it; a window's batches are measured together."""
        cfg = self.config
        if self._last_step is not None and step <= self._last_step:  # the loop went back: a replay
            self._flush()
            self._dups.rewind(step)
        if self._pending and step // cfg.every != self._pending[0][0] // cfg.every:
            self._flush()
        self._last_step = step
        tokens = tokens.detach().cpu()
        host = tokens.numpy()
        if ids is None:
            ids = [step * host.shape[0] + i for i in range(host.shape[0])]
        slots = token_slots(host, None if mask is None else mask.detach().cpu().numpy(), cfg.pad_id)
        self._pending.append((step, tokens, ids, slots))
        if step % cfg.every == cfg.every - 1:
            self._flush()

    def _measure(self, group: list[tuple[int, torch.Tensor, list[int], np.ndarray]]) -> None:
        """Batches of one width, measured at once (numpy's per-call cost paid once per window, not
        per batch): duplicates row by row in order, the sketch (novelty against the frequencies
        before the group), the scorers, then into the window."""
        steps = np.concatenate([np.full(len(ids), step) for step, _, ids, _ in group])
        ids = [i for _, _, batch_ids, _ in group for i in batch_ids]
        tokens = group[0][1] if len(group) == 1 else torch.cat([t for _, t, _, _ in group])
        host = tokens.numpy()
        slots = np.concatenate([sl for _, _, _, sl in group]) if len(group) > 1 else group[0][3]
        sig, has = self._dups.signatures(host, slots)
        dups = self._dups.observe(steps, ids, sig, has)
        # a duplicate's tokens are counted once: a repeated batch is a duplicate burst, not a drift
        counts, novelty = self._sketch.observe(host, slots & ~dups.any[:, None])
        garbled = self._score("garbled", self._garbled, tokens, group[0][0])
        ppl = self._score("perplexity", self._perplexity, tokens, group[0][0])
        self._window.add(steps, ids, slots, counts, novelty, dups, garbled, ppl)
        self.batches += len(group)
        if self._on_batch is not None:
            start = 0
            for step, _, batch_ids, _ in group:
                rows = slice(start, start + len(batch_ids))
                start = rows.stop
                part = Duplicates(dups.in_batch[rows], dups.in_window[rows], dups.similarity[rows], dups.of[rows])
                self._on_batch(BatchReport(step, batch_ids, part, None if garbled is None else garbled[rows],
                                           None if ppl is None else ppl[rows]))

    def _score(self, what: str, scorer: Scorer | None, tokens: torch.Tensor, step: int) -> np.ndarray | None:
        if scorer is None:
            return None
        try:
            scores = scorer(tokens)
            out = scores.numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
            return out.astype(np.float64, copy=False)
        except Exception:  # noqa: BLE001 - the other statistics go on
            self._error(f"the {what} scorer", step)
            return None

    def _flush(self) -> None:
        """Measure the held batches and send their window."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        self._window.reset(pending[0][0])
        group: list[tuple[int, torch.Tensor, list[int], np.ndarray]] = []
        for item in pending:
            if group and item[1].shape[1] != group[0][1].shape[1]:
                self._measure(group)
                group = []
            group.append(item)
        self._measure(group)
        dropped = self.dropped - self._dropped_sent
        self._dropped_sent += dropped
        self._emit(EventType.DATA_STATS, self._window.payload(dropped), step=self._window.last_step)
        self.events += 1

    def _error(self, what: str, step: int) -> None:
        self.errors += 1
        if _is_power_of_ten(self.errors):
            log.exception("data watch: %s raised at step %d (%d errors so far); the statistics go on", what, step,
                          self.errors)


def _is_power_of_ten(n: int) -> bool:
    while n % 10 == 0:
        n //= 10
    return n == 1
