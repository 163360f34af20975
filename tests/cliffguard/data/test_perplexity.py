import os
import random

import pytest

from cliffguard.data.corpus import corpus_files
from cliffguard.data.perplexity import ByteTrigramLM, PerplexityConfig, perplexity_weight
from cliffguard.data.pipeline import run_pass
from cliffguard.data.rules import DocRules

PROSE = ("The committee met on Tuesday to review the budget for the coming year. Members agreed that "
         "the library needs new shelves, and the park needs more benches near the river. ")


def _ocr(text: str, rng: random.Random) -> str:
    swaps = {"h": "li", "m": "rn", "e": "c", "o": "0", "l": "1", "w": "vv", " ": "  ~"}
    return "".join(swaps.get(c, c) if rng.random() < 0.5 else c for c in text)


def test_garbage_scores_higher_perplexity_than_clean_text():
    lm = ByteTrigramLM()
    for _ in range(20):
        lm.train(PROSE * 5)
    clean, ocr = lm.perplexity(PROSE), lm.perplexity(_ocr(PROSE, random.Random(1)))
    noise = lm.perplexity(os.urandom(2000).decode("latin-1"))
    assert clean < ocr < noise
    assert lm.perplexity("ab") is None


def test_weight_formula():
    cfg = PerplexityConfig(tolerance=2.0, floor=0.1)
    assert perplexity_weight(10.0, 10.0, cfg) == 1.0
    assert perplexity_weight(40.0, 10.0, cfg) == 0.5
    assert perplexity_weight(1e6, 10.0, cfg) == 0.1
    assert perplexity_weight(None, 10.0, cfg) == 1.0


def test_pass_lowers_weights_of_garbage_and_keeps_them(tmp_path):
    rng = random.Random(2)
    for i in range(20):
        (tmp_path / f"p{i:02d}.txt").write_text((PROSE + f" Item {i} of {rng.random()}. ") * 8)
    (tmp_path / "ocr.txt").write_text(_ocr(PROSE * 8, rng))
    (tmp_path / "noise.txt").write_text("".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(3000)))
    (tmp_path / "links.txt").write_text(" ".join(f"https://spam{i}.example.com/p?id={i}" for i in range(300)))
    manifest, report = run_pass(tmp_path, corpus_files(tmp_path))
    docs = {d["path"].rsplit("/", 1)[1]: d for d in manifest["documents"]}
    clean = [d["weight"] for n, d in docs.items() if n.startswith("p")]
    assert min(clean) == 1.0 or sum(w == 1.0 for w in clean) >= 18  # prose is not punished
    # the reference model trains on the garbage too, yet it stays far more surprising than prose
    assert docs["ocr.txt"]["weight"] < 0.9 and docs["noise.txt"]["weight"] < 0.3
    for name in ("ocr.txt", "noise.txt"):
        assert docs[name]["kept"]
        assert "perplexity" in {r["reason"] for r in docs[name]["reasons"]}
    assert "url_pile" in {r["reason"] for r in docs["links.txt"]["reasons"]}
    assert docs["links.txt"]["weight"] <= 0.1
    assert report["reasons"]["url_pile"] == 1


def test_doc_rules_use_the_trainer_rules():
    flags = DocRules().check(bytes(range(256)).decode("latin-1") * 4)
    assert {f.rule for f in flags} >= {"nonprintable"}
    assert DocRules().check(PROSE * 4) == []


def test_config_is_validated():
    with pytest.raises(ValueError, match="^tolerance:"):
        PerplexityConfig(tolerance=0.5)
