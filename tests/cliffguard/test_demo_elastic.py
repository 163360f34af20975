"""``cliffguard demo --elastic``: its config checks, and a smoke run (two torchrun agents of 2 CPU
processes, one killed and brought back; slow: a few minutes on 2 cores)."""

from __future__ import annotations

import pytest

from cliffguard.demo_elastic import ElasticDemoConfig, run_elastic_demo


@pytest.mark.parametrize("kw, field", [({"kill_at": 40, "rejoin_at": 30}, "kill_at"), ({"global_batch": 12}, "global_batch"),
                                       ({"ckpt_every": 50}, "ckpt_every")])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ElasticDemoConfig(**kw)


@pytest.mark.slow
def test_elastic_demo_scales_down_and_back_up(tmp_path):
    summary = run_elastic_demo(ElasticDemoConfig(out_dir=str(tmp_path), steps=120, kill_at=15, rejoin_at=22))
    assert summary["ok"], summary
    down, up = summary["scale_events"]
    assert (down["from_world"], down["to_world"], down["global_batch"]) == (4, 2, 8)
    assert (up["from_world"], up["to_world"], up["global_batch"]) == (2, 4, 16)
    assert down["step"] <= 15 and down["seconds_lost"] > 0 and up["step"] >= 22
    assert summary["final_step"] == 120 and summary["final_loss"] < 5.5 and summary["incidents"] == []
