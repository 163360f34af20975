"""Agent overhead: median step time with the agent on vs off, same script, alternating.

``python -m bench.agent_overhead --json OUT.json [--nproc 2] [--rounds 8] [--steps-per-round 10]``

Launches ``--nproc`` torchrun workers (gloo on CPU). Each worker builds three copies of the
default GPT (``trainer.model.GPTConfig()``) on the default global batch, each under DDP:

- ``off``: the plain loop — forward, backward, ``optimizer.step()``, and the one all-reduced loss
  scalar a loop reads anyway (``all_reduce`` + ``.item()``);
- ``on``: the same loop with the agent's hooks (its packed all-reduce replaces the loop's, the
  DDP timing hook, the guard, per-layer norms, step events to the sink, heartbeats) and
  gradient histograms every 10 steps;
- ``on_hist1``: the same with histograms every step.

Modes run in alternating rounds of ``--steps-per-round`` steps (after a warm-up), so drift in
machine load hits all three alike. Step time is rank 0's wall time per optimizer step. The sink is
a real ``Publisher`` to an embedded broker when one can be started (``--sink kafka``), else the
in-memory sink. ``ratio`` = median(on) / median(off); ``ratio_hist_every_step`` =
median(on_hist1) / median(off).
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


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from accelerate import Accelerator

    from agent.hooks import Agent, AgentConfig
    from agent.publisher import InMemorySink, PublisherConfig
    from core.kafka_config import KafkaConfig
    from trainer.model import GPT, GPTConfig

    acc = Accelerator(cpu=True)
    rank, world = acc.process_index, acc.num_processes
    cfg = GPTConfig()
    per_rank = args.global_batch // world
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, cfg.vocab_size, (per_rank, cfg.block_size + 1), generator=gen) for _ in range(16)]

    def build(hist_every: int | None):
        torch.manual_seed(0)
        model = GPT(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt = acc.prepare(model, opt)
        agent = None
        if hist_every is not None:
            kw: dict = {}
            if args.bootstrap:
                kw = {"kafka": KafkaConfig(bootstrap=args.bootstrap, topic_prefix="bench"),
                      "publisher_config": PublisherConfig(spill_path=os.path.join(args.tmp, f"spill-{hist_every}-{rank}.bin"))}
            else:
                kw = {"sink": InMemorySink()}
            agent = Agent(acc, model, opt, AgentConfig(run=f"bench-h{hist_every}", hist_every=hist_every,
                                                       calibration_s=0.1), seq_len=cfg.block_size, **kw)
            agent.start(global_batch=args.global_batch)
        return model, opt, agent

    setups = {"off": build(None), "on": build(10), "on_hist1": build(1)}
    times: dict[str, list[float]] = {k: [] for k in setups}

    def step(mode: str, i: int) -> float:
        model, opt, agent = setups[mode]
        b = batches[i % len(batches)]
        x, y = b[:, :-1], b[:, 1:]
        t0 = time.perf_counter()
        if agent is not None:
            with agent.data_wait():
                pass
        _, loss = model(x, y)
        if agent is not None:
            agent.after_forward(loss, tokens=x.numel())
        acc.backward(loss)
        if agent is not None:
            agent.after_backward()
            if agent.before_optimizer_step():
                opt.step()
        else:
            g = loss.detach().clone()
            dist.all_reduce(g)
            _ = g.item() / world  # the scalar the loop reads anyway
            opt.step()
        opt.zero_grad(set_to_none=True)
        if agent is not None:
            agent.after_step()
            agent.poll_commands()
        return time.perf_counter() - t0

    for mode in setups:
        for i in range(args.warmup):
            step(mode, i)
    for r in range(args.rounds):
        for mode in setups:
            for i in range(args.steps_per_round):
                times[mode].append(step(mode, r * args.steps_per_round + i))
    for _, _, agent in setups.values():
        if agent is not None:
            agent.close()
    if rank == 0:
        with open(args.out, "w") as fh:
            json.dump({"times": times, "world": world, "n_params": GPT(cfg).num_params(),
                       "global_batch": args.global_batch, "seq_len": cfg.block_size}, fh)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--sink", choices=["kafka", "memory"], default="kafka")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0

    broker = None
    tmp = tempfile.mkdtemp(prefix="cg-overhead-")
    bootstrap = None
    if args.sink == "kafka":
        try:
            from controller.broker import EmbeddedBroker, ensure_topics
            from core.kafka_config import KafkaConfig

            broker = EmbeddedBroker(port=0).start()
            bootstrap = broker.bootstrap
            ensure_topics(KafkaConfig(bootstrap=bootstrap, topic_prefix="bench", partitions=1))
        except Exception as exc:  # noqa: BLE001 - fall back to the in-memory sink, and say so
            print(f"no broker ({exc}); using the in-memory sink")
            args.sink = "memory"
    out = os.path.join(tmp, "result.json")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           "-m", "bench.agent_overhead", "--worker", "--out", out, "--tmp", tmp, "--rounds", str(args.rounds),
           "--steps-per-round", str(args.steps_per_round), "--warmup", str(args.warmup),
           "--global-batch", str(args.global_batch)]
    if bootstrap:
        cmd += ["--bootstrap", bootstrap]
    try:
        subprocess.run(cmd, check=True)
    finally:
        if broker is not None:
            broker.stop()
    with open(out) as fh:
        res = json.load(fh)
    med = {k: statistics.median(v) for k, v in res["times"].items()}
    result = {
        "benchmark": "agent_overhead",
        "ratio": med["on"] / med["off"],
        "ratio_hist_every_step": med["on_hist1"] / med["off"],
        "median_step_s": med,
        "p90_step_s": {k: statistics.quantiles(v, n=10)[-1] for k, v in res["times"].items()},
        "steps_per_mode": len(res["times"]["off"]),
        "world": res["world"], "n_params": res["n_params"], "global_batch": res["global_batch"],
        "seq_len": res["seq_len"], "sink": args.sink, "hist_every": 10,
    }
    print(f"{'mode':<12}{'median step (ms)':>18}{'p90 (ms)':>12}{'ratio vs off':>14}")
    for k in ("off", "on", "on_hist1"):
        print(f"{k:<12}{1000 * med[k]:>18.2f}{1000 * result['p90_step_s'][k]:>12.2f}{med[k] / med['off']:>14.3f}")
    print(f"ratio (hist every 10) = {result['ratio']:.3f}; ratio_hist_every_step = {result['ratio_hist_every_step']:.3f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
