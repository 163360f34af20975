"""Shrink, don't kill (issue 24): an elastic run of two ``cliffguard train --nnodes 1:2`` launches
loses only the node whose launcher got the scheduler's warning, goes on at half the world, scales
back up when the node starts again, and survives a warning to every node; every step runs once.

No Slurm here: the warning reaches the launcher alone, as ``sbatch --signal=B:USR1@N`` (a time
limit) and a ``kill`` by hand do (the Slurm path, which signals every process of the job, is the
``slurm`` tier's demo test). The rendezvous store is hosted by the test, as a job-independent host
does in production, so either node may leave."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from cliffguard.controller.broker import free_port
from cliffguard.demo_elastic import _paths
from cliffguard.trainer.record import SAMPLES_NAME

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 160


def _launch(tmp_path: Path, node: str, rdzv: str) -> subprocess.Popen[str]:
    args = [sys.executable, "-m", "cliffguard", "train", "--config", str(tmp_path / "cfg.toml"), "--nnodes", "1:2",
            "--nproc", "1", "--run", "shrink", "--out-dir", str(tmp_path / "runs"), "--no-monitor",
            "--rdzv-endpoint", rdzv, "--rdzv-client", "--node-id", node, "--rdzv-last-call-s", "3",
            "--rdzv-timeout-s", "300", "--steps", str(STEPS), "--global-batch", "8", "--ckpt-every", "5",
            "--full-every", "0", "--snapshot-every", "5", "--val-every", "0", "--progress-every", "10",
            "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--max-bytes", "200000"]
    log = (tmp_path / f"{node}.log").open("a")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _wait_for(cond, timeout_s: float, what: str, tmp_path: Path) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            logs = "".join((tmp_path / f"{n}.log").read_text()[-2000:] for n in ("a", "b"))
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        time.sleep(0.3)


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_one_warned_node_leaves_the_other_trains_on_both_come_back_and_every_step_runs_once(tmp_path):
    import torch.distributed as dist

    # rank 0's pace (slow_rank) is in the config file so that the last, requeued launches, which
    # read it again, train unpaced: nothing is left to wait for then, and the sleep is not math
    cfg = "[train]\nsample_log = true\n{pace}[agent.preemption]\ndeadline_s = 20.0\n"
    (tmp_path / "cfg.toml").write_text(cfg.format(pace='faults = ["slow_rank@0:0.15"]\n'))
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, multi_tenant=True,
                          timeout=timedelta(seconds=600))
    rdzv = f"127.0.0.1:{port}"
    mark_path, events_path = _paths(type("C", (), {"out_dir": str(tmp_path / "runs"), "run": "shrink"})())
    mark = lambda: _json(mark_path)  # noqa: E731
    a, b = _launch(tmp_path, "a", rdzv), _launch(tmp_path, "b", rdzv)
    procs = [a, b]
    try:
        _wait_for(lambda: mark().get("world") == 2 and mark().get("step", 0) >= 15, 180, "training at world 2", tmp_path)
        b.send_signal(signal.SIGUSR1)  # the time-limit warning, to node b's launcher alone
        assert b.wait(timeout=90) == 75
        assert "node b left run shrink on the scheduler's warning (after its workers saved)" in (tmp_path / "b.log").read_text()
        _wait_for(lambda: mark().get("world") == 1, 120, "the shrink to world 1", tmp_path)
        down = _events(events_path)[-1]
        assert (down["from_world"], down["to_world"], down["global_batch"], down["steps_lost"]) == (2, 1, 4, 0)
        assert a.poll() is None  # node a never stopped training for good

        b = _launch(tmp_path, "b", rdzv)  # the scheduler starts the job again
        procs.append(b)
        _wait_for(lambda: mark().get("world") == 2, 180, "the scale-up to world 2", tmp_path)
        up = _events(events_path)[-1]
        assert (up["from_world"], up["to_world"], up["global_batch"], up["steps_lost"]) == (1, 2, 8, 0)
        at = mark().get("step", 0)
        _wait_for(lambda: mark().get("step", 0) >= at + 5, 120, "training after the scale-up", tmp_path)

        a.send_signal(signal.SIGTERM)  # every node warned: the whole job saves and leaves
        b.send_signal(signal.SIGTERM)
        assert a.wait(timeout=90) == 75 and b.wait(timeout=90) == 75
        saved = mark().get("step")
        (tmp_path / "cfg.toml").write_text(cfg.format(pace=""))
        a, b = _launch(tmp_path, "a", rdzv), _launch(tmp_path, "b", rdzv)  # both requeued
        procs += [a, b]
        assert a.wait(timeout=300) == 0 and b.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
        del store
    assert mark()["step"] == STEPS
    steps = [json.loads(line)["step"] for line in (tmp_path / "runs" / "shrink" / SAMPLES_NAME).read_text().splitlines()
             if json.loads(line).get("kind") == "step"]
    assert steps == list(range(STEPS)), f"steps repeated or skipped around {saved}"
