"""The incidents section names the triage ladder's causes: a step the kit cured (its class, the
remedy, the re-runs' loss per rank), a bad rank evicted (rank and node), a diverged replica (the
suspect and the last agreement). The evidence is what the recovery machine itself records."""

from __future__ import annotations

import pytest

from cliffguard.controller.recovery_types import OpenIncident, TriagedIn, VerdictIn
from cliffguard.controller.rules.sdc import SdcRule
from cliffguard.controller.store.db import session_scope
from cliffguard.controller.store.models import IncidentRow
from cliffguard.dashboard.incident_cause import cause_line, rerun_table
from tests.controller.test_recovery import Driver, healthy_run
from tests.controller.test_recovery_sdc import _check
from tests.controller.test_recovery_triage import _torchrun
from tests.dashboard.conftest import run_app, texts

pytestmark = pytest.mark.timeout(180)

RERUNS = {"same": {"loss": [0.2, 9.5, 0.21], "norm": [1.0, 40.0, 1.1]},
          "swapped": {"loss": [0.19, 9.1, 0.2], "norm": [1.0, 39.0, 1.0]}, "median": 0.2, "sigma": 0.01}


def _opened(d: Driver, acts) -> tuple[str, dict]:
    (o,) = [a for a in acts if isinstance(a, OpenIncident)]
    return o.rule, o.evidence


def _incidents() -> list[tuple[str, dict]]:
    """(rule, evidence) of each kind, as the recovery machine opens them."""
    out = []
    d = Driver()
    healthy_run(d, 30)
    out.append(_opened(d, d.feed(TriagedIn(step=31, now=d.now, cls="data", remedy="skip_batch", rank=1,
                                           reason="rank 1's shard is bad on rank 0 too", reruns=2, rerun_s=0.012,
                                           sample_ids=(3101,), update_applied=False, ts=1.0, evidence=RERUNS))))
    e = Driver()
    _torchrun(e)
    healthy_run(e, 30)
    out.append(_opened(e, e.feed(TriagedIn(step=31, now=e.now, cls="bad_rank", remedy="suspect_rank", rank=1,
                                           reason="rank 1 is bad on rank 0's shard too", reruns=2, rerun_s=0.02,
                                           sample_ids=(), update_applied=False, ts=1.0, node="node-b",
                                           evidence=RERUNS))))
    f = Driver()
    healthy_run(f, 40)
    (v,) = SdcRule().on_event(_check(40, 25))
    out.append(_opened(f, f.feed(VerdictIn(verdict=v, now=f.now))))
    return out


def test_each_cause_reads_as_a_line_and_the_reruns_as_a_table():
    (t_rule, t_ev), (b_rule, b_ev), (s_rule, s_ev) = _incidents()
    assert cause_line(t_rule, t_ev).startswith("class **data** on rank 1: skip_batch by the trainer after 2 re-run(s)")
    assert "1 sample(s) listed, never fed again" in cause_line(t_rule, t_ev)
    assert "rank 1 on node **node-b**" in cause_line(b_rule, b_ev) and "evicted" in cause_line(b_rule, b_ev)
    assert "rank(s) [2] differ from the others; they last agreed at step 25" in cause_line(s_rule, s_ev)
    table = rerun_table(t_ev)
    assert list(table["re-run"]) == ["the same shards again", "the shards rotated by one rank"]
    assert list(table.columns) == ["re-run", "rank 0", "rank 1", "rank 2"] and table["rank 1"].tolist() == [9.5, 9.1]
    assert rerun_table(s_ev) is None and cause_line("loss_spike", {"median": 2.0}) is None


def test_the_incidents_section_shows_the_causes(filled):
    run = filled.run.run_id
    with session_scope(filled.engine) as s:
        for i, (rule, ev) in enumerate(_incidents()):
            s.add(IncidentRow(id=f"cause-{i}", run_id=run, opened_at=2e9 + i, closed_at=2e9 + i + 1, rule=rule,
                              level="critical", spike_step=31, onset_step=31,
                              outcome={"triage": "cured", "bad_rank": "restarted", "sdc": "rolled_back"}[rule],
                              evidence=ev))
    at = run_app()
    text = texts(at)
    assert "class **data** on rank 1: skip_batch" in text and "**cured**" in text
    assert "rank 1 on node **node-b**" in text and "**restarted**" in text
    assert "**silent data corruption**" in text
    shown = [d.value for d in at.dataframe if "re-run" in d.value.columns]
    assert len(shown) == 2 and shown[0]["rank 1"].tolist() == [9.5, 9.1]  # the triage's and the bad rank's
