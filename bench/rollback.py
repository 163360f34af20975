"""Rollback time: from the memory ring, from disk, and by restarting the torchrun job from disk.

``python -m bench.rollback --json OUT.json [--nproc 2] [--repeats 5] [--restarts 2]``

Same script, same model (the default GPT), same checkpoint state:

- ``memory``: ``tr.kit.rollback(step, 1.0)`` while the job runs, the step in the in-memory ring
  (a CPU copy loaded into the model, optimizer, sampler, RNG; plus the all-rank agreement);
- ``disk``: the same call for a step only on disk (read, sha256-checked, loaded);
- ``restart``: what a job without in-process rollback does — start a fresh
  ``torchrun`` job that resumes from the newest disk checkpoint: process start, imports, process
  group, corpus, model, restore; timed from launch until every rank has restored.

Each figure is the median over repeats, measured on rank 0 after a barrier so both ranks start
together. ``ratio_memory_vs_restart`` = memory / restart, ``ratio_disk_vs_restart`` = disk / restart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def _config(tmp: str, resume: bool):
    from cliffguard.agent.hooks import AgentConfig
    from cliffguard.trainer.checkpoint import CheckpointConfig
    from cliffguard.trainer.config import TrainConfig
    from cliffguard.trainer.data import DataConfig

    return TrainConfig(
        run="bench-rollback", steps=1000, out_dir=tmp, val_every=0, progress_every=0, resume=resume,
        data=DataConfig(max_bytes=2_000_000),
        checkpoint=CheckpointConfig(dir=os.path.join(tmp, "ckpt"), snapshot_every=5, memory_ring=2,
                                    ckpt_every=10, full_every=0, keep_incremental=4),
        agent=AgentConfig(run="bench-rollback", hist_every=0, heartbeat_s=30, calibration_s=0.1),
    )


def _trainer(tmp: str, resume: bool):
    import torch

    torch.set_num_threads(1)
    from accelerate import Accelerator

    from cliffguard.agent.sinks import NullSink
    from cliffguard.trainer.loop import Trainer

    return Trainer(_config(tmp, resume), Accelerator(cpu=True), sink=NullSink())


def worker_inprocess(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    tr = _trainer(args.tmp, resume=False)
    tr.agent.start()
    while tr.step <= 20:
        tr.kit.at_boundary()
        tr.train_step()
    tr.ckpt.wait()
    ring, disk = sorted(tr.ckpt.ring), tr.ckpt.disk_steps()
    mem_step = ring[-1]
    disk_step = max(s for s in disk if s not in ring)

    def timed(step: int, expect: str) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        detail = tr.kit.rollback(step, 1.0).detail
        dt = time.perf_counter() - t0
        assert f"from {expect};" in detail, (detail, expect)
        return dt

    mem = [timed(mem_step, "memory") for _ in range(args.repeats)]
    disk_t = [timed(disk_step, "disk") for _ in range(args.repeats)]
    tr.ckpt.close()
    tr.agent.close()
    if tr.rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"memory": mem, "disk": disk_t, "memory_step": mem_step, "disk_step": disk_step,
                       "world": tr.world}, fh)


def worker_restart(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    tr = _trainer(args.tmp, resume=True)
    tr.resume_latest()
    dist.barrier()
    dt = time.time() - float(os.environ["CG_BENCH_T0"])
    step = tr.step
    tr.ckpt.close()
    tr.agent.close()
    if tr.rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"restart": dt, "step": step}, fh)


def _torchrun(nproc: int, extra: list[str], env: dict | None = None) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "bench.rollback", *extra]
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--restarts", type=int, default=2)
    p.add_argument("--worker", choices=["inprocess", "restart"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "inprocess":
        worker_inprocess(args)
        return 0
    if args.worker == "restart":
        worker_restart(args)
        return 0

    tmp = tempfile.mkdtemp(prefix="cg-rollback-")
    out = os.path.join(tmp, "inprocess.json")
    _torchrun(args.nproc, ["--worker", "inprocess", "--out", out, "--tmp", tmp, "--repeats", str(args.repeats)])
    with open(out) as fh:
        res = json.load(fh)
    restarts = []
    for i in range(args.restarts):
        rout = os.path.join(tmp, f"restart{i}.json")
        env = {**os.environ, "CG_BENCH_T0": repr(time.time())}
        _torchrun(args.nproc, ["--worker", "restart", "--out", rout, "--tmp", tmp], env=env)
        with open(rout) as fh:
            restarts.append(json.load(fh)["restart"])
    med = {"memory": statistics.median(res["memory"]), "disk": statistics.median(res["disk"]),
           "restart": statistics.median(restarts)}
    result = {
        "benchmark": "rollback",
        "median_s": med,
        "samples_s": {"memory": res["memory"], "disk": res["disk"], "restart": restarts},
        "ratio_memory_vs_restart": med["memory"] / med["restart"],
        "ratio_disk_vs_restart": med["disk"] / med["restart"],
        "memory_step": res["memory_step"], "disk_step": res["disk_step"], "world": res["world"],
        "model": "trainer.model.GPTConfig() (default)",
    }
    print(f"{'rollback from':<16}{'median (s)':>12}{'vs restart':>12}")
    for k in ("memory", "disk", "restart"):
        print(f"{k:<16}{med[k]:>12.4f}{med[k] / med['restart']:>12.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
