"""``cliffguard demo --preemption`` (cliffguard/demo_preemption.py): its config, its verdict
(cliffguard/demo_preemption_summary.py, pure), and the whole demo on a real one-machine Slurm
cluster, run the way a user runs it (a fresh directory, the installed command)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from cliffguard.demo_preemption import PreemptionDemoConfig, config_text, train_args
from cliffguard.demo_preemption_summary import summarize
from testing.services import missing


@pytest.mark.parametrize(("kw", "field"), [({"global_batch": 5}, "global_batch"), ({"explore_at": 0}, "explore_at"),
                                           ({"deadline_s": 30.0, "grace_s": 30}, "deadline_s")])
def test_config_validation_names_the_field(kw, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        PreemptionDemoConfig(out_dir=str(tmp_path), **kw)


def test_each_group_only_joins_the_rendezvous_this_process_hosts(tmp_path):
    cfg = PreemptionDemoConfig(out_dir=str(tmp_path))
    args = train_args(cfg, run="p", rdzv="127.0.0.1:1", node="group-a", bootstrap="b:1", nproc=1)
    assert "--rdzv-client" in args and args[args.index("--node-id") + 1] == "group-a"
    ref = train_args(cfg, run="p-reference", rdzv="127.0.0.1:2", node=None, bootstrap=None, nproc=2)
    assert "--rdzv-client" not in ref and "--no-monitor" in ref and ref[ref.index("--nnodes") + 1] == "1:1"
    # the production groups read the paced config, the reference its own unpaced one
    assert args[args.index("--config") + 1] != ref[ref.index("--config") + 1] and "--fault" not in args


def test_the_pace_is_in_the_config_a_requeued_launch_reads_and_the_unpaced_one_parses(tmp_path):
    import tomllib

    from cliffguard.trainer.config import TrainConfig

    cfg = PreemptionDemoConfig(out_dir=str(tmp_path), pace_s=0.3, deadline_s=12.0)
    paced, unpaced = (tomllib.loads(config_text(cfg, paced=p)) for p in (True, False))
    assert paced["train"]["faults"] == ["slow_rank@0:0.3"] and "train" not in unpaced
    assert paced["agent"]["preemption"]["deadline_s"] == unpaced["agent"]["preemption"]["deadline_s"] == 12.0
    TrainConfig(faults=paced["train"]["faults"])  # a spec the trainer accepts


def _facts(**over):
    base = {
        "preemptions": [
            {"id": "p1", "scope": "nodes", "nodes": ["group-a"], "outcome": "shrunk", "signal": "SIGTERM",
             "saved_step": 144, "save_s": 0.05, "deadline_s": 20.0, "verified": True, "steps_lost": 0,
             "seconds_to_train": 23.3},
            {"id": "p2", "scope": "job", "nodes": ["group-a", "group-b"], "outcome": "requeued", "signal": "SIGTERM",
             "saved_step": 293, "save_s": 0.1, "deadline_s": 20.0, "verified": True, "steps_lost": 0,
             "seconds_to_train": 20.6}],
        "incidents": [{"id": "p1", "rule": "preemption", "outcome": "shrunk", "spike_step": 144},
                      {"id": "p2", "rule": "preemption", "outcome": "requeued", "spike_step": 293}],
        "scale_events": [{"step": 144, "from_world": 2, "to_world": 1, "global_batch": 8, "lr_factor": 0.7,
                          "steps_lost": 0, "seconds_lost": 24.0},
                         {"step": 160, "from_world": 1, "to_world": 2, "global_batch": 16, "lr_factor": 1.0,
                          "steps_lost": 0, "seconds_lost": 8.3}],
        "mark": {"step": 700, "val_loss": 1.803}, "reference_mark": {"step": 700, "val_loss": 1.796},
        "slurm": [{"job": "1", "by": "3", "ts": "t"}, {"job": "2", "by": "4", "ts": "t"}, {"job": "1", "by": "4", "ts": "t"}],
        "jobs": {"group-a": 1, "group-b": 2}, "exploration_jobs": [3, 4]}
    return {**base, **over}


def test_the_verdict_is_ok_only_when_production_shrank_came_back_and_resumed_without_loss(tmp_path):
    cfg = PreemptionDemoConfig(out_dir=str(tmp_path))
    good = summarize(cfg, _facts(), "")
    assert good["ok"] and good["problems"] == [] and good["loss_gap"] == pytest.approx(0.0039, abs=1e-3)
    f = _facts()
    bad = {
        "no shrink": _facts(preemptions=[f["preemptions"][1]]),
        "lost steps": _facts(preemptions=[f["preemptions"][0], {**f["preemptions"][1], "steps_lost": 3}]),
        "no scale-up": _facts(scale_events=f["scale_events"][:1]),
        "loss off": _facts(mark={"step": 700, "val_loss": 2.2}),
        "not finished": _facts(mark={"step": 400, "val_loss": 1.8}),
        "halted": _facts(incidents=[*f["incidents"], {"id": "x", "rule": "loss_spike", "outcome": "halted",
                                                      "spike_step": 300}]),
        "one group never preempted": _facts(slurm=f["slurm"][:1]),
    }
    for why, facts in bad.items():
        verdict = summarize(cfg, facts, "")
        assert not verdict["ok"] and verdict["problems"], why
    assert summarize(cfg, _facts(), "the production run did not finish")["problems"][0] == "the production run did not finish"


@pytest.mark.slurm
@pytest.mark.timeout(1100)
def test_the_preemption_demo_on_a_real_slurm_cluster_from_a_fresh_directory(tmp_path):
    """Exploration preempts one of two production groups, production shrinks and keeps training,
    scales back up, then survives a whole-job preemption; final loss within 5 % of an uninterrupted run."""
    if shutil.which("slurmctld") is None and not os.path.exists("/usr/sbin/slurmctld"):
        missing("Slurm (apt-get install slurm-wlm munge)")
    out = subprocess.run([sys.executable, "-m", "cliffguard", "demo", "--preemption", "--json", "summary.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=1050)
    assert (tmp_path / "summary.json").exists(), out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert out.returncode == 0 and summary["ok"], json.dumps(summary, indent=1)[-4000:]
    by_scope = {p["scope"]: p for p in summary["preemptions"]}
    assert by_scope["nodes"]["outcome"] == "shrunk" and by_scope["job"]["outcome"] == "requeued"
    for p in summary["preemptions"]:  # every save inside the grace time, dated from the scheduler's signal
        assert p["verified"] and p["signal"] == "SIGUSR1" and 0 <= p["save_s"] < p["deadline_s"], p
    assert [(e["from_world"], e["to_world"]) for e in summary["scale_events"]][:2] == [(2, 1), (1, 2)]
    assert abs(summary["loss_gap"]) <= 0.05
