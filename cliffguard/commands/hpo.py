"""``cliffguard hpo``: Bayesian hyperparameter search (Optuna TPE + median pruning) on the bundled trainer.

Objective: the validation-loss drop over ``--window`` steps from one common starting checkpoint
(made once by a ``--warmup``-step run). Each trial is a monitored run ``<study>-t<N>`` of the
bundled trainer in this process (one CPU process) with its own lr, global batch and Adam betas;
a diverged trial (non-finite loss, a critical of the deployment's ``[spike]`` rule, or a loss far
above the start) is pruned, never counted. With ``--bootstrap`` the trials' events go to Kafka,
so the controller and the dashboard see every trial.

Storage: ``--storage URL``; else beside the controller's store ``--db`` (SQLite: ``optuna.db``
in the same directory; PostgreSQL: the same database, schema ``optuna``); else
``<out-dir>/optuna.db``. The study is loaded if it exists: rerun to add trials, or run several
workers on one ``--study``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from cliffguard.commands.json_stdout import emit
from cliffguard.core.settings import ConfigError


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("hpo", help="Bayesian hyperparameter search (Optuna) on validation-loss windows",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8, help="trials to run in this invocation (default 8)")
    p.add_argument("--window", type=int, default=3000, help="steps per trial from the common start (default 3000)")
    p.add_argument("--warmup", type=int, default=50, help="steps of the warm-up run making the start (default 50)")
    p.add_argument("--report-every", type=int, default=0, help="validation reported to the pruner every N steps "
                                                                "(default window/4)")
    p.add_argument("--study", default="hpo", help="study name; also the prefix of the trials' run ids (default hpo)")
    p.add_argument("--storage", help="Optuna storage URL (sqlite:///... or postgresql://...)")
    p.add_argument("--db", help="the controller's store URL: the study goes beside it, in its own file or schema")
    p.add_argument("--seed", type=int, default=None, help="TPE sampler seed (default: random)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (progress stays on stderr)")
    p.add_argument("--out-dir", default="runs", help="root of the trials' run directories (default runs/)")
    p.add_argument("--config", help="TOML file: its [kafka] and [spike] sections are used")
    p.add_argument("--bootstrap", help="Kafka bootstrap HOST:PORT: stream the trials' events (default: in memory)")
    p.add_argument("--fault", action="append", dest="faults", metavar="TRIAL:SPEC", default=[],
                   help="inject a trainer fault into one trial (repeatable), e.g. 3:lr_blowup@5x1000:10 "
                        "(trainer/faults.py specs): to see a diverged trial pruned")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    g = p.add_argument_group("model and data (tiny defaults for CPU)")
    g.add_argument("--n-layer", type=int, default=2)
    g.add_argument("--n-head", type=int, default=2)
    g.add_argument("--n-embd", type=int, default=64)
    g.add_argument("--seq-len", type=int, default=64)
    g.add_argument("--max-bytes", type=int, default=1_000_000, help="corpus bytes read (default 1 MB)")
    g.add_argument("--data", action="append", dest="data_paths", metavar="PATH", help="text file or directory")
    return p


def _fail(msg: str) -> int:
    print(f"cliffguard hpo: {msg}", file=sys.stderr)
    return 2


def build_config(args: argparse.Namespace):
    """(HpoConfig, storage URL); ValueError/ConfigError naming the option."""
    from cliffguard.config import load_deployment
    from cliffguard.hpo.objective import HpoConfig
    from cliffguard.hpo.storage import study_storage
    from cliffguard.trainer.data import DataConfig
    from cliffguard.trainer.faults import FaultSpec
    from cliffguard.trainer.model import GPTConfig

    if args.trials < 1:
        raise ValueError("--trials: must be >= 1")
    faults: dict[int, list[str]] = {}
    for item in args.faults:
        number, sep, spec = item.partition(":")
        if not sep or not number.isdigit():
            raise ValueError(f"--fault: {item!r} is not TRIAL:SPEC (e.g. 3:lr_blowup@5x1000:10)")
        try:
            FaultSpec.parse(spec)
        except ValueError as exc:
            raise ValueError(f"--fault: {exc}") from None
        faults.setdefault(int(number), []).append(spec)
    url = study_storage(args.storage, args.db, args.out_dir)
    deployment = load_deployment(args.config, flags={"kafka": {"bootstrap": args.bootstrap}})
    try:
        model = GPTConfig(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, block_size=args.seq_len)
        data = DataConfig(seq_len=args.seq_len, max_bytes=args.max_bytes, paths=args.data_paths or [])
    except ValueError as exc:
        raise ValueError(f"model/data options: {exc}") from None
    try:
        cfg = HpoConfig(study=args.study, window=args.window, warmup=args.warmup, report_every=args.report_every,
                        seed=1337, threads=args.threads, out_dir=args.out_dir, model=model, data=data,
                        spike=deployment.spike, kafka=deployment.kafka if args.bootstrap else None, faults=faults)
    except ValueError as exc:  # HpoConfig names its field ("window: ..."): name the option instead
        field, _, reason = str(exc).partition(":")
        raise ValueError(f"--{field.strip().replace('_', '-')}:{reason}") from None
    return cfg, url


def run(args: argparse.Namespace) -> int:
    try:
        cfg, url = build_config(args)
    except (ConfigError, ValueError) as exc:
        return _fail(str(exc))
    from cliffguard.controller.store.db import masked_url
    from cliffguard.hpo.objective import StartMismatch
    from cliffguard.hpo.report import importances, summary_json, summary_text, trial_line
    from cliffguard.hpo.study import run_search

    if cfg.kafka is not None:
        from cliffguard.controller.broker import ensure_topics

        ensure_topics(cfg.kafka)
    t0 = time.perf_counter()
    done = [0]

    def progress(study, trial) -> None:
        done[0] += 1
        best = study.best_value if any(t.state.name == "COMPLETE" for t in study.trials) else None
        print(trial_line(trial, best) + f"  [{done[0]}/{args.trials}, {time.perf_counter() - t0:.0f}s]",
              file=sys.stderr, flush=True)

    print(f"study {cfg.study} in {masked_url(url)}: {args.trials} trial(s) of {cfg.window} steps "
          f"(common start: {cfg.warmup}-step warm-up)", file=sys.stderr, flush=True)
    try:
        study = run_search(cfg, url, args.trials, seed=args.seed, on_trial=progress)
    except StartMismatch as exc:
        return _fail(str(exc))
    seconds = time.perf_counter() - t0
    imps = importances(study)
    print(summary_text(study, imps) + f"\n({seconds:.0f} s)", file=sys.stderr, flush=True)
    if args.json:
        emit(json.dumps(summary_json(study, imps, masked_url(url), seconds)))
    return 0
