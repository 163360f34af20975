"""Shared pieces of the alert tests: databases, a fake HTTP poster, a real local receiver."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sqlalchemy.engine import Engine

from cliffguard.controller.alerts import HttpResponse
from cliffguard.controller.store.db import init_db, make_engine
from testing.pg_schema import pg_schema_store

GENERIC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # the Standard Webhooks spec's test secret


def sqlite_engine(tmp_path) -> Engine:
    engine = make_engine(f"sqlite:///{tmp_path / 'alerts.db'}")
    init_db(engine)
    return engine


@contextlib.contextmanager
def pg_engine(pg_url: str) -> Iterator[Engine]:
    """A migrated schema of its own inside the shared test database, dropped afterwards."""
    with pg_schema_store(pg_url, "alerts") as (engine, _url):
        yield engine


class ConstRng:
    """A jitter source returning a fixed fraction, so backoff waits are predictable."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@dataclass
class Posted:
    url: str
    body: bytes
    headers: dict[str, str]


@dataclass
class FakePoster:
    """Answers from a script: ints are statuses, exceptions are raised; then ``default``."""

    script: list[int | BaseException | HttpResponse] = field(default_factory=list)
    default: int = 200
    calls: list[Posted] = field(default_factory=list)

    def __call__(self, url: str, body: bytes, headers: Mapping[str, str], timeout_s: float) -> HttpResponse:
        self.calls.append(Posted(url, body, dict(headers)))
        answer = self.script.pop(0) if self.script else self.default
        if isinstance(answer, BaseException):
            raise answer
        return answer if isinstance(answer, HttpResponse) else HttpResponse(answer)


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A real HTTP webhook receiver on 127.0.0.1:port in a thread.

    ``fail_first`` answers the first N requests with 503 *after* recording them, as a receiver
    whose response got lost would: the sender must retry with the same webhook-id, and the
    receiver de-duplicates by it.
    """

    def __init__(self, port: int, fail_first: int = 0) -> None:
        self.requests: list[Received] = []
        self._lock = threading.Lock()
        self._fail_left = fail_first
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver._lock:
                    receiver.requests.append(Received({k.lower(): v for k, v in self.headers.items()}, body))
                    fail = receiver._fail_left > 0
                    receiver._fail_left -= 1 if fail else 0
                self.send_response(503 if fail else 200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def snapshot(self) -> list[Received]:
        with self._lock:
            return list(self.requests)
