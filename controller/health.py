"""Liveness and readiness of ``cliffguard controller`` over HTTP, for a supervisor.

- ``GET /healthz``: 200 while the consumer loop comes round (its last pass is younger than
  ``[controller] health_max_loop_age_s``), 503 when it hangs: restart the process.
- ``GET /readyz``: 200 when the store is writable (no batch waiting out a store error), a broker is
  connected and the consumer holds partitions; 503 otherwise: do not restart, wait (a store that is
  gone stops the process itself, with a non-zero exit).

Both answer a JSON body ``{"ok": bool, "reason": str, ...}``. The verdicts are pure functions of
a ``HealthSnapshot`` the loop thread takes each pass; the HTTP thread only reads the newest one,
so it never touches the Kafka client or the store (neither is thread-safe to share).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    loop_at: float = 0.0
    """time.monotonic() of the loop's last pass (0: it has not run yet)."""
    store_error: str = ""
    """Why the store is not writable now ("" when the last transaction committed)."""
    broker_connected: bool = False
    assigned: int = 0
    """Metrics partitions this instance consumes."""


@dataclass(frozen=True, slots=True)
class HealthReport:
    ok: bool
    reason: str

    def body(self, snap: HealthSnapshot, now: float) -> dict[str, object]:
        age = round(now - snap.loop_at, 3) if snap.loop_at else None
        return {"ok": self.ok, "reason": self.reason, "loop_age_s": age,
                **{k: v for k, v in asdict(snap).items() if k != "loop_at"}}


def liveness(snap: HealthSnapshot, now: float, max_loop_age_s: float) -> HealthReport:
    if not snap.loop_at:
        return HealthReport(True, "starting")  # the first group join may take a while
    age = now - snap.loop_at
    if age > max_loop_age_s:
        return HealthReport(False, f"the consumer loop has not run for {age:.0f} s (limit {max_loop_age_s:g} s)")
    return HealthReport(True, "loop running")


def readiness(snap: HealthSnapshot) -> HealthReport:
    if snap.store_error:
        return HealthReport(False, f"store not writable: {snap.store_error}")
    if not snap.broker_connected:
        return HealthReport(False, "no broker connection")
    if snap.assigned < 1:
        return HealthReport(False, "no partitions assigned (joining the consumer group)")
    return HealthReport(True, "ready")


class HealthServer:
    """``/healthz`` and ``/readyz`` on ``host:port`` (port 0 picks a free one), on a daemon thread."""

    def __init__(self, host: str, port: int, snapshot: Callable[[], HealthSnapshot],
                 max_loop_age_s: float) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's API
                path = self.path.split("?", 1)[0]
                snap, now = snapshot(), time.monotonic()
                if path == "/healthz":
                    report = liveness(snap, now, max_loop_age_s)
                elif path == "/readyz":
                    report = readiness(snap)
                else:
                    self.send_error(404, "try /healthz or /readyz")
                    return
                data = json.dumps(report.body(snap, now)).encode()
                self.send_response(200 if report.ok else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, fmt: str, *args: object) -> None:
                log.debug("health %s", fmt % args)  # probes every few seconds: not for the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="controller-health", daemon=True)
        self.host = host
        self.port = self._server.server_address[1]
        outer._thread.start()
        log.info("health endpoint on http://%s:%d/healthz and /readyz", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
