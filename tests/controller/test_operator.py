"""Operator commands and the ``cliffguard command`` / ``cliffguard status`` CLIs (real SQLite store)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from cliffguard.cli import main
from controller.operator import UnknownRun, issue_operator_command
from controller.store.db import session_scope
from controller.store.models import AuditRow, CommandRow, OutboxRow, Run
from core.events import decode_command
from core.signing import CommandVerifier
from tests.controller.service_support import SECRET, store_engine


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", SECRET.reveal().decode())
    with store_engine("sqlite", tmp_path) as (engine, url):
        with session_scope(engine) as s:
            s.add(Run(id="run-1", recovery_state="halted", last_step=42, lr_scale=0.5))
        yield engine, url


def test_issue_operator_command_writes_signed_command_audit_and_outbox_in_one_transaction(store):
    engine, _ = store
    with pytest.raises(UnknownRun):
        with session_scope(engine) as s:
            issue_operator_command(s, run_id="nope", type="pause", args={}, actor="bob", secret=SECRET,
                                   commands_topic="cg.commands")
    with session_scope(engine) as s:
        row = issue_operator_command(s, run_id="run-1", type="set_lr_scale", args={"lr_scale": 0.25},
                                     actor="bob", secret=SECRET, commands_topic="cg.commands", ttl_s=30)
        cmd_id = row.id
    with session_scope(engine) as s:
        out = s.get(OutboxRow, f"cmd_{cmd_id}")
        cmd = decode_command(out.payload)
        assert out.kind == "command" and out.target == "cg.commands" and out.key == "run-1"
        assert CommandVerifier("run-1", SECRET).verify(cmd).ok
        assert cmd.expires_at - cmd.issued_at == pytest.approx(30)
        assert s.get(CommandRow, cmd_id).source == "operator"
        audit = s.scalars(select(AuditRow)).one()
        assert (audit.actor, audit.action, audit.command_id) == ("bob", "command.set_lr_scale", cmd_id)


def test_command_cli_queues_a_rollback_and_status_shows_it(store, capsys):
    engine, url = store
    rc = main(["command", "run-1", "rollback", "--to-step", "20", "--lr-scale", "0.5", "--skip-data", "100", "200",
               "--db", url, "--topic-prefix", "cg", "--actor", "carol"])
    assert rc == 0
    printed = capsys.readouterr().out
    with session_scope(engine) as s:
        row = s.scalars(select(CommandRow)).one()
        assert row.args == {"to_step": 20, "lr_scale": 0.5, "skip_data": [100, 200]}
        assert row.id in printed
        assert s.get(OutboxRow, f"cmd_{row.id}").target == "cg.commands"
    assert main(["status", "--db", url]) == 0
    table = capsys.readouterr().out
    assert "run-1" in table and "halted" in table
    assert main(["status", "run-1", "--db", url, "--json"]) == 0
    detail = json.loads(capsys.readouterr().out)
    assert detail["run"]["recovery_state"] == "halted"
    assert [c["type"] for c in detail["commands"]] == ["rollback"]


def test_command_cli_errors_are_clear(store, capsys, monkeypatch):
    _, url = store
    assert main(["command", "run-1", "rollback", "--db", url]) == 2
    assert "--to-step is required" in capsys.readouterr().out
    assert main(["command", "ghost", "pause", "--db", url]) == 1
    assert "not in the store" in capsys.readouterr().out
    monkeypatch.delenv("CLIFFGUARD_COMMAND_SECRET")
    assert main(["command", "run-1", "pause", "--db", url]) == 2
    assert "CLIFFGUARD_COMMAND_SECRET" in capsys.readouterr().out
    assert main(["status", "ghost", "--db", url]) == 1
