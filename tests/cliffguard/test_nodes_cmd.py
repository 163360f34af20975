"""``cliffguard nodes``: the suspect nodes listed with why and since; ``clear`` and ``recheck``
change the store and are audited; a node that is not suspect is said so (exit 1)."""

from __future__ import annotations

import json

from sqlalchemy import select

from cliffguard.cli import main
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.models import AuditRow
from cliffguard.controller.store.suspects import record_suspect, standing

T0 = 1_700_000_000.0


def _store(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    init_db(engine)
    with session_scope(engine) as s:
        record_suspect(s, node="gpu-07", cause="bad_rank", reason="step 31 re-run 2x: rank 5 is bad", run_id="run-a",
                       incident_id="abcdef0123456789" * 2, at=T0)
    engine.dispose()
    return url


def _audit_and_standing(url: str):
    engine = make_engine(url)
    with session_scope(engine) as s:
        audit = [(a.actor, a.action, a.detail) for a in s.scalars(select(AuditRow))]
        st = standing(s)["gpu-07"]
    engine.dispose()
    return audit, st


def test_the_list_says_which_node_why_since_and_the_run(tmp_path, capsys):
    url = _store(tmp_path)
    assert main(["nodes", "--db", url]) == 0
    out = capsys.readouterr().out
    assert "gpu-07" in out and "bad_rank" in out and "SUSPECT: not admitted" in out and "run run-a" in out
    assert "why: step 31 re-run 2x: rank 5 is bad" in out and "2023-11-14 22:13:20Z" in out
    assert main(["nodes", "--db", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["node"], row["cause"], row["since"], row["cleared_at"], row["records"]) == (
        "gpu-07", "bad_rank", T0, None, 1)


def test_clear_needs_a_reason_then_admits_the_node_and_is_audited(tmp_path, capsys):
    url = _store(tmp_path)
    assert main(["nodes", "clear", "gpu-07", "--db", url]) == 2
    assert "needs --reason" in capsys.readouterr().out
    assert main(["nodes", "clear", "gpu-07", "--db", url, "--actor", "alice", "--reason", "GPU 5 replaced"]) == 0
    assert "cleared: admitted to runs again" in capsys.readouterr().out
    audit, st = _audit_and_standing(url)
    assert audit == [("alice", "nodes.clear", {"node": "gpu-07", "reason": "GPU 5 replaced", "records": 1})]
    assert not st.refused
    assert main(["nodes", "--db", url]) == 0
    assert "no suspect nodes" in capsys.readouterr().out
    assert main(["nodes", "--db", url, "--all"]) == 0
    assert "cleared 20" in capsys.readouterr().out
    assert main(["nodes", "clear", "gpu-07", "--db", url, "--reason", "again"]) == 1
    assert "is not suspect" in capsys.readouterr().out


def test_recheck_puts_the_node_on_probation(tmp_path, capsys):
    url = _store(tmp_path)
    assert main(["nodes", "recheck", "gpu-07", "--db", url, "--actor", "bob"]) == 0
    assert "on probation" in capsys.readouterr().out
    audit, st = _audit_and_standing(url)
    assert [a[:2] for a in audit] == [("bob", "nodes.recheck")] and st.recheck and not st.refused
    assert main(["nodes", "--db", url]) == 0
    assert "on probation (recheck asked" in capsys.readouterr().out
    assert main(["nodes", "recheck", "--db", url]) == 2
