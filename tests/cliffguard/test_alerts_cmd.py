"""``cliffguard alerts``: an endpoint disabled by HTTP 410 is listed as such and can be re-enabled."""

from __future__ import annotations

import json
import time

from sqlalchemy import select

from cliffguard.cli import main
from cliffguard.controller.alerts.enqueue import set_endpoint_disabled
from cliffguard.controller.store.db import init_db, make_engine, session_scope
from cliffguard.controller.store.models import AlertEndpointStateRow, AuditRow, OutboxRow


def _store(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = make_engine(url)
    init_db(engine)
    now = time.time()
    with session_scope(engine) as s:
        s.add(OutboxRow(id="a1:ops", kind="alert", target="ops", payload=b"a1", created_at=now,
                        status="delivered", next_attempt_at=now))
        s.add(OutboxRow(id="a2:ops", kind="alert", target="ops", payload=b"a2", created_at=now,
                        status="disabled", next_attempt_at=now))
        set_endpoint_disabled(s, "ops", disabled=True, reason="HTTP 410 Gone", now=now)
    engine.dispose()
    return url


def test_list_shows_the_disabled_endpoint_with_its_counts(tmp_path, capsys):
    url = _store(tmp_path)
    assert main(["alerts", "--db", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["endpoint"] == "ops" and row["disabled"] is True and row["reason"] == "HTTP 410 Gone"
    assert row["counts"] == {"delivered": 1, "disabled": 1}


def test_enable_re_enables_and_audits(tmp_path, capsys):
    url = _store(tmp_path)
    assert main(["alerts", "enable", "ops", "--db", url, "--actor", "alice"]) == 0
    assert "ops" in capsys.readouterr().out
    engine = make_engine(url)
    with session_scope(engine) as s:
        state = s.get(AlertEndpointStateRow, "ops")
        audit = s.scalars(select(AuditRow)).one()
    engine.dispose()
    assert state.disabled is False and state.disabled_reason is None
    assert audit.actor == "alice" and audit.action == "alerts.enable" and audit.detail["endpoint"] == "ops"


def test_enable_without_a_name_is_an_error(tmp_path, capsys):
    assert main(["alerts", "enable", "--db", _store(tmp_path)]) == 2
    assert "needs an endpoint NAME" in capsys.readouterr().out
