"""The torchrun worker: ``python -m cliffguard.trainer.run --config <run_dir>/config.json``.

``cliffguard train`` writes the config and starts ``python -m torch.distributed.run
--nproc_per_node N -m trainer.run --config ...`` (on GPUs ``accelerate launch -m trainer.run``
works the same way). Every worker reads the same saved config, builds an ``Accelerator`` (CPU:
gloo, ``torch.set_num_threads(threads)`` so the processes do not fight over the cores) and runs
the ``Trainer``. Everything but the secrets is in the saved config (the launcher resolved the
deployment's ``[kafka]``, ``[spike]`` and ``[policy]`` into it); the command public key (or HMAC
secret), the run's event key and a SASL password come in the environment the launcher set
(``worker_config``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path

import torch


def with_env_secrets(cfg, env: Mapping[str, str] | None = None):
    """The saved config masks secret fields; the launcher hands them over in the environment."""
    import dataclasses

    password = (os.environ if env is None else env).get("CLIFFGUARD_KAFKA__SASL_PLAIN_PASSWORD")
    if cfg.kafka is not None and password and cfg.kafka.sasl_plain_password is not None:
        cfg.kafka = dataclasses.replace(cfg.kafka, sasl_plain_password=password)
    return cfg


def worker_config(path: str | Path, env: Mapping[str, str] | None = None):
    """(TrainConfig, command verifying key or None) of a worker: the saved config plus the secrets
    of its environment, the key by the deployment's one rule (``core/deployment.py``: the Ed25519
    public key, else the HMAC secret). Its events are signed with ``CLIFFGUARD_EVENT_KEY``."""
    from cliffguard.core.deployment import agent_verifying_key
    from cliffguard.trainer.config import TrainConfig

    env = os.environ if env is None else env
    return with_env_secrets(TrainConfig.load(path), env), agent_verifying_key(env)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cliffguard.trainer.run", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="path of the saved TrainConfig JSON")
    p.add_argument("--log-level", default=os.environ.get("CLIFFGUARD_LOG_LEVEL", "WARNING"))
    args = p.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s r%(process)d %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)

    from accelerate import Accelerator

    from cliffguard.trainer.loop import Trainer

    cfg, secret = worker_config(args.config)
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(cfg.threads)
    from accelerate.utils import InitProcessGroupKwargs

    from cliffguard.agent.hang.timeouts import enable_flight_recorder, timeout

    hang = cfg.agent.hang
    enable_flight_recorder(hang.fr_buffer)  # before the group exists: each rank's ring of collectives
    # a dead or stuck peer fails a collective after this, not torch's 30-minute default
    accelerator = Accelerator(cpu=not cuda, kwargs_handlers=[InitProcessGroupKwargs(timeout=timeout(hang.collective_timeout_s))])
    try:
        trainer = Trainer(cfg, accelerator, secret=secret)
        return trainer.run()
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
