import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cliffguard.cli import main

ROOT = Path(__file__).resolve().parents[3]


def test_json_contract_stdout_is_one_object_ranked_best_first():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "cliffguard", "plan", "--params", "175e9", "--gpus", "1024",
                           "--gpu-mem-gb", "80", "--json"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)  # the whole of stdout is one JSON document
    assert list(out) == ["configs"]
    configs = out["configs"]
    assert len(configs) == 10
    for c in configs:
        assert {"tp", "pp", "dp", "zero", "recompute", "micro_batch", "memory_gb_per_device", "tokens_per_s",
                "memory_gb"} <= set(c)
        assert c["tp"] * c["pp"] * c["dp"] == 1024
        assert c["memory_gb_per_device"] <= 80
    rates = [c["tokens_per_s"] for c in configs]
    assert rates == sorted(rates, reverse=True)
    assert "layouts evaluated" in proc.stderr


def test_table_output_and_top(capsys):
    assert main(["plan", "--layers", "24", "--hidden", "2048", "--heads", "16", "--gpus", "16",
                 "--gpu-mem-gb", "40", "--global-batch", "256", "--top", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:3] == ["tp", "pp", "dp"] and len(lines) == 4


@pytest.mark.parametrize("argv, flag", [
    (["--layers", "4", "--hidden", "100", "--heads", "7", "--gpus", "8", "--gpu-mem-gb", "80"], "--heads"),
    (["--params", "1e9", "--gpus", "0", "--gpu-mem-gb", "80"], "--gpus"),
    (["--params", "1e9", "--gpus", "8", "--gpu-mem-gb", "-1"], "--gpu-mem-gb"),
    (["--params", "1e12", "--gpus", "8", "--gpu-mem-gb", "80"], "--gpu-mem-gb: no layout fits"),
    (["--params", "1e9", "--layers", "4", "--gpus", "8", "--gpu-mem-gb", "80"], "--params"),
    (["--layers", "4", "--gpus", "8", "--gpu-mem-gb", "80"], "--hidden: missing"),
    (["--params", "1e9", "--gpus", "8", "--gpu-mem-gb", "80", "--global-batch", "0"], "--global-batch"),
])
def test_bad_input_names_the_flag_and_exits_2(capsys, argv, flag):
    assert main(["plan", *argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # stdout stays JSON-only: nothing on failure
    assert f"cliffguard plan: {flag}" in captured.err
