"""How the dashboard process reaches the store: read-only, apart from one narrow write.

The page reads through ``read_only_engine``: every connection it opens refuses writes (SQLite
``PRAGMA query_only``; PostgreSQL ``default_transaction_read_only``), so no section can change
what the controller owns. Its one write, an operator's unsigned command request, goes through
``request_writer`` to ``controller.store.requests.submit_request``, which inserts a row into
``command_requests`` and touches nothing else. The dashboard never holds a signing key: the
controller validates, signs and queues each request (``controller.operator``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, event

from cliffguard.controller.store.db import make_engine


def _refuse_writes(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        if type(dbapi_conn).__module__.startswith("sqlite3"):
            cur.execute("PRAGMA query_only = ON")
        else:
            cur.execute("SET default_transaction_read_only = on")
            dbapi_conn.commit()  # a SET inside a transaction that is rolled back would be undone
    finally:
        cur.close()


def read_only_engine(url: str) -> Engine:
    """An engine whose connections can read the store and cannot write it."""
    engine = make_engine(url)
    event.listen(engine, "connect", _refuse_writes)
    return engine


@contextmanager
def request_writer(url: str) -> Iterator[Engine]:
    """A short-lived writable engine, only for ``submit_request`` (an operator's click is rare)."""
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()
