"""A rollback that fails on any rank changes nothing: the trainer discards the abandoned timeline's
checkpoints only after every rank restored (world 1 here; another rank's failure is simulated)."""

from __future__ import annotations

import pytest

from cliffguard.trainer.loop import RollbackUnavailable
from testing.trainer import make_trainer, small_config


def test_a_rollback_refused_by_another_rank_keeps_every_newer_checkpoint(tmp_path):
    tr, _, _ = make_trainer(small_config(tmp_path))
    try:
        for step in (2, 4, 6):
            tr.ckpt.snapshot(step, tr.capture_state())
        tr.ckpt.save(8, tr.capture_state(), "full")
        tr.ckpt.wait()
        before = tr.kit.available_steps()
        assert before == [2, 4, 6, 8]
        tr.kit.all_ranks = lambda ok: False  # another rank could not load step 4
        with pytest.raises(RollbackUnavailable):
            tr.kit.restore(4)
        assert tr.kit.available_steps() == before
        del tr.kit.all_ranks
        assert tr.kit.restore(4) == "memory"
        assert tr.kit.available_steps() == [2, 4]  # discarded only once every rank restored
    finally:
        tr.ckpt.close()
        tr.agent.close(None)
