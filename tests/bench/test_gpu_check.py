"""bench/gpu/check.sh where there is no GPU (a clear exit 2 at once), and its table
(bench/gpu/summary.py) from made-up step files: goals, timeouts, missing figures, skipped cases."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench.gpu.summary import BLOCK_GOAL, OVERHEAD_GOAL, main, rows, table

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "bench" / "gpu" / "check.sh"


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(CHECK)]).returncode == 0


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None or any(Path("/dev").glob("nvidia[0-9]*")),
                    reason="a GPU is visible here: the check would run")
def test_without_a_gpu_it_says_so_and_exits_2_before_any_python(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": "/nonexistent/python"}  # never started
    res = subprocess.run(["bash", str(CHECK)], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "no CUDA GPU on this machine" in res.stdout and "not run (exit 2)" in res.stdout
    assert "no CUDA GPU" in (tmp_path / "check.log").read_text()
    assert not (tmp_path / "steps.tsv").exists()


def test_cpu_is_refused_outside_a_smoke_run(tmp_path):
    res = subprocess.run(["bash", str(CHECK), "--cpu"], env={**os.environ, "OUT": str(tmp_path)},
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 2 and "--smoke only" in res.stderr


def _overhead(ratio: float) -> dict:
    return {"ratio": ratio, "ratio_spread": {"q1": ratio - 0.01, "q3": ratio + 0.01}, "device_name": "NVIDIA H200",
            "size": "default", "n_params": 834_304, "global_batch": 16, "world": 1, "ratio_hist_every_step": ratio + 0.05,
            "cpu_attributed_ratio": 1.002, "median_step_s": {"off": 0.004}}


def _stall(*blocks: tuple[float, float]) -> dict:
    sizes = {f"s{i}": {"ratio_block": med, "ratio_block_mean": mean, "ratio_block_p95": mean, "sync_block_ms": 20.0,
                       "async_block_ms": 20.0 * med} for i, (med, mean) in enumerate(blocks)}
    return {"device_name": "NVIDIA H200", "sizes": sizes}


def _junit(tests: int, failures: int = 0, skipped: int = 0) -> str:
    cases = "".join(f'<testcase classname="t" name="c{i}">{"<failure/>" if i < failures else ""}</testcase>'
                    for i in range(tests))
    return (f'<testsuites><testsuite name="pytest" tests="{tests}" failures="{failures}" errors="0" '
            f'skipped="{skipped}">{cases}</testsuite></testsuites>')


def _write(out: Path, steps: list[tuple[str, int]], files: dict[str, str | dict]) -> None:
    out.mkdir(exist_ok=True)
    (out / "steps.tsv").write_text("".join(f"{name}\t{rc}\t5\n" for name, rc in steps))
    for name, body in files.items():
        (out / name).write_text(body if isinstance(body, str) else json.dumps(body))


def test_every_step_within_its_goal_passes_and_the_figures_are_the_benches(tmp_path, capsys):
    _write(tmp_path, [("setup", 0), ("cuda_tests", 0), ("agent_overhead", 0), ("checkpoint_stall", 0)],
           {"env.json": {"torch": "2.11.0+cu130", "gpu": "NVIDIA H200", "cuda": "13.0"},
            "cuda_tests.xml": _junit(7), "agent_overhead.json": _overhead(OVERHEAD_GOAL - 0.004),
            "checkpoint_stall.json": _stall((0.02, 0.03), (BLOCK_GOAL, 0.04))})
    assert main([str(tmp_path)]) == 0
    found = {r.step: r for r in rows(tmp_path)}
    assert all(r.passed for r in found.values())
    assert found["agent_overhead"].figure == "1.006" and found["checkpoint_stall"].figure == f"{BLOCK_GOAL:.3f}"
    assert found["cuda_tests"].figure == "7 passed, 0 failed, 0 skipped"
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["passed"] is True and summary["env"]["gpu"] == "NVIDIA H200"
    assert "every step passed" in capsys.readouterr().out


def test_a_goal_missed_a_timeout_a_skipped_case_or_a_missing_figure_fails(tmp_path):
    _write(tmp_path, [("setup", 0), ("cuda_tests", 0), ("agent_overhead", 0), ("agent_overhead_wide", 124),
                      ("checkpoint_stall", 0), ("later", -1)],
           {"env.json": {"torch": "2.11.0+cu130"}, "cuda_tests.xml": _junit(7, skipped=1),
            "agent_overhead.json": _overhead(1.02), "agent_overhead_wide.json": _overhead(1.0),
            "checkpoint_stall.json": _stall((0.04, 0.06))})
    found = {r.step: r for r in rows(tmp_path)}
    assert found["setup"].passed
    assert not found["cuda_tests"].passed  # on a GPU a skipped cuda case did not see it
    assert not found["agent_overhead"].passed and found["agent_overhead"].figure == "1.020"
    # a step that timed out fails whatever it left behind
    assert not found["agent_overhead_wide"].passed and "timed out" in found["agent_overhead_wide"].detail
    assert not found["checkpoint_stall"].passed and found["checkpoint_stall"].figure == "0.060"  # the mean counts too
    assert not found["later"].passed and found["later"].figure == "not run"
    assert main([str(tmp_path)]) == 1
    text = table(list(found.values()))
    assert text.splitlines()[0].split() == ["step", "goal", "figure", "result", "s"] and text.count("FAIL") == 5


def test_a_step_that_wrote_nothing_or_a_cut_file_fails_and_no_step_at_all_is_no_pass(tmp_path):
    _write(tmp_path, [("cuda_tests", 1), ("agent_overhead", 0)], {"agent_overhead.json": '{"ratio": 1.0'})
    found = {r.step: r for r in rows(tmp_path)}
    assert found["cuda_tests"].figure == "none" and "exit 1" in found["cuda_tests"].detail
    assert found["agent_overhead"].figure == "unreadable" and not found["agent_overhead"].passed
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([str(empty)]) == 1
