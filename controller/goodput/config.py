"""``[goodput]``: the ledger's resolution, the ETTR alert and the ``/metrics`` endpoint."""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.core.declared import bounded, check_declared, non_empty


@dataclass(kw_only=True, slots=True)
class GoodputConfig:
    mark_every: int = bounded(50, ge=1)
    """Steps between the ledger's marks of kept time when no checkpoint came (a checkpoint is a
    mark too): a redo to a step between two marks is interpolated between them."""
    max_marks: int = bounded(64, ge=2)
    """Marks kept (the newest): a redo older than the oldest is interpolated from the run's first step."""
    timeline_points: int = bounded(64, ge=8, le=1000)
    """Points of the stacked time chart kept per run (thinned by half when full)."""
    hang_after_s: float = bounded(60.0, gt=0)
    """A gap with no step this long, while heartbeats said the trainer was running, is a hang
    (from the last step to the last heartbeat); shorter gaps stay unknown."""
    ettr_floor: float = bounded(0.8, ge=0, le=1, why="0: no alert")
    """Alert (warn) when the ETTR over the last ``ettr_window_s`` falls below this."""
    ettr_window_s: float = bounded(1800.0, gt=0)
    """The alert's window; it is judged once the run has booked a whole window."""
    ettr_rearm: float = bounded(0.05, ge=0, le=1)
    """After an alert, the window's ETTR must climb this far above the floor before another (hysteresis)."""
    mtbf_prior_s: float = bounded(6 * 3600.0, gt=0)
    """Mean time between failures assumed by the checkpoint-interval counterfactual until the run
    has had a restart of its own to measure it by."""
    max_costs: int = bounded(8, ge=1)
    """Cost records (per incident, restart, scale change) kept in the ledger's state; every one is
    in the store's ``goodput_costs`` as well."""
    row_every_s: float = bounded(5.0, ge=0)
    """Seconds of a run's booked time between writes of its ``goodput`` row when nothing else
    changed (a new chart point, a cost, a start or an end writes it at once). The ledger's own
    state is saved with the run's state every batch, so this only bounds how stale readers are."""
    metrics_port: int = bounded(0, ge=0, le=65535, reason="must be 0 (off) or a TCP port")
    """Port of the controller's Prometheus ``/metrics`` endpoint; 0 = none."""
    metrics_host: str = non_empty("127.0.0.1")
    """Address the ``/metrics`` endpoint listens on."""

    def __post_init__(self) -> None:
        check_declared(self)
