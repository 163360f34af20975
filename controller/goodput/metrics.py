"""The controller's Prometheus ``/metrics`` endpoint (``prometheus-client``): each owned run's
goodput as gauges, for teams that already watch their runs in Grafana.

- ``cliffguard_goodput_ettr{run}``: productive seconds / wall seconds since the run's first start;
- ``cliffguard_goodput_ettr_gpu{run}``: the same in GPU-seconds (each second weighted by the world size);
- ``cliffguard_goodput_window_ettr{run}``: over the alert window (``[goodput] ettr_window_s``);
- ``cliffguard_goodput_seconds{run,bucket}`` and ``cliffguard_goodput_gpu_seconds{run,bucket}``;
- ``cliffguard_goodput_wall_seconds{run}`` and ``cliffguard_goodput_steps_lost{run}``.

Gauges, not counters: a rollback moves seconds from ``productive`` to ``rolled_back``, so a bucket
can shrink. Each instance reports the runs it owns (a run is owned by one instance at a time),
as of its last committed batch: the loop thread hands over a snapshot (``publish``) and the HTTP
thread only reads the newest one, never the ledgers or the store.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from cliffguard.controller.goodput.buckets import BUCKETS, INDEX, Bucket

log = logging.getLogger(__name__)

_PROD = INDEX[Bucket.PRODUCTIVE]
PREFIX = "cliffguard_goodput"
PUBLISH_EVERY_S = 1.0
"""How fresh a scrape is at worst (Prometheus scrapes every 15-60 s)."""


def snapshot_of(slots: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The figures ``/metrics`` shows for each slot whose ledger has booked anything."""
    out: dict[str, dict[str, Any]] = {}
    for slot in slots:
        led = slot.ledger
        if led is None or led.started_at is None or led.cursor is None:
            continue
        wall, gpu = led.cursor - led.started_at, sum(led.gpu)
        out[slot.run_id] = {"wall": wall, "seconds": list(led.seconds), "gpu": list(led.gpu),
                            "ettr": led.seconds[_PROD] / wall if wall > 0 else None,
                            "ettr_gpu": led.gpu[_PROD] / gpu if gpu > 0 else None,
                            "window_ettr": led.window.ettr, "steps_lost": led.counts["steps_lost"]}
    return out


class GoodputCollector:
    """A prometheus-client collector over the newest snapshot."""

    def __init__(self) -> None:
        self.snapshot: dict[str, dict[str, Any]] = {}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        snap = self.snapshot  # one read: publish swaps the whole dict
        ettr = GaugeMetricFamily(f"{PREFIX}_ettr", "Productive seconds over wall seconds since the run's first start",
                                 labels=["run"])
        ettr_gpu = GaugeMetricFamily(f"{PREFIX}_ettr_gpu", "Productive GPU-seconds over all GPU-seconds",
                                     labels=["run"])
        window = GaugeMetricFamily(f"{PREFIX}_window_ettr", "ETTR over the alert window ([goodput] ettr_window_s)",
                                   labels=["run"])
        wall = GaugeMetricFamily(f"{PREFIX}_wall_seconds", "Seconds from the run's first start to its newest booked "
                                 "moment", labels=["run"])
        lost = GaugeMetricFamily(f"{PREFIX}_steps_lost", "Steps redone after rollbacks, restarts and scale changes",
                                 labels=["run"])
        secs = GaugeMetricFamily(f"{PREFIX}_seconds", "Wall seconds booked to each goodput bucket",
                                 labels=["run", "bucket"])
        gpus = GaugeMetricFamily(f"{PREFIX}_gpu_seconds", "GPU-seconds booked to each goodput bucket",
                                 labels=["run", "bucket"])
        for run, s in sorted(snap.items()):
            for family, key in ((ettr, "ettr"), (ettr_gpu, "ettr_gpu"), (window, "window_ettr")):
                if s[key] is not None:
                    family.add_metric([run], s[key])
            wall.add_metric([run], s["wall"])
            lost.add_metric([run], s["steps_lost"])
            for i, b in enumerate(BUCKETS):
                secs.add_metric([run, b.value], s["seconds"][i])
                gpus.add_metric([run, b.value], s["gpu"][i])
        yield from (ettr, ettr_gpu, window, wall, lost, secs, gpus)


class MetricsServer:
    """``/metrics`` on ``host:port`` (port 0 picks a free one) on prometheus-client's own thread."""

    def __init__(self, host: str, port: int) -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise RuntimeError("[goodput] metrics_port is set but prometheus-client is not installed: "
                               "pip install 'cliffguard[controller]'") from exc
        self.collector = GoodputCollector()
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        self.host, self.port = host, int(self._server.server_address[1])
        self._published = -PUBLISH_EVERY_S
        log.info("goodput metrics on http://%s:%d/metrics", host, self.port)

    def publish(self, slots: Iterable[Any]) -> None:
        """Called on the loop thread after a commit: the snapshot the next scrape reads, taken at
        most every ``PUBLISH_EVERY_S`` (a fleet's thousands of ledgers are not copied per batch)."""
        now = time.monotonic()
        if now - self._published < PUBLISH_EVERY_S:
            return
        self._published = now
        self.collector.snapshot = snapshot_of(slots)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
