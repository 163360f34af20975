"""``/metrics``: each owned run's goodput as Prometheus gauges, served by prometheus-client and
read back with its own parser (what a Prometheus server would see)."""

from __future__ import annotations

import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cliffguard.controller.goodput.ledger import Ledger
from cliffguard.controller.goodput.metrics import MetricsServer
from cliffguard.controller.goodput.summary import summarize
from testing.goodput_script import schedule


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition page."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_the_endpoint_serves_each_run_s_ettr_and_buckets():
    ledger = Ledger()
    for ev in schedule().events():
        ledger.on_event(ev)
    quiet = Ledger()  # a slot whose ledger booked nothing yet is left out
    server = MetricsServer("127.0.0.1", 0)
    try:
        server.publish([SimpleNamespace(run_id="run-a", ledger=ledger), SimpleNamespace(run_id="run-b", ledger=quiet),
                        SimpleNamespace(run_id="run-c", ledger=None)])
        got = scrape(f"http://127.0.0.1:{server.port}/metrics")
    finally:
        server.close()
    want = summarize(ledger)
    assert got[("cliffguard_goodput_ettr", (("run", "run-a"),))] == pytest.approx(want["ettr"])
    assert got[("cliffguard_goodput_ettr_gpu", (("run", "run-a"),))] == pytest.approx(want["ettr_gpu"])
    assert got[("cliffguard_goodput_wall_seconds", (("run", "run-a"),))] == pytest.approx(want["wall_s"])
    for bucket, seconds in want["seconds"].items():
        assert got[("cliffguard_goodput_seconds", (("bucket", bucket), ("run", "run-a")))] == pytest.approx(seconds)
    assert not any(dict(labels).get("run") in ("run-b", "run-c") for _, labels in got)
