"""The figures of one hang run: from the faults' own clock (``<run_dir>/faults/fired.jsonl``), the
store (evidence rows, the hang incidents and their transitions) and the watched launches (worker
processes by life, rank 0's progress lines). Every time is seconds after the fault fired."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.hangs.kinds import Kind
from bench.hangs.launch import POLL_S, Watched

_REMEDY = {"hang": "in_place", "hang_again": "exclude", "node_check_failed": "exclude"}


def fired(run_dir: Path) -> list[dict[str, Any]]:
    """Each firing of a hang fault, oldest first (a straggler's slow_rank is not one)."""
    try:
        lines = (run_dir / "faults" / "fired.jsonl").read_text().splitlines()
    except OSError:
        return []
    return sorted((json.loads(x) for x in lines if x.strip()), key=lambda e: e["ts"])


def _after(ts: float | None, t0: float) -> float | None:
    return None if ts is None else round(ts - t0, 2)


def _trigger(t: dict[str, Any]) -> str:
    return str(t["reason"]).split(":", 1)[0]


def monitored(kind: Kind, store: Any, run: str, run_dir: Path, launches: list[Watched]) -> dict[str, Any]:
    from cliffguard.controller.store import read

    faults = fired(run_dir)
    with store.session() as s:
        ev_rows = read.evidence(s, run, kind="hang.evidence", limit=None)
        checks = read.evidence(s, run, kind="node.check", limit=None)
        incs = [i for i in read.incidents(s, run, limit=None)[::-1] if i["rule"] == "hang"]
        timelines = {i["id"]: read.transitions(s, run, incident_id=i["id"], limit=None) for i in incs}
        alerts = read.alerts(s, run, limit=None)
        runrow = read.get_run(s, run)
    episodes = []
    for n, f in enumerate(faults):
        t0 = f["ts"]
        nxt = faults[n + 1]["ts"] if n + 1 < len(faults) else float("inf")
        inc = next((i for i in incs if t0 <= i["opened_at"] < nxt), None)
        tl = timelines.get(inc["id"], []) if inc else []
        at = {(_trigger(t)): t for t in tl}
        opened = next((t for t in tl if _trigger(t) in _REMEDY or _trigger(t).endswith(("unavailable", "spent"))), None)
        again = at.get("training_again")
        first_ev = min((r["ts"] for r in ev_rows if t0 - 1 <= r["ts"] < nxt and r["reason"] != "resolved"), default=None)
        culprit = (inc or {}).get("evidence", {}).get("culprit")
        old = _alive_at(launches, t0)
        t_again = again["ts"] if again else None
        waiting = [w.rank for w in old if t_again is not None and w.last > t_again + POLL_S]
        episodes.append({
            "fault": f["kind"], "rank": f["rank"], "step": f["step"], "life": f["life"],
            "detect_s": _after(first_ev, t0),
            "named_s": _after(inc["opened_at"], t0) if inc else None,
            "culprit": culprit, "culprit_correct": culprit == list(kind.culprit) if inc else False,
            "frame": (inc or {}).get("evidence", {}).get("frame"),
            "collective": (inc or {}).get("evidence", {}).get("collective"),
            "remedy": _REMEDY.get(_trigger(opened)) if opened else None,
            "restart_begun_s": _after(at["workers_started"]["ts"], t0) if "workers_started" in at else None,
            "new_life_process_s": _after(_first_new(launches, t0), t0),
            "training_again_s": _after(t_again, t0),
            "steps_lost": f["step"] - int((again["evidence"] or {}).get("step", f["step"])) if again else None,
            "outcome": inc["outcome"] if inc else None,
            "old_life_last_seen_s": _after(max((w.last for w in old), default=None), t0),
            "left_waiting": waiting,
        })
    lives = sorted({w.life for la in launches for w in la.workers.values()})
    steps = [st for la in launches for _, st in la.steps()]
    return {
        "episodes": episodes, "hang_incidents": len(incs), "lives": lives,
        "node_checks": [{"life": c["life"], "ok": c["data"]["ok"], "seconds": c["data"]["seconds"],
                         "slow": c["data"]["slow"], "detail": c["data"]["detail"]} for c in checks],
        "straggler_alerts": sum(1 for a in alerts if a["rule"] == "straggler"),
        "last_step": max(steps, default=None), "run_status": runrow["status"] if runrow else None,
        "exit_codes": [la.code for la in launches],
    }


def _first_new(launches: list[Watched], t0: float) -> float | None:
    """When the first worker process of a later life was seen (torchrun began the restart)."""
    return min((w.first for la in launches for w in la.workers.values() if w.first > t0), default=None)


def _alive_at(launches: list[Watched], t0: float) -> list[Any]:
    """The workers of the life that hung: running when the fault fired (a node's torchrun counts only
    its own restarts, so its restart count does not tell the lives of a run of several nodes apart)."""
    return [w for la in launches for w in la.workers.values() if w.first <= t0 <= w.last + POLL_S]


def baseline(kind: Kind, run_dir: Path, launch: Watched) -> dict[str, Any]:
    """torchrun alone: it restarts everything when a worker fails (a peer's death, or the collective
    timeout on the ranks that waited); it names no culprit."""
    faults = fired(run_dir)
    if not faults:
        return {"episodes": [], "lives": launch.lives(), "exit_codes": [launch.code]}
    f = faults[0]
    t0 = f["ts"]
    failed = launch.first_exit(f["life"])
    nxt = launch.life_start(f["life"] + 1)  # one node: its restart count is the life
    again = next(((ts, st) for ts, st in launch.steps() if nxt is not None and ts > nxt), None)
    old = _alive_at([launch], t0)
    waiting = [w.rank for w in old if again is not None and w.last > again[0] + POLL_S]
    return {"episodes": [{
        "fault": f["kind"], "rank": f["rank"], "step": f["step"], "life": f["life"],
        "detect_s": _after(failed, t0) if nxt is not None else None,
        "named_s": None, "culprit": None, "culprit_correct": False, "remedy": "restart everything" if nxt else None,
        "restart_begun_s": None, "new_life_process_s": _after(nxt, t0),
        "training_again_s": _after(again[0], t0) if again else None,
        "steps_lost": f["step"] - (again[1] - 1) if again else None,  # a progress line prints the next step
        "old_life_last_seen_s": _after(max((w.last for w in old), default=None), t0), "left_waiting": waiting}],
        "lives": launch.lives(), "exit_codes": [launch.code]}
