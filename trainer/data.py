"""Real text with no download, byte tokens, and a sample order that is a pure function of the index.

Corpus. By default every ``.py`` file of the standard library (``sysconfig``'s ``stdlib`` path,
``site-packages``/``dist-packages`` left out), read in sorted path order and capped at
``max_bytes``; or the files / directories (recursively, sorted) the user names. Files are joined
with a newline. The byte stream is cut into blocks of ``block_bytes``; a seeded coin per block
puts ``val_fraction`` of them in the held-out split, so validation text comes from the whole
corpus, not just the alphabetically last files.

Samples. Sample id ``i`` is the train window ``tokens[i*T : i*T + T + 1]`` (x = first T bytes,
y = the next-byte targets). The *stream* visits sample ids in a seeded permutation per epoch:
global index ``g`` lies in epoch ``g // n`` and maps to ``perm(seed, epoch)[g % n]``. A step's
global batch is stream positions ``[step*B, (step+1)*B)``; rank ``r`` of ``w`` takes the
contiguous slice ``[r*B/w, (r+1)*B/w)`` of it. Nothing is iterated, so ``batch(step)`` is the
same batch whenever it is asked for: resuming at step ``s`` is exact by construction.

Batch changes. An elastic run changes the global batch at a step (``rebatch``): the stream is
cut into segments ``(first step, first position, batch)``, so positions stay contiguous and no
sample of an epoch is seen twice or skipped across a scale change; the segments are part of the
sampler's state.

Skipping. ``skip(first, stop)`` removes the half-open window ``[first, stop)`` of *global
indices* (the ``sample_range`` a ``step`` event reports, the ``skip_data`` a ``rollback`` command
carries) from the stream: positions at or past ``first`` shift by the window's length, so the
next batch starts at ``stop``. Earlier steps are unchanged.

Weights. Samples the data rules flag (and any the caller flags later, e.g. a batch validation
found transient) get a weight < 1. A stream position whose sample is flagged keeps it with
probability = its weight; otherwise it redraws, deterministically from (seed, global index,
try), until a sample is kept. Flags are knowledge about the data, not training progress, so
``load_state_dict`` (a rollback) keeps flags learned since that state was saved.

Manifest. ``weights_manifest`` names a JSON manifest (``cliffguard data`` writes it: per file a
weight, 0 for a removed one, and a category; curriculum phases with per-category weights by
fraction of ``curriculum_steps``). A sample belongs to the file its first byte came from; its
weight is its flag weight x its file's weight x its category's weight in the phase of the step
its stream position falls in (phase weights scaled so the phase's largest is 1; only relative
weights matter to the redraw). A sample of weight 0 is never drawn.
"""

from __future__ import annotations

import json
import math
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from cliffguard.core.declared import bounded, check_declared
from cliffguard.trainer.reweight_config import ReweightConfig

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(kw_only=True, slots=True)
class DataConfig:
    paths: list[str] = field(default_factory=list)
    """Text files or directories (recursive, sorted); empty = the standard library's .py sources."""
    seq_len: int = bounded(64, ge=2)
    """Tokens (bytes) per training sequence; must not exceed the model's block_size."""
    val_fraction: float = bounded(0.05, gt=0, lt=1)
    """Share of corpus blocks held out for validation."""
    seed: int = 1234
    """Seeds the train/val split, the per-epoch permutations and weighted redraws."""
    max_bytes: int = bounded(8_000_000, ge=1024)
    """Read at most this many bytes of text (the corpus is cut here)."""
    block_bytes: int = 16_384
    """Granularity of the train/val split."""
    suffixes: list[str] = field(default_factory=lambda: [".py", ".txt", ".md", ".rst"])
    """File suffixes read when a named path is a directory (the default corpus reads only .py)."""
    apply_rules: bool = True
    """Scan the train samples with the data rules at load time and down-weight flagged ones."""
    weights_manifest: str = ""
    """A ``cliffguard data`` manifest: per-file weights and curriculum phases the sampler follows ("" = none)."""
    curriculum_steps: int = bounded(0, ge=0)
    """Total training steps the manifest's phase fractions refer to (0 = the run's ``steps``)."""
    reweight: ReweightConfig = field(default_factory=ReweightConfig)
    """Live reweighting of the manifest's sources (trainer/reweight.py; off by default)."""
    watch_perplexity: bool = True
    """The data watch (``[agent.data_watch]``) scores each batch with the byte-trigram reference model:
    the manifest's (``perplexity_model``), else one trained on the training split (trainer/data_watch.py)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.block_bytes < 2 * (self.seq_len + 1):
            raise ValueError("block_bytes: must be at least two sequences long")
        for p in self.paths:
            if not Path(p).exists():
                raise ValueError(f"paths: {p!r} does not exist")
        if self.weights_manifest and not Path(self.weights_manifest).is_file():
            raise ValueError(f"weights_manifest: {self.weights_manifest!r} does not exist")


def _default_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(files)


def _named_files(paths: list[str], suffixes: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes))
        else:
            files.append(p)
    return files


def read_text_bytes(cfg: DataConfig) -> tuple[bytes, list[str]]:
    """The corpus bytes (capped at max_bytes) and the files they came from."""
    text, used, _ = _read_corpus(cfg)
    return text, used


def _read_corpus(cfg: DataConfig) -> tuple[bytes, list[str], list[int]]:
    """read_text_bytes plus each used file's start offset in the bytes."""
    files = _named_files(cfg.paths, cfg.suffixes) if cfg.paths else _default_files()
    parts: list[bytes] = []
    used: list[str] = []
    starts: list[int] = []
    total = 0
    for f in files:
        if total >= cfg.max_bytes:
            break
        try:
            data = f.read_bytes()
        except OSError:
            continue  # unreadable file (permissions, vanished): the corpus is what can be read
        parts.append(data + b"\n")
        used.append(str(f))
        starts.append(total)
        total += len(data) + 1
    text = b"".join(parts)[: cfg.max_bytes]
    if len(text) < 4 * cfg.block_bytes:
        raise ValueError(f"paths: corpus too small ({len(text)} bytes; need >= {4 * cfg.block_bytes})")
    return text, used, starts


@dataclass(slots=True)
class Corpus:
    train: torch.Tensor
    """uint8 byte tokens of the training split."""
    val: torch.Tensor
    """uint8 byte tokens of the held-out split."""
    files: list[str]
    seq_len: int
    flags: list[Any] = field(default_factory=list)
    """DataFlag records from the load-time scan (trainer.data_rules)."""
    sample_files: torch.Tensor | None = None
    """Index into ``files`` of each train sample's first byte (set when a manifest is configured)."""

    @property
    def n_train_samples(self) -> int:
        return (self.train.numel() - 1) // self.seq_len

    @property
    def n_val_samples(self) -> int:
        return (self.val.numel() - 1) // self.seq_len

    def train_samples(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _windows(self.train, ids, self.seq_len)


def _windows(tokens: torch.Tensor, ids: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = ids.long().unsqueeze(1) * t + torch.arange(t + 1).unsqueeze(0)
    chunk = tokens[idx].long()
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def load_corpus(cfg: DataConfig) -> Corpus:
    text, files, starts = _read_corpus(cfg)
    tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    n_blocks = math.ceil(tokens.numel() / cfg.block_bytes)
    gen = torch.Generator().manual_seed(cfg.seed)
    is_val = torch.rand(n_blocks, generator=gen) < cfg.val_fraction
    is_val[0] = False  # both splits are never empty
    if not bool(is_val.any()):
        is_val[-1] = True
    blocks = tokens.split(cfg.block_bytes)
    train = torch.cat([b for b, v in zip(blocks, is_val.tolist(), strict=True) if not v])
    val = torch.cat([b for b, v in zip(blocks, is_val.tolist(), strict=True) if v])
    if (val.numel() - 1) // cfg.seq_len < 1:
        raise ValueError("val_fraction: held-out split holds no complete sequence")
    corpus = Corpus(train=train, val=val, files=files, seq_len=cfg.seq_len)
    if cfg.weights_manifest:
        # train offset -> offset in the whole text: train is the non-val blocks, in order
        train_blocks = torch.nonzero(~is_val).squeeze(1)
        off = torch.arange(corpus.n_train_samples) * cfg.seq_len
        orig = train_blocks[off // cfg.block_bytes] * cfg.block_bytes + off % cfg.block_bytes
        corpus.sample_files = torch.searchsorted(torch.tensor(starts), orig, right=True) - 1
    if cfg.apply_rules:
        from cliffguard.trainer.data_rules import DataRules

        ids = torch.arange(corpus.n_train_samples)
        x, _ = corpus.train_samples(ids)
        corpus.flags = DataRules().scan(x, ids)
    return corpus


class Sampler:
    """Deterministic per-step batches for one rank (see the module docstring)."""

    def __init__(self, corpus: Corpus, cfg: DataConfig, global_batch: int, rank: int = 0, world: int = 1):
        if global_batch < 1 or global_batch % world:
            raise ValueError("global_batch: must be a positive multiple of the world size")
        if not 0 <= rank < world:
            raise ValueError("rank: must be in [0, world)")
        self.corpus = corpus
        self.seed = cfg.seed
        self.global_batch = global_batch
        self.rank = rank
        self.world = world
        self.n = corpus.n_train_samples
        self.skips: list[tuple[int, int]] = []
        self.segments: list[tuple[int, int, int]] = [(0, 0, global_batch)]
        """(first step, first stream position, global batch), ascending: the batch changes."""
        self.weights: dict[int, float] = {}
        self._perm_cache: tuple[int, torch.Tensor] | None = None
        for flag in corpus.flags:
            self.flag(flag.sample_ids, flag.weight)
        self._base: torch.Tensor | None = None  # per-sample manifest weight
        self._category: torch.Tensor | None = None
        self._phases: list[tuple[int, torch.Tensor]] = []  # (end step, weight per category id)
        self.categories: list[str] = []
        """The manifest's categories (sources), by category id."""
        self.live: dict[int, float] = {}
        """Live reweighting's factor per category id (trainer/reweight.py; absent = 1)."""
        if cfg.weights_manifest:
            self._load_manifest(cfg)

    def _load_manifest(self, cfg: DataConfig) -> None:
        try:
            man = json.loads(Path(cfg.weights_manifest).read_text(encoding="utf-8"))
            docs = {str(Path(d["path"]).resolve()): (float(d["weight"]), str(d.get("category", "")))
                    for d in man["documents"]}
            cur = man.get("curriculum") or {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"weights_manifest: {cfg.weights_manifest!r} is not a manifest ({exc})") from None
        names = sorted({c for _, c in docs.values()} | {str(cur.get("default", ""))})
        self.categories = names
        cat_id = {c: i for i, c in enumerate(names)}
        default = (1.0, str(cur.get("default", "")))
        per_file = [docs.get(str(Path(f).resolve()), default) for f in self.corpus.files]
        assert self.corpus.sample_files is not None
        sf = self.corpus.sample_files
        self._base = torch.tensor([w for w, _ in per_file], dtype=torch.float64)[sf]
        self._category = torch.tensor([cat_id[c] for _, c in per_file], dtype=torch.long)[sf]
        if cfg.curriculum_steps:
            for ph in cur.get("phases", []):
                w = torch.tensor([float(ph.get("weights", {}).get(c, 1.0)) for c in names], dtype=torch.float64)
                end = math.ceil(float(ph["until"]) * cfg.curriculum_steps)
                self._phases.append((end, w / w.max() if float(w.max()) > 0 else w))
        if not bool((self._base > 0).any()):
            raise ValueError(f"weights_manifest: {cfg.weights_manifest!r} gives every training sample weight 0")

    def sample_weight(self, sid: int, g: int) -> float:
        """Sample ``sid``'s weight at global index ``g`` (flags x manifest x curriculum phase)."""
        w = self.weights.get(sid, 1.0)
        if self._base is not None and self._category is not None:
            w *= float(self._base[sid])
            if self._phases:
                step = self.step_of(g)
                phase = next((pw for end, pw in self._phases if step < end), self._phases[-1][1])
                w *= float(phase[self._category[sid]])
            if self.live:
                w *= self.live.get(int(self._category[sid]), 1.0)
        return w

    def category_of(self, sid: int) -> str | None:
        """The manifest category (source) of sample ``sid``; None without a manifest."""
        return self.categories[int(self._category[sid])] if self._category is not None else None

    # -- order ---------------------------------------------------------------------------
    def _perm(self, epoch: int) -> torch.Tensor:
        if self._perm_cache is None or self._perm_cache[0] != epoch:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm_cache = (epoch, torch.randperm(self.n, generator=gen))
        return self._perm_cache[1]

    def global_index(self, position: int) -> int:
        """Stream position -> global sample index, after the skip windows."""
        g = position
        for first, stop in self.skips:  # sorted, disjoint, in global-index space
            if g >= first:
                g += stop - first
        return g

    def _sample_id(self, g: int) -> int:
        sid = int(self._perm(g // self.n)[g % self.n])
        if not self.weights and self._base is None:
            return sid
        tries = 0
        while (w := self.sample_weight(sid, g)) < 1.0:
            gen = torch.Generator().manual_seed(hash((self.seed, g, tries)) & 0x7FFF_FFFF_FFFF)
            # past 64 tries any sample of weight > 0 will do; weight 0 means never drawn
            if float(torch.rand(1, generator=gen)) < w or (tries >= 64 and w > 0) or tries >= 100_000:
                break
            tries += 1
            sid = int(torch.randint(self.n, (1,), generator=gen))
        return sid

    def _segment(self, step: int) -> tuple[int, int, int]:
        return next(seg for seg in reversed(self.segments) if seg[0] <= step)

    def position(self, step: int) -> int:
        """First stream position of the step's global batch."""
        first, pos, batch = self._segment(step)
        return pos + (step - first) * batch

    def batch_size(self, step: int) -> int:
        return self._segment(step)[2]

    def step_of(self, position: int) -> int:
        first, pos, batch = next(seg for seg in reversed(self.segments) if seg[1] <= position)
        return first + (position - pos) // batch

    def rebatch(self, step: int, global_batch: int, world: int, rank: int) -> None:
        """From ``step`` on, batches of ``global_batch`` over ``world`` ranks (earlier steps unchanged)."""
        if global_batch < 1 or global_batch % world or not 0 <= rank < world:
            raise ValueError(f"global_batch: {global_batch} does not split over {world} ranks")
        pos = self.position(step)
        self.segments = [seg for seg in self.segments if seg[0] < step] + [(step, pos, global_batch)]
        self.global_batch, self.world, self.rank = global_batch, world, rank

    def step_range(self, step: int) -> tuple[int, int]:
        """[first, last+1) global indices of the step's global batch (the step event's sample_range)."""
        p = self.position(step)
        return self.global_index(p), self.global_index(p + self.batch_size(step) - 1) + 1

    def sample_ids(self, step: int, rank: int | None = None) -> list[int]:
        """The sample ids of ``rank``'s share (default: this rank's) of the step's global batch."""
        per, rem = divmod(self.batch_size(step), self.world)
        if rem:  # a loaded state at another world's batch that nobody rebatched: never a silent wrong batch
            raise ValueError(f"global_batch: {self.batch_size(step)} at step {step} does not split over {self.world} ranks")
        start = self.position(step) + (self.rank if rank is None else rank) * per
        return [self._sample_id(self.global_index(p)) for p in range(start, start + per)]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """This rank's (x, y, sample_ids) of the step's global batch; x, y are int64 [B/world, T]."""
        return self.shard_batch(step, self.rank)

    def shard_batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """Rank ``rank``'s (x, y, sample_ids) of the step's global batch, built on any rank (a
        re-run of another rank's shard: trainer/rerun.py)."""
        ids = self.sample_ids(step, rank)
        x, y = self.corpus.train_samples(torch.tensor(ids))
        return x, y, ids

    def val_batches(self, n: int, batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The same n held-out batches every time (and on every rank): a fixed seeded choice."""
        total = self.corpus.n_val_samples
        gen = torch.Generator().manual_seed(self.seed + 7)
        order = torch.randperm(total, generator=gen)
        need = n * batch_size
        ids = order.repeat(math.ceil(need / total))[:need]
        return [
            _windows(self.corpus.val, ids[i * batch_size : (i + 1) * batch_size], self.corpus.seq_len)
            for i in range(n)
        ]

    # -- edits ---------------------------------------------------------------------------
    def skip(self, first: int, stop: int) -> None:
        """Remove global indices [first, stop) from the stream (merged with earlier windows)."""
        if not 0 <= first < stop:
            raise ValueError("skip: need 0 <= first < stop")
        merged: list[tuple[int, int]] = []
        for a, b in sorted([*self.skips, (first, stop)]):
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.skips = merged

    def flag(self, sample_ids: list[int], weight: float) -> None:
        """Lower these samples' sampling weight (never raises an existing lower weight)."""
        if not 0.0 <= weight <= 1.0:
            raise ValueError("weight: must be in [0, 1]")
        for sid in sample_ids:
            if 0 <= sid < self.n:
                self.weights[sid] = min(weight, self.weights.get(sid, 1.0))

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "global_batch": self.global_batch,
            "n": self.n,
            "skips": [list(w) for w in self.skips],
            "weights": {int(k): float(v) for k, v in self.weights.items()},
            "segments": [list(seg) for seg in self.segments],
            "live": {int(k): float(v) for k, v in self.live.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A state saved at another global batch is taken with its segments (the caller then
        ``rebatch``es to its own); one without segments must match this sampler's batch."""
        segments = [tuple(int(v) for v in seg) for seg in state.get("segments", [])]
        if state["n"] != self.n or (not segments and state["global_batch"] != self.global_batch):
            raise ValueError("sampler state: saved for a different corpus or global batch")
        if segments:
            self.segments = segments  # type: ignore[assignment]
            self.global_batch = segments[-1][2]
        self.seed = int(state["seed"])
        self._perm_cache = None
        self.skips = [tuple(w) for w in state["skips"]]  # type: ignore[misc]
        for sid, w in state["weights"].items():
            self.weights[int(sid)] = min(float(w), self.weights.get(int(sid), 1.0))
        # live factors are knowledge about the sources too: a rollback keeps what was learned since
        for cat, f in state.get("live", {}).items():
            self.live[int(cat)] = min(float(f), self.live.get(int(cat), 1.0))
