"""``cliffguard demo --elastic``: its config checks, and a smoke run (two torchrun agents of 2 CPU
processes, one killed and brought back; slow: a few minutes on 2 cores) from a fresh directory as a
new user runs it, its verdict and argv."""

from __future__ import annotations

import pytest

from cliffguard.demo_elastic import ElasticDemoConfig, summarize, train_argv
from tests.cliffguard.test_demo import run_from_fresh_dir

ELASTIC_TIMEOUT_S = 900


@pytest.mark.parametrize("kw, field", [({"kill_at": 40, "rejoin_at": 30}, "kill_at"), ({"global_batch": 12}, "global_batch"),
                                       ({"ckpt_every": 50}, "ckpt_every"), ({"faults": ("corrupt@120",)}, "faults"),
                                       ({"faults": ("bogus@1",)}, "faults"), ({"monitor": False}, "faults"),
                                       ({"batch_policy": "double"}, "batch_policy")])
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ElasticDemoConfig(**kw)


@pytest.mark.slow
@pytest.mark.timeout(ELASTIC_TIMEOUT_S + 90)
def test_elastic_demo_scales_down_and_back_up_from_a_fresh_directory(tmp_path):
    """``cliffguard demo --elastic --clean --steps 80`` in an empty directory (the default, relative
    ``--dir``): as small as it can be and still scale down and back up (the kill at 12, the rejoin at
    18), monitored (the scale events must reach the store through the broker and the controller)
    but without spike faults (those need ~80 steps of their own)."""
    summary, out, code = run_from_fresh_dir(tmp_path, ["demo", "--elastic", "--clean", "--steps", "80"],
                                            ELASTIC_TIMEOUT_S)
    assert summary["ok"] and code == 0, (summary, out[-4000:])
    assert (tmp_path / "fresh" / "cliffguard-demo-elastic" / "monitor" / "keys").is_dir()
    down, up = summary["scale_events"]
    assert (down["from_world"], down["to_world"], down["global_batch"]) == (4, 2, 8)
    assert (up["from_world"], up["to_world"], up["global_batch"]) == (2, 4, 16)
    assert down["step"] <= 12 and down["seconds_lost"] > 0 and up["step"] >= 18
    assert summary["final_step"] == 80 and summary["final_loss"] < 5.5 and summary["unmatched_incidents"] == []
    # the kill's own incident, when the hang rule named it before torchrun re-formed the group
    assert all((i["rule"], i["outcome"]) == ("hang", "restarted") and 12 <= i["spike_step"] < 27
               for i in summary["incidents"]), summary["incidents"]


def _event(step, frm, to, batch):
    return {"step": step, "from_world": frm, "to_world": to, "global_batch": batch, "lr": 1e-3, "lr_factor": 1.0,
            "steps_lost": 1, "seconds_lost": 9.0}


def _incident(outcome, spike, rollback_to=None, lr_scale=1.0):
    return {"id": f"i{spike}", "rule": "loss_spike", "outcome": outcome, "spike_step": spike,
            "rollback_to": rollback_to, "lr_scale": lr_scale}


GOOD_EVENTS = [_event(100, 4, 2, 8), _event(120, 2, 4, 16)]
GOOD_FACTS = {"incidents": [_incident("resumed", 46), _incident("rolled_back", 76, 70, 0.5)], "steps_lost": 11,
              "stored_scale_events": GOOD_EVENTS}


def test_summary_ok_only_when_scale_events_faults_and_store_agree():
    cfg, mark = ElasticDemoConfig(), {"step": 170, "loss": 2.4}
    good = summarize(cfg, GOOD_EVENTS, mark, 0, GOOD_FACTS)
    assert good["ok"] and good["problems"] == [] and [f["ok"] for f in good["faults"]] == [True, True]
    assert good["incidents"][1]["rollback_to"] == 70 and good["final_loss"] == 2.4
    wrong_batch = summarize(cfg, [_event(100, 4, 2, 16), GOOD_EVENTS[1]], mark, 0, GOOD_FACTS)
    assert not wrong_batch["ok"] and "scale events" in wrong_batch["problems"][0]
    no_rollback = summarize(cfg, GOOD_EVENTS, mark, 0, {**GOOD_FACTS, "incidents": GOOD_FACTS["incidents"][:1]})
    assert not no_rollback["ok"] and "lr_blowup@75..77: no incident" in no_rollback["problems"][0]
    unstored = summarize(cfg, GOOD_EVENTS, mark, 0, {**GOOD_FACTS, "stored_scale_events": GOOD_EVENTS[:1]})
    assert not unstored["ok"] and "the store holds" in unstored["problems"][0]
    short = summarize(cfg, GOOD_EVENTS, {"step": 150}, 0, GOOD_FACTS)
    assert not short["ok"] and "run ended at step 150" in short["problems"][0]
    keep = ElasticDemoConfig(batch_policy="keep", monitor=False, faults=())
    assert summarize(keep, [_event(100, 4, 2, 16), GOOD_EVENTS[1]], mark, 0, None)["ok"]


def test_the_killed_groups_hang_incident_is_the_kills_and_must_end_restarted():
    cfg, mark = ElasticDemoConfig(), {"step": 170, "loss": 2.4}  # kill_at 100
    hang = {**_incident("restarted", 101), "id": "h", "rule": "hang"}
    named = summarize(cfg, GOOD_EVENTS, mark, 0, {**GOOD_FACTS, "incidents": [*GOOD_FACTS["incidents"], hang]})
    assert named["ok"] and named["unmatched_incidents"] == [] and named["faults"][-1]["fault"] == "kill@100"
    halted = summarize(cfg, GOOD_EVENTS, mark, 0,
                       {**GOOD_FACTS, "incidents": [*GOOD_FACTS["incidents"], {**hang, "outcome": "halted"}]})
    assert not halted["ok"] and "kill@100: outcome halted, expected restarted" in halted["problems"][0]
    late = summarize(cfg, GOOD_EVENTS, mark, 0,
                     {**GOOD_FACTS, "incidents": [*GOOD_FACTS["incidents"], {**hang, "spike_step": 150}]})
    assert late["unmatched_incidents"] == ["h"]  # a hang long after the kill is not the kill's


def test_train_argv_streams_and_injects_faults_only_when_monitored():
    cfg = ElasticDemoConfig()
    monitored = train_argv(cfg, "h:1", bootstrap="b:2")
    assert "--no-monitor" not in monitored and monitored[monitored.index("--bootstrap") + 1] == "b:2"
    assert [monitored[i + 1] for i, a in enumerate(monitored) if a == "--fault"][:4] == list(cfg.faults)
    plain = train_argv(ElasticDemoConfig(monitor=False, faults=()), "h:1")
    assert "--no-monitor" in plain and not any(a.startswith("corrupt") for a in plain)


def test_samples_ratio_counts_the_half_batch_stretch():
    from bench.elastic_loss import samples_ratio

    assert samples_ratio(150, 16, [_event(20, 4, 2, 8), _event(85, 2, 4, 16)]) == pytest.approx(1 - 65 * 8 / (150 * 16))
    assert samples_ratio(150, 16, [_event(20, 4, 2, 16), _event(85, 2, 4, 16)]) == 1.0
