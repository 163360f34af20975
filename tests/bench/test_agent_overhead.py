"""bench.agent_overhead's summary: paired per-round ratios, their median and spread."""

from __future__ import annotations

import pytest

from bench.agent_overhead import summarize


def test_the_ratio_is_the_median_of_the_paired_rounds_with_its_spread():
    # load doubles the step time halfway; one round of "on" was hit by a burst of load
    rounds = [{"off": 1.0, "on": 1.01, "on_hist1": 1.1}] * 3 + [{"off": 2.0, "on": 2.02, "on_hist1": 2.2}] * 2
    rounds.append({"off": 2.0, "on": 3.0, "on_hist1": 2.2})
    times = {k: [r[k] for r in rounds] for k in ("off", "on", "on_hist1")}
    def part(total, hooks, side):
        return {"all": total, "main": total - side, "side": side, "hooks": hooks}

    cpu = [{"off": part(0.5, 0.01, 0.0), "on": part(0.505, 0.012, 0.003), "on_hist1": part(0.55, 0.04, 0.02)}] * 6
    res = summarize({"times": times, "rounds": rounds, "cpu_rounds": cpu, "world": 2, "n_params": 10,
                     "global_batch": 16, "seq_len": 64}, sink="memory", load_before=(1.0, 1.0, 1.0),
                    load_after=(2.0, 1.0, 1.0))
    assert res["ratio"] == pytest.approx(1.01) and res["ratio_hist_every_step"] == pytest.approx(1.1)
    assert res["ratio_spread"]["min"] == pytest.approx(1.01) and res["ratio_spread"]["max"] == pytest.approx(1.5)
    assert res["ratio_per_round"]["on"][-1] == pytest.approx(1.5)
    assert res["cpu_ratio"] == pytest.approx(1.01) and res["cpu_ratio_hist_every_step"] == pytest.approx(1.1)
    assert res["cpu_attributed_ratio"] == pytest.approx(1 + (0.002 + 0.003) / 0.5)
    assert res["cpu_attributed_ratio_hist_every_step"] == pytest.approx(1 + (0.03 + 0.02) / 0.5)
    assert res["rounds"] == 6 and res["loadavg_before"] == [1.0, 1.0, 1.0] and res["loadavg_after"][0] == 2.0
    assert res["ratio_pooled"] == pytest.approx(2.02 / 2.0)  # the old figure stays in the JSON


def test_the_data_watch_is_its_threads_cpu_per_batch_over_a_plain_step():
    rounds = [{"off": 0.06, "on": 0.062, "on_hist1": 0.07, "on_data": 0.0625}] * 4

    def part(total, hooks, side):
        return {"all": total, "main": total - side, "side": side, "hooks": hooks}

    cpu = [{"off": part(0.05, 0.0, 0.0), "on": part(0.051, 0.001, 0.0), "on_hist1": part(0.06, 0.005, 0.0),
            "on_data": part(0.0515, 0.001, 0.0003)}] * 4
    times = {k: [r[k] for r in rounds] for k in rounds[0]}
    res = summarize({"times": times, "rounds": rounds, "cpu_rounds": cpu, "world": 2, "n_params": 10,
                     "global_batch": 16, "seq_len": 64,
                     "data_watch": {"cpu_s": 0.03, "batches": 100, "dropped": 0, "events": 10}},
                    sink="memory", load_before=(1.0,) * 3, load_after=(1.0,) * 3)
    assert res["data_watch_cpu_ms_per_batch"] == pytest.approx(0.3)
    assert res["data_watch_share"] == pytest.approx(0.0003 / 0.05)
    assert res["data_watch_wall_share"] == pytest.approx(0.0003 / 0.06)
    assert res["ratio_data"] == pytest.approx(0.0625 / 0.062) and res["data_watch_dropped"] == 0
    assert res["cpu_attributed_ratio_data"] == pytest.approx(1 + (0.001 + 0.0003) / 0.05)
