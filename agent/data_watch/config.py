"""The data watch's settings (``[agent.data_watch]``): what it measures, how often it reports, and
which ranks watch. Defaults sized so the statistics cost well under 1 % of the default GPT's step
on the watcher's thread (``python -m bench.agent_overhead``)."""

from __future__ import annotations

from dataclasses import dataclass

from cliffguard.core.declared import bounded, check_declared


@dataclass(kw_only=True, slots=True)
class DataWatchConfig:
    enabled: bool = True
    """Watch the batches the run trains on (the bundled trainer and ``Agent.watch_data``)."""
    every: int = bounded(10, ge=1)
    """Steps per ``data.stats`` event: the window a data rule judges (windows are aligned on
    multiples of it, so a replayed step falls in the same window)."""
    ranks: int = bounded(1, ge=0)
    """The first this many ranks watch their share of each batch and send their own events (the
    sampler deals every rank a random share, so rank 0's is a sample of the global batch); 0 = none."""
    buckets: int = bounded(256, ge=16, le=65_536)
    """Buckets of the token-frequency sketch; ids below it have a bucket each (a byte vocabulary is exact)."""
    shingle: int = bounded(8, ge=1)
    """Tokens per shingle for near-duplicates (8 bytes of the bundled trainer's byte tokens)."""
    num_perm: int = bounded(16, ge=4, le=256)
    """MinHash permutations per sequence."""
    bands: int = bounded(4, ge=1)
    """LSH bands (``num_perm`` must divide by it): more bands propose more candidates."""
    dup_threshold: float = bounded(0.8, gt=0, le=1)
    """Estimated Jaccard similarity of shingle sets at which two sequences are near-duplicates
    (``cliffguard data``'s default too)."""
    dup_window_steps: int = bounded(100, ge=0)
    """Steps of earlier batches a sequence is compared with (0 = its own batch only)."""
    top_k: int = bounded(8, ge=0, le=256)
    """Outlier sequences per reason kept in each event (their sample ids name them in a verdict)."""
    queue: int = bounded(64, ge=1)
    """Batches that may wait for the watcher's thread; a batch handed over beyond it is skipped and
    counted in the next event's ``dropped`` (and logged), never waited for."""
    pad_id: int | None = None
    """The padding token id, when batches are padded and no attention mask is given."""
    seed: int = 1
    """Seeds the MinHash permutations (the same sequences get the same signatures in every run)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.num_perm % self.bands:
            raise ValueError(f"bands: {self.bands} does not divide num_perm {self.num_perm}")
