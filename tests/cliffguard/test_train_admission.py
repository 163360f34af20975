"""Admission before a node joins (issue 22, item 4), on the real embedded broker: the controller
publishes the store's suspect nodes (controller/admission.py), and ``cliffguard train`` reads that
list before it starts torchrun (cliffguard/admission.py): a suspect node is not started (exit 77,
one line naming it), a cleared one is; a broker that is away, or entries not signed by the
controller, never stop a launch."""

from __future__ import annotations

import json
import socket
import time

import pytest
from kafka import KafkaProducer

from cliffguard import admission
from cliffguard.cli import main
from cliffguard.controller.admission import SuspectBoard
from cliffguard.controller.recovery_hang_types import RecordSuspect
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.suspects import ask_recheck, clear_suspect
from cliffguard.core.admission import REFUSED_EXIT, cleared_entry, encode_entry
from cliffguard.core.deployment import SECRET_ENV
from cliffguard.core.kafka_config import KafkaConfig
from cliffguard.core.signing import Secret
from testing.controller_service import SECRET, Running, wait_for


def _store(tmp_path):
    eng = make_engine(f"sqlite:///{tmp_path / 'store.db'}")
    init_db(eng)
    return eng


class Started(Exception):
    """torchrun would have started here: the node was admitted."""


def _train(kafka: KafkaConfig, tmp_path, node: str, monkeypatch, *extra: str) -> int:
    """``cliffguard train`` with the real flags and config: a refusal returns before torchrun starts;
    an admitted launch reaches torchrun's start, which raises ``Started`` here (no trainer runs)."""
    def popen(*_a, **_k):
        raise Started

    monkeypatch.setattr("cliffguard.commands.train.subprocess.Popen", popen)
    return main(["train", "--bootstrap", kafka.bootstrap, "--topic-prefix", kafka.topic_prefix,
                 "--run", "adm-run", "--out-dir", str(tmp_path / "runs"), "--node-id", node, *extra])


def test_a_suspect_recorded_by_the_controller_is_refused_before_joining_and_admitted_once_cleared(
        kafka_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(SECRET_ENV, SECRET.reveal().decode())
    engine = _store(tmp_path)
    # its own consumer group: the session broker's group "ctl" is the in-process controllers' of
    # tests/controller, which a full clean-clone run saw get no partitions after this test
    running = Running(kafka_cfg, engine, group="ctl-admission")
    running.svc.suspect_board.interval_s = 0.2  # the CLI's clear is seen within this (10 s by default)
    with running as svc:
        # the controller's edge records the machine's eviction (controller/suspects.py), as a batch does
        with session_scope(engine) as s:
            svc.processor.suspects.apply(s, "run-a", RecordSuspect(node="node-b", cause="bad_rank",
                                                                   reason="rank 1 diverged", incident_id="inc1",
                                                                   at=time.time()))
        svc.suspect_board.wake()  # what the service does after committing such a batch
        wait_for(lambda: admission.check(kafka_cfg, "node-b", SECRET, 5.0).refused, 15)

        t0 = time.monotonic()
        code = _train(kafka_cfg, tmp_path, "node-b", monkeypatch)
        took = time.monotonic() - t0
        err = capsys.readouterr().err
        assert code == REFUSED_EXIT
        (line,) = [ln for ln in err.splitlines() if "is suspect" in ln]
        for part in ("node node-b", "bad_rank", "rank 1 diverged", "cliffguard nodes clear node-b --reason"):
            assert part in line
        print(f"refused launch took {took:.2f} s")
        with pytest.raises(Started):  # the opt-out starts it anyway (the heartbeat refusal remains)
            _train(kafka_cfg, tmp_path, "node-b", monkeypatch, "--no-admission-check")

        ok = admission.check(kafka_cfg, "node-c", SECRET, 5.0)  # another node is admitted
        assert ok.verdict is not None and ok.verdict.admitted

        with session_scope(engine) as s:  # `cliffguard nodes clear node-b --reason ...` (the store, directly)
            assert clear_suspect(s, "node-b", by="alice", reason="GPU reseated", now=time.time()) == 1
        wait_for(lambda: (c := admission.check(kafka_cfg, "node-b", SECRET, 5.0)).verdict is not None
                 and c.verdict.admitted, 15)
        found = admission.check(kafka_cfg, "node-b", SECRET, 5.0)
        assert found.verdict is not None and found.verdict.entry is not None
        assert found.verdict.entry["state"] == "cleared"
        print(f"an admitted node's check took {found.seconds * 1000:.0f} ms over {found.board.records} records")
        with pytest.raises(Started):
            _train(kafka_cfg, tmp_path, "node-b", monkeypatch)
        assert "node node-b admitted by the suspect-node list" in capsys.readouterr().out


def test_a_fresh_topic_is_filled_at_start_and_probation_is_admitted(kafka_cfg, tmp_path):
    engine = _store(tmp_path)
    from cliffguard.controller.store.suspects import record_suspect

    with session_scope(engine) as s:
        record_suspect(s, node="n1", cause="hang_again", reason="hung twice", run_id="r", incident_id=None, at=1.0)
        record_suspect(s, node="n2", cause="bad_rank", reason="bad", run_id="r", incident_id="i", at=2.0)
        ask_recheck(s, "n2", by="bob", now=3.0)
    board = SuspectBoard(engine, kafka_cfg, SECRET)
    try:
        assert board.publish_due() == 2  # the first pass: every node with a record
        assert board.publish_due() == 0  # nothing changed: nothing sent
        assert admission.check(kafka_cfg, "n1", SECRET, 5.0).refused
        assert not admission.check(kafka_cfg, "n2", SECRET, 5.0).refused  # on probation: may join
    finally:
        board.close()


def test_unsigned_entries_are_ignored_loudly_and_a_refusal_stands(kafka_cfg, tmp_path):
    engine = _store(tmp_path)
    from cliffguard.controller.store.suspects import record_suspect

    with session_scope(engine) as s:
        record_suspect(s, node="n1", cause="bad_rank", reason="bad", run_id="r", incident_id=None, at=1.0)
    board = SuspectBoard(engine, kafka_cfg, SECRET)
    try:
        board.publish_due()
    finally:
        board.close()
    attacker = KafkaProducer(**kafka_cfg.client_kwargs())
    forged = cleared_entry("n1", at=time.time() + 1000)
    attacker.send(kafka_cfg.suspects_topic, key=b"n1", value=json.dumps(forged).encode())
    attacker.send(kafka_cfg.suspects_topic, key=b"n1",
                  value=encode_entry(forged, Secret("not-the-controller-secret")))
    attacker.send(kafka_cfg.suspects_topic, key=b"n1", value=None)
    attacker.flush()
    attacker.close()
    found = admission.check(kafka_cfg, "n1", SECRET, 5.0)
    assert found.refused and found.board is not None and found.board.ignored == 3
    assert any("3 of 4 entries of the suspect-node list ignored" in ln for ln in found.lines)


def test_a_broker_that_is_away_fails_open_quickly_and_says_so(tmp_path, capsys):
    from cliffguard.controller.broker import free_port

    down = KafkaConfig(bootstrap=f"127.0.0.1:{free_port()}", topic_prefix="gone")
    t0 = time.monotonic()
    found = admission.check(down, "node-b", SECRET, 5.0)
    took = time.monotonic() - t0
    assert found.verdict is None and not found.refused
    assert "failed open" in found.lines[0] and "UNCHECKED" in found.lines[0]
    assert took < 1.5
    print(f"fail-open check with the broker down took {took * 1000:.0f} ms")
    no_key = admission.check(down, "node-b", None, 5.0)
    assert no_key.verdict is None and "no command key" in no_key.lines[0]


def test_a_broker_that_accepts_but_never_answers_fails_open_at_the_timeout():
    with socket.socket() as silent:  # listens (the TCP probe passes) but never speaks Kafka
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        down = KafkaConfig(bootstrap=f"127.0.0.1:{silent.getsockname()[1]}", topic_prefix="mute")
        t0 = time.monotonic()
        found = admission.check(down, "node-b", SECRET, 1.0)
        took = time.monotonic() - t0
    assert found.verdict is None and "failed open" in found.lines[0]
    assert took < 3.0, took
    print(f"fail-open check against a silent broker took {took:.2f} s (timeout 1 s)")


def test_a_node_with_suspect_device_slots_starts_without_them_and_with_none_left_is_refused(
        kafka_cfg, tmp_path, monkeypatch, capsys):
    """A device-level eviction's record reaches the node's next launch: ``cliffguard train --nproc 2``
    starts torchrun with one process on the slot left, narrowed in its workers' environment."""
    from cliffguard.controller.store.suspects import record_suspect

    monkeypatch.setenv(SECRET_ENV, SECRET.reveal().decode())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    engine = _store(tmp_path)
    with session_scope(engine) as s:
        record_suspect(s, node="node-dev1", cause="sdc_again_device", reason="replicas differ on device 1",
                       run_id="r", incident_id="i", at=1.0, device=1)
        for slot in (0, 1):
            record_suspect(s, node="node-dev2", cause="bad_rank", reason="bad", run_id="r", incident_id=None,
                           at=2.0, device=slot)
    board = SuspectBoard(engine, kafka_cfg, SECRET)
    try:
        assert board.publish_due() == 2
    finally:
        board.close()
    started: list = []

    def popen(cmd, env=None, **_k):
        started.append((cmd, env))
        raise Started

    monkeypatch.setattr("cliffguard.commands.train.subprocess.Popen", popen)
    common = ["train", "--bootstrap", kafka_cfg.bootstrap, "--topic-prefix", kafka_cfg.topic_prefix, "--nproc", "2",
              "--run", "adm-dev", "--out-dir", str(tmp_path / "runs")]
    with pytest.raises(Started):
        main([*common, "--node-id", "node-dev1"])
    (cmd, env), = started
    assert "--nproc_per_node=1" in cmd
    assert (env["CLIFFGUARD_DEVICE_SLOTS"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "0")
    err = capsys.readouterr().err
    assert "node node-dev1 admitted without device slot(s) 1 (sdc_again_device" in err and "slot(s) 0" in err

    assert main([*common, "--node-id", "node-dev2"]) == REFUSED_EXIT
    assert len(started) == 1  # torchrun never started
    assert "every device slot of node node-dev2 is recorded suspect" in capsys.readouterr().err

    # the same check for an own launcher (cliffguard admit): export lines for eval, or the refusal
    where = ["--bootstrap", kafka_cfg.bootstrap, "--topic-prefix", kafka_cfg.topic_prefix, "--nproc", "2"]
    assert main(["admit", *where, "--node-id", "node-dev1", "--shell"]) == 0
    got = capsys.readouterr()
    assert got.out.splitlines() == ["export CLIFFGUARD_NPROC=1", "export CLIFFGUARD_DEVICE_SLOTS=0",
                                    "export CUDA_VISIBLE_DEVICES=0"]
    assert "cliffguard admit: WARNING: node node-dev1 admitted without device slot(s) 1" in got.err
    assert main(["admit", *where, "--node-id", "node-dev2", "--shell"]) == REFUSED_EXIT
    assert capsys.readouterr().out == ""  # nothing to eval: the script stops on the exit code
    assert main(["admit", *where, "--node-id", "node-clean"]) == 0
    assert "node node-clean admitted: 2 process(es) on device slot(s) 0, 1" in capsys.readouterr().out


def test_admit_with_the_broker_away_fails_open_on_every_slot_and_says_so(monkeypatch, capsys):
    from cliffguard.controller.broker import free_port

    monkeypatch.setenv(SECRET_ENV, SECRET.reveal().decode())
    assert main(["admit", "--bootstrap", f"127.0.0.1:{free_port()}", "--nproc", "2", "--node-id", "n9"]) == 0
    got = capsys.readouterr()
    assert "cliffguard admit: WARNING: admission check failed open" in got.err
    assert "node n9 UNCHECKED (fail-open): 2 process(es) on device slot(s) 0, 1" in got.out
    assert main(["admit", "--nproc", "0"]) == 2
