"""bench.fleet on a tiny fleet: the stream is what the agents send, the controllers keep up, the
spikes become pauses and the JSON has its top-level figures (the full runs live in bench/)."""

from __future__ import annotations

import json
import math
import time

import pytest

from bench import fleet
from bench.fleet_stream import FleetSpec, FleetStream, healthy_loss
from cliffguard.core.enums import EventType
from cliffguard.core.events import decode_event, encode_event


def test_stream_is_one_step_event_per_run_step_plus_rank_arrays_and_node_beats():
    spec = FleetSpec(ranks=40, runs=2, steps_per_s=1.0, node_size=8, ranks_every=10, ranks_per_event=16,
                     heartbeat_s=5.0, spikes={1: [3]}, hung=(0, 21, 12))
    stream = FleetStream(spec, ["a", "b"])
    counts: dict[tuple[str, EventType], int] = {}
    for k in range(20):
        for run, ev in stream.tick(k, 1000.0 + k):
            ev = decode_event(encode_event(ev))  # what the controller will read
            counts[run, ev.type] = counts.get((run, ev.type), 0) + 1
            if ev.type is EventType.HEARTBEAT and run == "a" and k > 12 and 21 in ev.data["ranks"]:
                i = ev.data["ranks"].index(21)
                assert ev.data["collectives"][i] == "" and ev.data["steps"][i] == 12
                assert set(ev.data["collectives"]) - {""} == {"all_reduce"}
            if ev.type is EventType.STEP and run == "b" and k == 3:
                assert ev.data["loss"] == pytest.approx(2 * healthy_loss(3), rel=0.01)  # the spike
    assert counts["b", EventType.STEP] == 20 and counts["a", EventType.STEP] == 13  # run a hangs after 12
    assert counts["b", EventType.RANKS] == 1 * math.ceil(40 / 16)  # step 10 only (not step 0)
    assert counts["b", EventType.HEARTBEAT] == 20 * spec.nodes // spec.beat_ticks
    assert spec.events_per_run_step() == pytest.approx(1 + 3 / 10 + 5 / 5)


@pytest.mark.broker
def test_tiny_fleet_end_to_end(tmp_path):
    out = tmp_path / "fleet.json"
    t0 = time.monotonic()
    assert fleet.main(["--json", str(out), "--ranks", "64", "--steps-per-s", "8", "--duration-s", "6",
                       "--probes", "2", "--warmup-s", "12", "--settle-s", "6", "--partitions", "4"]) == 0
    doc = json.loads(out.read_text())
    assert time.monotonic() - t0 < 60
    assert doc["ranks"] == 64 and doc["events_per_run_step"] == pytest.approx(1 + 1 / 10 + 8 / 40)
    one = doc["per_instances"]["1"]
    assert one["offered"] > 0 and doc["processed_over_offered"] > 0.5
    assert one["spikes_paused"] >= 1 and doc["verdict_p99_ms"] is not None
    assert one["lag"] and one["cpu_s"]["controller-0"] > 0
    assert 0 < doc["cpu_share"]["controller-0"] < 2  # CPU s / wall s over the offered load
    assert min(s["lag"] for s in one["lag"]) >= 0  # offered - committed: nothing is committed before it is offered
