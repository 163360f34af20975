"""Which rank speaks for the run: the one rule every process uses.

The ranks of a data-parallel run all-reduce the loss, the global gradient norm and the loss
scale, so any rank's ``step`` event carries the same run-level values; agents send it from rank 0
alone (with every rank's loss summarised, core/rank_arrays.py), older agents from every rank; the
other run-level events (run.started, checkpoint, validation, histograms, command acks) come from
rank 0 alone (agent/hooks.py). One rank's copy therefore stands for the run:

    the lowest rank heard from speaks for the run.

That is ``RUN_RANK`` (0) whenever rank 0 reports at all. A higher rank speaks only while rank 0
has not been heard (its events are late, or its rows are gone from the store) and gives way as
soon as a lower rank turns up.

Who applies it: controller/detect.py (which ``step`` events feed the loss rules:
``takes_over``), controller/batch.py (recovery inputs come from ``RUN_RANK`` only: a stand-in's
step numbers would interleave with rank 0's once it arrives), and the store's read API
(controller/store/read/ranks.py: ``speaker`` over the ranks a run has rows for, computed in SQL
as ``min(rank)``).
"""

from __future__ import annotations

from collections.abc import Iterable

RUN_RANK = 0
"""The rank that sends the run-level events and whose step events speak for a healthy run."""


def speaker(ranks_heard: Iterable[int]) -> int | None:
    """The rank that speaks for the run among ``ranks_heard``; None when none was heard."""
    return min(ranks_heard, default=None)


def takes_over(rank: int, current: int | None) -> bool:
    """True when a report from ``rank`` makes it the speaker instead of ``current`` (None: no
    speaker yet): the incremental form of ``speaker`` for a reader that sees ranks one by one."""
    return current is None or rank < current


def rank_spans(ranks: Iterable[int]) -> str:
    """Sorted ranks as ranges: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    out: list[str] = []
    start = prev = None
    for r in sorted(set(ranks)):
        if prev is not None and r == prev + 1:
            prev = r
            continue
        if start is not None:
            out.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(out)
