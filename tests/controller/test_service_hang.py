"""A hang through the real broker and controller (broker tier): four ranks' evidence in, the
culprit named in the incident, a signed restart command out, the next life's start and first
step closing the incident ``restarted``; the evidence readable from the store."""

from __future__ import annotations

import pytest

from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from testing.controller_service import FakeTrainer, Running, step_data, store_engine, wait_for
from tests.controller.test_rules_hang import report, started

pytestmark = pytest.mark.broker
RUN = "r"  # the rule tests' run id


def _send(t: FakeTrainer, ev) -> None:
    t.send(ev.run, str(ev.type), ev.step, ev.data, rank=ev.rank, world=ev.world)


def test_a_hang_is_named_restarted_in_place_and_trains_again(kafka_cfg, tmp_path):
    with store_engine("sqlite", tmp_path) as (engine, _):
        t = FakeTrainer(kafka_cfg)
        try:
            with Running(kafka_cfg, engine):
                _send(t, started(0, 0.0))
                t.steps(RUN, 0, 26)
                for r in range(3):
                    _send(t, report(r, 0.0))
                _send(t, report(3, 0.0, seq=59, done=59, frame="trainer/hang_faults.py:124 in hang"))
                t.producer.flush()
                cmd = t.expect(RUN, "restart")
                assert (cmd.args["mode"], cmd.args["life"], cmd.args["ranks"]) == ("in_place", 0, [3])
                t.ack(cmd, detail="in_place: rank 0 leaves")
                t.send(RUN, "run.failed", 27, {"error": "restart in_place of life 0 requested"})
                _send(t, started(1, 0.0))
                t.send(RUN, "step", 25, step_data(2.0, 25))
                t.producer.flush()

                def closed() -> bool:
                    with session_scope(engine) as s:
                        return [i["outcome"] for i in read.incidents(s, RUN)] == ["restarted"]

                wait_for(closed)
            with session_scope(engine) as s:
                (inc,) = read.incidents(s, RUN)
                assert inc["rule"] == "hang" and inc["evidence"]["culprit"] == [3]
                assert inc["evidence"]["frame"] == "trainer/hang_faults.py:124 in hang"
                steps = [r["reason"].split(":")[0] for r in read.transitions(s, RUN, incident_id=inc["id"])]
                assert steps == ["hang", "run_ended", "workers_started", "training_again"]
                h = read.hang_evidence(s, inc["id"])
                assert [r["rank"] for r in h["reports"]] == [0, 1, 2, 3] and h["table"][3]["verdict"] == "culprit"
                assert read.get_run(s, RUN)["recovery_state"] == "running"
        finally:
            t.close()
