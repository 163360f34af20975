"""The byte-trigram reference model (trainer/byte_lm.py): what cliffguard data trains and saves and
the trainer's data watch scores batches with."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cliffguard.trainer.byte_lm import ByteLMConfig, ByteTrigramLM
from testing.data_watch import code_batches, code_tokens, reference_model


def test_sequence_scores_are_the_log_of_the_texts_perplexity_and_garbage_scores_higher():
    lm = reference_model()
    _, x, _ = next(code_batches(range(1)))
    scores = lm.sequence_scores(x.numpy())
    ascii_row = next(i for i in range(len(x)) if int(x[i].max()) < 128)  # decodes to the same bytes
    assert scores[ascii_row] == pytest.approx(math.log(lm.perplexity(bytes(x[ascii_row].tolist()).decode("ascii"))))
    noise = np.random.default_rng(0).integers(0, 256, (4, 64))
    assert lm.sequence_scores(noise).min() > scores.max()
    assert lm.sequence_scores(np.zeros((2, 2), dtype=np.int64)).tolist() == [0.0, 0.0]


def test_a_saved_model_loads_with_the_same_scores(tmp_path):
    lm = ByteTrigramLM(ByteLMConfig(add_k=0.5))
    lm.train_tokens(code_tokens().numpy()[:200_000])
    lm.train("def f(x):\n    return x\n")
    path = tmp_path / "m.lm.npz"
    lm.save(path)
    back = ByteTrigramLM.load(path)
    _, x, _ = next(code_batches(range(1)))
    assert back.cfg.add_k == 0.5 and np.array_equal(back.tri, lm.tri)
    assert np.allclose(back.sequence_scores(x.numpy()), lm.sequence_scores(x.numpy()))
    assert path.stat().st_size < 4_000_000  # the trigrams seen, not the 64 MiB table


def test_a_file_that_is_not_a_model_is_an_error_naming_it(tmp_path):
    bad = tmp_path / "bad.lm.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match=f"perplexity model: '{bad}' is not a saved byte-trigram model"):
        ByteTrigramLM.load(bad)
    np.savez(tmp_path / "wrong.npz", ids=np.array([1 << 25], dtype=np.uint32), counts=np.array([1], dtype=np.uint32),
             add_k=0.1, max_doc_bytes=10)
    with pytest.raises(ValueError, match="out of range"):
        ByteTrigramLM.load(tmp_path / "wrong.npz")
