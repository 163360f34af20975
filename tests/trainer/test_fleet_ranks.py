"""Run-level events on a real torchrun job (4 CPU processes; ``python -m bench.fleet_ranks`` runs
8): one step event per step whatever the world, the straggler found from the ``ranks`` arrays,
and a frozen rank named by its node heartbeat while the others wait in the all-reduce."""

from __future__ import annotations

import uuid

import pytest

from bench.fleet_ranks import measure
from cliffguard.controller.broker import ensure_topics

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(300)]


def test_four_ranks_publish_o1_step_events_and_are_judged_from_the_arrays(broker, tmp_path):
    kafka = broker.kafka_config(topic_prefix=f"fr{uuid.uuid4().hex[:8]}", partitions=1)
    ensure_topics(kafka)
    res = measure(kafka, nproc=4, steps=200, ranks_every=2, slow_rank=2, freeze_rank=3, freeze_at=24,
                  workdir=tmp_path)
    assert res["step_events_per_step"] == 1 and res["step_senders"] == [0] and res["heartbeat_senders"] == [0]
    assert res["steps"] >= 25 and res["ranks_events"] >= res["steps"] // 2 - 1
    assert res["events_per_run_step"] < 4  # 1 step + 1/2 ranks + heartbeats + start; was 4 + 4 beats per 5 s
    assert res["straggler"]["found"] == [2]
    frozen = res["frozen"]
    assert frozen["named"] and frozen["named_step"] >= frozen["stopped_after_step"] - 1
    # blocked in the step's packed all-reduce, or in DDP's gradient all-reduce when it froze mid-backward
    assert frozen["others_named"] == [] and frozen["others_wait_in"] and set(frozen["others_wait_in"]) <= {
        "all_reduce", "backward"}
    assert frozen["time_to_name_s"] < 60
