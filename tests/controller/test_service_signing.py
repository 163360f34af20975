"""Least privilege through the real broker: a controller with Ed25519 command keys and an agent
secret, a real command listener holding only the public key, and a forger on both topics.

Forged commands (HMAC-signed with the deployment's old shared secret, or signed with another
Ed25519 key) are refused by the listener; forged metric events (unsigned, or signed with another
run's key) go to the DLQ, counted, and open no incident and set no validation baseline; the real,
signed spike that follows does open one, and its pause reaches the listener.
"""

from __future__ import annotations

import threading
import time

import pytest
from kafka import KafkaProducer
from sqlalchemy import select

from cliffguard.agent.listener import CommandListener
from cliffguard.controller.config import ControllerConfig
from cliffguard.controller.recovery_types import RecoveryConfig
from cliffguard.controller.service import ControllerService
from cliffguard.controller.store import read
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import DlqCountRow
from cliffguard.core.enums import AckStatus
from cliffguard.core.events import encode_command, encode_event, make_command, make_event
from cliffguard.core.keys import CommandPrivateKey, EventSigner, EventVerifier, event_key
from cliffguard.core.signing import CommandVerifier, Secret, sign_command
from testing.controller_service import FAST_GROUP, FakeTrainer, store_engine

pytestmark = pytest.mark.broker

RUN = "run-keys"
AGENT_SECRET = b"the-agent-secret-0123456789abcdef"
OLD_HMAC = Secret("the-old-shared-hmac-secret-0123")
PRIVATE = CommandPrivateKey.generate()


class SignedTrainer(FakeTrainer):
    """The real trainer's events: signed with its run's key (``CLIFFGUARD_EVENT_KEY``)."""

    def __init__(self, kafka, key_secret: bytes | None) -> None:
        super().__init__(kafka)
        self.key_secret = key_secret

    def send(self, run, type, step, data, rank=0, world=1) -> None:
        raw = encode_event(make_event(type, run, step, data, rank=rank, world=world))
        headers = None if self.key_secret is None else EventSigner(event_key(self.key_secret, run)).headers(raw)
        self.producer.send(self.kafka.metrics_topic, key=run.encode(), value=raw, headers=headers)


def _incidents(engine) -> list[dict]:
    with session_scope(engine) as s:
        return read.incidents(s, RUN)


def _wait(pred, timeout_s=30.0):
    end = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.1)


def test_forged_commands_are_not_obeyed_and_forged_events_open_no_incident(kafka_cfg, tmp_path):
    cfg = ControllerConfig(group_id="ctl-keys", tick_s=0.2, outbox_interval_s=0.2, **FAST_GROUP)
    rejects: list[tuple] = []
    listener = CommandListener(kafka_cfg, RUN, CommandVerifier(RUN, PRIVATE.public_key()),
                               lambda *a: rejects.append(a)).start()
    real = SignedTrainer(kafka_cfg, AGENT_SECRET)
    unsigned = SignedTrainer(kafka_cfg, None)
    wrong_run_key = SignedTrainer(kafka_cfg, b"some-other-agent-secret-000000")
    forger = KafkaProducer(**kafka_cfg.client_kwargs())
    with store_engine("sqlite", tmp_path) as (engine, _):
        svc = ControllerService(cfg, kafka_cfg, engine, PRIVATE, event_verifier=EventVerifier(AGENT_SECRET),
                                recovery=RecoveryConfig(stable_window=5, recover_window=5))
        stop = threading.Event()
        thread = threading.Thread(target=svc.run_forever, args=(stop,), daemon=True)
        svc.start()
        thread.start()
        try:
            real.steps(RUN, 0, 10)
            real.checkpoint(RUN, 10, "full")
            real.validation(RUN, 10, 2.0)
            real.steps(RUN, 11, 40)
            # Forged metrics: a spike and a 1e6 validation baseline, unsigned and with the wrong key.
            for t in (unsigned, wrong_run_key):
                t.steps(RUN, 41, 43, loss=lambda s: 20.0)
                t.validation(RUN, 43, 1e6)
            # Forged commands: HMAC with the old shared secret, and another Ed25519 key.
            forged = [sign_command(make_command("pause", RUN, {}, ttl_s=60), OLD_HMAC),
                      sign_command(make_command("stop", RUN, {}, ttl_s=60), CommandPrivateKey.generate())]
            for cmd in forged:
                forger.send(kafka_cfg.commands_topic, key=RUN.encode(), value=encode_command(cmd))
            forger.flush(10)
            obeyed: list = []  # refusals are reported from poll(), on the caller's thread
            _wait(lambda: bool(obeyed.extend(listener.poll()))
                  or (svc.edge.dead_count_by_reason["unsigned"] >= 4
                      and svc.edge.dead_count_by_reason["bad_signature"] >= 4 and len(rejects) >= 2))
            time.sleep(1.0)  # a pause, had the forgery opened an incident, would be on its way
            obeyed += listener.poll()
            assert obeyed == []
            assert {r[0]: (r[2], r[3].split(":")[0]) for r in rejects} == {
                c.id: (AckStatus.REJECTED, "bad_signature") for c in forged}
            assert _incidents(engine) == []
            # The real, signed spike is judged: an incident, and a pause the listener accepts.
            real.steps(RUN, 41, 43, loss=lambda s: 20.0)
            got: list = []
            _wait(lambda: bool(got.extend(listener.poll()) or got))
            assert [str(c.type) for c in got] == ["pause"] and got[0].sig.startswith("ed25519:")
            assert len(_incidents(engine)) == 1
        finally:
            stop.set()
            thread.join(20)
            listener.close()
            forger.close()
            for t in (real, unsigned, wrong_run_key):
                t.close()
        with session_scope(engine) as s:  # counted in the store, by reason
            counts = {r.reason: r.count for r in s.scalars(select(DlqCountRow))}
    assert counts == {"unsigned": 4, "bad_signature": 4}
