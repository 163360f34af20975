import pytest
import torch

from cliffguard.trainer.data import DataConfig, Sampler, load_corpus


@pytest.fixture(scope="module")
def cfg():
    return DataConfig(seq_len=32, max_bytes=400_000, block_bytes=4096)


@pytest.fixture(scope="module")
def corpus(cfg):
    return load_corpus(cfg)


def test_default_corpus_is_stdlib_source(corpus):
    assert corpus.files and all(f.endswith(".py") for f in corpus.files)
    assert not any("site-packages" in f for f in corpus.files)
    text = bytes(corpus.train[:20000].tolist())
    assert b"def " in text and b"import" in text
    assert corpus.n_val_samples > 0 and corpus.n_train_samples > 1000


def test_named_text_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"hello world " * 2000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_bytes(b"other text. " * 2000)
    c = load_corpus(DataConfig(paths=[str(tmp_path)], seq_len=16, max_bytes=100_000, block_bytes=1024))
    assert [f.split("/")[-1] for f in c.files] == ["a.txt", "b.md"]
    assert set(bytes(c.train.tolist() + c.val.tolist())) == set(b"hello world other text.\n")


def test_missing_path_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="^paths:"):
        DataConfig(paths=[str(tmp_path / "nope")])


def test_same_step_same_batch_and_targets_shift(corpus, cfg):
    a = Sampler(corpus, cfg, global_batch=8)
    b = Sampler(corpus, cfg, global_batch=8)
    x1, y1, ids1 = a.batch(17)
    a.batch(3)
    x2, _, ids2 = a.batch(17)
    x3, _, ids3 = b.batch(17)
    assert ids1 == ids2 == ids3 and torch.equal(x1, x2) and torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert a.batch(18)[2] != ids1


def test_ranks_slice_the_global_batch(corpus, cfg):
    whole = Sampler(corpus, cfg, global_batch=8).sample_ids(5)
    parts = [Sampler(corpus, cfg, global_batch=8, rank=r, world=2).sample_ids(5) for r in range(2)]
    assert parts[0] + parts[1] == whole
    with pytest.raises(ValueError, match="global_batch"):
        Sampler(corpus, cfg, global_batch=7, rank=0, world=2)


def test_epoch_is_a_permutation(corpus, cfg):
    s = Sampler(corpus, cfg, global_batch=1)
    s.weights.clear()  # weights redraw flagged samples; the underlying order is a permutation
    n = corpus.n_train_samples
    ids = [s._sample_id(g) for g in range(n)]
    assert sorted(ids) == list(range(n))


def test_skip_window_is_exact(corpus, cfg):
    gb = 8
    plain = Sampler(corpus, cfg, global_batch=gb)
    s = Sampler(corpus, cfg, global_batch=gb)
    s.skip(10 * gb, 13 * gb)  # drop the global batches of steps 10, 11, 12
    for step in range(10):
        assert s.sample_ids(step) == plain.sample_ids(step)
    assert s.sample_ids(10) == plain.sample_ids(13)
    assert s.step_range(10) == (13 * gb, 14 * gb)
    # A window inside a batch shifts only what follows it.
    t = Sampler(corpus, cfg, global_batch=gb)
    t.skip(3, 5)
    want = [plain._sample_id(g) for g in [0, 1, 2, 5, 6, 7, 8, 9]]
    assert t.sample_ids(0) == want


def test_state_round_trip(corpus, cfg):
    s = Sampler(corpus, cfg, global_batch=8)
    s.skip(40, 64)
    s.flag([1, 2, 3], 0.0)
    fresh = Sampler(corpus, cfg, global_batch=8)
    fresh.load_state_dict(s.state_dict())
    for step in (0, 4, 5, 9, 1000):
        assert fresh.sample_ids(step) == s.sample_ids(step)


def test_flagged_samples_are_drawn_less(corpus, cfg):
    s = Sampler(corpus, cfg, global_batch=64)
    s.weights.clear()
    before = [i for step in range(20) for i in s.sample_ids(step)]
    s.flag(before[:200], 0.0)
    after = [i for step in range(20) for i in s.sample_ids(step)]
    assert not set(before[:200]) & set(after)
    # Unflagged positions keep their samples: only the flagged ones were redrawn.
    kept = [a for a, b in zip(after, before, strict=True) if b not in set(before[:200])]
    assert kept == [b for b in before if b not in set(before[:200])]


def test_load_state_keeps_newer_flags(corpus, cfg):
    s = Sampler(corpus, cfg, global_batch=8)
    old = s.state_dict()
    s.flag([5], 0.0)
    s.load_state_dict(old)
    assert s.weights[5] == 0.0


def test_validation_batches_are_fixed_and_held_out(corpus, cfg):
    s = Sampler(corpus, cfg, global_batch=8)
    v1 = s.val_batches(3, 4)
    v2 = Sampler(corpus, cfg, global_batch=8, rank=1, world=2).val_batches(3, 4)
    assert len(v1) == 3 and v1[0][0].shape == (4, 32)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(v1, v2, strict=True))
    train_text = bytes(corpus.train.tolist())
    hits = sum(bytes(x.tolist()) in train_text for x, _ in v1 for x in x)
    assert hits < 12  # held-out text is not the training windows (short repeats may occur)


# -- manifest (cliffguard data) ------------------------------------------------------------
def _manifest_corpus(tmp_path, phases=None):
    import json

    for name, byte in (("a.py", b"a"), ("b.py", b"b"), ("c.py", b"c"), ("d.md", b"d")):
        (tmp_path / name).write_bytes(byte * 16_383)
    docs = [
        {"path": str(tmp_path / "a.py"), "kept": True, "weight": 1.0, "category": "code", "reasons": []},
        {"path": str(tmp_path / "b.py"), "kept": False, "weight": 0.0, "category": "code", "reasons": []},
        {"path": str(tmp_path / "c.py"), "kept": True, "weight": 0.25, "category": "code", "reasons": []},
        {"path": str(tmp_path / "d.md"), "kept": True, "weight": 1.0, "category": "prose", "reasons": []},
    ]
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"version": 1, "documents": docs,
                               "curriculum": {"categories": {}, "default": "other", "phases": phases or []}}))
    cfg = DataConfig(paths=[str(tmp_path)], seq_len=16, max_bytes=100_000, block_bytes=1024, val_fraction=0.05,
                     apply_rules=False, weights_manifest=str(man), curriculum_steps=100)
    return cfg, load_corpus(cfg)


def _letters(sampler, steps):
    from collections import Counter

    counts = Counter()
    for step in steps:
        x, _, _ = sampler.batch(step)
        counts.update(chr(int(row[0])) for row in x)
    return counts


def test_sampler_follows_manifest_weights_and_never_draws_a_removed_file(tmp_path):
    cfg, corpus = _manifest_corpus(tmp_path)
    assert corpus.sample_files is not None and corpus.sample_files.numel() == corpus.n_train_samples
    counts = _letters(Sampler(corpus, cfg, global_batch=32), range(60))
    assert counts["b"] == 0
    assert 0.15 < counts["c"] / counts["a"] < 0.35  # weight 0.25
    assert 0.8 < counts["d"] / counts["a"] < 1.25


def test_sampler_follows_curriculum_phases(tmp_path):
    phases = [{"until": 0.5, "weights": {"prose": 1.0, "code": 0.0}},
              {"until": 1.0, "weights": {"prose": 0.0, "code": 1.0}}]
    cfg, corpus = _manifest_corpus(tmp_path, phases)
    s = Sampler(corpus, cfg, global_batch=16)
    assert set(_letters(s, range(0, 50, 5))) == {"d"}
    assert set(_letters(s, range(50, 100, 5))) == {"a", "c"}


def test_manifest_errors(tmp_path):
    with pytest.raises(ValueError, match="^weights_manifest:"):
        DataConfig(weights_manifest=str(tmp_path / "nope.json"))
    (tmp_path / "x.txt").write_bytes(b"x" * 20_000)
    (tmp_path / "m.json").write_text("{}")
    cfg = DataConfig(paths=[str(tmp_path / "x.txt")], seq_len=16, max_bytes=100_000, block_bytes=1024,
                     weights_manifest=str(tmp_path / "m.json"))
    with pytest.raises(ValueError, match="is not a manifest"):
        Sampler(load_corpus(cfg), cfg, global_batch=4)
