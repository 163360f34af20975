"""``cliffguard train --nnodes MIN:MAX``: torchrun's elastic agent with a c10d rendezvous, the
elastic config the workers read, and a rendezvous that never completes ending with a clear error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cliffguard.cli import build_parser
from cliffguard.commands import train

REPO = Path(__file__).resolve().parents[2]


def _args(*argv: str):
    return build_parser().parse_args(["train", *argv])


def test_nnodes_makes_an_elastic_resuming_config_and_an_elastic_torchrun_command(tmp_path):
    args = _args("--nnodes", "1:2", "--nproc", "2", "--run", "el", "--no-monitor", "--out-dir", str(tmp_path),
                 "--batch-policy", "halve", "--rdzv-timeout-s", "30", "--max-restarts", "3")
    _, cfg = train.build_train_config(args, bootstrap=None, env={})
    e = cfg.elastic
    assert cfg.resume and e.enabled and e.base_world == 4 and e.batch_policy == "halve" and e.max_restarts == 3
    cmd = train.torchrun_command(2, "cfg.json", nnodes="1:2", rdzv_endpoint="127.0.0.1:29400", rdzv_id="el",
                                 max_restarts=e.max_restarts, rdzv_timeout_s=e.rdzv_timeout_s)
    assert "--standalone" not in cmd
    for flag in ("--nnodes=1:2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400", "--rdzv_id=el",
                 "--max_restarts=3", "--rdzv_conf=join_timeout=30,last_call_timeout=30"):
        assert flag in cmd
    _, plain = train.build_train_config(_args("--no-monitor", "--out-dir", str(tmp_path)), bootstrap=None, env={})
    assert not plain.elastic.enabled and not plain.resume


def test_uneven_nodes_declare_the_jobs_base_world_by_flag_file_or_env_and_it_is_not_derived(tmp_path):
    """Nodes of 2 and 1 processes: each would derive --nproc x MAX (4 and 2) and disagree on the batch."""
    common = ("--nnodes", "1:2", "--run", "el", "--no-monitor", "--out-dir", str(tmp_path))
    for nproc in ("2", "1"):
        _, cfg = train.build_train_config(_args(*common, "--nproc", nproc, "--base-world", "3"), bootstrap=None, env={})
        assert cfg.elastic.base_world == 3
    toml = tmp_path / "job.toml"
    toml.write_text("[train.elastic]\nbase_world = 3\n")
    _, cfg = train.build_train_config(_args(*common, "--nproc", "1", "--config", str(toml)), bootstrap=None, env={})
    assert cfg.elastic.base_world == 3
    _, cfg = train.build_train_config(_args(*common, "--nproc", "2"), bootstrap=None,
                                      env={"CLIFFGUARD_TRAIN__ELASTIC__BASE_WORLD": "3"})
    assert cfg.elastic.base_world == 3
    _, cfg = train.build_train_config(_args(*common, "--nproc", "2"), bootstrap=None, env={})
    assert cfg.elastic.base_world == 4  # nothing declared: --nproc x MAX nodes, as before


@pytest.mark.parametrize("value", ["2:1", "x", "0:2"])
def test_bad_nnodes_is_refused_naming_the_flag(value):
    with pytest.raises(ValueError, match="^--nnodes:"):
        train.parse_nnodes(value)


@pytest.mark.slow
def test_a_rendezvous_that_never_completes_ends_with_a_clear_error(tmp_path):
    from cliffguard.controller.broker import free_port

    proc = subprocess.run(
        [sys.executable, "-m", "cliffguard", "train", "--nnodes", "2:2", "--nproc", "1", "--run", "lonely",
         "--no-monitor", "--out-dir", str(tmp_path), "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
         "--rdzv-timeout-s", "5", "--steps", "2", "--max-bytes", "20000"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    assert "no rendezvous of 2:2 nodes" in proc.stderr and "within 5 s" in proc.stderr
