"""The queue view (issue 24): the classes highest tier first with whom they preempt; with no
cluster configured it says how to name one; a queue squeue cannot read is said on the page while
slurmctld's log still gives what preempted what; on a real one-machine cluster (slurm tier) a job
submitted to a class is listed with that class and its state."""

from __future__ import annotations

import subprocess
import time

import pytest

from cliffguard.dashboard.sections.queue import class_rows, named_preemptions
from cliffguard.slurm.classes import PriorityClass
from tests.dashboard.conftest import run_app, texts

pytestmark = pytest.mark.timeout(180)

LOG_LINE = ("[2026-12-02T10:00:01.123] preempted JobId=7 has been requeued to reclaim resources for JobId=9\n")


def _queue_view(monkeypatch, slurm_dir: str | None):
    if slurm_dir is not None:
        monkeypatch.setenv("CLIFFGUARD_DASHBOARD__SLURM_DIR", slurm_dir)
    at = run_app()
    at.radio(key="view").set_value("queue").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_classes_are_listed_highest_tier_first_with_whom_they_preempt():
    rows = class_rows((PriorityClass("low", 1, "REQUEUE", True), PriorityClass("top", 10, None, False),
                       PriorityClass("mid", 5, "REQUEUE", True)))
    assert [(r["class"], r["preempts"]) for r in rows] == [("top", "mid, low"), ("mid", "low"), ("low", "–")]
    assert rows[0]["when preempted"] == "never (top tier)" and rows[2]["grace time"] == "yes"


def test_preemptions_are_newest_first_and_named_from_the_queue():
    pre = [{"ts": "t1", "job": "7", "by": "9"}, {"ts": "t2", "job": "8", "by": "Invalid"}]
    jobs = [{"job": "7", "class": "production", "name": "prod-a", "state": "PENDING", "reason": "BeginTime"}]
    assert named_preemptions(pre, jobs) == [
        {"ts": "t2", "job": "8", "job_name": "–", "by": "Invalid", "by_name": "–"},
        {"ts": "t1", "job": "7", "job_name": "prod-a (production)", "by": "9", "by_name": "–"}]


def test_without_a_cluster_the_view_says_how_to_name_one(filled, monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_DASHBOARD__SLURM_DIR", raising=False)
    assert "--slurm-dir DIR" in texts(_queue_view(monkeypatch, None))


def test_an_unreadable_queue_is_said_and_the_logs_preemptions_still_show(filled, monkeypatch, tmp_path):
    (tmp_path / "slurmctld.log").write_text("[x] something else\n" + LOG_LINE)  # no slurm.conf: squeue fails
    at = _queue_view(monkeypatch, str(tmp_path))
    assert any("the queue cannot be read" in e.value for e in at.error)
    table = next(d.value for d in at.dataframe if "by_name" in d.value.columns)
    assert list(table["job"]) == ["7"] and list(table["by"]) == ["9"]


@pytest.mark.slurm
def test_a_submitted_job_is_listed_with_its_class_and_state(filled, monkeypatch, slurm_cluster):
    from cliffguard.slurm.jobs import jobs, submit

    env = slurm_cluster.env()
    job = submit("#!/bin/bash\n#SBATCH --partition=exploration\n#SBATCH --job-name=queue-view\n#SBATCH --output=/dev/null\n"
                 "sleep 120\n", env)
    try:
        end = time.monotonic() + 60
        while not any(j["job"] == str(job) for j in jobs(env)):
            assert time.monotonic() < end, "squeue never listed the job"
            time.sleep(0.5)
        at = _queue_view(monkeypatch, str(slurm_cluster.root))
        assert not at.error, [e.value for e in at.error]
        table = next(d.value for d in at.dataframe if "reason" in d.value.columns)
        row = table[table["job"] == str(job)].iloc[0]
        assert (row["class"], row["name"]) == ("exploration", "queue-view")
        assert row["state"] in {"PENDING", "RUNNING"}
    finally:
        subprocess.run(["scancel", str(job)], env=env, timeout=30, check=False)
