"""A one-machine Slurm cluster from Debian's packages (``slurm-wlm`` 22.05, ``munge``), for local
use and the ``slurm`` test tier: ``cliffguard slurm up|down|status``.

Everything lives under one directory (``--dir``, default ``~/.cache/cliffguard/slurm``): a
generated munge key (1024 random bytes, 0400) and munged's socket, ``slurm.conf`` rendered from
the template this package ships (``slurm.conf.in``) with the priority classes of
``classes.py``, and slurmctld's and slurmd's state, spool, logs and pid files. The daemons run as
root with no cgroups (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``) and the
node may claim more CPUs than the machine has (``SlurmdParameters=config_overrides``), so a
production job and an exploration job each asking for all the node's CPUs share two cores.
``down`` stops exactly the daemons ``up`` started (by their pid files); commands reach this cluster
through ``SLURM_CONF`` (``env()``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cliffguard.core.declared import bounded, check_declared, non_empty
from cliffguard.slurm.classes import CLASSES, partition_lines

TEMPLATE = Path(__file__).with_name("slurm.conf.in")
DAEMONS = ("munged", "slurmctld", "slurmd")


SOCKETS_ROOT_MAX = 64
"""A Unix socket's path must fit ``sun_path`` (108 bytes on Linux): munged's socket and
slurmstepd's (``<spool>/<node>_<job>.<step>``, ~25 more) live under a directory this short."""


def sockets_dir(root: Path) -> Path:
    """Where the sockets go: the cluster's directory when it is short enough, else a short
    directory of the temp dir named after it (a cluster made deep in a tree, e.g. by pytest, starts)."""
    if len(str(root)) <= SOCKETS_ROOT_MAX:
        return root
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"cliffguard-slurm-{tag}"


def default_dir() -> str:
    return str(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cliffguard" / "slurm")


@dataclass(kw_only=True, slots=True)
class ClusterConfig:
    dir: str = non_empty(default_dir())
    """Where the key, the config, the state and the logs go."""
    node: str = non_empty("cg1")
    """The one node's name."""
    cpus: int = bounded(4, ge=1)
    """CPUs the node claims (more than the machine has is fine: config_overrides)."""
    grace_s: int = bounded(30, ge=1)
    """The production partition's GraceTime: from the preemption decision (and its SIGUSR1 warning) to SIGTERM."""
    ctld_port: int = bounded(16817, ge=1024, le=65535)
    slurmd_port: int = bounded(16818, ge=1024, le=65535)
    requeue_exit: int = bounded(75, ge=1, le=254)
    """``RequeueExit``: a job exiting with it is requeued ([agent.preemption] exit_code)."""

    def __post_init__(self) -> None:
        check_declared(self)
        if self.ctld_port == self.slurmd_port:
            raise ValueError("slurmd_port: must differ from ctld_port")


def _gone(pid: int, timeout_s: float) -> bool:
    """Wait for ``pid`` to exit (reaping it when it is our child); False if it is still there."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


class Cluster:
    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        self.root = Path(cfg.dir).resolve()
        self.conf = self.root / "slurm.conf"
        self.munge = self.root / "munge"
        self.sockets = sockets_dir(self.root)
        self.socket = self.sockets / "munge" / "munge.socket.2"
        self.spool = self.sockets / "spool"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """An environment whose Slurm commands talk to this cluster."""
        return {**(os.environ if base is None else base), "SLURM_CONF": str(self.conf)}

    # -- files ------------------------------------------------------------------------------
    def render(self) -> str:
        host = socket.gethostname().split(".")[0]
        c = self.cfg
        return TEMPLATE.read_text(encoding="utf-8").format(
            host=host, hostname=host, dir=self.root, socket=self.socket, spool=self.spool, ctld_port=c.ctld_port, slurmd_port=c.slurmd_port,
            requeue_exit=c.requeue_exit, node=c.node, cpus=c.cpus,
            partitions="\n".join(partition_lines(CLASSES, c.node, c.grace_s)))

    def _write_files(self) -> None:
        (self.root / "state").mkdir(parents=True, exist_ok=True)
        self.spool.mkdir(parents=True, exist_ok=True)
        self.munge.mkdir(parents=True, exist_ok=True)
        self.munge.chmod(0o700)
        self.socket.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = self.munge / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o400)
        self.conf.write_text(self.render(), encoding="utf-8")

    # -- daemons ----------------------------------------------------------------------------
    def _pid(self, daemon: str) -> int | None:
        path = {"munged": self.munge / "munged.pid", "slurmctld": self.root / "slurmctld.pid",
                "slurmd": self.root / "slurmd.pid"}[daemon]
        try:
            pid = int(path.read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def running(self) -> dict[str, int | None]:
        return {d: self._pid(d) for d in DAEMONS}

    def up(self, timeout_s: float = 60.0) -> None:
        """Start munged, slurmctld and slurmd (those not running) and wait until the node is idle."""
        missing = [b for b in DAEMONS if shutil.which(b) is None and not Path(f"/usr/sbin/{b}").exists()]
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)} (Debian: apt-get install slurm-wlm munge)")
        self._write_files()
        run = self.running()
        m = self.munge
        steps = {
            "munged": ["munged", "--force", f"--socket={self.socket}", f"--key-file={m / 'munge.key'}",
                       f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'munge.seed'}"],
            "slurmctld": ["slurmctld", "-f", str(self.conf)],
            "slurmd": ["slurmd", "-f", str(self.conf), "-N", self.cfg.node],
        }
        for daemon, argv in steps.items():
            if run[daemon] is None:
                out = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30)
                if out.returncode != 0:
                    raise RuntimeError(f"{daemon} did not start (exit {out.returncode}): "
                                       f"{(out.stderr or out.stdout).strip()[-500:]}")
        self._wait_idle(timeout_s)

    def _wait_idle(self, timeout_s: float) -> None:
        end = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < end:
            out = subprocess.run(["sinfo", "-h", "-n", self.cfg.node, "-o", "%T"], env=self.env(),
                                 capture_output=True, text=True, timeout=10)
            state = out.stdout.strip()
            if out.returncode == 0 and state and not any(s in state for s in ("down", "drain", "unknown", "not_responding")):
                return
            time.sleep(0.5)
        raise RuntimeError(f"node {self.cfg.node} not up within {timeout_s:.0f} s (state {state!r}); "
                           f"see {self.root / 'slurmctld.log'} and {self.root / 'slurmd.log'}")

    def down(self, timeout_s: float = 20.0) -> list[str]:
        """Cancel every job (and wait for them to go), then stop the daemons this cluster started
        (by their pid files): SIGTERM, SIGKILL after ``timeout_s``."""
        if self.running()["slurmctld"] is not None:
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=self.env(), capture_output=True,
                           timeout=30)
            end = time.monotonic() + timeout_s
            while time.monotonic() < end:
                out = subprocess.run(["squeue", "-h"], env=self.env(), capture_output=True, text=True, timeout=10)
                if out.returncode != 0 or not out.stdout.strip():
                    break
                time.sleep(0.5)
        stopped = []
        for daemon in reversed(DAEMONS):
            pid = self._pid(daemon)
            if pid is None:
                continue
            os.kill(pid, signal.SIGTERM)
            if not _gone(pid, timeout_s):
                os.kill(pid, signal.SIGKILL)
                _gone(pid, 5.0)
            stopped.append(daemon)
        if self.sockets != self.root:  # the short directory made for the sockets goes with the daemons
            shutil.rmtree(self.sockets, ignore_errors=True)
        return stopped

    def status(self) -> str:
        lines = [f"{d}: {'pid ' + str(p) if p else 'not running'}" for d, p in self.running().items()]
        lines.append(f"SLURM_CONF={self.conf}")
        if self.running()["slurmctld"] is not None:
            out = subprocess.run(["sinfo"], env=self.env(), capture_output=True, text=True, timeout=10)
            lines.append(out.stdout.rstrip() or out.stderr.rstrip())
        return "\n".join(lines)
