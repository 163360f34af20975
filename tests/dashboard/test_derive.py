"""Pure reshaping for the charts: stragglers, spans, state segments, heatmap cells, targets."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from cliffguard.dashboard import derive


def _ranks(step_times: dict[int, float]) -> pd.DataFrame:
    rows = []
    for step in range(10):
        for rank, t in step_times.items():
            rows.append({"step": step, "rank": rank, "step_time_s": t, "mfu": 0.4, "tokens_per_s": 1000 / t,
                         "data_wait_s": 0.1 * t, "comm_exposed_s": 0.2 * t})
    return pd.DataFrame(rows)


def test_straggler_is_the_slow_rank_only():
    summary = derive.rank_summary(_ranks({0: 0.10, 1: 0.10, 2: 0.20, 3: 0.11})).set_index("rank")
    assert list(summary.index[summary["straggler"]]) == [2]
    assert summary.loc[0, "data_wait_ratio"] == pytest.approx(0.1)
    assert summary.loc[0, "comm_exposed_ratio"] == pytest.approx(0.2)


def test_no_straggler_when_ranks_agree():
    assert not derive.rank_summary(_ranks({0: 0.1, 1: 0.11})).straggler.any()


def _incidents() -> tuple[pd.DataFrame, pd.DataFrame]:
    inc = pd.DataFrame([{"id": "a" * 32, "opened_at": 100.0, "closed_at": 110.0, "rule": "loss_spike", "level": "critical",
                         "spike_step": 60, "onset_step": 58, "outcome": "rolled_back", "rollback_to": 40, "lr_scale": 0.5,
                         "evidence": {}}])
    tr = pd.DataFrame([
        {"incident_id": "a" * 32, "ts": 100.0, "step": 60, "from_state": "running", "to_state": "pausing", "reason": "", "evidence": {}},
        {"incident_id": "a" * 32, "ts": 102.0, "step": 61, "from_state": "pausing", "to_state": "validating", "reason": "", "evidence": {}},
        {"incident_id": "a" * 32, "ts": 105.0, "step": 41, "from_state": "validating", "to_state": "running", "reason": "", "evidence": {}},
    ])
    return inc, tr


def test_incident_span_runs_from_onset_to_last_transition():
    spans = derive.incident_spans(*_incidents())
    assert spans.iloc[0][["start", "end", "outcome"]].tolist() == [58, 62, "rolled_back"]


def test_state_segments_last_until_the_next_transition():
    seg = derive.state_segments(*_incidents(), now=200.0)
    assert list(seg["state"]) == ["pausing", "validating", "running"]
    assert list(seg["start_s"]) == [0.0, 2.0, 5.0]
    assert list(seg["end_s"])[:2] == [2.0, 5.0]
    assert seg["end_s"].iloc[2] == 10.0  # the closed incident's close time


def test_hist_cells_bins_are_log2_of_lower_edges():
    hists = [{"step": 10, "edges": [2.0**-3, 2.0**-2, 2.0**-1], "layers": {"w": {"counts": [5, 0]}}}]
    cells = derive.hist_cells(hists, "w")
    assert cells[["step", "bin", "count"]].values.tolist() == [[10, -3.0, 5], [10, -2.0, 0]]
    assert math.isclose(cells["log_count"].iloc[0], math.log10(6))
    assert derive.hist_layers(hists) == ["w"]


def test_stable_targets_are_verified_and_stable_newest_first():
    ck = pd.DataFrame({"step": [10, 20, 30, 40], "verified": [True, True, False, True], "stable": [True, True, True, False]})
    assert derive.stable_targets(ck) == [20, 10]


def test_age_is_human():
    assert [derive.age(s) for s in (3, 125, 7300, 200000)] == ["3s", "2m", "2h", "2d"]
