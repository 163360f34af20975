"""The scripted run with its known schedule of faults through the real broker and the real
controller: the controller's own incidents (a pause that resumes, a rollback to the target it
chose) answered as a trainer would, two scale changes and a restart; the stored ledger must add up
to the wall time within 1 % and match the schedule bucket by bucket within ``TOLERANCE_S``."""

from __future__ import annotations

import time
import uuid

import pytest

from cliffguard.controller.broker import free_port
from cliffguard.controller.goodput.config import GoodputConfig
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.core.events import encode_event
from testing.controller_service import FakeTrainer, Running, store_engine, wait_for
from testing.goodput_script import Answer, Script, schedule
from tests.controller.goodput.test_metrics import scrape

pytestmark = [pytest.mark.broker, pytest.mark.timeout(300)]
TOLERANCE_S = 0.01
"""Per bucket: the events carry the schedule's own timestamps, so only float rounding may differ."""


def test_the_scripted_run_is_booked_by_the_real_controller(kafka_cfg, tmp_path):
    trainer = FakeTrainer(kafka_cfg)
    run = f"goodput-{uuid.uuid4().hex[:6]}"

    def publish(ev) -> None:
        trainer.producer.send(kafka_cfg.metrics_topic, key=run.encode(), value=encode_event(ev))

    def answer(s: Script, kind: str) -> Answer:
        trainer.producer.flush()
        cmd = trainer.expect(run, kind, timeout_s=60)
        return Answer(cmd.id, dict(cmd.args))

    try:
        metrics = GoodputConfig(metrics_port=free_port())
        with store_engine("sqlite", tmp_path) as (engine, _url), Running(kafka_cfg, engine, goodput=metrics):
            s = schedule(answer, script=Script(run=run, t=time.time() - 400, on_emit=publish))
            trainer.producer.flush()

            def booked():
                with session_scope(engine) as ses:
                    g = read.goodput(ses, run)
                return g if g is not None and g["ended"] and g["booked_until"] >= s.t - 1e-6 else None

            wait_for(booked, 60)
            g = booked()
            with session_scope(engine) as ses:
                incidents = {i["id"]: i for i in read.incidents(ses, run)}
                costs = read.goodput_costs(ses, run)
            url = f"http://127.0.0.1:{metrics.metrics_port}/metrics"
            ettr = ("cliffguard_goodput_ettr", (("run", run),))
            lost = ("cliffguard_goodput_steps_lost", (("run", run),))

            def published() -> bool:  # at most once a second; steps_lost is final before the last booking is
                now = scrape(url)
                return now.get(lost) == s.steps_lost and now.get(ettr) == pytest.approx(g["ettr"])

            wait_for(published, 30)
            scraped = scrape(url)
    finally:
        trainer.close()
    assert abs(sum(g["seconds"].values()) - s.wall_s) <= 0.01 * s.wall_s
    assert g["wall_s"] == pytest.approx(s.wall_s, abs=TOLERANCE_S)
    for bucket, seconds in g["seconds"].items():
        assert seconds == pytest.approx(s.expected.get(bucket, 0.0), abs=TOLERANCE_S), bucket
    assert g["steps_lost"] == s.steps_lost
    # each of the controller's incidents carries what it cost; the restarts carry their own
    by_outcome = {incidents[c["key"]]["outcome"]: c for c in costs if c["kind"] == "incident"}
    assert set(by_outcome) == {"resumed", "rolled_back"}
    assert by_outcome["resumed"]["buckets"]["pause_validation"]["seconds"] == pytest.approx(0.2 + 3.0 + 0.01 + 1.0)
    rolled = by_outcome["rolled_back"]
    assert rolled["buckets"]["checkpoint_restore"]["seconds"] == pytest.approx(2.0)
    assert rolled["steps_lost"] == 45 - incidents[rolled["key"]]["rollback_to"]  # 40..44 bad, redone from the target
    assert sorted(c["kind"] for c in costs if c["kind"] != "incident") == ["elastic", "elastic", "restart"]
    # the controller's /metrics says the same, as Prometheus reads it
    assert scraped[("cliffguard_goodput_ettr", (("run", run),))] == pytest.approx(g["ettr"])
    assert scraped[("cliffguard_goodput_seconds", (("bucket", "rolled_back"), ("run", run)))] == pytest.approx(
        g["seconds"]["rolled_back"])
    assert scraped[("cliffguard_goodput_steps_lost", (("run", run),))] == s.steps_lost
