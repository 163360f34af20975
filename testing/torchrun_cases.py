"""A 2-process torchrun of an integration test's worker script: every case in one run, each rank's
result read back (``<out>/<case>-rank<r>.json``), the worker's stderr shown when it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cliffguard.controller.broker import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_cases(worker: Path, out: Path, cases: tuple[str, ...], env: dict[str, str] | None = None,
              timeout_s: float = 240) -> dict[str, list[dict[str, Any]]]:
    """Case -> [rank 0's result, rank 1's]. The user's ``CLIFFGUARD_*`` settings are left out: the
    worker wires its own."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})}
    full = {k: v for k, v in full.items() if not k.startswith("CLIFFGUARD_")}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(free_port()), str(worker), str(out), *cases],
                          cwd=out, env=full, capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-4000:]
    return {c: [json.loads((out / f"{c}-rank{r}.json").read_text()) for r in (0, 1)] for c in cases}
