"""The pre-flight node check of a restarted worker group: a short matmul and all-gather in pairs,
re-paired to isolate a slow or broken rank (DLRover's node check), before the group trains.

Round 0 pairs the ranks (0,1), (2,3), ...; round 1 shifts the pairing by one, (1,2), (3,4), ...,
(w-1,0) (a rank left over joins the last group). In each round every rank times
``check_iters`` matmuls of ``check_size``² and then an all-gather inside its group (a group of
its own, ``check_timeout_s``: a broken peer fails the pair, it cannot hold the check). A group is
slow when it took ``check_slow_factor`` times the median of the round's other groups and
``check_min_s`` more; a rank
is slow when every group it was in was slow (one slow pair says one of two; the re-pairing says
which), or when its fastest single matmul is that much slower than the other ranks' median (the
fastest, so that a rank the scheduler preempted for a moment on shared cores is not called slow).
On a world of two the pairs cannot tell the ranks apart and the matmuls decide.

``run_check`` (collective: every rank calls it at the same point) returns the same
``CheckResult`` on every rank; ``judge`` is the pure part.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.hang.config import HangConfig
from cliffguard.agent.hang.timeouts import timeout

log = logging.getLogger(__name__)

ROUNDS = 2


def groups_for(world: int, round_: int) -> list[list[int]]:
    """The pairs of ``round_`` (see the module docstring); one group for a world below 2."""
    if world < 2:
        return [list(range(world))]
    order = [(r + round_) % world for r in range(world)]
    groups = [order[i:i + 2] for i in range(0, world, 2)]
    if len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return [sorted(g) for g in groups]


@dataclass(frozen=True, slots=True)
class RankResult:
    rank: int
    node: str
    matmul_s: float
    group_s: tuple[float, ...]
    """This rank's time for its group's round (matmul + all-gather), per round; inf = it failed."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool
    ranks: list[int]
    nodes: list[str]
    matmul_s: list[float]
    rounds: list[dict[str, Any]]
    slow: list[int]
    slow_nodes: list[str]
    seconds: float
    detail: str
    life: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def event_data(self) -> dict[str, Any]:
        return {"ok": self.ok, "life": self.life, "ranks": self.ranks, "nodes": self.nodes,
                "matmul_s": [round(x, 6) for x in self.matmul_s], "rounds": self.rounds, "slow": self.slow,
                "slow_nodes": self.slow_nodes, "seconds": round(self.seconds, 3), "detail": self.detail}


def _slow(values: Sequence[float], factor: float, min_s: float) -> list[int]:
    """Indices of the values ``factor`` times the median of the *others* and ``min_s`` above it (the
    others': with two groups a median of all would sit between the healthy and the slow one)."""
    if len(values) < 2:
        return []
    out = []
    for i, v in enumerate(values):
        others = [x for j, x in enumerate(values) if j != i and x != float("inf")]
        med = statistics.median(others) if others else 0.0
        if v == float("inf") or (others and v > factor * med and v > med + min_s):
            out.append(i)
    return out


def judge(results: Sequence[RankResult], world: int, factor: float, min_s: float, seconds: float = 0.0,
          life: int = 0) -> CheckResult:
    """Which ranks are slow or broken, from every rank's timings (pure)."""
    by_rank = {r.rank: r for r in results}
    ranks = sorted(by_rank)
    missing = [r for r in range(world) if r not in by_rank]
    rounds: list[dict[str, Any]] = []
    slow_in: dict[int, list[bool]] = {r: [] for r in range(world)}
    for k in range(ROUNDS):
        groups = groups_for(world, k)
        secs = [max((by_rank[r].group_s[k] if r in by_rank and k < len(by_rank[r].group_s) else float("inf"))
                    for r in g) for g in groups]
        slow_groups = _slow(secs, factor, min_s) if len(groups) > 1 else []
        rounds.append({"groups": groups, "seconds": [round(s, 6) if s != float("inf") else -1.0 for s in secs],
                       "slow": slow_groups})
        for i, g in enumerate(groups):
            for r in g:
                slow_in[r].append(i in slow_groups)
    by_pairs = [r for r, flags in slow_in.items() if flags and all(flags)] if world > 2 else []
    mm = [by_rank[r].matmul_s for r in ranks]
    by_matmul = [ranks[i] for i in _slow(mm, factor, min_s)]
    slow = sorted(set(by_pairs) | set(by_matmul) | set(missing))
    node_of = {r: by_rank[r].node for r in ranks}
    slow_nodes = sorted({node_of.get(r, "?") for r in slow})
    why = []
    if by_pairs:
        why.append(f"slow in every pair: ranks {by_pairs}")
    if by_matmul:
        med = statistics.median(mm)
        why.append("matmul " + ", ".join(f"rank {r} {by_rank[r].matmul_s:.3f}s" for r in by_matmul)
                   + f" vs median {med:.3f}s")
    if missing:
        why.append(f"no result from ranks {missing}")
    detail = "; ".join(why) if why else f"{world} ranks, {ROUNDS} rounds: every pair and matmul within x{factor:g}"
    return CheckResult(ok=not slow, ranks=ranks, nodes=[node_of[r] for r in ranks], matmul_s=mm, rounds=rounds,
                       slow=slow, slow_nodes=slow_nodes, seconds=seconds, detail=detail, life=life)


def run_check(config: HangConfig, rank: int, world: int, node: str, *, life: int = 0, device: Any = "cpu",
              before_round: Callable[[int], None] | None = None) -> CheckResult:
    """The check on every rank (collective); ``before_round(k)`` runs before each timed matmul of
    round ``k`` (a test's or a fault's slow rank)."""
    t_start = time.perf_counter()
    n = config.check_size
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    torch.mm(a, b)  # warm
    matmul_s = float("inf")
    group_s: list[float] = []
    made: dict[tuple[int, ...], Any] = {}
    """This rank's groups by members. A pairing that comes again (a world of 2 or 3 has one group in
    every round) reuses its group: a second ``new_group`` of the same ranks has the same hashed
    name, so its gloo connect read the first one's addresses from the store and timed out."""
    try:
        for k in range(ROUNDS):
            mine = tuple(next(g for g in groups_for(world, k) if rank in g))
            group = made.get(mine)
            if group is None:
                try:
                    group = made[mine] = dist.new_group(list(mine), timeout=timeout(config.check_timeout_s),
                                                        use_local_synchronization=True)
                except Exception as exc:  # noqa: BLE001 - a peer that never comes (started late, gone) fails its pair
                    log.warning("node check round %d: the group of ranks %s did not form: %s", k, list(mine), exc)
                    group_s.append(float("inf"))
                    continue
                try:
                    # a new gloo group connects on its first collective (~1 s here): not part of the timing
                    dist.all_gather([torch.empty(1024, device=device) for _ in mine], torch.zeros(1024, device=device),
                                    group=group)
                except Exception as exc:  # noqa: BLE001 - a pair that cannot connect is a failed pair
                    log.warning("node check round %d: ranks %s cannot connect: %s", k, list(mine), exc)
            out = [torch.empty(1024, device=device) for _ in mine]
            t0 = time.perf_counter()
            try:
                for _ in range(config.check_iters):
                    t_mm = time.perf_counter()
                    if before_round is not None:
                        before_round(k)
                    torch.mm(a, b)
                    # the fastest single matmul: a rank the scheduler preempted for a moment is not slow,
                    # one that is slow on every matmul is
                    matmul_s = min(matmul_s, time.perf_counter() - t_mm)
                dist.all_gather(out, torch.full((1024,), float(rank), device=device), group=group)
                group_s.append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - a failed pair is a slow pair, never a crashed check
                log.warning("node check round %d with ranks %s failed: %s", k, list(mine), exc)
                group_s.append(float("inf"))
    finally:
        for group in made.values():
            try:
                dist.destroy_process_group(group)
            except Exception:  # noqa: BLE001
                pass
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, RankResult(rank, node, matmul_s, tuple(group_s)))
    results = [r for r in gathered if isinstance(r, RankResult)]
    return judge(results, world, config.check_slow_factor, config.check_min_s,
                 seconds=time.perf_counter() - t_start, life=life)
