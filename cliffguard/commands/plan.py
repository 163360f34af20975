"""``cliffguard plan``: search tensor/pipeline/data-parallel layouts, ZeRO stages, recomputation
and micro-batch sizes for a model on a cluster; print the fitting ones ranked by tokens/s."""

from __future__ import annotations

import argparse
import json
import sys

from cliffguard.commands.json_stdout import emit

SHAPE_FLAGS = ("layers", "hidden", "heads")


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("plan", help="search parallelism layouts with a memory and step-time estimate",
                       description=__doc__)
    shape = p.add_argument_group("model (either --params, or --layers/--hidden/--heads)")
    shape.add_argument("--params", type=float, help="parameter count, e.g. 175e9 (GPT-3 proportions assumed)")
    shape.add_argument("--layers", type=int)
    shape.add_argument("--hidden", type=int)
    shape.add_argument("--heads", type=int)
    shape.add_argument("--vocab", type=int, default=51200, help="vocabulary size (default 51200)")
    shape.add_argument("--seq", type=int, default=2048, help="sequence length (default 2048)")
    hw = p.add_argument_group("cluster")
    hw.add_argument("--gpus", type=int, required=True, help="GPUs in the job")
    hw.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node; TP stays inside a node (default 8)")
    hw.add_argument("--gpu-mem-gb", type=float, required=True, help="memory per GPU in GiB, e.g. 80")
    hw.add_argument("--peak-tflops", type=float, default=312.0,
                    help="dense 16-bit peak per GPU (default 312, A100; H100 SXM is 989)")
    hw.add_argument("--mfu", type=float, default=0.5,
                    help="fraction of peak the matmuls reach while computing, before bubble and communication "
                         "(default 0.5: with those added, A100 estimates land near the 44-52%% end to end that "
                         "Narayanan et al. 2021 measured)")
    hw.add_argument("--intra-gbps", type=float, default=300.0,
                    help="intra-node bandwidth per GPU, GB/s (gigabytes) one way (default 300, NVLink 3)")
    hw.add_argument("--inter-gbps", type=float, default=25.0,
                    help="inter-node bandwidth per GPU, GB/s (gigabytes) one way (default 25, 200 Gb/s InfiniBand)")
    p.add_argument("--global-batch", type=int, default=1536, help="sequences per optimizer step (default 1536)")
    p.add_argument("--top", type=int, default=10, help="how many layouts to print (default 10)")
    p.add_argument("--json", action="store_true", help="print one JSON object {\"configs\": [...]} on stdout")
    return p


def _fail(message: str) -> int:
    """Print ``field: reason`` as ``--flag: reason`` (the config dataclasses name their fields)."""
    field, sep, reason = message.partition(": ")
    if sep and field.replace("_", "").isalnum():
        message = f"--{field.replace('_', '-')}: {reason}"
    print(f"cliffguard plan: {message}", file=sys.stderr)
    return 2


def _model(args: argparse.Namespace):
    from cliffguard.plan.model import ModelShape

    given = [f for f in SHAPE_FLAGS if getattr(args, f) is not None]
    if args.params is not None and given:
        raise ValueError(f"params: give --params or --{'/--'.join(SHAPE_FLAGS)}, not both")
    if args.params is not None:
        return ModelShape.from_params(args.params, vocab=args.vocab, seq=args.seq)
    if len(given) != len(SHAPE_FLAGS):
        missing = [f for f in SHAPE_FLAGS if f not in given]
        raise ValueError(f"{missing[0]}: missing; give --params or all of --{', --'.join(SHAPE_FLAGS)}")
    return ModelShape(args.layers, args.hidden, args.heads, args.vocab, args.seq)


def _table(configs: list[dict]) -> str:
    head = f"{'tp':>3} {'pp':>3} {'dp':>5} {'zero':>4} {'recompute':>9} {'mb':>3} {'mem GiB':>8} {'tokens/s':>11} {'TFLOP/s':>8} {'MFU':>5}"
    rows = [head] + [
        f"{c['tp']:>3} {c['pp']:>3} {c['dp']:>5} {c['zero']:>4} {c['recompute']:>9} {c['micro_batch']:>3} "
        f"{c['memory_gb_per_device']:>8.1f} {c['tokens_per_s']:>11,.0f} {c['tflops_per_gpu']:>8.1f} {c['mfu']:>5.1%}"
        for c in configs]
    return "\n".join(rows)


def run(args: argparse.Namespace) -> int:
    from cliffguard.plan.layout import Cluster
    from cliffguard.plan.search import search

    try:
        if args.top <= 0:
            raise ValueError(f"top: must be positive, got {args.top}")
        if args.global_batch <= 0:
            raise ValueError(f"global_batch: must be positive, got {args.global_batch}")
        model = _model(args)
        cluster = Cluster(gpus=args.gpus, gpu_mem_gb=args.gpu_mem_gb, gpus_per_node=args.gpus_per_node,
                          peak_tflops=args.peak_tflops, mfu=args.mfu, intra_gbps=args.intra_gbps,
                          inter_gbps=args.inter_gbps)
    except ValueError as exc:
        return _fail(str(exc))

    def progress(n: int) -> None:
        print(f"plan: {n} layouts evaluated", file=sys.stderr, flush=True)

    print(f"plan: {model.params / 1e9:.1f}B parameters ({model.layers} layers, hidden {model.hidden}, "
          f"{model.heads} heads), {cluster.gpus} GPUs", file=sys.stderr)
    result = search(model, cluster, args.global_batch, progress=progress)
    reasons = ", ".join(f"{k}: {v}" for k, v in sorted(result.rejected.items()))
    print(f"plan: {result.evaluated} layouts evaluated, {len(result.plans)} fit; rejected: {reasons or 'none'}",
          file=sys.stderr)
    if not result.plans:
        return _fail(f"gpu_mem_gb: no layout fits in {cluster.gpu_mem_gb} GiB per GPU on {cluster.gpus} GPUs "
                     f"(rejected: {reasons or 'no layout divides the model and batch'})")
    configs = [p.to_dict() for p in result.plans[: args.top]]
    if args.json:
        emit(json.dumps({"configs": configs}))
    else:
        print(_table(configs))
    return 0
