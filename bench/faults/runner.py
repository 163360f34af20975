"""Runs scenarios one by one, each in its own worker process with its own timeout, and sums them.

Row ``status``: ``passed``, ``failed`` (a check did not hold), ``hang`` (past its timeout; the
worker and everything it started are killed), ``crash`` (the worker died without a result, or a
process the scenario watched died unasked), ``skipped`` (a PostgreSQL scenario with no PostgreSQL given or startable).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.faults.harness import REPO, child_env
from bench.faults.registry import Scenario
from bench.faults.worker import BOOTSTRAP_ENV, PG_ENV
from cliffguard.procs import stop_group

TOTALS = ("lost_events", "duplicate_commands", "forged_obeyed", "crashes", "hangs")


def run_one(sc: Scenario, bootstrap: str, pg_url: str | None, keep: Path | None = None,
            budget_s: float = float("inf")) -> dict[str, Any]:
    """One row; the scenario gets its own timeout or what is left of the suite's ``budget_s``."""
    row: dict[str, Any] = {"name": sc.name, "hole": sc.hole, "family": sc.family}
    if sc.postgres and not pg_url:
        return {**row, "status": "skipped", "passed": None, "seconds": 0.0, "detail": "skipped (no PostgreSQL)"}
    if budget_s < 10:
        return {**row, "status": "hang", "passed": False, "seconds": 0.0, "hangs": 1,
                "detail": "not run: the suite's time budget was spent"}
    timeout_s = min(sc.timeout_s, budget_s)
    tmp = Path(tempfile.mkdtemp(prefix=f"faults-{sc.name}-", dir=keep))
    out = tmp / "result.json"
    env = child_env({BOOTSTRAP_ENV: bootstrap, PG_ENV: pg_url or ""})
    log_path = tmp / "worker.log"
    t0 = time.monotonic()
    with log_path.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "bench.faults.worker", sc.name, "--out", str(out),
                                 "--tmp", str(tmp)], env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=str(REPO))
        try:
            proc.wait(timeout_s)
            hang = False
        except subprocess.TimeoutExpired:
            hang = True
        stop_group(proc, grace_s=3.0)  # also whatever it started that outlived it
    seconds = time.monotonic() - t0
    tail = log_path.read_text(errors="replace")[-1500:]
    if hang:
        return {**row, "status": "hang", "passed": False, "seconds": seconds, "hangs": 1,
                "detail": f"no result within {timeout_s:.0f}s", "log_tail": tail}
    if not out.exists():
        return {**row, "status": "crash", "passed": False, "seconds": seconds, "crashes": 1,
                "detail": f"worker exited {proc.returncode} without a result", "log_tail": tail}
    res = json.loads(out.read_text())
    passed = not res["failures"] and res["crashes"] == 0
    status = "passed" if passed else ("crash" if res["crashes"] else "failed")
    detail = res["detail"] if passed else "; ".join([*res["failures"], res["detail"]]).strip("; ")
    row = {**row, **res, "status": status, "passed": passed, "seconds": seconds, "hangs": 0, "detail": detail}
    if not passed:
        row["log_tail"] = tail
    return row


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ran = [r for r in rows if r["status"] != "skipped"]
    out: dict[str, Any] = {k: sum(int(r.get(k) or 0) for r in ran) for k in TOTALS}
    out.update(scenarios=len(rows), ran=len(ran), passed=sum(r["status"] == "passed" for r in rows),
               failed=sum(r["status"] == "failed" for r in rows), skipped=len(rows) - len(ran))
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'scenario':<36}{'status':<9}{'s':>6} {'prod/stored':>12} {'sent/obeyed':>12} {'forged':>7} "
             f"{'rb':>3} {'recover':>8}"]
    for r in rows:
        if r["status"] == "skipped":
            lines.append(f"{r['name']:<36}{'skipped':<9}{'':>6} {r['detail']}")
            continue
        rec = "" if r.get("recover_s") is None else f"{r['recover_s']:.1f}s"
        lines.append(f"{r['name']:<36}{r['status']:<9}{r['seconds']:>6.1f} "
                     f"{r.get('events_produced', 0):>5}/{r.get('events_stored', 0):<6} "
                     f"{r.get('commands_sent', 0):>5}/{r.get('commands_obeyed', 0):<6} "
                     f"{r.get('forged_obeyed', 0):>3}/{r.get('forged_sent', 0):<3} {r.get('rollbacks', 0):>3} {rec:>8}")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table: scenario, hole, result and the counts that matter for it."""
    out = ["| scenario | hole / attack | result | produced / stored | sent / obeyed | forged obeyed | rollbacks | recover |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "skipped":
            out.append(f"| `{r['name']}` | {r['hole']} | {r['detail']} | | | | | |")
            continue
        rec = "" if r.get("recover_s") is None else f"{r['recover_s']:.1f} s"
        prod = f"{r['events_produced']} / {r['events_stored']}" if r.get("events_produced") else ""
        sent = f"{r['commands_sent']} / {r['commands_obeyed']}" if r.get("commands_sent") else ""
        forged = f"{r['forged_obeyed']} of {r['forged_sent']}" if r.get("forged_sent") else ""
        out.append(f"| `{r['name']}` | {r['hole']} | {r['status']} ({r['seconds']:.0f} s) | {prod} | {sent} | "
                   f"{forged} | {r.get('rollbacks') or ''} | {rec} |")
    return "\n".join(out)
