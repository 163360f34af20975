"""Pure arithmetic the invariants share: what the trainer executed by its own record, time spent
in faults, the store's longest stall, and compact step ranges for evidence lines."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any


def executed_steps(record: Sequence[dict[str, Any]]) -> Counter[int]:
    """How often rank 0 ran each step, from its record (trainer/record.py): a ``start`` at step s,
    then steps s.. until a command or timeout moved the step back (a rollback), and so on to ``end``.
    Without an ``end`` line the last stretch is unknown and left out."""
    done: Counter[int] = Counter()
    cur: int | None = None
    for line in record:
        kind = line.get("kind")
        if kind == "start":
            cur = int(line["step"])
        elif kind in ("command", "timeout") and cur is not None:
            before, after = int(line["step_before"]), int(line["step_after"])
            if after != before:
                done.update(range(cur, before))
                cur = after
        elif kind == "end" and cur is not None:
            done.update(range(cur, int(line["step"])))
            cur = None
    return done


def ranges(steps: Iterable[int], limit: int = 8) -> str:
    """``30-61, 88, 90-92`` (the first ``limit`` stretches, then how many more)."""
    out: list[list[int]] = []
    for s in sorted(set(steps)):
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    text = ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out[:limit])
    return text + (f" (+{len(out) - limit} more)" if len(out) > limit else "")


def overlap_s(lo: float, hi: float, windows: Iterable[tuple[float, float]]) -> float:
    """Seconds of [lo, hi] covered by the union of ``windows``."""
    covered, last = 0.0, lo
    for a, b in sorted(windows):
        a, b = max(a, last), min(b, hi)
        if b > a:
            covered += b - a
            last = b
    return covered


def longest_stall(
    polls: Sequence[tuple[float, float | None]],
    trainer_ts: Sequence[float],
    since: float,
    slack_s: float = 1.0,
) -> tuple[float, float | None]:
    """The longest stretch after ``since`` in which the store's newest step (``polls``: (time, newest
    stored step ts), in time order) did not move while the trainer had newer steps (``trainer_ts``,
    sorted): (its seconds, when it began). A paused trainer, or a store that caught up, is no stall."""
    longest, began_at = 0.0, None
    start: float | None = None
    prev: tuple[float, float | None] | None = None
    for t, newest in polls:
        i = bisect.bisect_right(trainer_ts, t)
        trainer_newest = trainer_ts[i - 1] if i else None
        behind = trainer_newest is not None and (newest is None or trainer_newest > newest + slack_s)
        if t >= since and prev is not None and behind and newest == prev[1]:
            start = max(since, prev[0]) if start is None else start
            if t - start > longest:
                longest, began_at = t - start, start
        else:
            start = None
        prev = (t, newest)
    return longest, began_at
