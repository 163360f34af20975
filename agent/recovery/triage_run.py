"""Re-run attribution in the loop (issue 22, part 1): the kit's re-runs of a step the guard skipped.

When the guard finds a step critical (skip or hold) and the loop gave the kit a ``rerun_fn``, the
step is executed again from its pre-step state (the weights are still the pre-step ones: the
update was not applied; the global RNGs are put back as they were before the step's forward):

1. the same shard on every rank; if exactly one rank carries the excess and its peers are normal,
2. the shards rotated by one rank (rank ``r`` runs rank ``r - 1``'s shard: the loop makes any
   rank's shard from its sampler, so no batch moves between ranks); if no rank stands out alone,
3. the newest step's shard that passed the guard (``last_ok_step``; in a bad stretch it is not
   the previous step) as the control.

Each re-run's per-rank (loss, local grad norm) travel in one all-reduce; ``core/triage.py``
classifies. The remedies the kit applies (``RecoveryKit.before_optimizer_step``):

- ``data``: the update stays skipped, the batch joins the bad-batch list (never fed again), and
  the guard's stretch is explained (no hold for it);
- ``transient``: the step is retried (the same shard with the gradient all-reduce) and its update
  applied; the rank it was seen on (by its loss, where one stood out) is counted;
- ``bad_rank``: the guard's decision stands (skip, then hold); the verdict names the rank's node,
  and the controller evicts it (controller/recovery_evict.py: a restart without that node);
- ``optimizer``, ``unclear``: the guard's decision stands (skip, then hold for the controller's
  rollback).

Rank 0 reports each verdict as ``step.triaged`` with the re-runs' evidence and their cost; every
rank logs it. The global RNGs are put back after the re-runs as the step left them, so a triaged
run's random stream is an untriaged one's.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from cliffguard.agent.recovery.bad_batches import BadBatch, BadBatchList
from cliffguard.agent.recovery.state import rng_state, set_rng_state
from cliffguard.core.enums import EventType
from cliffguard.core.restart_plan import node_id
from cliffguard.core.triage import (
    Baseline,
    Measure,
    TriageClass,
    TriageConfig,
    Verdict,
    carriers,
    classify,
    is_bad,
    lone_carrier,
)

log = logging.getLogger(__name__)

RerunFn = Callable[[int, int, bool], "tuple[torch.Tensor | float, float | None]"]
"""``rerun_fn(step, shard_rank, sync)``: forward and backward of rank ``shard_rank``'s shard of
``step``'s batch on this rank, the gradients all-reduced only when ``sync`` (DDP's ``no_sync``
otherwise); returns (loss, this rank's local gradient norm or None)."""

SampleIdsFn = Callable[[int, int], "list[int]"]
"""``sample_ids_fn(step, shard_rank)``: the sample ids of that shard (for the bad-batch list)."""

_NO_NORM = -1.0  # a rank that measured no gradient norm, on the wire


class StepTriage:
    """The re-runs, their verdicts and their cost over the run. One per rank (the kit's)."""

    def __init__(self, agent: Any, model: torch.nn.Module, rerun_fn: RerunFn, *,
                 sample_ids_fn: SampleIdsFn | None = None, config: TriageConfig | None = None,
                 exclude: Callable[[list[int]], None] | None = None, max_steps: int = 0) -> None:
        self.agent, self.model, self.rerun_fn = agent, model, rerun_fn
        self.max_steps = max_steps
        """The most steps re-run (``[agent.recovery] triage_max_steps``; 0 = no limit): the cost's bound."""
        self.steps_run = 0
        self.sample_ids_fn = sample_ids_fn
        self.config = config or TriageConfig()
        self.bad = BadBatchList(exclude)
        self.reruns = 0
        self.seconds = 0.0
        self.verdicts: Counter[str] = Counter()
        self.transient_ranks: Counter[int] = Counter()
        self.last: Verdict | None = None
        self._pending: dict[str, Any] = {}
        self.last_ok_step: int | None = None
        """The newest step the guard passed as ok (the control batch; the kit sets it)."""
        self._pre_rng: dict[str, Any] | None = None

    def before_step(self) -> None:
        """At the boundary: the RNGs the next step's forward starts from."""
        self._pre_rng = rng_state()

    def _measure(self, step: int, shard: int, sync: bool = False) -> Measure:
        assert self._pre_rng is not None
        set_rng_state(self._pre_rng)
        self.model.zero_grad(set_to_none=True)
        loss, norm = self.rerun_fn(step, shard, sync)
        self.reruns += 1
        world, rank = self.agent.world, self.agent.rank
        t = torch.zeros(2 * world, dtype=torch.float64, device=self.agent.device)
        t[rank] = float(loss.detach() if isinstance(loss, torch.Tensor) else loss)
        t[world + rank] = _NO_NORM if norm is None else float(norm)
        if self.agent.distributed:
            dist.all_reduce(t)
        vals = t.tolist()
        norms = vals[world:]
        return Measure(tuple(vals[:world]), () if _NO_NORM in norms else tuple(norms))

    def baseline(self) -> Baseline | None:
        stats = self.agent.guard.detector.stats()
        if stats is None or not all(math.isfinite(v) for v in stats) or stats[1] <= 0:
            return None
        return Baseline(*stats)

    def run(self, step: int) -> Verdict | None:
        """Re-run ``step`` and classify it (None: no baseline yet, or no pre-step RNG)."""
        if self.max_steps and self.steps_run >= self.max_steps:
            if self.steps_run == self.max_steps:  # once: every rank reaches it at the same step
                log.warning("cliffguard triage: %d steps re-run, the [agent.recovery] triage_max_steps budget; "
                            "from step %d the guard's decisions stand without re-runs", self.steps_run, step)
                self.steps_run += 1
            return None
        base = self.baseline()
        if base is None or self._pre_rng is None:
            log.warning("cliffguard triage: step %d not re-run (the guard has no noise estimate yet)", step)
            return None
        self.steps_run += 1
        after = rng_state()
        t0, runs0 = time.monotonic(), self.reruns
        world, rank = self.agent.world, self.agent.rank
        try:
            same = self._measure(step, rank)
            held = carriers(same, base, self.config)
            swapped = control = None
            if lone_carrier(same, base, self.config) is not None:  # one rank, its peers normal: rotate
                swapped = self._measure(step, (rank - 1) % world)
            elif len(held) < 2 and is_bad(same, base, self.config) and self.last_ok_step is not None:
                control = self._measure(self.last_ok_step, rank)  # the whole batch is bad: a known-good one
            verdict = classify(same, base, self.config, swapped=swapped, control=control)
            if verdict.cls is TriageClass.TRANSIENT:  # the rank it was seen on: the original's carrier, if any
                verdict = self._seen_on(verdict, base)
            node = self._node_of(verdict)
        finally:
            self.model.zero_grad(set_to_none=True)
            set_rng_state(after)
        spent = time.monotonic() - t0
        self.seconds += spent
        self.verdicts[verdict.cls.value] += 1
        self.last = verdict
        self._report(step, verdict, self.reruns - runs0, spent, node)
        return verdict

    def _node_of(self, verdict: Verdict) -> str:
        """A suspect rank's node (bad, or transient: the controller evicts a rank whose transients
        reach a budget): it says its own, to every rank (one broadcast, only on such a verdict,
        which every rank reached from the same all-reduced re-runs)."""
        if verdict.cls not in (TriageClass.BAD_RANK, TriageClass.TRANSIENT) or verdict.rank is None:
            return ""
        box = [node_id() if self.agent.rank == verdict.rank else ""]
        if self.agent.distributed:
            dist.broadcast_object_list(box, src=verdict.rank)
        return str(box[0])

    def _seen_on(self, verdict: Verdict, base: Baseline) -> Verdict:
        losses = list(getattr(self.agent.probe, "_losses", []))  # every rank's loss at the step (the all-reduce's)
        if len(losses) != self.agent.world:
            return verdict
        seen = carriers(Measure(tuple(losses)), base, self.config)
        if len(seen) != 1:
            return verdict
        ev = dict(verdict.evidence, original={"loss": losses})
        return Verdict(verdict.cls, seen[0], f"{verdict.reason}; rank {seen[0]}'s loss stood out", ev)

    def retry(self, step: int) -> None:
        """The transient cure: the step again, gradients all-reduced, ready for the update."""
        after = rng_state()
        try:
            self._measure(step, self.agent.rank, sync=True)
        finally:
            set_rng_state(after)

    def record_data(self, step: int, verdict: Verdict) -> list[int]:
        """The bad shard (or, ``rank`` None, every shard) into the bad-batch list; its sample ids."""
        if self.sample_ids_fn is None:
            return []
        shards = range(self.agent.world) if verdict.rank is None else [verdict.rank]
        ids = [i for r in shards for i in self.sample_ids_fn(step, r)]
        self.bad.add(BadBatch(step, tuple(ids), verdict.rank, verdict.reason))
        return ids

    def _report(self, step: int, verdict: Verdict, reruns: int, seconds: float, node: str) -> None:
        on = f" on node {node}" if node else ""
        log.warning("cliffguard triage: step %d is %s (%s): %s%s; %d re-run(s) in %.3f s", step, verdict.cls.value,
                    verdict.remedy, verdict.reason, on, reruns, seconds)
        self._pending = {"class": verdict.cls.value, "remedy": verdict.remedy, "rank": verdict.rank,
                         "reason": verdict.reason, "reruns": reruns, "rerun_s": round(seconds, 6),
                         "evidence": verdict.evidence, **({"node": node} if node else {})}

    def emit(self, step: int, *, sample_ids: list[int], applied: bool) -> None:
        """Rank 0's ``step.triaged``, once the remedy is known."""
        if verdict := self.last:
            if verdict.cls is TriageClass.TRANSIENT and verdict.rank is not None:
                self.transient_ranks[verdict.rank] += 1
        if self.agent.rank != 0:
            return
        data = dict(self._pending, sample_ids=sample_ids, update_applied=applied, bad_batches=len(self.bad),
                    transient_counts={str(r): n for r, n in sorted(self.transient_ranks.items())})
        if data["rank"] is None:
            del data["rank"]  # absent on the wire: every shard, or no rank stood out
        self.agent.emit(EventType.STEP_TRIAGED, data, step=step)

    def summary(self) -> dict[str, Any]:
        """``run.finished``'s ``triage``: what the re-runs found and cost."""
        return {"reruns": self.reruns, "rerun_s": round(self.seconds, 3), "verdicts": dict(self.verdicts),
                "bad_batches": len(self.bad), "budget_spent": bool(self.max_steps and self.steps_run > self.max_steps)}

    def state_dict(self) -> dict[str, Any]:
        return {"bad_batches": self.bad.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bad.load_state_dict(state["bad_batches"])
