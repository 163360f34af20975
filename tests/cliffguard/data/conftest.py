import random

import pytest


def random_doc(rng: random.Random, n_words: int = 400, vocab: int = 5000) -> list[str]:
    return [f"w{rng.randrange(vocab)}" for _ in range(n_words)]


def perturb(rng: random.Random, doc: list[str], share: float) -> list[str]:
    out = list(doc)
    for i in rng.sample(range(len(out)), max(1, round(share * len(out)))):
        out[i] = f"x{rng.randrange(10**6)}"
    return out


@pytest.fixture
def planted(tmp_path):
    """60 distinct docs, 20 near-duplicates (1% of words changed), 10 far variants (30% changed)."""
    rng = random.Random(7)
    originals = [random_doc(rng) for _ in range(60)]
    dups, far = {}, {}
    for i in range(60):
        (tmp_path / f"a{i:03d}.txt").write_text(" ".join(originals[i]))
    for j in range(20):
        (tmp_path / f"b{j:03d}.txt").write_text(" ".join(perturb(rng, originals[j], 0.01)))
        dups[str((tmp_path / f"b{j:03d}.txt").resolve())] = str((tmp_path / f"a{j:03d}.txt").resolve())
    for j in range(10):
        (tmp_path / f"c{j:03d}.txt").write_text(" ".join(perturb(rng, originals[30 + j], 0.3)))
        far[str((tmp_path / f"c{j:03d}.txt").resolve())] = j
    return tmp_path, dups, far
