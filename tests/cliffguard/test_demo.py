"""``cliffguard demo`` end to end: real broker, controller and 2-process trainer as subprocesses,
each run from a fresh, empty directory with the default (relative) ``--dir`` and ``--json`` path,
as a new user runs it: every path handed to a child process must be absolute.

One short demo (240 steps, the default faults scaled to it: corrupted batches at steps 79-81 and
an LR blow-up at step 148) and its JSON summary: the bundled trainer's re-runs found each corrupted
batch bad (triage: skipped and listed, no pause), the blow-up rolled back before its step with the
LR halved, and the loss came down. One
80-step smoke per library (hf, lightning, plain, deepspeed, accelerate-tracker); their full 240-step
scenario and a clean run are ``python -m bench.integrations``. Plus the pure matching of
incidents to faults, which decides the demo's exit code.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from cliffguard.commands.demo import CORRUPT_STEPS, default_faults
from cliffguard.demo_summary import judge
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.faults import FaultSpec

DEMO_TIMEOUT_S = 480
"""About 2.5 minutes on 2 idle cores; much longer when other jobs share them."""
SMOKE_TIMEOUT_S = 600
"""``--trainer ...`` smoke: 80 steps, about a minute on 2 idle cores (mostly process start-up); the
limit is for cores shared with other jobs (at load 10-12 the tracker took over 4 minutes)."""


def _inc(id_: str, spike: int, outcome: str, rollback_to: int | None = None, lr_scale: float = 1.0) -> dict:
    return {"id": id_, "spike_step": spike, "outcome": outcome, "rollback_to": rollback_to, "lr_scale": lr_scale}


def test_judge_accepts_expected_outcomes_and_rejects_others():
    faults = [FaultSpec.parse("corrupt@100"), FaultSpec.parse("lr_blowup@200x30:3")]
    good = [_inc("a", 101, "resumed"), _inc("b", 202, "rolled_back", rollback_to=150, lr_scale=0.5)]
    ok, results, unmatched = judge(faults, good)
    assert ok and [r["incident"] for r in results] == ["a", "b"] and unmatched == []

    swapped = [_inc("a", 101, "rolled_back", rollback_to=90, lr_scale=0.5), _inc("b", 202, "resumed")]
    ok, results, _ = judge(faults, swapped)
    assert not ok and [r["ok"] for r in results] == [False, False]

    late_target = [_inc("a", 101, "resumed"), _inc("b", 202, "rolled_back", rollback_to=200, lr_scale=0.5)]
    assert not judge(faults, late_target)[0]
    missing = [_inc("a", 101, "resumed"), _inc("x", 290, "resumed")]
    ok, results, unmatched = judge(faults, missing)
    assert not ok and results[1]["problem"] == "no incident" and unmatched == ["x"]


def test_a_bit_flip_is_judged_by_its_rollback_before_it_found_within_the_check_period_with_the_lr_kept():
    faults = [FaultSpec.parse("bitflip@250:2")]
    found = _inc("s", 300, "rolled_back", rollback_to=200, lr_scale=0.5) | {"lr_scale_at_open": 0.5}
    assert judge(faults, [found])[0]  # found at the next check (100 steps apart), the earlier cut kept
    cut = found | {"lr_scale": 0.25}
    assert judge(faults, [cut])[1][0]["problem"].startswith("lr_scale 0.5 -> 0.25")
    assert not judge(faults, [found | {"rollback_to": 250}])[0]
    assert judge(faults, [found | {"spike_step": 400}])[1][0]["problem"] == "no incident"  # past one period


def test_a_corrupted_stretch_cured_step_by_step_is_one_fault_with_every_cure_its_own():
    """A trainer that re-runs critical steps (the bundled one) cures each corrupted step itself; the
    controller joins a stretch into one ``triage`` incident, and the judge also takes one per step
    (a store written before that join) as the stretch's; the blow-up is still judged on its own."""
    faults = [FaultSpec.parse(f) for f in ("corrupt@100", "corrupt@101", "corrupt@102", "lr_blowup@200x100:3")]
    cured = [_inc(f"c{s}", s, "cured") for s in (100, 101, 102)]
    rolled = _inc("b", 202, "rolled_back", rollback_to=150, lr_scale=0.5)
    ok, results, unmatched = judge(faults, [*cured, rolled])
    assert ok and [r["outcome"] for r in results] == ["cured", "rolled_back"] and unmatched == []
    # a cure at the blow-up is not its expected rollback
    ok, results, _ = judge(faults, [*cured, _inc("x", 201, "cured"), rolled])
    assert not ok and results[1]["problem"] == "outcome cured, expected rolled_back"


def test_judge_fails_on_a_halted_incident_even_when_faults_match():
    faults = [FaultSpec.parse("corrupt@100")]
    assert not judge(faults, [_inc("a", 101, "resumed"), _inc("h", 250, "halted")])[0]


def test_judge_fails_when_an_incident_was_abandoned():
    faults = [FaultSpec.parse("corrupt@100")]
    ok, results, _ = judge(faults, [_inc("a", 101, "abandoned")])
    assert not ok and results[0]["problem"] == "outcome abandoned, expected cured or resumed"
    # an abandoned incident no fault explains still fails the demo: the run ended mid-recovery
    assert not judge(faults, [_inc("a", 101, "resumed"), _inc("x", 250, "abandoned")])[0]


def _alert(id_: str, step: int, level: str = "critical") -> dict:
    return {"id": id_, "level": level, "rule": "loss_spike", "action": "trigger", "evidence": {"step": step}}


def test_a_report_only_run_is_judged_by_its_alerts_and_by_no_command_sent():
    from cliffguard.demo_summary import judge_alerts

    faults = [FaultSpec.parse(f) for f in ("corrupt@100", "corrupt@101", "lr_blowup@200x100:3")]
    alerts = [_alert("a", 101), _alert("b", 102), _alert("c", 201), _alert("x", 150, "info")]
    ok, results, unmatched = judge_alerts(faults, alerts, commands_sent=0)
    assert ok and [r["alerts"] for r in results] == [2, 1] and unmatched == []
    ok, results, _ = judge_alerts(faults, alerts, commands_sent=1)
    assert not ok and "command" in results[0]["problem"]
    ok, results, unmatched = judge_alerts(faults, [_alert("a", 101), _alert("y", 170)], commands_sent=0)
    assert not ok and results[1]["problem"] == "no alert" and unmatched == ["y"]
    # no fault at all (a clean run): ok only while nothing was sent
    assert judge_alerts([], [], commands_sent=0)[0] and not judge_alerts([], [], commands_sent=2)[0]


def test_the_summary_judges_each_trainer_by_what_it_can_do():
    from cliffguard.commands.demo import summarize

    faults = [FaultSpec.parse("corrupt@100"), FaultSpec.parse("lr_blowup@200x100:3")]
    facts = {"incidents": [_inc("a", 101, "resumed"), _inc("b", 202, "rolled_back", rollback_to=150, lr_scale=0.5)],
             "alerts": [], "commands_sent": 5, "final_loss": 2.5, "initial_loss": 5.5, "steps_lost": 50,
             "flagged_samples": 16, "lr_scale": 0.5, "lr_scale_applied": 0.5, "run_status": "finished"}
    assert summarize(_demo_args("--trainer", "plain"), "r", faults, facts, 0)["ok"]
    assert not summarize(_demo_args("--trainer", "plain"), "r", faults, {**facts, "lr_scale_applied": 1.0}, 0)["ok"]
    assert not summarize(_demo_args("--trainer", "plain"), "r", faults, facts, 1)["ok"]
    # the tracker: incidents (or any command) mean the controller acted on a run that cannot obey
    tracker = _demo_args("--trainer", "accelerate-tracker")
    quiet = {**facts, "incidents": [], "alerts": [_alert("a", 101), _alert("b", 203)], "commands_sent": 0,
             "lr_scale": 1.0, "lr_scale_applied": None}
    summary = summarize(tracker, "r", faults, quiet, 0)
    assert summary["ok"] and summary["commands_sent"] == 0 and summary["alerts"] == 2
    assert not summarize(tracker, "r", faults, {**quiet, "commands_sent": 1}, 0)["ok"]
    assert not summarize(tracker, "r", faults, {**quiet, "alerts": [_alert("a", 101)]}, 0)["ok"]


def _demo_args(*argv: str):
    import argparse

    from cliffguard.commands import demo

    sub = argparse.ArgumentParser().add_subparsers()
    demo.add_parser(sub)
    return sub.choices["demo"].parse_args(list(argv))


def test_the_trainer_option_picks_the_training_command_and_its_kafka_settings(tmp_path):
    from cliffguard.commands.demo import trainer_command
    from cliffguard.core.kafka_config import KafkaConfig

    kafka = KafkaConfig(bootstrap="127.0.0.1:9999", topic_prefix="demo-x", partitions=1)
    faults = ["corrupt@10", "lr_blowup@20x100:3"]
    argv, env = trainer_command(_demo_args("--steps", "60"), "r1", kafka, tmp_path, faults)
    assert argv[argv.index("train") + 1:argv.index("train") + 3] == ["--nproc", "2"] and env == {}
    assert argv[-4:] == ["--fault", "corrupt@10", "--fault", "lr_blowup@20x100:3"]
    for name in ("hf", "lightning"):
        argv, env = trainer_command(_demo_args("--trainer", name, "--steps", "60"), "r1", kafka, tmp_path, faults)
        assert argv[1:3] == ["-m", f"cliffguard.trainer.demo_trainers.{name}_run"] and "--nproc" not in argv
        assert argv[argv.index("--run") + 1] == "r1" and argv[-2:] == ["--fault", "lr_blowup@20x100:3"]
        assert env == {"CLIFFGUARD_KAFKA__BOOTSTRAP": "127.0.0.1:9999", "CLIFFGUARD_KAFKA__TOPIC_PREFIX": "demo-x",
                       "CLIFFGUARD_KAFKA__PARTITIONS": "1"}
    argv, env = trainer_command(_demo_args("--trainer", "plain", "--steps", "60"), "r1", kafka, tmp_path, faults)
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert argv[5:8] == ["-m", "cliffguard.trainer.demo_trainers.plain_run", "--"] and "CLIFFGUARD_KAFKA__BOOTSTRAP" in env
    argv, _ = trainer_command(_demo_args("--trainer", "plain", "--nproc", "1", "--steps", "60"), "r1", kafka,
                              tmp_path, faults)
    assert argv[1:4] == ["-m", "cliffguard.trainer.demo_trainers.plain_run", "--run"]
    argv, _ = trainer_command(_demo_args("--trainer", "deepspeed", "--nproc", "1", "--steps", "60"), "r1", kafka,
                              tmp_path, faults)  # DeepSpeed always under torchrun: it reads the launcher's env
    assert argv[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    assert argv[5:8] == ["-m", "cliffguard.trainer.demo_trainers.deepspeed_run", "--"]
    argv, _ = trainer_command(_demo_args("--trainer", "accelerate-tracker", "--steps", "60"), "r1", kafka,
                              tmp_path, faults)
    assert argv[1:3] == ["-m", "cliffguard.trainer.demo_trainers.accelerate_tracker_run"]
    with pytest.raises(SystemExit):
        _demo_args("--trainer", "keras")


def test_demo_refuses_to_empty_a_directory_it_did_not_make(tmp_path):
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    proc = subprocess.run([sys.executable, "-m", "cliffguard.cli", "demo", "--dir", str(tmp_path), "--no-dashboard"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a demo directory" in proc.stderr
    assert keep.read_text() == "mine"


def run_from_fresh_dir(tmp_path, argv: list[str], timeout_s: float) -> tuple[dict, str, int]:
    """``argv`` (a ``cliffguard demo`` variant, its summary at the relative ``summary.json``) run
    from a fresh, empty directory; (summary, output, exit code)."""
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "cliffguard.cli", *argv, "--json", "summary.json"], cwd=fresh,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the demo stops its broker, controller and trainer (never SIGKILL it)
        stdout, _ = proc.communicate(timeout=60)
        pytest.fail(f"the demo took over {timeout_s} s:\n{stdout[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    out = fresh / "summary.json"
    assert out.exists(), stdout[-6000:]
    return json.loads(out.read_text()), stdout, proc.returncode


def _run_demo(tmp_path, steps: int, *extra: str, timeout_s: float = DEMO_TIMEOUT_S) -> tuple[dict, str]:
    summary, stdout, code = run_from_fresh_dir(
        tmp_path, ["demo", "--steps", str(steps), "--no-dashboard", "--broker-port", "0", *extra], timeout_s)
    assert code == (0 if summary["ok"] else 1)
    assert summary["ok"] is True, stdout[-6000:]
    assert (tmp_path / "fresh" / "cliffguard-demo" / "cliffguard.db").is_file()  # the default --dir, under the cwd
    return summary, stdout


def _both_faults_handled(summary: dict, steps: int) -> None:
    """The scenario's outcome, whoever trained: the corrupted stretch cured step by step by the
    trainer's re-runs (the bundled trainer: one ``triage`` incident closed ``cured``, a move per step) or, by
    a trainer without re-runs, resumed; the blow-up rolled back before its step with the LR halved
    (and the trainer applying it), and the loss came down."""
    specs = [FaultSpec.parse(f) for f in default_faults(steps)]
    corrupt, blowup = specs[0], specs[-1]
    assert (corrupt.kind, blowup.kind) == ("corrupt", "lr_blowup")
    by_outcome = {}
    for inc in summary["incidents"]:
        by_outcome.setdefault(inc["outcome"], []).append(inc)
    assert len(by_outcome.get("rolled_back", [])) == 1
    rolled, = by_outcome["rolled_back"]
    if summary["trainer"] == "bundled":
        cured, = by_outcome.get("cured", [None])  # the stretch is one excursion: one incident
        assert "resumed" not in by_outcome
        assert cured["rule"] == "triage" and cured["spike_step"] == corrupt.step
        assert [t["step"] for t in cured["transitions"]] == list(range(corrupt.step, corrupt.step + CORRUPT_STEPS))
    else:
        assert len(by_outcome.get("resumed", [])) == 1 and "cured" not in by_outcome
        resumed, = by_outcome["resumed"]
        assert corrupt.step <= resumed["spike_step"] < blowup.step
        assert resumed["rollback_to"] is None
    assert blowup.step <= rolled["spike_step"]
    assert rolled["rollback_to"] < rolled["spike_step"] and rolled["rollback_to"] < blowup.step
    assert rolled["lr_scale"] == 0.5 and summary["lr_scale_applied"] == 0.5
    assert _moves(rolled)[:3] == ["pausing", "validating", "rolling_back"]
    final, initial = summary["final_loss"], summary["initial_loss"]
    assert final is not None and math.isfinite(final) and final < initial


def _moves(incident: dict) -> list[str]:
    """The phases an incident went through, without its self-loops (a guard hold noted while the
    pause was on its way, a command resent)."""
    return [t["to"] for t in incident["transitions"] if t["from"] != t["to"]]


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(DEMO_TIMEOUT_S + 90)
def test_demo_handles_both_faults(tmp_path):
    steps = 240
    summary, _ = _run_demo(tmp_path, steps)
    _both_faults_handled(summary, steps)
    assert summary["trainer"] == "bundled" and summary["steps_lost"] > 0
    assert summary["validation"]["periodic"] >= 3 and summary["validation"]["off"] == ""  # its cost, in the summary
    # the re-runs listed exactly the corrupted stretch's samples: every step's global batch (no resume
    # flagged any: nothing paused for it)
    assert summary["listed_samples"] == CORRUPT_STEPS * TrainConfig().global_batch
    assert summary["flagged_samples"] == 0


SMOKE_STEPS = 80
SMOKE_FAULTS = ("corrupt@55", "corrupt@56", "corrupt@57")
"""A corrupted stretch after the first periodic validation (step 50, the controller's baseline): the
shortest run in which the whole pause -> validate -> resume cycle (or, for the report-only tracker,
an alert and no command) goes through the real broker and controller. The LR blow-up needs a
stable checkpoint 50 healthy steps old and a recover window after it: that is the 240-step
scenario of ``python -m bench.integrations``."""


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(SMOKE_TIMEOUT_S + 60)
@pytest.mark.parametrize("trainer", ["hf", "lightning", "plain", "deepspeed", "torchtitan", "accelerate-tracker"])
def test_a_smoke_scenario_per_library(tmp_path, trainer):
    """CI's one smoke per library: a corrupted stretch, the summary ``ok`` as that trainer is judged."""
    pytest.importorskip({"lightning": "pytorch_lightning", "hf": "transformers", "deepspeed": "deepspeed",
                         "torchtitan": "torchtitan"}.get(trainer, "torch"))
    summary, _ = _run_demo(tmp_path, SMOKE_STEPS, "--trainer", trainer, "--faults", *SMOKE_FAULTS,
                           timeout_s=SMOKE_TIMEOUT_S)
    assert summary["trainer"] == trainer and summary["train_exit_code"] == 0
    fault, = summary["faults"]
    if trainer == "accelerate-tracker":  # report-only: alerts, no incident, not one command
        assert fault["outcome"] == "alert" and summary["incidents"] == [] and summary["commands_sent"] == 0
    else:
        inc, = summary["incidents"]
        assert inc["outcome"] == "resumed" and 55 <= inc["spike_step"] < 60
        assert _moves(inc)[:3] == ["pausing", "validating", "resuming"]
        assert summary["commands_sent"] >= 3 and summary["lr_scale_applied"] == 1.0
        v = summary["validation"]  # run.finished's: the periodic one at step 50, the incident's on command
        assert v["periodic"] == 1 and v["on_command"] >= 1 and v["train_s"] > 0


@pytest.mark.slow
@pytest.mark.broker
@pytest.mark.timeout(DEMO_TIMEOUT_S + 60)
def test_a_flipped_bit_on_one_of_three_replicas_is_named_and_rolled_back_before_it_with_the_lr_kept(tmp_path):
    """The SDC watch end to end: 3 DDP ranks (16 samples do not split over 3: the demo takes 18), one
    mantissa bit of rank 2's first weight flipped before step 150; the check at step 200 names rank
    2 and the run rolls back to the newest stable checkpoint at or before step 100 (the last check
    that agreed), without a pause or a validation, and recovers."""
    summary, stdout = _run_demo(tmp_path, 300, "--nproc", "3", "--faults", "bitflip@150:2")
    assert summary["train_exit_code"] == 0
    inc, = summary["incidents"]
    assert (inc["rule"], inc["outcome"], inc["spike_step"]) == ("sdc", "rolled_back", 200)
    assert inc["rollback_to"] <= 100 and inc["lr_scale"] == 1.0
    assert _moves(inc) == ["rolling_back", "recovering", "running"]
    assert "rank 2; they last agreed at step 100" in inc["transitions"][0]["reason"]
    log = (tmp_path / "fresh" / "cliffguard-demo" / "train.log").read_text()
    assert "SDC watch: the data-parallel replicas' parameters differ at step 200: rank(s) [2]" in log
    assert log.count("SDC watch:") == 2  # rank 0 and the suspect, once: after the rollback the replicas agree


def test_a_halted_run_says_it_waits_for_a_human_and_how_to_resume_it(tmp_path, capsys):
    """A demo run the controller halts does not stand there in silence: the transition is followed
    by the command that resumes it against the demo's own store (and the dashboard, when there is one)."""
    from cliffguard.commands.demo import StoreWatch
    from cliffguard.controller.store.db import Store, StoreConfig
    from cliffguard.controller.store.models import RunRow, TransitionRow

    url = f"sqlite:///{tmp_path / 'cliffguard.db'}"
    store = Store.open(StoreConfig(url=url))
    with store.session() as s:
        s.add(RunRow(id="demo-1"))
        s.flush()
        s.add(TransitionRow(run_id="demo-1", ts=1.0, step=40, from_state="validating", to_state="halted",
                            reason="validation: worse than the baseline"))
        s.commit()
    StoreWatch(store, "demo-1", url, dashboard=False).poll()
    out = capsys.readouterr().out
    assert "validating -> halted" in out
    assert f"waits for a human: in another shell `cliffguard command demo-1 resume --db {url}`" in out
    StoreWatch(store, "demo-1", url, dashboard=True).poll()
    assert "the dashboard's operator actions, or in another shell" in capsys.readouterr().out
