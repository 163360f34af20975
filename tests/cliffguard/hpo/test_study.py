"""An Optuna study of 4 tiny trials end to end, one of them blown up and pruned; resume from storage."""

from __future__ import annotations

import math

import optuna
import pytest

from cliffguard.agent.sinks import InMemorySink
from cliffguard.core.enums import EventType
from cliffguard.hpo.objective import HpoConfig
from cliffguard.hpo.study import run_search
from cliffguard.trainer.data import DataConfig
from cliffguard.trainer.model import GPTConfig


def tiny(tmp_path, **kw) -> HpoConfig:
    # report_every = window: only the final validation is reported, so the median pruner never
    # prunes a healthy trial and only the divergence can.
    return HpoConfig(study="t", window=6, warmup=4, report_every=6, out_dir=str(tmp_path),
                     model=GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32),
                     data=DataConfig(seq_len=32, max_bytes=200_000), **kw)


def test_four_trials_one_divergence_pruned(tmp_path):
    sinks: dict[str, InMemorySink] = {}

    def sink(run: str) -> InMemorySink:
        sinks[run] = InMemorySink()
        return sinks[run]

    cfg = tiny(tmp_path, faults={2: ["lr_blowup@1x5000:5"]})
    url = f"sqlite:///{tmp_path}/optuna.db"
    seen = []
    study = run_search(cfg, url, 4, seed=3, sink_factory=sink, on_trial=lambda s, t: seen.append(t.number))
    states = [t.state for t in study.trials]
    assert seen == [0, 1, 2, 3]
    assert states[2] == optuna.trial.TrialState.PRUNED
    assert "pruned_reason" in study.trials[2].user_attrs
    others = [t for t in study.trials if t.number != 2]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and math.isfinite(t.value) for t in others)
    assert study.best_trial.number != 2
    # each trial is a monitored run with its own id: the pruned one ended as failed
    assert set(sinks) == {"t-warmup", "t-t0", "t-t1", "t-t2", "t-t3"}
    assert {e.type for e in sinks["t-t2"].events} >= {EventType.STEP, EventType.RUN_FAILED}
    assert EventType.RUN_FINISHED in {e.type for e in sinks["t-t0"].events}
    assert EventType.VALIDATION in {e.type for e in sinks["t-t1"].events}


def test_study_resumes_from_storage(tmp_path):
    cfg = tiny(tmp_path)
    url = f"sqlite:///{tmp_path}/optuna.db"
    run_search(cfg, url, 1, seed=1)
    again = run_search(cfg, url, 1, seed=2)  # a restart: same study, same common start
    assert [t.number for t in again.trials] == [0, 1]
    assert len(optuna.load_study(study_name="t", storage=url).trials) == 2
    assert (tmp_path / "t-warmup" / "start.json").exists()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="window"):
        HpoConfig(window=0)
    with pytest.raises(ValueError, match="warmup"):
        HpoConfig(warmup=0)


def test_common_start_of_another_model_is_refused(tmp_path):
    from cliffguard.hpo.objective import StartMismatch

    run_search(tiny(tmp_path), f"sqlite:///{tmp_path}/optuna.db", 1, seed=1)
    other = tiny(tmp_path)
    other.model = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=32)
    with pytest.raises(StartMismatch, match="--study"):
        run_search(other, f"sqlite:///{tmp_path}/optuna.db", 1, seed=1)
