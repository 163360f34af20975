"""Re-run attribution (issue 22, part 1): why a step went bad, from re-runs of it (pure, no I/O).

A critical step is re-executed from its pre-step state (same RNG): once with the same batch shard
on every rank (``same``), once with the shards rotated by one rank (``swapped``: rank ``r`` runs
the shard of rank ``r - 1``), and, where no single rank stands out, once on a batch that passed
the guard (``control``). Each re-run is a ``Measure``: every rank's own loss and its local
gradient norm (before any all-reduce). ``classify`` reads them with the declared table:

=================  =====================================================  ==============
class              what the re-runs showed                                remedy
=================  =====================================================  ==============
``transient``      the same batch on the same rank is normal again        retry the step
``data``           the excess follows the shard to another rank, or the   skip the batch
                   whole batch is bad while a known-good batch is normal
``bad_rank``       the excess stays on one rank whatever shard it gets    suspect rank
``optimizer``      no rank stands out and a known-good batch is bad too   roll back, cut LR
``unclear``        the re-runs disagree with each other                   roll back, cut LR
=================  =====================================================  ==============

What "bad" means is the guard's own scale, not a constant: the detector's median and sigma of
the global (rank-mean) loss. A global value is bad past ``median + k * sigma``; one rank's loss
is a carrier past its peers' median by ``k * sigma * sqrt(world)`` (a rank's loss is the mean of
``1/world`` of the samples, so its noise is ``sqrt(world)`` times the mean's); a gradient norm
is a carrier past ``grad_factor`` times its peers' median (local norms of one model on
same-sized shards are comparable). Anything non-finite is bad and a carrier. The shards are
rotated only for a lone carrier, one whose peers' losses are normal (``lone_carrier``): when
the peers are bad too, the weights are (an LR blow-up raises every shard's loss, unevenly), and
the control batch decides.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from enum import StrEnum

from cliffguard.core.declared import bounded, check_declared


class TriageClass(StrEnum):
    DATA = "data"
    TRANSIENT = "transient"
    BAD_RANK = "bad_rank"
    OPTIMIZER = "optimizer"
    UNCLEAR = "unclear"


REMEDY: dict[TriageClass, str] = {
    TriageClass.DATA: "skip_batch",
    TriageClass.TRANSIENT: "retry_step",
    TriageClass.BAD_RANK: "suspect_rank",
    TriageClass.OPTIMIZER: "rollback",
    TriageClass.UNCLEAR: "rollback",
}
"""Each class's cure (the cheapest that fits the cause)."""

CURED_IN_PROCESS = frozenset({TriageClass.DATA.value, TriageClass.TRANSIENT.value})
"""Classes the kit cures itself (a data batch skipped and listed, a transient fault retried): such a
step is not the curve's, so the controller's step rules leave it out; the others keep the guard's
decision and the controller's recovery."""


@dataclass(kw_only=True, slots=True)
class TriageConfig:
    k: float = bounded(6.0, gt=0)
    """Sigmas (the guard's, of the rank-mean loss) past the median that make a loss bad."""
    grad_factor: float = bounded(4.0, gt=1)
    """A rank's local gradient norm is a carrier past this multiple of its peers' median."""

    def __post_init__(self) -> None:
        check_declared(self)


@dataclass(frozen=True, slots=True)
class Measure:
    """One execution of the step: per rank, its own loss and its local gradient norm (None: not
    measured)."""

    loss: tuple[float, ...]
    grad_norm: tuple[float | None, ...] = ()

    def __post_init__(self) -> None:
        if not self.loss:
            raise ValueError("Measure: needs every rank's loss")
        if self.grad_norm and len(self.grad_norm) != len(self.loss):
            raise ValueError(f"Measure: {len(self.grad_norm)} grad norms for {len(self.loss)} ranks")

    @property
    def world(self) -> int:
        return len(self.loss)

    def as_dict(self) -> dict[str, list[float | None]]:
        return {"loss": list(self.loss), "grad_norm": list(self.grad_norm)}


@dataclass(frozen=True, slots=True)
class Baseline:
    """The guard's noise model of the rank-mean loss when the step went bad."""

    median: float
    sigma: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median) and math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"Baseline: median {self.median} and sigma {self.sigma} must be finite, sigma > 0")


@dataclass(frozen=True, slots=True)
class Verdict:
    cls: TriageClass
    rank: int | None
    """The suspect rank (transient, bad_rank) or the rank whose shard was bad (data; None: every shard)."""
    reason: str
    evidence: dict[str, object] = field(default_factory=dict)

    @property
    def remedy(self) -> str:
        return REMEDY[self.cls]


def _bad(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)


def _peer_median(values: tuple[float | None, ...], r: int) -> float | None:
    peers = [v for i, v in enumerate(values) if i != r and v is not None and math.isfinite(v)]
    return statistics.median(peers) if peers else None


def _carries(loss: float, norm: float | None, peer_loss: float | None, peer_norm: float | None,
             loss_margin: float, grad_factor: float) -> bool:
    if _bad(loss) or _bad(norm):
        return True
    if peer_loss is not None and loss - peer_loss > loss_margin:
        return True
    return norm is not None and peer_norm is not None and peer_norm > 0 and norm > grad_factor * peer_norm


def carriers(m: Measure, base: Baseline, cfg: TriageConfig) -> list[int]:
    """The ranks whose own loss or gradient norm stands out from their peers'."""
    if m.world < 2:
        return []
    loss_margin = cfg.k * base.sigma * math.sqrt(m.world)
    norms = m.grad_norm or (None,) * m.world
    return [r for r in range(m.world)
            if _carries(m.loss[r], norms[r], _peer_median(m.loss, r), _peer_median(norms, r) if m.grad_norm else None,
                        loss_margin, cfg.grad_factor)]


def lone_carrier(m: Measure, base: Baseline, cfg: TriageConfig) -> int | None:
    """The one rank that carries the excess while every peer's own loss is normal on the guard's
    scale (below ``median + k * sigma * sqrt(world)``); None otherwise. A carrier whose peers are
    bad too is no bad shard or bad rank: damaged weights (an LR blow-up) raise every shard's loss,
    unevenly, and the worst shard would follow a rotation like bad data."""
    held = carriers(m, base, cfg)
    if len(held) != 1:
        return None
    bound = base.median + cfg.k * base.sigma * math.sqrt(m.world)
    peers = [v for r, v in enumerate(m.loss) if r != held[0]]
    return held[0] if all(math.isfinite(v) and v <= bound for v in peers) else None


def is_bad(m: Measure, base: Baseline, cfg: TriageConfig) -> bool:
    """The execution is bad as a whole (its rank-mean loss past the guard's scale) or on some rank."""
    mean = sum(m.loss) / m.world
    return not math.isfinite(mean) or mean > base.median + cfg.k * base.sigma or bool(carriers(m, base, cfg))


def classify(same: Measure, base: Baseline, cfg: TriageConfig | None = None, *, swapped: Measure | None = None,
             control: Measure | None = None) -> Verdict:
    """The class of a bad step from its re-runs (see the module docstring). ``swapped`` is needed
    when one rank carries the excess, ``control`` when none does; without the one needed the
    verdict is ``unclear`` (today's cure: roll back)."""
    cfg = cfg or TriageConfig()
    ev: dict[str, object] = {"same": same.as_dict(), "median": base.median, "sigma": base.sigma}
    if not is_bad(same, base, cfg):
        return Verdict(TriageClass.TRANSIENT, None, "the same batch on the same ranks is normal again", ev)
    held = carriers(same, base, cfg)
    lone = lone_carrier(same, base, cfg)
    if lone is not None:
        r = lone
        if swapped is None:
            return Verdict(TriageClass.UNCLEAR, r, f"rank {r} carries the excess; no swapped re-run", ev)
        ev["swapped"] = swapped.as_dict()
        moved = carriers(swapped, base, cfg)
        follows, stays = (r + 1) % same.world in moved, r in moved
        if follows and not stays:
            return Verdict(TriageClass.DATA, r, f"rank {r}'s shard is bad on rank {(r + 1) % same.world} too", ev)
        if stays and not follows:
            return Verdict(TriageClass.BAD_RANK, r, f"rank {r} is bad on rank {(r - 1) % same.world}'s shard too", ev)
        return Verdict(TriageClass.UNCLEAR, r, f"rank {r} carries the excess; swapped, the carriers are {moved}", ev)
    if len(held) > 1:
        return Verdict(TriageClass.UNCLEAR, None, f"ranks {held} carry the excess", ev)
    # no rank stands out alone (one may stand out, its peers bad too): the whole batch is bad
    if control is None:
        return Verdict(TriageClass.UNCLEAR, None, "no rank stands out alone; no control re-run", ev)
    ev["control"] = control.as_dict()
    if is_bad(control, base, cfg):
        return Verdict(TriageClass.OPTIMIZER, None, "a batch that passed the guard is bad on these weights too", ev)
    return Verdict(TriageClass.DATA, None, "the whole batch is bad while a batch that passed the guard is normal", ev)
