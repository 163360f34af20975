"""The bundled trainer's data watch: the agent's batch statistics (agent/data_watch/) with this
trainer's two scorers, both run on the watcher's thread:

- ``garbled``: the data rules' garbled-text score (trainer/data_rules.py, ``DataRules.garbled``:
  control bytes and U+FFFD, byte entropy), > 1 where a rule flags the sequence;
- ``perplexity``: each sequence's log-perplexity per byte under the byte-trigram reference model
  (trainer/byte_lm.py), the same model ``cliffguard data`` builds: the one its manifest names
  (``perplexity_model``, written beside the manifest), else one trained on this run's training split
  before the first batch (~1 s for the default 8 MB corpus, 64 MiB per watching rank).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from cliffguard.agent.data_watch.watcher import BatchReport, DataWatch
from cliffguard.agent.hooks import Agent
from cliffguard.trainer.byte_lm import ByteTrigramLM
from cliffguard.trainer.data import Corpus, DataConfig
from cliffguard.trainer.data_rules import DataRules

log = logging.getLogger(__name__)


def manifest_model(manifest: str) -> str | None:
    """The reference model a ``cliffguard data`` manifest names, if it names one that exists."""
    if not manifest:
        return None
    try:
        entry = json.loads(Path(manifest).read_text(encoding="utf-8")).get("perplexity_model") or {}
    except (OSError, ValueError, AttributeError):
        return None  # the sampler reads the manifest too, and says what is wrong with it
    path = entry.get("path") if isinstance(entry, dict) else None
    if isinstance(path, str) and Path(path).is_file():
        return path
    if path:
        log.warning("data watch: the manifest's perplexity model %s is missing; training one on the split", path)
    return None


class ReferenceModel:
    """The perplexity scorer; ``prepare`` (on the watcher's thread) loads or trains the model."""

    def __init__(self, corpus: Corpus, model_path: str | None) -> None:
        self.corpus = corpus
        self.model_path = model_path
        self.lm: ByteTrigramLM | None = None
        self.source = ""
        """Where the model came from: the saved file's path, or ``train split``."""

    def prepare(self) -> None:
        if self.model_path is not None:
            self.lm, self.source = ByteTrigramLM.load(self.model_path), self.model_path
            return
        lm = ByteTrigramLM()
        lm.train_tokens(self.corpus.train.numpy())
        self.lm, self.source = lm, "train split"

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self.lm is not None, "prepare() runs before the first batch"
        return torch.from_numpy(self.lm.sequence_scores(tokens.numpy()))


def attach_data_watch(agent: Agent, corpus: Corpus, cfg: DataConfig,
                      on_batch: Callable[[BatchReport], None] | None = None) -> DataWatch | None:
    """Start the agent's data watch with this trainer's scorers (None where this rank does not watch)."""
    rules = DataRules()
    model = ReferenceModel(corpus, manifest_model(cfg.weights_manifest)) if cfg.watch_perplexity else None
    return agent.watch_data(garbled=rules.garbled, perplexity=model, prepare=model.prepare if model else None,
                            on_batch=on_batch)
