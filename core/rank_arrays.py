"""Per-rank arrays in events: the loss summary of a run-level ``step`` event, the ``ranks`` event's
performance arrays and a node heartbeat's liveness arrays — how they are built, bounded and read.

Run-level events keep a run's event rate O(1) per step whatever its size: rank 0 sends one
``step`` event per step with ``rank_losses`` (the agent holds every rank's loss after its packed
all-reduce, agent/hooks.py), per-rank performance comes every ``ranks_every`` steps in ``ranks``
events of at most ``MAX_RANKS_PER_EVENT`` ranks each, and liveness in one heartbeat per node.

Outliers: a rank's loss is an outlier when it is non-finite or
``|loss - median| > OUTLIER_K * sigma`` with ``sigma = max(1.4826 * MAD, OUTLIER_REL_FLOOR *
|median|)`` over the finite losses (the robust σ of core/spike.py; the floor keeps ranks that
agree to many digits from making every tiny difference an outlier). Only then does the event
carry the full vector (``losses``, when the world is at most ``MAX_RANKS_PER_EVENT``); the
outlier ranks themselves are always named, worst first, at most ``MAX_OUTLIERS``.

Decoding (core/events.py) calls the ``check_*`` functions, so every array is bounded and
consistent with the envelope's ``world`` before any consumer sees it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from statistics import median
from typing import Any

from cliffguard.core.schema import SchemaError

MAX_RANKS_PER_EVENT = 4096
"""Ranks one ``ranks`` event, node heartbeat or full loss vector may hold (~0.6 MB of JSON at most)."""
MAX_OUTLIERS = 64
"""Outlier ranks a loss summary names."""
MAX_DETAIL_STEPS = 10_000
"""The most steps one detail command may ask per-rank step events for."""
OUTLIER_K = 6.0
OUTLIER_REL_FLOOR = 0.01
MAD_TO_SIGMA = 1.4826
MAX_COLLECTIVE_CHARS = 64

RANKS_ARRAYS: tuple[str, ...] = ("step_time_s", "data_wait_s", "comm_exposed_s", "mfu", "tokens_per_s",
                                 "mem_allocated", "mem_reserved", "loss_local")
"""The array fields of a ``ranks`` event (core/payloads.py ``RanksData``), all of one length."""
HEARTBEAT_ARRAYS: tuple[str, ...] = ("ranks", "steps", "ages_s", "collectives")
"""The array fields of a node heartbeat, all of one length, all present or none."""


def summarize_losses(losses: Sequence[float], *, k: float = OUTLIER_K) -> dict[str, Any]:
    """Every rank's loss (index = rank) -> a ``LossSummary`` (core/payloads.py)."""
    finite = [(x, r) for r, x in enumerate(losses) if math.isfinite(x)]
    nan = float("nan")
    if finite:
        lo, hi = min(finite), max(finite)
        med = median(x for x, _ in finite)
        mad = median(abs(x - med) for x, _ in finite)
    else:
        lo = hi = (nan, 0)
        med = mad = nan
    sigma = max(MAD_TO_SIGMA * mad, OUTLIER_REL_FLOOR * abs(med)) if finite else nan
    scored = []
    for r, x in enumerate(losses):
        if not math.isfinite(x):
            scored.append((math.inf, r, x))
        elif finite and abs(x - med) > k * sigma:
            scored.append((abs(x - med), r, x))
    scored.sort(key=lambda t: (-t[0], t[1]))
    scored = scored[:MAX_OUTLIERS]
    out: dict[str, Any] = {
        "min": lo[0], "max": hi[0], "argmin": lo[1], "argmax": hi[1], "median": med, "mad": mad,
        "outliers": [r for _, r, _ in scored], "outlier_losses": [x for _, _, x in scored],
    }
    if scored and len(losses) <= MAX_RANKS_PER_EVENT:
        out["losses"] = [float(x) for x in losses]
    return out


def _rank(value: int, world: int, where: str) -> None:
    if not 0 <= value < world:
        raise SchemaError(where, f"rank {value} outside world of {world}")


def _length(data: Mapping[str, Any], names: Sequence[str], where: str) -> int:
    n = len(data[names[0]])
    for name in names:
        if len(data[name]) != n:
            lengths = {name: len(data[name]) for name in names}
            raise SchemaError(where, f"arrays of different lengths: {lengths}")
    if n > MAX_RANKS_PER_EVENT:
        raise SchemaError(where, f"{n} ranks exceed the limit of {MAX_RANKS_PER_EVENT} per event")
    return n


def check_loss_summary(summary: Mapping[str, Any], world: int, where: str) -> None:
    for name in ("argmin", "argmax"):
        _rank(summary[name], world, f"{where}.{name}")
    outliers = summary["outliers"]
    if len(outliers) > MAX_OUTLIERS:
        raise SchemaError(f"{where}.outliers", f"more than {MAX_OUTLIERS} ranks")
    if len(summary["outlier_losses"]) != len(outliers):
        raise SchemaError(f"{where}.outlier_losses", "must be as long as outliers")
    for i, r in enumerate(outliers):
        _rank(r, world, f"{where}.outliers[{i}]")
    losses = summary.get("losses")
    if losses is not None and len(losses) != world:
        raise SchemaError(f"{where}.losses", f"{len(losses)} losses for a world of {world}")


def check_ranks(data: Mapping[str, Any], world: int, where: str = "data") -> None:
    n = _length(data, RANKS_ARRAYS, where)
    first = data["first_rank"]
    if n < 1:
        raise SchemaError(f"{where}.step_time_s", "must hold at least one rank")
    if first < 0 or first + n > world:
        raise SchemaError(f"{where}.first_rank", f"ranks [{first}, {first + n}) outside world of {world}")
    if data["steps"] < 1:
        raise SchemaError(f"{where}.steps", "must be >= 1")


def check_node_heartbeat(data: Mapping[str, Any], world: int, max_step: int, where: str = "data") -> None:
    present = [name for name in HEARTBEAT_ARRAYS if data.get(name) is not None]
    if not present:
        return
    if len(present) != len(HEARTBEAT_ARRAYS):
        missing = sorted(set(HEARTBEAT_ARRAYS) - set(present))
        raise SchemaError(f"{where}.{missing[0]}", f"a node heartbeat carries all of {', '.join(HEARTBEAT_ARRAYS)}")
    if _length(data, HEARTBEAT_ARRAYS, where) == 0:
        return
    ranks, steps, ages, collectives = data["ranks"], data["steps"], data["ages_s"], data["collectives"]
    if (min(ranks) >= 0 and max(ranks) < world and min(steps) >= 0 and max(steps) <= max_step and min(ages) >= 0
            and math.isfinite(sum(ages)) and max(map(len, collectives)) <= MAX_COLLECTIVE_CHARS):
        return  # no element can fail the checks below (a NaN or inf age makes the sum non-finite)
    for i, (r, s, age, coll) in enumerate(zip(ranks, steps, ages, collectives, strict=True)):
        _rank(r, world, f"{where}.ranks[{i}]")
        if not 0 <= s <= max_step:
            raise SchemaError(f"{where}.steps[{i}]", f"must be in [0, {max_step}]")
        if not (math.isfinite(age) and age >= 0):
            raise SchemaError(f"{where}.ages_s[{i}]", "must be finite and >= 0")
        if len(coll) > MAX_COLLECTIVE_CHARS:
            raise SchemaError(f"{where}.collectives[{i}]", f"longer than {MAX_COLLECTIVE_CHARS} characters")


class RankRow(Mapping[str, Any]):
    """One rank's fields of a ``ranks`` event, as in a per-rank step event: read from the arrays
    when asked, so walking a 16,384-rank chunk copies nothing per rank."""

    __slots__ = ("_data", "_i")

    def __init__(self, data: Mapping[str, Any], i: int) -> None:
        self._data, self._i = data, i

    def __getitem__(self, name: str) -> Any:
        if name not in RANKS_ARRAYS:
            raise KeyError(name)
        return self._data[name][self._i]

    def __iter__(self) -> Iterator[str]:
        return iter(RANKS_ARRAYS)

    def __len__(self) -> int:
        return len(RANKS_ARRAYS)


def rank_entries(data: Mapping[str, Any]) -> Iterator[tuple[int, RankRow]]:
    """A ``ranks`` event's data -> (rank, that rank's fields)."""
    first = data["first_rank"]
    for i in range(len(data["step_time_s"])):
        yield first + i, RankRow(data, i)


def is_run_level(data: Mapping[str, Any]) -> bool:
    """A ``step`` event's data: True for a run-level event (rank 0's, with the loss summary)."""
    return data.get("rank_losses") is not None


def is_detail(data: Mapping[str, Any]) -> bool:
    """A ``step`` event's data: True for a per-rank event sent for a detail command."""
    return bool(data.get("detail"))
