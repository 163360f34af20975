"""bench.fleet_drain on a tiny backlog: the controllers drain exactly what was produced, the rate
and CPU shares are measured between 10 % and 90 % of it, and the run names spread evenly."""

from __future__ import annotations

import json

import pytest
from kafka.partitioner.default import murmur2

from bench import fleet_drain


def test_balanced_names_give_every_partition_its_share():
    names = fleet_drain.balanced_names(48, 16)
    parts = [(murmur2(n.encode()) & 0x7FFFFFFF) % 16 for n in names]
    assert len(set(names)) == 48 and all(parts.count(p) == 3 for p in range(16))


@pytest.mark.broker
def test_tiny_backlog_is_drained_and_measured(tmp_path):
    out = tmp_path / "drain.json"
    assert fleet_drain.main(["--json", str(out), "--ranks", "64", "--runs", "4", "--seconds", "40",
                             "--instances", "1", "--partitions", "4", "--timeout-s", "120"]) == 0
    one = json.loads(out.read_text())["per_instances"]["1"]
    assert one["offered"] > 0 and one["committed"] == one["offered"]
    assert one["events_per_s"] > 0 and one["measured_s"] > 0
    assert 0 < one["cpu_share"]["controller-0"] < 2 and one["machine_busy_cores"] > 0
