"""``cliffguard submit`` over ``sbatch`` and ``cliffguard queue`` over ``squeue`` and the controller log.

A submitted job is a batch script that ``exec``s ``cliffguard train`` with this interpreter
(``sys.executable``: the job runs the same installation, from any directory), so the batch shell
is the launcher and a ``--signal=B:USR1@N`` warning reaches it. The script adds ``--resume`` when
Slurm restarts it (``SLURM_RESTART_COUNT`` > 0: requeued after a preemption or a ``RequeueExit``).
Why sbatch and not submitit: submitit is not installed here, and a batch script is what Slurm's
own requeue restarts; submitit's pickled-callable jobs add nothing for a CLI that already exists.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

from cliffguard.slurm.classes import BY_NAME

_PREEMPTED = re.compile(r"^\[(?P<ts>[^\]]{1,40})\] preempted JobId=(?P<job>\d+) has been requeued to reclaim "
                        r"resources for JobId=(?P<by>\d+|Invalid)")
_GRACE = re.compile(r"^\[(?P<ts>[^\]]{1,40})\] debug:\s+setting \d+ sec preemption grace time for JobId=(?P<job>\d+) "
                    r"to reclaim resources for JobId=(?P<by>\d+|Invalid)")
"""The decision, logged at ``debug`` (the template's ``SlurmctldDebug``): a job warned at the decision
(``preempt_send_user_signal``) that saves and exits within ``GraceTime`` is requeued by ``RequeueExit``,
and the "preempted ... has been requeued" line, written when the grace time ends, never comes."""


def batch_script(cls: str, train_args: list[str], *, cpus: int, output: str, signal_before_s: int = 0,
                 name: str = "cliffguard") -> str:
    if cls not in BY_NAME:
        raise ValueError(f"--class: {cls!r} is not one of {', '.join(BY_NAME)}")
    lines = ["#!/bin/bash", f"#SBATCH --partition={cls}", f"#SBATCH --job-name={name}",
             f"#SBATCH --cpus-per-task={cpus}", "#SBATCH --requeue", "#SBATCH --open-mode=append",
             f"#SBATCH --output={output}"]
    warn_s = signal_before_s or BY_NAME[cls].warn_s  # a preemptible class is warned at the decision
    if warn_s:
        lines.append(f"#SBATCH --signal=B:USR1@{warn_s}")
    train = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "cliffguard", "train", *train_args])
    lines += ['resume=""', 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then resume="--resume"; fi',
              'echo "cliffguard job $SLURM_JOB_ID start (restart ${SLURM_RESTART_COUNT:-0}) $(date +%s.%N)"',
              f"exec {train} $resume"]
    return "\n".join(lines) + "\n"


def submit(script: str, env: dict[str, str]) -> int:
    """sbatch the script (on stdin); the job id."""
    out = subprocess.run(["sbatch", "--parsable"], input=script, env=env, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed: {out.stderr.strip()}")
    return int(out.stdout.strip().split(";")[0])


def release(job: int, env: dict[str, str]) -> None:
    """Lift a requeued job's hold: Slurm sets its BeginTime about two minutes ahead; an operator may
    let it start as soon as it fits (``scontrol update JobId=N StartTime=now``)."""
    out = subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], env=env, capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"scontrol update JobId={job} StartTime=now failed: {out.stderr.strip()}")


def jobs(env: dict[str, str], timeout_s: float = 30.0) -> list[dict[str, str]]:
    """Every job squeue knows: id, class (partition), name, state, reason, restarts."""
    try:
        out = subprocess.run(["squeue", "-h", "-o", "%i|%P|%j|%T|%r"], env=env, capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:  # e.g. no slurm.conf: it looks for a controller to ask
        raise RuntimeError(f"squeue did not answer in {timeout_s:.0f} s (is slurmctld up?)") from exc
    if out.returncode != 0:
        raise RuntimeError(f"squeue failed: {out.stderr.strip()}")
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5:
            rows.append(dict(zip(("job", "class", "name", "state", "reason"), parts, strict=True)))
    return rows


def preemptions(log_path: Path) -> list[dict[str, str]]:
    """What preempted what, from slurmctld's log (no accounting database on this cluster)."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out: list[dict[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for line in text.splitlines():
        m = _GRACE.match(line) or _PREEMPTED.match(line)
        if m and (m["job"], m["by"]) not in seen:  # one record per preemption: its decision, else its requeue
            seen.add((m["job"], m["by"]))
            out.append(m.groupdict())
    return out
