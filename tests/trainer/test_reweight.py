"""Live reweighting of sources (trainer/reweight.py): a corpus of two sources, code and garbled
scrapes, under a manifest that lets each fall to x0.25; the reweighter lowers the garbled one step
by step to its floor (the same on every rank: it scores rank 0's share from the corpus), the sampler
then draws it less, every change is reported, and it can be reverted."""

from __future__ import annotations

import dataclasses
import json
import sysconfig
from pathlib import Path

import pytest

from cliffguard.core.enums import EventType
from cliffguard.trainer.data import DataConfig, Sampler, load_corpus
from cliffguard.trainer.model import GPTConfig
from cliffguard.trainer.reweight import SourceReweighter
from cliffguard.trainer.reweight_config import ReweightConfig
from testing.trainer import make_trainer, small_config

GARBLED = ("caf\ufffd na\ufffdve \x01\x02 r\ufffdsum\ufffd \x03 d\ufffd\ufffdj\x7f vu " * 40).encode()


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    (root / "code").mkdir(parents=True)
    (root / "scraped").mkdir()
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("argparse.py", "typing.py", "inspect.py"):
        (root / "code" / name).write_bytes((stdlib / name).read_bytes())
    for i in range(60):
        (root / "scraped" / f"page{i:02d}.txt").write_bytes(GARBLED)
    return root


def _manifest(root: Path, tmp_path: Path, **extra) -> str:
    docs = [{"path": str(f.resolve()), "kept": True, "weight": 1.0, "category": f.parent.name, "reasons": []}
            for f in sorted(root.rglob("*")) if f.is_file()]
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"version": 1, "root": str(root), "documents": docs,
                                "curriculum": {"categories": {}, "default": "code", "phases": []}, **extra}))
    return str(path)


def _data(root: Path, manifest: str, **rw) -> DataConfig:
    return DataConfig(paths=[str(root)], seq_len=64, max_bytes=2_000_000, block_bytes=4096, apply_rules=False,
                      weights_manifest=manifest, reweight=ReweightConfig(enabled=True, every=10, min_sequences=4, **rw))


def _scraped_share(sampler: Sampler, steps: range) -> float:
    drawn = [sid for s in steps for sid in sampler.sample_ids(s)]
    return sum(sampler.category_of(sid) == "scraped" for sid in drawn) / len(drawn)


def test_a_garbled_source_is_lowered_to_its_floor_and_drawn_less(corpus, tmp_path):
    cfg = _data(corpus, _manifest(corpus, tmp_path, live_reweight={"floor": 0.25}))
    sampler = Sampler(load_corpus(cfg), cfg, global_batch=16, rank=0, world=2)
    rw = SourceReweighter(cfg.reweight, sampler, cfg.weights_manifest)
    before = _scraped_share(sampler, range(0, 10))
    changes = [c for step in range(0, 41) for c in rw.at_step(step)]
    assert [(c["step"], c["category"], c["to"]) for c in changes] == [(10, "scraped", 0.5), (20, "scraped", 0.25)]
    assert all(sampler.category_of(s) == "scraped" for c in changes for s in c["sample_ids"])
    assert rw.at_step(10) == []  # a replayed step decides nothing again
    after = _scraped_share(sampler, range(41, 61))
    assert before > 0.1 and after < before * 0.6
    twin = Sampler(load_corpus(cfg), cfg, global_batch=16, rank=1, world=2)
    twin.load_state_dict(sampler.state_dict())  # the factors are the sampler's state
    assert twin.live == sampler.live and twin.sample_ids(50) == Sampler.sample_ids(twin, 50)
    assert rw.event(changes[0]) == {"sample_ids": changes[0]["sample_ids"], "rule": "reweight:scraped", "score": 0.5}


def test_a_source_scoring_clean_again_is_raised_back(corpus, tmp_path):
    cfg = _data(corpus, _manifest(corpus, tmp_path, live_reweight={"floor": 0.25}))
    sampler = Sampler(load_corpus(cfg), cfg, global_batch=16)
    rw = SourceReweighter(cfg.reweight, sampler, cfg.weights_manifest)
    rw.at_step(10)
    code = sampler.categories.index("code")
    sampler.live[code] = 0.5  # as if code had scored badly before
    rw.decided = 0
    assert [(c["category"], c["from"], c["to"]) for c in rw.at_step(20) if c["category"] == "code"] == \
           [("code", 0.5, 1.0)]


def test_the_bounds_come_from_the_manifest_and_are_required(corpus, tmp_path):
    cfg = _data(corpus, _manifest(corpus, tmp_path, live_reweight={"sources": {"scraped": {"floor": 0.5}}}))
    sampler = Sampler(load_corpus(cfg), cfg, global_batch=16)
    rw = SourceReweighter(cfg.reweight, sampler, cfg.weights_manifest)
    assert rw.floors == {"code": 1.0, "scraped": 0.5}  # code may not change, scraped to x0.5
    assert [c["to"] for step in (10, 20, 30) for c in rw.at_step(step)] == [0.5]
    bare = _data(corpus, _manifest(corpus, tmp_path))
    with pytest.raises(ValueError, match="declares no live_reweight bounds"):
        SourceReweighter(bare.reweight, Sampler(load_corpus(bare), bare, global_batch=16), bare.weights_manifest)
    with pytest.raises(ValueError, match="needs \\[data\\] weights_manifest"):
        SourceReweighter(ReweightConfig(enabled=True), sampler, "")


def test_the_trainer_reports_each_change_and_a_resume_with_it_off_reverts(corpus, tmp_path):
    data = _data(corpus, _manifest(corpus, tmp_path, live_reweight={"floor": 0.25}))
    cfg = small_config(tmp_path, steps=25, global_batch=8, grad_accum=1, data=data,
                       model=GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=64))
    trainer, sink, _ = make_trainer(cfg)
    trainer.run()
    flags = [e for e in sink.events if e.type is EventType.DATA_FLAG and e.data["rule"].startswith("reweight:")]
    assert [(e.step, e.data["rule"], e.data["score"]) for e in flags] == [(10, "reweight:scraped", 0.5),
                                                                         (20, "reweight:scraped", 0.25)]
    state = trainer.capture_state()
    off = dataclasses.replace(cfg, data=dataclasses.replace(data, reweight=ReweightConfig()))
    resumed, _, _ = make_trainer(off)
    resumed.load_state(state)
    assert state["sampler"]["live"] and resumed.sampler.live == {}
