"""enqueue_alert: the alert row, its outbox rows, dedup/suppression per (run, rule), endpoint filters."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from cliffguard.controller.alerts import AlertsConfig, AlertSpec, EndpointConfig, enqueue_alert, is_suppressed
from cliffguard.controller.alerts.enqueue import set_endpoint_disabled
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import AlertRow, OutboxRow
from testing.alerts import GENERIC_SECRET, pg_engine, sqlite_engine

CONFIG = AlertsConfig(
    suppress_s=300,
    endpoints=[
        EndpointConfig(name="hooks", url="http://127.0.0.1:9/h", secret=GENERIC_SECRET),
        EndpointConfig(name="pd", format="pagerduty", secret="RK", min_level="critical"),
    ],
)


def spec(level="warn", rule="loss_spike", run="run-1", action="trigger", **kw) -> AlertSpec:
    return AlertSpec(rule=rule, level=level, title=f"{rule} {level}", run_id=run, action=action, **kw)


# ---- the pure decision --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "action", "last_sent", "last_resolve", "now", "suppressed"),
    [
        ("warn", "trigger", None, None, 1000, False),  # first of its kind
        ("warn", "trigger", 900, None, 1000, True),  # within the window
        ("info", "trigger", 900, None, 1000, True),
        ("warn", "trigger", 700, None, 1000, False),  # window (300 s) elapsed
        ("warn", "trigger", 701, None, 1000, True),
        ("critical", "trigger", 999, None, 1000, False),  # critical always goes
        ("warn", "resolve", 999, None, 1000, False),  # resolves always go
        ("warn", "trigger", 900, 950, 1000, False),  # resolved since: a new problem
        ("warn", "trigger", 900, 850, 1000, True),  # resolve older than the last trigger
    ],
)
def test_suppression_decision(level, action, last_sent, last_resolve, now, suppressed):
    assert is_suppressed(
        spec(level, action=action), now=now, suppress_s=300, last_sent_trigger_ts=last_sent, last_resolve_ts=last_resolve
    ) is suppressed


def test_spec_validates_level_and_action():
    with pytest.raises(ValueError, match="^level: "):
        spec(level="page")
    with pytest.raises(ValueError, match="^action: "):
        spec(action="ack")


# ---- through a real database ----------------------------------------------------------------


def outbox(engine) -> list[OutboxRow]:
    with session_scope(engine) as s:
        return list(s.scalars(select(OutboxRow).order_by(OutboxRow.created_at, OutboxRow.id)))


def alerts(engine) -> list[AlertRow]:
    with session_scope(engine) as s:
        return list(s.scalars(select(AlertRow).order_by(AlertRow.ts)))


def test_writes_alert_and_one_outbox_row_per_accepting_endpoint(tmp_path):
    engine = sqlite_engine(tmp_path)
    with session_scope(engine) as s:
        warn = enqueue_alert(s, spec("warn", evidence={"sigma": float("nan")}), CONFIG, now=1000.0)
        crit = enqueue_alert(s, spec("critical", rule="divergence"), CONFIG, now=1001.0)
        warn_id, crit_id = warn.id, crit.id
    rows = outbox(engine)
    assert [(r.target, r.payload.decode()) for r in rows] == [("hooks", warn_id), ("hooks", crit_id), ("pd", crit_id)]
    assert all(r.kind == "alert" and r.status == "pending" and r.attempts == 0 for r in rows)
    assert all(r.id.startswith("msg_") for r in rows) and len({r.id for r in rows}) == 3
    assert rows[0].next_attempt_at == 1000.0 and rows[0].key == "run-1"
    stored = alerts(engine)
    assert stored[0].evidence == {"sigma": "NaN"}  # non-finite kept, as the schema asks


def test_outbox_ids_sort_in_creation_order(tmp_path):
    engine = sqlite_engine(tmp_path)
    with session_scope(engine) as s:
        ids = [enqueue_alert(s, spec("critical", action=a), CONFIG, now=5.0).id for a in ("trigger", "resolve") * 5]
    by_order = [r.payload.decode() for r in outbox(engine) if r.target == "hooks"]
    assert by_order == ids


def test_repeated_warnings_within_the_window_are_stored_but_not_sent(tmp_path):
    engine = sqlite_engine(tmp_path)
    with session_scope(engine) as s:
        enqueue_alert(s, spec("warn"), CONFIG, now=1000.0)
        enqueue_alert(s, spec("warn"), CONFIG, now=1100.0)  # suppressed
        enqueue_alert(s, spec("warn", run="run-2"), CONFIG, now=1100.0)  # other run: sent
        enqueue_alert(s, spec("warn", rule="mfu_low"), CONFIG, now=1100.0)  # other rule: sent
        enqueue_alert(s, spec("critical"), CONFIG, now=1150.0)  # critical: sent
        enqueue_alert(s, spec("info"), CONFIG, now=1200.0)  # suppressed (critical at 1150 was sent)
        enqueue_alert(s, spec("warn"), CONFIG, now=1450.0)  # 300 s after 1150: sent
    got = sorted((a.ts, a.run_id, a.rule, a.level, a.suppressed) for a in alerts(engine))
    assert got == [
        (1000.0, "run-1", "loss_spike", "warn", False),
        (1100.0, "run-1", "loss_spike", "warn", True),
        (1100.0, "run-1", "mfu_low", "warn", False),
        (1100.0, "run-2", "loss_spike", "warn", False),
        (1150.0, "run-1", "loss_spike", "critical", False),
        (1200.0, "run-1", "loss_spike", "info", True),
        (1450.0, "run-1", "loss_spike", "warn", False),
    ]
    sent = {a.id for a in alerts(engine) if not a.suppressed}
    assert {r.payload.decode() for r in outbox(engine)} == sent


def test_resolve_is_sent_and_reopens_the_window(tmp_path):
    engine = sqlite_engine(tmp_path)
    with session_scope(engine) as s:
        enqueue_alert(s, spec("warn", incident_id="i1"), CONFIG, now=1000.0)
        enqueue_alert(s, spec("warn", incident_id="i1", action="resolve"), CONFIG, now=1010.0)
        enqueue_alert(s, spec("warn", incident_id="i2"), CONFIG, now=1020.0)
    assert [a.suppressed for a in alerts(engine)] == [False, False, False]


def test_resolve_reaches_an_endpoint_whose_min_level_filtered_nothing_out(tmp_path):
    engine = sqlite_engine(tmp_path)
    with session_scope(engine) as s:
        enqueue_alert(s, spec("warn"), CONFIG, now=1.0)  # below pd's min_level
        enqueue_alert(s, spec("info", action="resolve", incident_id="i"), CONFIG, now=2.0)
    assert sorted(r.target for r in outbox(engine)) == ["hooks", "hooks", "pd"]


def test_disabled_endpoints_get_no_rows(tmp_path):
    engine = sqlite_engine(tmp_path)
    cfg = AlertsConfig(endpoints=[*CONFIG.endpoints, EndpointConfig(name="off", format="slack", url="http://x.org/", enabled=False)])
    with session_scope(engine) as s:
        set_endpoint_disabled(s, "hooks", disabled=True, reason="HTTP 410", now=1.0)
    with session_scope(engine) as s:
        enqueue_alert(s, spec("critical"), cfg, now=2.0)
    assert [r.target for r in outbox(engine)] == ["pd"]
    with session_scope(engine) as s:
        set_endpoint_disabled(s, "hooks", disabled=False, reason=None, now=3.0)
        enqueue_alert(s, spec("critical"), cfg, now=4.0)
    assert sorted(r.target for r in outbox(engine)) == ["hooks", "pd", "pd"]


def test_alert_and_outbox_roll_back_with_the_callers_transaction(tmp_path):
    engine = sqlite_engine(tmp_path)
    with pytest.raises(RuntimeError), session_scope(engine) as s:
        enqueue_alert(s, spec("critical"), CONFIG, now=1.0)
        raise RuntimeError("the batch failed")
    assert alerts(engine) == [] and outbox(engine) == []


@pytest.mark.postgres
def test_suppression_and_outbox_on_postgresql(pg_url):
    with pg_engine(pg_url) as engine:
        with session_scope(engine) as s:
            enqueue_alert(s, spec("warn", run=None, evidence={"x": float("inf")}), CONFIG, now=1000.0)
            enqueue_alert(s, spec("warn", run=None), CONFIG, now=1001.0)
            enqueue_alert(s, spec("critical", run=None), CONFIG, now=1002.0)
        assert [a.suppressed for a in alerts(engine)] == [False, True, False]
        assert alerts(engine)[0].evidence == {"x": "Infinity"}
        assert sorted(r.target for r in outbox(engine)) == ["hooks", "hooks", "pd"]
