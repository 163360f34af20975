"""The verdict of ``cliffguard demo --preemption`` (cliffguard/demo_preemption.py): the facts are read
once (the store, the trainer's scale events and progress marks, slurmctld's log), the judgement is pure.

``ok`` only when:

- the first exploration job preempted one production group and the controller recorded a
  preemption of scope ``nodes`` closed ``shrunk``, with the run scaling down to half the world and
  later back up to the full world;
- the whole-node exploration job preempted both groups and the run trained again afterwards (a
  preemption closed ``requeued``);
- no step was lost to any preemption (every rank saved at the boundary: each incident's
  ``steps_lost`` and each scale event's are 0), and every save verified within the deadline;
- the run reached its last step with a final held-out loss within ``loss_tolerance`` of the
  uninterrupted run's, and no incident was left halted or open (others, e.g. a loss rule's on
  this small run's noise, are listed: a preemption is not one).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any


def facts(cfg: Any, sc: Any, stack: Any, cluster: Any) -> dict[str, Any]:
    from cliffguard.controller.store import read
    from cliffguard.demo_elastic import _events, _paths, _read_json
    from cliffguard.demo_stack import collect
    from cliffguard.slurm.jobs import preemptions as slurm_preemptions

    with stack.store.session() as s:
        stored = read.preemptions(s, cfg.run, limit=None)[::-1]
    ref_mark = _read_json(_paths(SimpleNamespace(out_dir=cfg.out_dir, run=f"{cfg.run}-reference"))[0]) or {}
    return {"preemptions": stored, "incidents": collect(stack.store, cfg.run)["incidents"],
            "scale_events": _events(Path(sc.events_path)), "mark": sc.mark(), "reference_mark": ref_mark,
            "slurm": slurm_preemptions(cluster.root / "slurmctld.log"), "jobs": dict(sc.jobs),
            "exploration_jobs": list(sc.explore)}


def _final_loss(mark: dict[str, Any]) -> float | None:
    for key in ("val_loss", "loss_mean"):
        if isinstance(mark.get(key), (int, float)):
            return float(mark[key])
    return None


def summarize(cfg: Any, f: dict[str, Any], problem: str) -> dict[str, Any]:
    full, half = 2 * cfg.nproc, cfg.nproc
    pre = [{k: p.get(k) for k in ("id", "scope", "nodes", "outcome", "signal", "saved_step", "save_s", "deadline_s",
                                  "verified", "steps_lost", "seconds_to_train")} for p in f["preemptions"]]
    scale = [{k: e.get(k) for k in ("step", "from_world", "to_world", "global_batch", "lr_factor", "steps_lost",
                                    "seconds_lost")} for e in f["scale_events"]]
    problems = [problem] if problem else []
    if not any(p["scope"] == "nodes" and p["outcome"] == "shrunk" for p in pre):
        problems.append("no preemption of one group closed 'shrunk'")
    if not any(p["outcome"] == "requeued" for p in pre):
        problems.append("no preemption closed 'requeued' (the whole-node preemption)")
    lost = [p for p in pre if p["steps_lost"] != 0 or not p["verified"]]
    if lost:
        problems.append(f"preemptions that lost steps or did not verify their save: {[p['id'] for p in lost]}")
    down = [e for e in scale if e["from_world"] == full and e["to_world"] == half]
    up = [e for e in scale if e["from_world"] == half and e["to_world"] == full and down and e["step"] >= down[0]["step"]]
    if not down or not up:
        problems.append(f"scale events {[(e['from_world'], e['to_world']) for e in scale]}: expected {full} -> {half} "
                        f"and back")
    if any(e["steps_lost"] for e in scale):
        problems.append("a scale event lost steps")
    preempted_jobs = {int(r["job"]) for r in f["slurm"]}
    if not set(f["jobs"].values()) <= preempted_jobs:
        problems.append(f"slurmctld preempted jobs {sorted(preempted_jobs)}, not both groups {sorted(f['jobs'].values())}")
    final, ref = _final_loss(f["mark"]), _final_loss(f["reference_mark"])
    gap = None if final is None or ref is None else (final - ref) / ref
    if int(f["mark"].get("step", -1)) < cfg.steps:
        problems.append(f"the run ended at step {f['mark'].get('step')} of {cfg.steps}")
    if gap is None or abs(gap) > cfg.loss_tolerance:
        problems.append(f"final loss {final} vs uninterrupted {ref}: not within {cfg.loss_tolerance:.0%}")
    halted = [i for i in f["incidents"] if i["outcome"] in ("halted", "open")]
    if halted:
        problems.append(f"incidents left halted or open: {[(i['id'], i['rule'], i['outcome']) for i in halted]}")
    return {"ok": not problems, "preemptions": pre, "scale_events": scale,
            "slurm_preemptions": [{"job": r["job"], "by": r["by"], "at": r["ts"]} for r in f["slurm"]],
            "jobs": f["jobs"], "exploration_jobs": f["exploration_jobs"], "final_loss": final,
            "uninterrupted_final_loss": ref, "loss_gap": None if gap is None else round(gap, 4),
            "final_step": f["mark"].get("step"),
            "incidents": [{k: i[k] for k in ("id", "rule", "outcome", "spike_step")} for i in f["incidents"]],
            "problems": problems}
