"""One search: the study in its storage (created or resumed), the common start, ``n_trials`` more trials."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cliffguard.hpo import storage as hpo_storage
from cliffguard.hpo.objective import HpoConfig, Objective, common_start


def open_study(name: str, storage_url: str, seed: int | None, n_startup_trials: int = 4) -> Any:
    """TPE (multivariate: lr and batch interact) + median pruning; ``load_if_exists`` so a restart or a
    second worker continues the same study."""
    import optuna

    logging.getLogger("optuna").setLevel(logging.WARNING)  # the progress line says it once
    hpo_storage.prepare(storage_url)
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)
    return optuna.create_study(study_name=name, storage=storage_url, sampler=sampler, pruner=pruner,
                               direction="maximize", load_if_exists=True)


def run_search(cfg: HpoConfig, storage_url: str, n_trials: int, *, seed: int | None = None,
               sink_factory: Callable[[str], Any] | None = None,
               on_trial: Callable[[Any, Any], None] | None = None) -> Any:
    """Run ``n_trials`` trials of ``cfg.study``; ``on_trial(study, frozen_trial)`` after each."""
    study = open_study(cfg.study, storage_url, seed)
    start = common_start(cfg, sink_factory)
    objective = Objective(cfg, start, sink_factory)
    callbacks = [lambda s, t: on_trial(s, t)] if on_trial is not None else []
    study.optimize(objective, n_trials=n_trials, callbacks=callbacks, catch=())
    return study
