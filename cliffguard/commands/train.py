"""``cliffguard train``: the bundled GPT trainer under torchrun, with the agent attached.

Settings: ``--config FILE.toml`` < ``CLIFFGUARD_<SECTION>__<FIELD>`` env < flags, by the one
resolver (``cliffguard/config.py``): the deployment's ``[kafka]``, ``[spike]`` (the guard uses its
``guard_budget``), ``[policy]`` and command secret, and the trainer's ``[train]`` (the loop),
``[model]``, ``[data]``, ``[checkpoint]``, ``[agent]`` (with ``[agent.guard]``, ``[agent.hist]``).
The resolved configuration is saved to ``<out-dir>/<run>/config.json`` and every worker reads
that file.

Broker: ``--bootstrap HOST:PORT`` streams to an existing Kafka cluster; without it an embedded
broker (Tansu) is started for the run's lifetime and its address printed, so a controller can
be pointed at it. ``--no-monitor`` runs without any stream.

Keys (``core/deployment.py``): the workers get the command *public* key (or, without Ed25519
keys, the HMAC secret ``CLIFFGUARD_COMMAND_SECRET``) and their run's event key, derived here from
the agent secret; never the private key or the agent secret itself. Without a command key the
trainer does not listen for commands. Keys reach the workers through their environment, never
through the command line or the saved config.

Launch: ``python -m torch.distributed.run --standalone --nproc_per_node N -m trainer.run``.
Elastic (``--nnodes MIN:MAX``): torchrun's elastic agent with a c10d rendezvous at
``--rdzv-endpoint`` (id: the run id, so give every node the same ``--run``), ``--max-restarts``
and a rendezvous join timeout; the workers resume from the newest checkpoint at whatever world
the rendezvous formed and rescale the batch and LR by ``[train.elastic]`` (trainer/elastic.py).
On CPUs this is the way to get N processes (``accelerate launch --cpu --num_processes N``
starts only one); each process uses ``--threads`` torch threads and the gloo backend.

Preemption (``[agent.preemption]``, agent/recovery/preemption.py): torchrun is told to forward the
warning signals to the workers (``PET_SIGNALS_TO_HANDLE``) and to wait ``deadline_s`` + 10 s for
them before SIGKILL (``PET_SHUTDOWN_TIMEOUT``); a warning that reaches this launcher alone is
passed to the workers (cliffguard/signals.py). When the workers saved and exited for a
preemption, this command exits with ``exit_code`` (75 by default: the shipped slurm.conf's
``RequeueExit``), whatever torchrun's own status. In an elastic launch only the warned node leaves
(cliffguard/node_leave.py): every rank saves, this node's workers are stopped once they saved, and
the other nodes re-form the group without it and go on; a SIGTERM that torchrun's agent sends on a
membership change saves too but is no preemption (agent/recovery/preempt_leave.py).

Admission (``[train.admission]``, cliffguard/admission.py): before torchrun starts, and so before
this node joins the rendezvous, the launcher reads the suspect-node list the controller publishes
(``<prefix>.suspects``) within ``timeout_s`` (5 s); a node the list holds suspect is not started:
one line names it, the cause, the reason and ``cliffguard nodes clear``, and the command exits 77
(``core/admission.py`` ``REFUSED_EXIT``). A broker that cannot be reached, a read past the timeout
or no key to verify the list with: the launch goes on, said loudly (fail-open), and the controller
still refuses the node at its first heartbeat. ``--no-admission-check`` skips it; a launch with its
own embedded broker has no list to read. An admitted node whose device slots the list records
suspect (a device-level eviction's record) starts without them: one process fewer each, the slots
kept in ``CLIFFGUARD_DEVICE_SLOTS`` and ``CUDA_VISIBLE_DEVICES``, one WARNING line naming them;
with every slot recorded it is refused (77).

Hangs (agent/hang/): every process group times out after ``--collective-timeout-s``; with
``--max-restarts`` N torchrun may restart the worker group, which is how the controller's
``restart`` command takes effect (from the newest disk checkpoint). The launcher watches the job's
restart plan (cliffguard/plan_watch.py, beside the checkpoints) and stops its torchrun agent when
the controller leaves this node (``--node-id``) out or halts the job. When it leaves one device of
this node out (a device-level eviction), the launcher starts torchrun again with one process fewer
and remembers the slots still in (``CLIFFGUARD_DEVICE_SLOTS``, and ``CUDA_VISIBLE_DEVICES`` narrowed
to them), so the evicted device stays out for the rest of this launch.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from cliffguard import plan_watch
from cliffguard.agent.recovery.preemption import PreemptionConfig
from cliffguard.core.admission import REFUSED_EXIT, devices_line
from cliffguard.core.deployment import EVENT_KEY_ENV, PUBLIC_KEY_ENV, SECRET_ENV, DeploymentConfig, scrub_keys
from cliffguard.core.restart_plan import MIN_NODES_ENV, NODE_ENV, SLOTS_ENV, node_id
from cliffguard.core.settings import ConfigError
from cliffguard.node_leave import NodeLeave
from cliffguard.signals import WarningForwarder
from cliffguard.trainer.record import RECORD_NAME, last_end

if TYPE_CHECKING:
    from cliffguard.trainer.config import TrainConfig

SASL_PASSWORD_ENV = "CLIFFGUARD_KAFKA__SASL_PLAIN_PASSWORD"


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train", help="launch the bundled GPT trainer under torchrun with the agent attached",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML file with [train] [model] [data] [checkpoint] [agent] [kafka] [spike] "
                                    "[policy] [secrets] sections")
    p.add_argument("--nproc", type=int, default=2, help="processes (ranks) to start on this machine (default 2)")
    p.add_argument("--run", help="run id (default run-<date>-<time>-<random>)")
    p.add_argument("--out-dir", help="root of run directories (default runs/)")
    g = p.add_argument_group("broker")
    g.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT[,...]; default: start an embedded broker")
    g.add_argument("--topic-prefix", help="Kafka topic prefix (default cliffguard)")
    g.add_argument("--broker-port", type=int, default=0, help="port of the embedded broker (default: a free one)")
    g.add_argument("--no-monitor", action="store_true", help="no event stream and no commands (a plain run)")
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, help="optimizer steps (default 300)")
    g.add_argument("--global-batch", type=int, help="sequences per optimizer step over all ranks (default 16)")
    g.add_argument("--grad-accum", type=int, help="micro-batches per step on each rank (default 1)")
    g.add_argument("--lr", type=float, help="peak learning rate (default 3e-3)")
    g.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default 3e-4)")
    g.add_argument("--warmup-steps", type=int, help="linear warmup steps (default 20)")
    g.add_argument("--bf16", action="store_true", default=None, help="bf16 autocast for forward/backward")
    g.add_argument("--seed", type=int, help="model init / torch RNG seed (default 1337)")
    g.add_argument("--val-every", type=int, help="periodic validation every N steps (default 50; 0 = off)")
    g.add_argument("--loss-scaling", action="store_true", default=None, help="adaptive loss scaling with skip-on-overflow (fp16-style)")
    g.add_argument("--clip-layer-norm", type=float, help="per-layer gradient clipping threshold (default 0 = off)")
    g.add_argument("--progress-every", type=int, help="progress line every N steps (default 10)")
    g.add_argument("--threads", type=int, help="torch threads per process on CPU (default 1)")
    g.add_argument("--resume", action="store_true", default=None, help="start from the newest usable disk checkpoint")
    g.add_argument("--fault", action="append", dest="faults", metavar="SPEC",
                   help="inject a fault (repeatable): lr_blowup@S xF:N, corrupt@S, nan@S, slow_rank@R:SEC, "
                        "kill_rank@R:S, broker_outage@S:N")
    g = p.add_argument_group("elastic (torchrun's elastic agent)")
    g.add_argument("--nnodes", help="MIN:MAX nodes (agents) of an elastic run, e.g. 1:2; each node runs --nproc ranks")
    g.add_argument("--rdzv-endpoint", default="127.0.0.1:29400",
                   help="c10d rendezvous HOST:PORT, the same on every node (default 127.0.0.1:29400)")
    g.add_argument("--max-restarts", type=int,
                   help="worker-group restarts torchrun allows (elastic: default [train.elastic] max_restarts, 10; "
                        "one node: default 0); a hang's restart needs at least 1")
    g.add_argument("--node-id", help="this node's id in hang evidence and restart plans (default "
                                     "CLIFFGUARD_NODE_ID, else the host name): distinct per launch of an elastic run")
    g.add_argument("--rdzv-last-call-s", type=int, default=30,
                   help="after the fewest nodes joined, wait this long for more before the rendezvous closes (default 30)")
    g.add_argument("--rdzv-timeout-s", type=float, help="rendezvous join timeout: no quorum by then ends the launch (default 120)")
    g.add_argument("--rdzv-client", action="store_true",
                   help="only join the rendezvous store at --rdzv-endpoint, never host it (is_host=false): a process "
                        "that outlives every node's job hosts it, so any node may be preempted (demo --preemption)")
    g.add_argument("--batch-policy", choices=["halve", "keep", "proportional"],
                   help="global batch on another world (default proportional)")
    g.add_argument("--lr-rule", choices=["sqrt", "linear", "none"], help="LR factor for the new batch (default sqrt)")
    g.add_argument("--base-world", type=int,
                   help="[train.elastic] base_world: the whole job's world the global batch is declared for, the "
                        "same on every node (default --nproc x MAX nodes; give it when nodes run different --nproc)")
    g.add_argument("--no-admission-check", action="store_true",
                   help="start without reading the suspect-node list first ([train.admission] enabled = false); "
                        "the controller still refuses a suspect node at its first heartbeat")
    g.add_argument("--admission-timeout-s", type=float,
                   help="[train.admission] timeout_s: the suspect-node list's read may take this long, then the "
                        "launch goes on unchecked (default 5)")
    g.add_argument("--collective-timeout-s", type=float,
                   help="[agent.hang] collective_timeout_s: a dead or stuck peer fails a collective after this (default 30)")
    g.add_argument("--hang-dump-after-s", type=float,
                   help="[agent.hang] dump_after_s: a rank without a step this long dumps its evidence (default 8)")
    g = p.add_argument_group("model and data")
    g.add_argument("--n-layer", type=int, help="transformer blocks (default 4)")
    g.add_argument("--n-head", type=int, help="attention heads (default 4)")
    g.add_argument("--n-embd", type=int, help="width (default 128)")
    g.add_argument("--seq-len", type=int, help="tokens per sequence; also the model's context (default 64)")
    g.add_argument("--data", action="append", dest="data_paths", metavar="PATH",
                   help="text file or directory (repeatable); default: the standard library's sources")
    g.add_argument("--max-bytes", type=int, help="read at most this many bytes of text (default 8 MB)")
    g = p.add_argument_group("checkpoints")
    g.add_argument("--snapshot-every", type=int, help="in-memory snapshot every N steps (default 10)")
    g.add_argument("--ckpt-every", type=int, help="incremental disk checkpoint every N steps (default 100)")
    g.add_argument("--full-every", type=int, help="full disk checkpoint every N steps (default 300)")
    g = p.add_argument_group("agent")
    g.add_argument("--hist-every", type=int, help="gradient histograms every N steps (default 100; 0 = off)")
    g.add_argument("--heartbeat-s", type=float, help="seconds between heartbeats of each rank (default 5)")
    g.add_argument("--peak-flops", type=float, help="peak FLOP/s per device for MFU (default: table or calibration)")
    g.add_argument("--guard-off", action="store_true", help="the guard reports but never skips an update")
    g.add_argument("--hold-timeout-s", type=float, help="guard hold: seconds to wait for the controller (default 120)")
    g.add_argument("--on-timeout", choices=["rollback", "resume", "stop"],
                   help="guard hold past the timeout: roll back locally with the [policy] LR cut (default), "
                        "resume, or stop")
    return p


def default_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"


def build_train_config(args: argparse.Namespace, *, bootstrap: str | None, env: Mapping[str, str] | None = None):
    """The deployment config and the TrainConfig tree built with it, from TOML < env < flags
    (raises ConfigError naming field and source)."""
    import dataclasses

    from cliffguard.config import build_section, load_deployment, read_toml

    env = os.environ if env is None else env
    toml = read_toml(args.config)
    source = str(args.config or "config file")
    deployment = load_deployment(args.config, toml=toml, env=env,
                                 flags={"kafka": {"bootstrap": bootstrap, "topic_prefix": args.topic_prefix}})

    def section(name: str, flags: dict):
        return build_section(name, deployment, toml=toml, env=env, flags=flags, toml_source=source)

    train_flags = {
        "steps": args.steps, "global_batch": args.global_batch, "grad_accum": args.grad_accum, "lr": args.lr,
        "min_lr": args.min_lr, "warmup_steps": args.warmup_steps, "bf16": args.bf16, "seed": args.seed,
        "val_every": args.val_every, "clip_layer_norm": args.clip_layer_norm, "loss_scaling": args.loss_scaling,
        "progress_every": args.progress_every, "threads": args.threads, "resume": args.resume,
        "faults": args.faults, "run": args.run, "out_dir": args.out_dir,
        "admission": {"enabled": False if getattr(args, "no_admission_check", False) else None,
                      "timeout_s": getattr(args, "admission_timeout_s", None)},
    }
    nodes = getattr(args, "nnodes", None)
    if nodes:
        _min_nodes, max_nodes = parse_nnodes(nodes)
        train_flags["resume"] = True  # every restart of the worker group resumes from the newest checkpoint
        # a declared base world (flag, file, env) wins; else every node derives the same one from its own
        # --nproc, which is only right when every node runs as many processes
        declared = (((toml.get("train") or {}).get("elastic") or {}).get("base_world")
                    or env.get("CLIFFGUARD_TRAIN__ELASTIC__BASE_WORLD"))
        base_world = getattr(args, "base_world", None) or (None if declared else args.nproc * max_nodes)
        train_flags["elastic"] = {
            "enabled": True, "base_world": base_world, "max_restarts": args.max_restarts,
            "rdzv_timeout_s": args.rdzv_timeout_s, "batch_policy": args.batch_policy, "lr_rule": args.lr_rule}
    base = section("train", train_flags)
    run = args.run or ((toml.get("train") or {}).get("run")) or env.get("CLIFFGUARD_TRAIN__RUN") or default_run_id()
    model = section("model", {"n_layer": args.n_layer, "n_head": args.n_head, "n_embd": args.n_embd,
                              "block_size": args.seq_len})
    data = section("data", {"seq_len": args.seq_len, "paths": args.data_paths, "max_bytes": args.max_bytes})
    # every path the workers get is absolute: they need not run where this command was typed
    data = dataclasses.replace(data, paths=[str(Path(p).resolve()) for p in data.paths])
    out_dir = Path(base.out_dir).resolve()
    run_dir = out_dir / run
    ckpt = section("checkpoint", {
        "dir": ((toml.get("checkpoint") or {}).get("dir")) or str(run_dir / "checkpoints"),
        "snapshot_every": args.snapshot_every, "ckpt_every": args.ckpt_every, "full_every": args.full_every})
    ckpt = dataclasses.replace(ckpt, dir=str(Path(ckpt.dir).resolve()))
    guard_flags = {"hold_timeout_s": args.hold_timeout_s, "on_timeout": args.on_timeout,
                   "enabled": False if args.guard_off else None}
    plan_set = ((toml.get("agent") or {}).get("hang") or {}).get("plan_dir") or env.get("CLIFFGUARD_AGENT__HANG__PLAN_DIR")
    hang_flags = {"collective_timeout_s": args.collective_timeout_s, "dump_after_s": args.hang_dump_after_s,
                  "plan_dir": None if plan_set else str(Path(ckpt.dir).resolve())}  # one directory for the job
    agent = section("agent", {"run": run, "hist_every": args.hist_every, "heartbeat_s": args.heartbeat_s,
                              "peak_flops": args.peak_flops, "guard": guard_flags, "hang": hang_flags})
    if agent.spill_dir:
        agent = dataclasses.replace(agent, spill_dir=str(Path(agent.spill_dir).resolve()))
    kafka = None if args.no_monitor else deployment.kafka
    cfg = dataclasses.replace(base, run=run, out_dir=str(out_dir), model=model, data=data, checkpoint=ckpt, agent=agent,
                              kafka=kafka)
    return deployment, cfg


def worker_env(deployment: DeploymentConfig, cfg: TrainConfig, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The workers' environment: the secrets the saved config masks travel here, never in argv."""
    out = dict(os.environ if env is None else env)
    if cfg.kafka is not None and cfg.kafka.sasl_plain_password is not None:
        out[SASL_PASSWORD_ENV] = cfg.kafka.sasl_plain_password
    out = scrub_keys(out)
    if deployment.public_key is not None:
        out[PUBLIC_KEY_ENV] = deployment.public_key.pem().decode()
    elif deployment.secret is not None:
        out[SECRET_ENV] = deployment.secret.reveal().decode()
    run_key = deployment.event_key_for(cfg.run)
    if run_key is not None:
        out[EVENT_KEY_ENV] = run_key.hex()
    return out


def parse_nnodes(value: str) -> tuple[int, int]:
    """``MIN:MAX`` (or ``N``) nodes; ValueError naming the flag."""
    try:
        lo, _, hi = value.partition(":")
        lo_n, hi_n = int(lo), int(hi or lo)
    except ValueError:
        raise ValueError(f"--nnodes: {value!r} is not MIN:MAX") from None
    if not 1 <= lo_n <= hi_n:
        raise ValueError(f"--nnodes: need 1 <= MIN <= MAX, got {value!r}")
    return lo_n, hi_n


def torchrun_command(nproc: int, config_path: str | Path, *, nnodes: str | None = None, rdzv_endpoint: str = "",
                     rdzv_id: str = "", max_restarts: int = 0, rdzv_timeout_s: float = 120.0,
                     last_call_s: int = 30, rdzv_client: bool = False) -> list[str]:
    if not nnodes:
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                f"--max_restarts={max_restarts}", "-m", "cliffguard.trainer.run", "--config", str(config_path)]
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            "--rdzv_backend=c10d", f"--rdzv_endpoint={rdzv_endpoint}", f"--rdzv_id={rdzv_id}",
            f"--max_restarts={max_restarts}",
            f"--rdzv_conf=join_timeout={int(rdzv_timeout_s)},last_call_timeout={last_call_s}"
            + (",is_host=false" if rdzv_client else ""),
            "-m", "cliffguard.trainer.run", "--config", str(config_path)]


def slot_env(slots: tuple[int, ...], parent: Mapping[str, str]) -> dict[str, str]:
    """The workers' device list after a device-level eviction: ``SLOTS_ENV`` (the slot of each local
    rank: the fault-pinned device stays out, and the heartbeats name slots) and, on GPU,
    ``CUDA_VISIBLE_DEVICES`` narrowed to those slots (through the launcher's own list when it has one)."""
    visible = [d.strip() for d in parent.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    devices = [visible[x] if x < len(visible) else str(x) for x in slots] if visible else [str(x) for x in slots]
    return {SLOTS_ENV: ",".join(map(str, slots)), "CUDA_VISIBLE_DEVICES": ",".join(devices)}


def preemption_env(preemption: PreemptionConfig) -> dict[str, str]:
    """torchrun's settings (its ``PET_*`` environment) for a preemption: forward the warning signals
    to the workers, and give them the deadline (plus the exit's margin) before SIGKILL."""
    handled = ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"]
    handled += [s for s in preemption.signals if s not in handled]
    return {"PET_SIGNALS_TO_HANDLE": ",".join(handled),
            "PET_SHUTDOWN_TIMEOUT": str(math.ceil(preemption.deadline_s) + 10)}


def _admission(cfg: TrainConfig, node: str, deployment: DeploymentConfig,
               slots: tuple[int, ...]) -> tuple[int | None, tuple[int, ...]]:
    """The suspect-node list's word on this node before it joins (cliffguard/admission.py): the
    refusal's exit code, or None to go on (admitted, or unchecked: fail-open), and the device slots
    to start on: ``slots`` less those the list records suspect (none left: refused)."""
    from cliffguard import admission

    assert cfg.kafka is not None
    found = admission.check(cfg.kafka, node, deployment.verifying_key(), cfg.admission.timeout_s)
    for line in found.lines:
        print(line, file=sys.stderr, flush=True)
    if found.refused:
        return REFUSED_EXIT, ()
    if found.verdict is None:
        return None, slots
    kept = found.kept_slots(slots)
    if found.verdict.devices_out:
        print(devices_line(found.verdict, kept), file=sys.stderr, flush=True)
        if not kept:
            return REFUSED_EXIT, ()
    print(f"node {node} admitted by the suspect-node list ({found.board.records if found.board else 0} entries, "
          f"{found.seconds * 1000:.0f} ms)", flush=True)
    return None, kept


def _tick(proc: subprocess.Popen[bytes], forwarder: WarningForwarder, leave: NodeLeave | None) -> None:
    forwarder.forward_pending(proc.pid)
    if leave is not None:
        leave.tick(proc)


def _wait(proc: subprocess.Popen[bytes], forwarder: WarningForwarder | None, plan_dir: str, node: str,
          since: float, leave: NodeLeave | None = None) -> plan_watch.Outcome:
    """torchrun's outcome: it stops this node's agent when the job's restart plan says so
    (cliffguard/plan_watch.py); meanwhile each warning this process got is passed to the workers."""
    if forwarder is not None:
        forwarder.install()
    try:
        return plan_watch.wait(proc, plan_dir, node, since=since,
                               tick=(lambda: _tick(proc, forwarder, leave)) if forwarder is not None else None)
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # torchrun forwards it to the workers
        return plan_watch.Outcome(proc.wait())
    finally:
        if forwarder is not None:
            forwarder.uninstall()


def run(args: argparse.Namespace) -> int:
    if args.nproc < 1:
        print("cliffguard train: --nproc: must be >= 1", file=sys.stderr)
        return 2
    broker = None
    bootstrap = args.bootstrap
    try:
        if bootstrap is None and not args.no_monitor:
            from cliffguard.controller.broker import EmbeddedBroker, free_port

            broker = EmbeddedBroker(port=args.broker_port or free_port()).start()
            bootstrap = broker.bootstrap
            print(f"embedded broker on {bootstrap} (point the controller here: --bootstrap {bootstrap})", flush=True)
        try:
            if args.nnodes and not args.run:
                raise ValueError("--run: an elastic run needs the same explicit run id on every node")
            deployment, cfg = build_train_config(args, bootstrap=bootstrap)
            if not args.nnodes:
                cfg.micro_batch(args.nproc)
        except (ConfigError, ValueError) as exc:
            print(f"cliffguard train: {exc}", file=sys.stderr)
            return 2
        if cfg.kafka is not None:
            from cliffguard.controller.broker import ensure_topics
            from cliffguard.core.kafka_producers import tcp_reachable

            if broker is not None or tcp_reachable(cfg.kafka):
                ensure_topics(cfg.kafka)
            else:  # the agent spills until the broker is back: a monitoring outage does not stop training
                print(f"cliffguard train: WARNING: no broker of {cfg.kafka.bootstrap} accepts connections; "
                      "starting anyway (the agent keeps the events until it is back)", file=sys.stderr, flush=True)
        config_path = cfg.run_dir / "config.json"
        cfg.save(config_path)
        env = worker_env(deployment, cfg)
        if deployment.verifying_key() is None and cfg.kafka is not None:
            print(f"cliffguard train: no {PUBLIC_KEY_ENV}[_FILE] (or {SECRET_ENV}): the run will not accept commands",
                  file=sys.stderr)
        print(f"run {cfg.run}: {args.nproc} process(es), config {config_path}", flush=True)
        e = cfg.elastic
        restarts = args.max_restarts if args.max_restarts is not None else (e.max_restarts if args.nnodes else 0)
        node = args.node_id or node_id(env)
        env[NODE_ENV] = node
        slots = tuple(range(args.nproc))  # this node's device slots in the job
        if cfg.kafka is not None and broker is None and cfg.admission.enabled:
            refused, admitted = _admission(cfg, node, deployment, slots)
            if refused is not None:
                return refused
            if admitted != slots:  # device slots recorded suspect: this launch starts without them
                if not args.nnodes:
                    try:
                        cfg.micro_batch(len(admitted))
                    except ValueError as exc:
                        print(f"cliffguard train: {exc} (device slot(s) left out by the suspect-node list)",
                              file=sys.stderr)
                        return 2
                slots = admitted
                env.update(slot_env(slots, os.environ))
        if args.nnodes or restarts:
            # Workers of each restart keep a TCPStore of their own: on the agent's shared store, a
            # restarted world (smaller, or the same after a hang) found the dead world's gloo
            # addresses and failed to connect ("Gloo connectFullMesh failed ... Connection refused").
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        if args.nnodes:
            env[MIN_NODES_ENV] = str(parse_nnodes(args.nnodes)[0])
        preemption = cfg.agent.preemption
        forwarder = WarningForwarder(preemption.signals) if preemption.enabled else None
        if forwarder is not None:
            env.update(preemption_env(preemption))
        plan_dir = cfg.agent.hang.plan_dir
        since = time.time()
        plan_watch.start_fresh(plan_dir)
        # elastic: on the scheduler's warning this node alone leaves, the others go on (cliffguard/node_leave.py)
        leave = NodeLeave(plan_dir, node, preemption.deadline_s) if forwarder is not None and args.nnodes else None
        if leave is not None and forwarder is not None:
            forwarder.on_warning = leave.warned
        while True:
            proc = subprocess.Popen(torchrun_command(len(slots), config_path, nnodes=args.nnodes,
                                                     rdzv_endpoint=args.rdzv_endpoint, rdzv_id=cfg.run,
                                                     max_restarts=restarts, rdzv_timeout_s=e.rdzv_timeout_s,
                                                     last_call_s=args.rdzv_last_call_s,
                                                     rdzv_client=args.rdzv_client),
                                    env=env)
            out = _wait(proc, forwarder, plan_dir, node, since, leave)
            kept = tuple(x for x in slots if x not in out.devices)
            if not out.devices or not kept or (leave is not None and leave.left):
                break
            # a device-level eviction: this node stays, its torchrun agent started again without the device
            print(f"cliffguard train: {out.message(node, keeps=len(kept))}; starting torchrun again with "
                  f"{len(kept)} process(es) on device slot(s) {', '.join(map(str, kept))}", file=sys.stderr, flush=True)
            slots, since = kept, time.time()
            env.update(slot_env(slots, os.environ))
        code = out.code
        if leave is not None and leave.left:
            print(f"cliffguard train: node {node} left run {cfg.run} on the scheduler's warning "
                  f"({'after its workers saved' if leave.saved else 'WITHOUT a save: the deadline passed'}); nodes "
                  f"that were not warned go on without it; exit {preemption.exit_code} (requeue: it rejoins when "
                  "it starts again)", flush=True)
            return preemption.exit_code
        if out.plan is not None:
            print(f"cliffguard train: {out.message(node, keeps=0) if out.devices else out.message(node)}",
                  file=sys.stderr)
            return code
        end = last_end(cfg.run_dir / RECORD_NAME, since=since)
        if forwarder is not None and end is not None and end.get("stop_reason") == "preempted":
            saved = end.get("preempted") if isinstance(end.get("preempted"), dict) else {}
            save_s = saved.get("save_s")
            took = f"{save_s:.2f} s" if isinstance(save_s, (int, float)) else "? s"
            print(f"cliffguard train: run {cfg.run} saved at step {end.get('step')} for a preemption "
                  f"({saved.get('signal', '?')}: {took} of {preemption.deadline_s:g} s, verified "
                  f"{saved.get('verified')}); exit {preemption.exit_code} (requeue; --resume continues there)",
                  flush=True)
            return preemption.exit_code
        if code and args.nnodes:
            print(f"cliffguard train: the elastic launch ended with exit {code}: the workers failed more than "
                  f"--max-restarts ({e.max_restarts}) times, or no rendezvous of {args.nnodes} nodes at "
                  f"{args.rdzv_endpoint} completed within {e.rdzv_timeout_s:.0f} s", file=sys.stderr)
        return code
    finally:
        if broker is not None:
            broker.stop()
