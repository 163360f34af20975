"""On a real one-machine Slurm cluster (slurm tier): a production job running the bundled trainer
(``cliffguard submit --class production``) is preempted by an exploration job, saves within the
partition's GraceTime, is requeued by Slurm and resumes exactly where it was: every step once, and
every rank's sample ids those the sampler gives an uninterrupted run of the same config."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cliffguard.slurm.jobs import jobs, preemptions, release
from cliffguard.trainer.config import TrainConfig
from cliffguard.trainer.data import Sampler, load_corpus
from cliffguard.trainer.record import RECORD_NAME, SAMPLES_NAME

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]

STEPS, PREEMPT_AFTER = 1500, 20
SLOW = "slow_rank@0:0.05"  # >= 75 s of training: the preemption (decided every bf_interval) lands mid-run
# the pace is in the config file, which the requeued job reads again: once the preemption is saved
# nothing is left to wait for, and the file is rewritten without it (the sleep does not touch the math)
PACE = f'faults = ["{SLOW}"]\n'
TOML = """
[train]
sample_log = true
progress_every = 0
val_every = 0
[checkpoint]
ckpt_every = 0
full_every = 0
[agent.preemption]
deadline_s = 25.0
"""


def _rows(path: Path, kind: str) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if row.get("kind") == kind:
                out.append(row)
    return out


def _wait_for(cond, timeout_s: float, what: str, log: Path | None = None) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"timed out waiting for {what}\n{tail}")
        time.sleep(0.5)


def _cli(cluster, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cliffguard", command, "--dir", str(cluster.root), *args],
                          capture_output=True, text=True, timeout=60, env=cluster.env())


def test_a_preempted_production_job_saves_in_its_grace_time_is_requeued_and_resumes_exactly(slurm_cluster, tmp_path):
    cluster = slurm_cluster
    cfg_file = tmp_path / "cfg.toml"
    cfg_file.write_text(TOML.replace("[train]\n", "[train]\n" + PACE, 1))
    run_dir = tmp_path / "runs" / "prod"
    log = tmp_path / "prod.out"
    sub = _cli(cluster, "submit", "--class", "production", "--output", str(log), "--name", "prod", "--",
               "--config", str(tmp_path / "cfg.toml"), "--no-monitor", "--nproc", "2", "--run", "prod",
               "--out-dir", str(tmp_path / "runs"), "--steps", str(STEPS), "--n-layer", "1", "--n-head", "2",
               "--n-embd", "32", "--seq-len", "32", "--max-bytes", "300000", "--global-batch", "8")
    assert sub.returncode == 0, sub.stderr
    prod = sub.stdout.strip()
    _wait_for(lambda: len(_rows(run_dir / SAMPLES_NAME, "step")) >= PREEMPT_AFTER, 240, "production training", log)

    (tmp_path / "explore.sh").write_text("#!/bin/bash\nsleep 3\n")
    out = subprocess.run(["sbatch", "--parsable", "--partition=exploration", "--cpus-per-task=4",
                          f"--output={tmp_path / 'explore.out'}", str(tmp_path / "explore.sh")],
                         env=cluster.env(), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    explore = out.stdout.strip().split(";")[0]

    _wait_for(lambda: bool(_rows(run_dir / RECORD_NAME, "end")), 120, "the preemption save", log)
    end = _rows(run_dir / RECORD_NAME, "end")[0]
    assert end["stop_reason"] == "preempted", end
    cfg_file.write_text(TOML)  # the requeued launch trains unpaced
    saved = end["preempted"]
    # warned at the preemption decision (preempt_send_user_signal: SIGUSR1), saved inside GraceTime=30
    assert saved["signal"] == "SIGUSR1" and saved["verified"] and saved["save_s"] < 30, saved
    _wait_for(lambda: any(p["job"] == prod for p in preemptions(cluster.root / "slurmctld.log")), 60,
              "slurmctld's preemption record")
    queue = _cli(cluster, "queue")
    assert queue.returncode == 0 and f"job {prod} preempted" in queue.stdout, queue.stdout + queue.stderr

    # Slurm requeues it, held ~2 minutes (BeginTime); once the exploration job is gone the hold is
    # lifted as an operator would (what waiting would prove is Slurm's timer), and the script
    # restarts it with --resume
    _wait_for(lambda: not [j for j in jobs(cluster.env()) if j["job"] == explore], 120, "the exploration job to end")
    held = [j for j in jobs(cluster.env()) if j["job"] == prod and j["reason"] == "BeginTime"]
    if held:
        try:
            release(int(prod), cluster.env())
        except RuntimeError:  # it started meanwhile: nothing to lift
            pass
    _wait_for(lambda: len(_rows(run_dir / RECORD_NAME, "end")) >= 2, 600, "the requeued job to finish", log)
    first, again = _rows(run_dir / RECORD_NAME, "start")[:2]
    assert (first["step"], again["step"]) == (0, end["step"])  # resumed where it saved: no step lost
    last = _rows(run_dir / RECORD_NAME, "end")[1]
    assert (last["step"], last["stop_reason"]) == (STEPS, "")
    assert "restart 1" in log.read_text()
    _wait_for(lambda: not [j for j in jobs(cluster.env()) if j["job"] in (prod, explore)], 60,
              "both jobs to leave the queue")

    done = _rows(run_dir / SAMPLES_NAME, "step")
    assert [r["step"] for r in done] == list(range(STEPS))  # every step once: none repeated or skipped
    cfg = TrainConfig.load(run_dir / "config.json")
    data_cfg = dataclasses.replace(cfg.data, curriculum_steps=cfg.data.curriculum_steps or cfg.steps)
    sampler = Sampler(load_corpus(cfg.data), data_cfg, cfg.global_batch, 0, 2)
    assert [r["ids"] for r in done] == [[sampler.sample_ids(s, rank=r) for r in range(2)] for s in range(STEPS)]
