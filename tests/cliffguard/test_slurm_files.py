"""The Slurm cluster's files and the job script, without Slurm (the slurm tier runs them for real)."""

from __future__ import annotations

import sys

import pytest

from cliffguard.signals import children
from cliffguard.slurm.classes import CLASSES
from cliffguard.slurm.cluster import Cluster, ClusterConfig
from cliffguard.slurm.jobs import batch_script, preemptions


def test_the_rendered_config_declares_the_issues_cluster(tmp_path):
    conf = Cluster(ClusterConfig(dir=str(tmp_path), cpus=6, grace_s=45)).render()
    for line in ("ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SlurmdParameters=config_overrides",
                 "PreemptType=preempt/partition_prio", "PreemptMode=REQUEUE", "RequeueExit=75", "CPUs=6",
                 "SlurmctldParameters=preempt_send_user_signal",  # the warning at the decision, not after grace
                 f"AuthInfo=socket={tmp_path.resolve()}/munge/munge.socket.2"):
        assert line in conf, line
    prod = next(line for line in conf.splitlines() if line.startswith("PartitionName=production"))
    explore = next(line for line in conf.splitlines() if line.startswith("PartitionName=exploration"))
    assert "PriorityTier=1 " in prod and "PreemptMode=REQUEUE" in prod and "GraceTime=45" in prod
    assert "PriorityTier=10 " in explore and "PreemptMode" not in explore and "GraceTime" not in explore
    assert "{" not in conf  # every placeholder filled
    assert {c.name for c in CLASSES} == {"exploration", "production"}


def test_cluster_config_is_validated():
    with pytest.raises(ValueError, match="slurmd_port"):
        ClusterConfig(ctld_port=20000, slurmd_port=20000)
    with pytest.raises(ValueError, match="grace_s"):
        ClusterConfig(grace_s=0)


def test_the_job_script_execs_this_interpreter_and_resumes_on_a_restart():
    script = batch_script("production", ["--run", "a b", "--steps", "10"], cpus=4, output="/x/%j.out",
                          signal_before_s=60)
    assert "#SBATCH --partition=production" in script and "#SBATCH --requeue" in script
    assert "#SBATCH --signal=B:USR1@60" in script
    assert f"exec {sys.executable} -m cliffguard train --run 'a b' --steps 10 $resume" in script
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then resume="--resume"; fi' in script
    with pytest.raises(ValueError, match="--class: 'urgent'"):
        batch_script("urgent", [], cpus=1, output="o")
    # a production job asks for the warning by itself (sent at the preemption decision); exploration none
    assert "#SBATCH --signal=B:USR1@60" in batch_script("production", [], cpus=1, output="o")
    assert "--signal" not in batch_script("exploration", [], cpus=1, output="o")


def test_what_preempted_what_is_read_from_the_log_and_junk_is_skipped(tmp_path):
    log = tmp_path / "slurmctld.log"
    log.write_text("[2026-12-02T04:45:10.879] preempted JobId=8 has been requeued to reclaim resources for JobId=9\n"
                   "garbage \x00 line\n[x] preempted JobId=abc has been requeued to reclaim resources for JobId=1\n")
    assert preemptions(log) == [{"ts": "2026-12-02T04:45:10.879", "job": "8", "by": "9"}]
    assert preemptions(tmp_path / "missing.log") == []
    # the decision (debug), for a job warned at once that saved and left within its grace time; a job
    # that did not leave gets the requeue line as well when the grace time ends: one record each
    log.write_text("[2026-12-05T18:02:53.100] debug:  setting 30 sec preemption grace time for JobId=1 to reclaim "
                   "resources for JobId=3\n"
                   "[2026-12-05T18:02:54.819] _job_complete: JobId=1 WEXITSTATUS 75\n"
                   "[2026-12-05T18:05:00.000] debug:  setting 30 sec preemption grace time for JobId=2 to reclaim "
                   "resources for JobId=4\n"
                   "[2026-12-05T18:05:30.000] preempted JobId=2 has been requeued to reclaim resources for JobId=4\n")
    assert preemptions(log) == [{"ts": "2026-12-05T18:02:53.100", "job": "1", "by": "3"},
                                {"ts": "2026-12-05T18:05:00.000", "job": "2", "by": "4"}]


def test_children_finds_a_childs_pid():
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import os

        assert proc.pid in children(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_a_cluster_made_deep_in_a_tree_puts_munges_socket_where_its_path_fits(tmp_path):
    from cliffguard.slurm.cluster import Cluster, ClusterConfig

    deep = tmp_path / ("d" * 60) / ("e" * 60)
    cluster = Cluster(ClusterConfig(dir=str(deep)))
    # munged's socket and slurmstepd's (<spool>/<node>_<job>.<step>) fit sun_path (108 bytes)
    assert len(str(cluster.socket)) < 100 and len(str(cluster.spool / "cg1_4294967.4294967291")) < 108
    assert str(deep) not in str(cluster.socket) and str(deep) not in str(cluster.spool)
    rendered = cluster.render()
    assert f"AuthInfo=socket={cluster.socket}" in rendered and f"SlurmdSpoolDir={cluster.spool}" in rendered
    assert Cluster(ClusterConfig(dir=str(deep))).socket == cluster.socket  # the same cluster finds it again
