"""Agent overhead: step time with the agent on vs off, same script, interleaved blocks.

``python -m bench.agent_overhead --json OUT.json [--nproc 2] [--rounds 16] [--steps-per-round 10]
[--device cpu|cuda] [--size default|wide]``

Launches ``--nproc`` torchrun workers (gloo on CPU; with ``--device cuda`` one GPU per worker, NCCL,
so ``--nproc 1`` on a one-GPU machine: the agent's packed all-reduce then has no peer, and its
two-rank path is tests/agent/test_agent_cuda.py's). Each worker builds four copies of the GPT of
``--size`` (``default``: ``trainer.model.GPTConfig()``) on the global batch, each under DDP:

- ``off``: the plain loop — forward, backward, ``optimizer.step()``, and the one all-reduced loss
  scalar a loop reads anyway (``all_reduce`` + ``.item()``);
- ``on``: the same loop with the agent's hooks (its packed all-reduce replaces the loop's, the
  DDP timing hook, the guard, norms, step events to the sink, heartbeats) and gradient
  histograms every 10 steps;
- ``on_hist1``: the same with histograms every step;
- ``on_data``: ``on`` plus the data watch (agent/data_watch/) fed each batch, with the bundled
  trainer's scorers (the garbled-text rules and a byte-trigram reference model trained on the
  corpus); the batches of every mode are real byte windows of the standard library's code.
  ``data_watch_share`` is the watcher thread's CPU per batch (its own ``thread_time``) over a plain
  step's CPU: the issue's <= 1 % figure; ``ratio_data`` the paired wall ratio on_data / on; the
  same batches through a fresh watch with nothing training beside it give its cost alone.

A shared 2-core machine drifts by 2x within a minute, so the modes run in interleaved blocks of
``--steps-per-round`` steps (after a warm-up), the order reversed every other round (A B C, C B
A, ...), and each round gives its own paired ratio: median(on) / median(off) over that round's
steps. ``ratio`` is the median of the rounds' ratios, with its spread (quartiles, min, max);
``ratio_pooled`` is the old figure, median over all steps of each mode. ``cpu_ratio``: the same
paired median of rank 0's CPU time per step (every thread of the process), which load moves less;
``cpu_attributed_ratio``: 1 + the agent's own CPU per step (the training thread inside its calls,
less the loop's own reduce it replaces, plus its side threads) over the plain step's CPU, the
steadiest of the three on a shared machine (it leaves out the DDP hook's work inside backward). Step time is rank 0's
wall time per optimizer step. The sink is a real ``Publisher`` to an embedded broker when one can
be started (``--sink kafka``), else the in-memory sink. ``os.getloadavg()`` is recorded before
and after.
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
from typing import Any

from bench.model_sizes import SIZES, gpt_config


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    from accelerate import Accelerator

    from cliffguard.agent.hooks import Agent, AgentConfig
    from cliffguard.agent.publisher import PublisherConfig
    from cliffguard.agent.sinks import InMemorySink
    from cliffguard.core.kafka_config import KafkaConfig
    from cliffguard.trainer.byte_lm import ByteTrigramLM
    from cliffguard.trainer.data_rules import DataRules
    from cliffguard.trainer.model import GPT
    from testing.data_watch import code_tokens

    acc = Accelerator(cpu=args.device == "cpu")
    rank, world = acc.process_index, acc.num_processes
    cuda = acc.device.type == "cuda"
    cfg = gpt_config(args.size)
    per_rank = args.global_batch // world
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(rank)
    code = code_tokens()
    n_windows = (code.numel() - 1) // (cfg.block_size + 1)
    batch_ids = [torch.randint(0, n_windows, (per_rank,), generator=gen) for _ in range(16)]
    batches = [code[ids.unsqueeze(1) * (cfg.block_size + 1) + torch.arange(cfg.block_size + 1)].long()
               for ids in batch_ids]
    on_device = [b.to(acc.device) for b in batches]  # the data watch sees the loader's host batch, as in a trainer

    def reference() -> ByteTrigramLM:
        lm = ByteTrigramLM()
        lm.train_tokens(code.numpy())
        return lm

    def build(hist_every: int | None, data: bool = False):
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
            agent = Agent(acc, model, opt, AgentConfig(run=f"bench-h{hist_every}{'-data' if data else ''}",
                                                       hist_every=hist_every, calibration_s=0.1),
                          seq_len=cfg.block_size, **kw)
            agent.start(global_batch=args.global_batch)
            if data:
                lm = reference()  # the trainer builds it on the watcher's thread; here before the timing
                agent.watch_data(garbled=DataRules().garbled, perplexity=lambda x: lm.sequence_scores(x.numpy()))
        return model, opt, agent

    setups = {"off": build(None), "on": build(10), "on_hist1": build(1), "on_data": build(10, data=True)}
    times: dict[str, list[float]] = {k: [] for k in setups}

    hook_cpu = dict.fromkeys(setups, 0.0)  # training-thread CPU inside the agent's calls

    def step(mode: str, i: int) -> float:
        model, opt, agent = setups[mode]
        b = on_device[i % len(batches)]
        x, y = b[:, :-1], b[:, 1:]
        tt = time.thread_time
        t0 = time.perf_counter()
        c = tt()
        if agent is not None:
            with agent.data_wait():
                pass
            agent.observe_batch(batches[i % len(batches)][:, :-1], batch_ids[i % len(batch_ids)].tolist())  # a no-op but in on_data
        h = tt() - c
        _, loss = model(x, y)
        if agent is not None:
            c = tt()
            agent.after_forward(loss, tokens=x.numel())
            h += tt() - c
        acc.backward(loss)
        c = tt()
        if agent is not None:
            agent.after_backward()
            ok = agent.before_optimizer_step()
        else:  # the loop's own reduce, which the agent's packed one replaces
            g = loss.detach().clone()
            dist.all_reduce(g)
            _ = g.item() / world  # the scalar the loop reads anyway
            ok = True
        h += tt() - c
        if ok:
            opt.step()
        opt.zero_grad(set_to_none=True)
        if agent is not None:
            c = tt()
            agent.after_step()
            agent.poll_commands()
            h += tt() - c
        hook_cpu[mode] += h
        if cuda:  # the optimizer's kernels are still queued: count them in this step, not the next mode's
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for mode in setups:
        for i in range(args.warmup):
            step(mode, i)
    order = list(setups)
    rounds: list[dict[str, float]] = []
    cpu_rounds: list[dict[str, dict[str, float]]] = []
    n = args.steps_per_round
    for r in range(args.rounds):
        this: dict[str, list[float]] = {}
        cpu: dict[str, dict[str, float]] = {}
        for mode in order if r % 2 == 0 else order[::-1]:
            c0, m0, h0 = time.process_time(), time.thread_time(), hook_cpu[mode]
            this[mode] = [step(mode, r * n + i) for i in range(n)]
            every = time.process_time() - c0  # every thread of this process: publisher, kafka I/O, gloo
            main = time.thread_time() - m0
            cpu[mode] = {"all": every / n, "main": main / n, "side": (every - main) / n, "hooks": (hook_cpu[mode] - h0) / n}
            times[mode].extend(this[mode])
        rounds.append({mode: statistics.median(v) for mode, v in this.items()})
        cpu_rounds.append(cpu)
    watch = setups["on_data"][2].data_watch
    for _, _, agent in setups.values():
        if agent is not None:
            agent.close()
    if rank == 0:
        assert watch is not None
        alone = isolated_watch(batches, batch_ids, reference(), watch.batches)
        with open(args.out, "w") as fh:
            json.dump({"times": times, "rounds": rounds, "cpu_rounds": cpu_rounds, "world": world, "n_params": GPT(cfg).num_params(),
                       "device": acc.device.type, "device_name": torch.cuda.get_device_name(acc.device) if cuda else "cpu",
                       "size": args.size,
                       "global_batch": args.global_batch, "seq_len": cfg.block_size,
                       "data_watch": {"cpu_s": watch.cpu_s, "batches": watch.batches, "dropped": watch.dropped,
                                      "events": watch.events, "isolated_cpu_s": alone.cpu_s,
                                      "isolated_batches": alone.batches}}, fh)


def isolated_watch(batches: list, batch_ids: list, lm: Any, n: int) -> Any:
    """The same batches through a fresh data watch with nothing training beside it (its cost alone)."""
    from cliffguard.agent.data_watch.config import DataWatchConfig
    from cliffguard.agent.data_watch.watcher import DataWatch
    from cliffguard.trainer.data_rules import DataRules

    w = DataWatch(DataWatchConfig(queue=n + 1), lambda *a, **k: None, garbled=DataRules().garbled,
                  perplexity=lambda x: lm.sequence_scores(x.numpy())).start()
    for i in range(n):
        b = batches[i % len(batches)]
        w.observe(i, b[:, :-1], batch_ids[i % len(batch_ids)].tolist())
    w.close()
    return w


def _spread(values: list[float]) -> dict[str, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {"median": q2 if len(values) > 1 else values[0], "q1": q1, "q3": q3, "min": min(values), "max": max(values)}


def summarize(res: dict, *, sink: str, load_before: tuple[float, ...], load_after: tuple[float, ...]) -> dict:
    """The JSON result from a worker's raw times (pure: tests feed it made-up times)."""
    times, rounds = res["times"], res["rounds"]
    med = {k: statistics.median(v) for k, v in times.items()}
    per_round = {k: [r[k] / r["off"] for r in rounds] for k in ("on", "on_hist1")}
    spread = {k: _spread(v) for k, v in per_round.items()}
    cr = res["cpu_rounds"]
    cpu = {k: _spread([r[k]["all"] / r["off"]["all"] for r in cr]) for k in ("on", "on_hist1")}
    # The agent's own CPU, counted where it runs: the training thread inside its calls (less the
    # loop's own reduce, which its packed all-reduce replaces) and the side threads (publisher,
    # kafka I/O), over the plain step's CPU. It leaves out the DDP hook's cost inside backward.
    attributed = {k: _spread([1 + (r[k]["hooks"] - r["off"]["hooks"] + r[k]["side"] - r["off"]["side"]) / r["off"]["all"]
                              for r in cr]) for k in ("on", "on_hist1")}
    parts = {k: {part: 1000 * statistics.median(r[k][part] for r in cr) for part in ("all", "main", "side", "hooks")}
             for k in times}
    out = {
        "benchmark": "agent_overhead",
        "ratio": spread["on"]["median"],
        "ratio_hist_every_step": spread["on_hist1"]["median"],
        "ratio_spread": spread["on"], "ratio_hist_every_step_spread": spread["on_hist1"],
        "ratio_per_round": per_round,
        "ratio_pooled": med["on"] / med["off"], "ratio_hist_every_step_pooled": med["on_hist1"] / med["off"],
        "ratio_mean": statistics.fmean(times["on"]) / statistics.fmean(times["off"]),
        "cpu_ratio": cpu["on"]["median"], "cpu_ratio_hist_every_step": cpu["on_hist1"]["median"],
        "cpu_ratio_spread": cpu["on"], "cpu_ratio_hist_every_step_spread": cpu["on_hist1"],
        "cpu_ms_per_step": parts,
        "cpu_attributed_ratio": attributed["on"]["median"],
        "cpu_attributed_ratio_hist_every_step": attributed["on_hist1"]["median"],
        "cpu_attributed_spread": attributed,
        "median_step_s": med,
        "p90_step_s": {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()},
        "rounds": len(rounds), "steps_per_mode": len(times["off"]),
        "world": res["world"], "n_params": res["n_params"], "global_batch": res["global_batch"],
        "seq_len": res["seq_len"], "sink": sink, "hist_every": 10,
        "device": res.get("device", "cpu"), "device_name": res.get("device_name", "cpu"), "size": res.get("size", "default"),
        "loadavg_before": list(load_before), "loadavg_after": list(load_after),
    }
    if "on_data" in times:
        out.update(_data_watch(res, rounds, cr))
    return out


def _data_watch(res: dict, rounds: list[dict[str, float]], cr: list[dict[str, dict[str, float]]]) -> dict:
    """The data watch's cost: its thread's CPU per batch over a plain step's CPU and wall time, and
    the paired wall ratio of the agent with it over the agent without."""
    w = res["data_watch"]
    per_batch = w["cpu_s"] / max(w["batches"], 1)
    plain_cpu = statistics.median(r["off"]["all"] for r in cr)
    plain_wall = statistics.median(r["off"] for r in rounds)
    ratio = _spread([r["on_data"] / r["on"] for r in rounds])
    alone = w.get("isolated_cpu_s", 0.0) / max(w.get("isolated_batches", 0), 1)
    return {
        "data_watch_cpu_ms_per_batch": 1000 * per_batch,
        "data_watch_isolated_cpu_ms_per_batch": 1000 * alone,
        "data_watch_share": per_batch / plain_cpu,
        "data_watch_wall_share": per_batch / plain_wall,
        "ratio_data": ratio["median"], "ratio_data_spread": ratio,
        "cpu_attributed_ratio_data": _spread([1 + (r["on_data"]["hooks"] - r["off"]["hooks"] + r["on_data"]["side"]
                                                    - r["off"]["side"]) / r["off"]["all"] for r in cr])["median"],
        "data_watch_batches": w["batches"], "data_watch_dropped": w["dropped"],
    }


def print_table(result: dict) -> None:
    med, p90 = result["median_step_s"], result["p90_step_s"]
    spreads = {"on": result["ratio_spread"], "on_hist1": result["ratio_hist_every_step_spread"]}
    print(f"{'mode':<10}{'median ms':>11}{'p90 ms':>9}{'ratio':>8}{'q1':>8}{'q3':>8}{'min':>8}{'max':>8}")
    print(f"{'off':<10}{1000 * med['off']:>11.2f}{1000 * p90['off']:>9.2f}{1.0:>8.3f}")
    for k, sp in spreads.items():
        print(f"{k:<10}{1000 * med[k]:>11.2f}{1000 * p90[k]:>9.2f}{sp['median']:>8.3f}{sp['q1']:>8.3f}"
              f"{sp['q3']:>8.3f}{sp['min']:>8.3f}{sp['max']:>8.3f}")
    cpu = result["cpu_ms_per_step"]
    print("rank 0 CPU per step, ms (all threads | training thread | inside the agent's calls | side threads):")
    for k in [m for m in ("off", "on", "on_hist1", "on_data") if m in cpu]:
        c = cpu[k]
        print(f"  {k:<10}{c['all']:>8.2f}{c['main']:>8.2f}{c['hooks']:>8.2f}{c['side']:>8.2f}")
    print(f"CPU ratio {result['cpu_ratio']:.3f} / {result['cpu_ratio_hist_every_step']:.3f}; the agent's own CPU over a "
          f"plain step: {result['cpu_attributed_ratio']:.3f} / {result['cpu_attributed_ratio_hist_every_step']:.3f}")
    if "data_watch_share" in result:
        print(f"data watch: {result['data_watch_cpu_ms_per_batch']:.3f} ms CPU per batch on its thread = "
              f"{100 * result['data_watch_share']:.2f} % of a plain step's CPU ({100 * result['data_watch_wall_share']:.2f} % "
              f"of its wall time); wall ratio with/without it {result['ratio_data']:.3f}; "
              f"{result['data_watch_dropped']} of {result['data_watch_batches']} batches skipped; alone (nothing "
              f"training beside it) {result['data_watch_isolated_cpu_ms_per_batch']:.3f} ms a batch")
    lb, la = result["loadavg_before"], result["loadavg_after"]
    print(f"device {result['device_name']}, GPT {result['size']} ({result['n_params']:,} parameters), "
          f"{result['world']} rank(s), global batch {result['global_batch']}")
    print(f"ratio (hist every 10) = {result['ratio']:.3f}; ratio_hist_every_step = {result['ratio_hist_every_step']:.3f}"
          f"  (median of {result['rounds']} paired rounds; pooled {result['ratio_pooled']:.3f} / "
          f"{result['ratio_hist_every_step_pooled']:.3f}; loadavg {lb[0]:.2f} -> {la[0]:.2f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results here")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--sink", choices=["kafka", "memory"], default="kafka")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where the workers train (cuda: one GPU per worker, --nproc at most the GPUs)")
    p.add_argument("--size", choices=sorted(SIZES), default="default", help="the GPT's size (bench/model_sizes.py)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--bootstrap", help=argparse.SUPPRESS)
    p.add_argument("--tmp", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch.cuda.is_available() is False (no GPU, or a CPU build of torch)")
        if args.nproc > torch.cuda.device_count():
            p.error(f"--device cuda: --nproc {args.nproc} is more than the {torch.cuda.device_count()} GPU(s)")

    broker = None
    tmp = tempfile.mkdtemp(prefix="cg-overhead-")
    bootstrap = None
    if args.sink == "kafka":
        try:
            from cliffguard.controller.broker import EmbeddedBroker, ensure_topics
            from cliffguard.core.kafka_config import KafkaConfig

            broker = EmbeddedBroker(port=0).start()
            bootstrap = broker.bootstrap
            ensure_topics(KafkaConfig(bootstrap=bootstrap, topic_prefix="bench", partitions=1))
        except Exception as exc:  # noqa: BLE001 - fall back to the in-memory sink, and say so
            print(f"no broker ({exc}); using the in-memory sink")
            args.sink = "memory"
    out = os.path.join(tmp, "result.json")
    load_before = os.getloadavg()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           "-m", "bench.agent_overhead", "--worker", "--out", out, "--tmp", tmp, "--rounds", str(args.rounds),
           "--steps-per-round", str(args.steps_per_round), "--warmup", str(args.warmup),
           "--global-batch", str(args.global_batch), "--device", args.device, "--size", args.size]
    if bootstrap:
        cmd += ["--bootstrap", bootstrap]
    try:
        subprocess.run(cmd, check=True)
    finally:
        if broker is not None:
            broker.stop()
    with open(out) as fh:
        res = json.load(fh)
    result = summarize(res, sink=args.sink, load_before=load_before, load_after=os.getloadavg())
    print_table(result)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
