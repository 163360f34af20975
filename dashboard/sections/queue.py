"""The queue (issue 24): the priority classes, the jobs of a local Slurm cluster and what preempted
what, beside the runs' own preemptions (the run page's Preemptions section).

It reads what ``cliffguard queue`` reads: ``squeue`` against the cluster's ``slurm.conf`` and
slurmctld's log (the one-machine cluster keeps no accounting database). A ``squeue`` that fails is
said on the page, with what it printed; the log's preemptions still show.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from cliffguard.dashboard.config import DashboardConfig
from cliffguard.slurm.classes import CLASSES, PriorityClass

JOB_COLUMNS = ("job", "class", "name", "state", "reason")
PREEMPTION_COLUMNS = ("ts", "job", "job_name", "by", "by_name")
SQUEUE_TIMEOUT_S = 10.0
"""A live section must not hang on a controller that does not answer; squeue's own retries take longer."""


def class_rows(classes: tuple[PriorityClass, ...] = CLASSES) -> list[dict[str, object]]:
    """One row per class, highest tier first, with the classes it may preempt."""
    ordered = sorted(classes, key=lambda c: -c.tier)
    return [{"class": c.name, "tier": c.tier, "preempts": ", ".join(o.name for o in ordered if o.tier < c.tier
                                                                      and o.preempt_mode) or "–",
             "when preempted": c.preempt_mode or "never (top tier)", "grace time": "yes" if c.grace else "no"}
            for c in ordered]


def named_preemptions(pre: list[dict[str, str]], jobs: list[dict[str, str]]) -> list[dict[str, str]]:
    """The log's preemptions, newest first, with each job's name where squeue still knows it."""
    names = {j["job"]: f"{j['name']} ({j['class']})" for j in jobs}
    return [{"ts": p["ts"], "job": p["job"], "job_name": names.get(p["job"], "–"), "by": p["by"],
             "by_name": names.get(p["by"], "–")} for p in reversed(pre)]


def render(cfg: DashboardConfig, every: float | None) -> None:
    st.title("Queue")
    if not cfg.slurm_dir:
        st.info("no Slurm cluster configured: `cliffguard dashboard --slurm-dir DIR` (a `cliffguard slurm up` "
                "directory) shows its classes, jobs and preemptions here")
        return
    st.fragment(_live, run_every=every)(cfg)


def _live(cfg: DashboardConfig) -> None:
    from cliffguard.slurm.cluster import Cluster, ClusterConfig
    from cliffguard.slurm.jobs import jobs, preemptions

    cluster = Cluster(ClusterConfig(dir=cfg.slurm_dir))
    st.caption(f"cluster: `{cluster.conf}`")
    st.subheader("Classes")
    st.dataframe(pd.DataFrame(class_rows()), hide_index=True, width="stretch")
    st.subheader("Jobs")
    rows: list[dict[str, str]] = []
    if not cluster.conf.is_file():
        st.error(f"the queue cannot be read: no slurm.conf in `{cluster.root}` (not a `cliffguard slurm up` "
                 "directory, or the cluster was never brought up)")
    else:
        try:
            rows = jobs(cluster.env(), timeout_s=SQUEUE_TIMEOUT_S)
        except (RuntimeError, OSError) as exc:
            st.error(f"the queue cannot be read: {exc}")
    if rows:
        st.dataframe(pd.DataFrame(rows, columns=list(JOB_COLUMNS)), hide_index=True, width="stretch")
    elif cluster.conf.is_file():
        st.caption("no jobs queued or running")
    st.subheader("What preempted what")
    pre = named_preemptions(preemptions(cluster.root / "slurmctld.log"), rows)
    if pre:
        st.dataframe(pd.DataFrame(pre, columns=list(PREEMPTION_COLUMNS)), hide_index=True, width="stretch")
    else:
        st.caption("no preemptions in slurmctld's log")
