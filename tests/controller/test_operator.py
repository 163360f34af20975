"""Operator requests: only the controller signs (decide_request), requesters only insert a row;
the ``cliffguard command`` / ``cliffguard status`` CLIs over a real store (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, func, insert, select

from cliffguard.cli import main
from cliffguard.controller.operator import decide_pending_requests, decide_request, issue_operator_command
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AuditRow, CommandRequestRow, CommandRow, OutboxRow, RunRow
from cliffguard.controller.store.read import recent_requests
from cliffguard.controller.store.requests import (
    RequestStatus,
    request_state,
    submit_request,
    wait_for_decision,
)
from cliffguard.core.events import decode_command
from cliffguard.core.signing import CommandVerifier
from testing.controller_service import SECRET, store_engine

TOPIC = "cg.commands"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store(request, tmp_path, monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_COMMAND_SECRET", raising=False)  # requesters never need it
    pg = request.getfixturevalue("pg_url") if request.param == "postgres" else None
    with store_engine(request.param, tmp_path, pg) as (engine, url):
        with session_scope(engine) as s:
            s.add(RunRow(id="run-1", recovery_state="halted", last_step=42, lr_scale=0.5))
            s.add(RunRow(id="done", status="finished"))
            s.add(RunRow(id="watch-only", capabilities=[]))
            s.add(RunRow(id="no-rollback", capabilities=["pause", "resume", "validate"]))
        yield engine, url


def _decide(engine: Engine, request_id: int, now: float | None = None) -> CommandRequestRow | None:
    with session_scope(engine) as s:
        return decide_request(s, request_id, secret=SECRET, commands_topic=TOPIC, ttl_s=30,
                              now=time.time() if now is None else now)


def _counts(engine: Engine) -> tuple[int, int, int]:
    with session_scope(engine) as s:
        return tuple(s.scalar(select(func.count()).select_from(m)) for m in (CommandRow, AuditRow, OutboxRow))


def test_accepted_request_becomes_a_signed_command_with_audit_and_outbox_rows(store):
    engine, _ = store
    rid = submit_request(engine, run_id="run-1", type="set_lr_scale", args={"lr_scale": 0.25}, requested_by="bob",
                         source="cli")
    assert _counts(engine) == (0, 0, 0)  # the request alone: nothing signed, nothing queued
    req = _decide(engine, rid)
    assert req is not None and req.status == "accepted" and req.decided_at is not None
    with session_scope(engine) as s:
        cmd_row = s.get(CommandRow, req.command_id)
        out = s.get(OutboxRow, f"cmd_{req.command_id}")
        cmd = decode_command(out.payload)
        assert out.kind == "command" and out.target == TOPIC and out.key == "run-1"
        assert CommandVerifier("run-1", SECRET).verify(cmd).ok  # what the trainer checks
        assert cmd.args == {"lr_scale": 0.25} and cmd.expires_at - cmd.issued_at == pytest.approx(30)
        assert cmd_row.source == "operator" and cmd_row.status == "pending"
        audit = s.scalars(select(AuditRow)).one()
        assert (audit.actor, audit.action, audit.command_id) == ("bob", "command.set_lr_scale", req.command_id)
        assert audit.detail["request"] == rid
        assert request_state(s, rid).status is RequestStatus.ACCEPTED
    assert _decide(engine, rid) is None  # decided once: a second instance finds nothing to claim


@pytest.mark.parametrize("run_id, ctype, args, age_s, why", [
    ("ghost", "pause", {}, 0, "not in the store"),
    ("done", "pause", {}, 0, "has ended (finished)"),
    ("run-1", "rollback", {"lr_scale": 0.5}, 0, "to_step"),
    ("run-1", "set_lr_scale", {"lr_scale": "high"}, 0, "lr_scale"),
    ("run-1", "pause", {}, 120, "older than a command's lifetime"),
    ("watch-only", "pause", {}, 0, "cannot apply pause (it declared: no command)"),
    ("no-rollback", "rollback", {"to_step": 1, "lr_scale": 0.5}, 0, "cannot apply rollback (it declared: pause, resume"),
])
def test_bad_request_is_rejected_with_its_reason_and_nothing_is_queued(store, run_id, ctype, args, age_s, why):
    engine, _ = store
    now = time.time()
    rid = submit_request(engine, run_id=run_id, type=ctype, args=args, requested_by="eve", source="dashboard",
                         now=now - age_s)
    req = _decide(engine, rid, now)
    assert req is not None and req.status == "rejected" and why in req.detail
    assert req.command_id is None
    assert _counts(engine) == (0, 0, 0)


def test_unknown_type_written_behind_submit_is_rejected(store):
    engine, _ = store
    with engine.begin() as conn:
        rid = conn.execute(insert(CommandRequestRow).values(run_id="run-1", type="reboot", args={}, requested_by="x",
                                                         source="cli", requested_at=time.time(),
                                                         status="pending")).inserted_primary_key[0]
    done = decide_pending_requests(engine, secret=SECRET, commands_topic=TOPIC, ttl_s=30)
    assert (done.accepted, done.rejected) == (0, 1)
    with session_scope(engine) as s:
        assert "reboot" in s.get(CommandRequestRow, rid).detail
    assert _counts(engine) == (0, 0, 0)


def test_submit_checks_the_shape_only():
    for kwargs, field in [({"source": "web"}, "web"), ({"type": "reboot"}, "reboot"), ({"requested_by": " "}, "requested_by")]:
        base = {"run_id": "r", "type": "pause", "args": {}, "requested_by": "a", "source": "cli", **kwargs}
        with pytest.raises(ValueError, match=field):
            submit_request(None, **base)  # type: ignore[arg-type]  # refused before the store is touched


def test_issue_operator_command_refuses_an_unknown_run_before_writing(store):
    engine, _ = store
    with pytest.raises(LookupError):
        with session_scope(engine) as s:
            issue_operator_command(s, run_id="nope", type="pause", args={}, actor="bob", secret=SECRET,
                                   commands_topic=TOPIC)
    assert _counts(engine) == (0, 0, 0)


def test_wait_for_decision_gives_up_after_the_timeout(store):
    engine, _ = store
    rid = submit_request(engine, run_id="run-1", type="pause", args={}, requested_by="a", source="cli")
    ticks = iter(range(100))
    state = wait_for_decision(engine, rid, 3, clock=lambda: next(ticks), sleep=lambda _s: None)
    assert state.status is RequestStatus.PENDING
    _decide(engine, rid)
    assert wait_for_decision(engine, rid, 3).status is RequestStatus.ACCEPTED
    with session_scope(engine) as s:
        assert [r["status"] for r in recent_requests(s, "run-1")] == ["accepted"]


@contextmanager
def controller_deciding(engine: Engine) -> Iterator[None]:
    """The request-deciding part of the controller's loop, on a thread."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            decide_pending_requests(engine, secret=SECRET, commands_topic=TOPIC, ttl_s=30)
            stop.wait(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def test_command_cli_requests_a_rollback_waits_for_the_decision_and_status_shows_it(store, capsys):
    engine, url = store
    with controller_deciding(engine):
        rc = main(["command", "run-1", "rollback", "--to-step", "20", "--lr-scale", "0.5", "--skip-data", "100",
                   "200", "--db", url, "--actor", "carol"])
    assert rc == 0
    printed = capsys.readouterr().out
    with session_scope(engine) as s:
        row = s.scalars(select(CommandRow)).one()
        assert row.args == {"to_step": 20, "lr_scale": 0.5, "skip_data": [100, 200]}
        assert f"accepted: command {row.id}" in printed
        req = s.scalars(select(CommandRequestRow)).one()
        assert (req.requested_by, req.source, req.command_id) == ("carol", "cli", row.id)
        assert s.scalars(select(AuditRow.actor)).one() == "carol"
    assert main(["status", "--db", url]) == 0
    table = capsys.readouterr().out
    assert "run-1" in table and "halted" in table
    assert main(["status", "run-1", "--db", url, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["run"]["recovery_state"] == "halted"
    assert [c["type"] for c in detail["commands"]] == ["rollback"]


def test_command_cli_prints_the_rejection_and_the_missing_decision(store, capsys):
    engine, url = store
    assert main(["command", "run-1", "rollback", "--db", url]) == 2
    assert "--to-step is required" in capsys.readouterr().out
    with controller_deciding(engine):
        assert main(["command", "ghost", "pause", "--db", url]) == 1
    assert "rejected: run 'ghost' is not in the store" in capsys.readouterr().out
    assert main(["command", "run-1", "pause", "--db", url, "--timeout", "0.3"]) == 3
    assert "no decision within 0.3s" in capsys.readouterr().out
    assert main(["command", "run-1", "pause", "--db", url, "--no-wait"]) == 0
    assert "request" in capsys.readouterr().out
    with session_scope(engine) as s:
        assert [r.status for r in s.scalars(select(CommandRequestRow).order_by(CommandRequestRow.id))] == [
            "rejected", "pending", "pending"]
    assert _counts(engine) == (0, 0, 0)
    assert main(["status", "ghost", "--db", url]) == 1
