"""What an incident's cause was, in a line and a table (pure; the incidents section shows them).

The triage ladder's incidents carry their evidence: a step the kit re-ran (``triage``: its class,
the remedy the kit applied, each re-run's per-rank loss), a rank the re-runs found bad
(``bad_rank``: the rank, its node, the eviction), a diverged replica (``sdc``: the suspects, the
last step the replicas agreed), a suspect node that joined a run (``suspect_node``: its record). A loss rule's incident says nothing here (its window stats are
shown as metrics)."""

from __future__ import annotations

from typing import Any

import pandas as pd

RERUN_ROWS = (("original", "the step as trained"), ("same", "the same shards again"),
              ("swapped", "the shards rotated by one rank"), ("control", "the newest good batch"))


def cause_line(rule: str, ev: dict[str, Any]) -> str | None:
    """One line naming the cause and the remedy, or None for an incident of another kind."""
    if rule == "triage":
        rank = f" on rank {ev['rank']}" if ev.get("rank") is not None else ""
        ids = ev.get("sample_ids") or []
        listed = f"; {len(ids)} sample(s) listed, never fed again" if ids else ""
        return (f"class **{ev.get('cause')}**{rank}: {ev.get('remedy')} by the trainer after "
                f"{ev.get('reruns')} re-run(s) ({_secs(ev.get('rerun_s'))}){listed}. {ev.get('reason', '')}")
    if rule == "bad_rank":
        node = f" on node **{ev['node']}**" if ev.get("node") else " (node unknown)"
        return (f"class **bad_rank**: rank {ev.get('rank')}{node} computes wrong numbers whatever shard it gets; "
                f"evicted: the worker group restarts without that node. {ev.get('reason', '')}")
    if rule == "suspect_node":  # a node the suspect-node store holds beat in the run (controller/suspects.py)
        rec = ev.get("record") or {}
        return (f"node **{ev.get('node')}** is suspect ({rec.get('cause')}, evicted from run {rec.get('run')}: "
                f"{rec.get('why', '')}); not admitted until cleared (`cliffguard nodes clear`)")
    if rule == "sdc":
        suspects = ev.get("suspects") or []
        who = (f"rank(s) {suspects} differ from the others" if ev.get("named") else
               f"no majority among the replicas ({ev.get('groups')}): none named")
        last = ev.get("last_agreed")
        since = f"they last agreed at step {last}" if last is not None else "they never agreed"
        return f"**silent data corruption**: the replicas' parameters differ at step {ev.get('step')}: {who}; {since}"
    return None


def rerun_table(ev: dict[str, Any]) -> pd.DataFrame | None:
    """Each re-run's loss per rank (a row per re-run, a column per rank), or None without re-runs."""
    runs = ev.get("reruns_by_rank") or {}
    rows = []
    for key, label in RERUN_ROWS:
        run = runs.get(key)
        if isinstance(run, dict) and isinstance(run.get("loss"), list):
            rows.append({"re-run": label, **{f"rank {r}": v for r, v in enumerate(run["loss"])}})
    return pd.DataFrame(rows) if rows else None


def _secs(x: Any) -> str:
    return f"{float(x):.3f} s" if isinstance(x, (int, float)) else "?"
