import pytest
import torch

from cliffguard.trainer.data import DataConfig, Sampler, load_corpus
from cliffguard.trainer.data_rules import DataRules, DataRulesConfig


def rows(*texts: bytes, width: int = 128) -> torch.Tensor:
    return torch.tensor([list(t[:width].ljust(width, b" ")) for t in texts], dtype=torch.long)


CODE = b"def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n\n" * 2
PROSE = b"The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun. " * 2
URLS = b"https://example.com/a/b?c=1 http://foo.org/bar www.spam.net/page https://x.io/y/z/w " * 2


def test_clean_text_and_code_are_not_flagged():
    assert DataRules().scan(rows(CODE, PROSE), [0, 1]) == []


def test_random_bytes_flagged_as_garbled():
    gen = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (3, 128), generator=gen)
    flags = {f.rule: f for f in DataRules().scan(torch.cat([rows(CODE), noise]), [10, 11, 12, 13])}
    assert set(flags["entropy"].sample_ids) == {11, 12, 13}
    assert set(flags["nonprintable"].sample_ids) == {11, 12, 13}
    assert flags["entropy"].score > 0.9 and flags["entropy"].weight == 0.1


def test_replacement_characters_count_as_garbled():
    mojibake = ("caf\ufffd na\ufffdve r\ufffdsum\ufffd " * 10).encode()
    flags = DataRules().scan(rows(mojibake, PROSE), [0, 1])
    assert [(f.rule, f.sample_ids) for f in flags] == [("nonprintable", [0])]


def test_url_pile_flagged_but_prose_citing_one_url_is_not():
    cites = b"See the docs at https://docs.python.org/3/ for details on the module and its options here."
    flags = DataRules().scan(rows(URLS, cites), [5, 6])
    assert [(f.rule, f.sample_ids) for f in flags] == [("url_pile", [5])]
    assert flags[0].event_data() == {"sample_ids": [5], "rule": "url_pile", "score": flags[0].score}


def test_flags_lower_the_sampling_weight(tmp_path):
    clean = b"".join(CODE for _ in range(400))
    pile = b"".join(URLS for _ in range(200))
    (tmp_path / "a_clean.py").write_bytes(clean)
    (tmp_path / "b_links.txt").write_bytes(pile)
    cfg = DataConfig(paths=[str(tmp_path)], seq_len=64, max_bytes=200_000, block_bytes=2048, val_fraction=0.1)
    corpus = load_corpus(cfg)
    url_flag = next(f for f in corpus.flags if f.rule == "url_pile")
    pile_share = len(url_flag.sample_ids) / corpus.n_train_samples
    assert pile_share > 0.2
    weighted = Sampler(corpus, cfg, global_batch=64)
    drawn = [i for s in range(20) for i in weighted.sample_ids(s)]
    drawn_share = sum(i in set(url_flag.sample_ids) for i in drawn) / len(drawn)
    assert drawn_share < pile_share / 3


def test_config_validation():
    with pytest.raises(ValueError, match="^entropy_max:"):
        DataRulesConfig(entropy_max=0.0)
