"""The ``cliffguard`` command: one entry point, a subcommand per job.

Each subcommand lives in ``cliffguard/commands/<name>.py`` and exposes
``add_parser(subparsers) -> argparse.ArgumentParser`` and ``run(args) -> int``. Modules are
imported lazily only when their subcommand runs (``--help`` of the top level imports each one
to describe it), so ``cliffguard broker`` does not pay for importing torch.

``cliffguard`` is the composition root: the only package that imports agent, trainer,
controller and dashboard together.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from cliffguard.core import kafka_log

# name -> one-line help. Order is the order in --help.
SUBCOMMANDS: dict[str, str] = {
    "demo": "run the whole loop locally: broker, controller, dashboard, 2-process training with faults",
    "broker": "run the embedded Kafka-protocol broker (Tansu)",
    "train": "launch the bundled GPT trainer under torchrun with the agent attached",
    "controller": "run the controller service (consumer group on the metrics topic)",
    "command": "send an operator command to a run through the controller's outbox",
    "status": "list runs and their recovery states",
    "badbatches": "the batches a run's re-runs classified as data (never fed again)",
    "nodes": "the suspect nodes kept out of every run; clear or recheck one",
    "admit": "may this node join a run, and on which device slots? (an own launcher's admission check)",
    "report": "a run's post-mortem: goodput, incidents and their cost (one HTML file, or JSON)",
    "alerts": "alert endpoints' delivery state; re-enable one disabled by HTTP 410",
    "backtest": "replay a step,loss CSV (or a stored run) through the controller's rules",
    "dashboard": "serve the Streamlit dashboard over a store",
    "plan": "search parallelism layouts (TP/PP/DP, ZeRO, recomputation) with memory and step-time estimates",
    "hpo": "Bayesian hyperparameter search (Optuna TPE + pruning) on validation-loss windows",
    "data": "data-quality pass over a text corpus: near-duplicates, contamination, reweighting, curriculum",
    "keys": "generate the Ed25519 command key pair and the agent secret (cliffguard keys generate --out DIR)",
    "slurm": "a one-machine Slurm cluster for local use and tests: up, down, status",
    "submit": "submit cliffguard train to Slurm as an exploration or production job",
    "queue": "the priority classes, the Slurm jobs and what preempted what",
    "config": "validate a TOML config (+ CLIFFGUARD_* env) and print the resolved values",
}


def _module(name: str):
    return importlib.import_module(f"cliffguard.commands.{name}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cliffguard",
        description="Monitoring and recovery for large-model training: agents stream metrics to Kafka, "
        "a controller catches loss spikes and divergences and pauses, validates, rolls back and resumes.",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        if only is not None and name != only:
            sub.add_parser(name, help=help_text)
            continue
        try:
            mod = _module(name)
        except ModuleNotFoundError as exc:
            if exc.name != f"cliffguard.commands.{name}":
                raise
            continue  # not built yet
        p = mod.add_parser(sub)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(only=chosen if chosen in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kafka-python logs every connection at INFO; only its warnings are news to an operator.
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    kafka_log.install()  # kafka-python's closed-socket race: one line, not a traceback
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger().level))  # migrations run at every start
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help()
        return 2
    from cliffguard.commands import json_stdout

    try:
        if json_stdout.wants_json_stdout(args):
            with json_stdout.held():  # only the document on stdout; a library's chatter goes to stderr
                return int(run(args) or 0)
        return int(run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader left (``cliffguard status | head``): stop quietly, as a Unix tool does; stdout
        # points at /dev/null so the interpreter's final flush does not raise again
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool its pipe closed


if __name__ == "__main__":
    raise SystemExit(main())
