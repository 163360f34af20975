"""What a database error means for the controller: wait and retry, stop, or blame the event.

Three kinds, decided from the exception alone (pure, no I/O):

- **transient** (``is_transient``): the store is there but busy or briefly unreachable — SQLite
  "database is locked"/"database table is locked"/"disk is full", PostgreSQL connection loss,
  serialization failures, deadlocks, lock timeouts, an exhausted pool. The batch is kept and
  retried with ``Backoff``; nothing is skipped and no offset moves.
- **lost** (``is_store_lost``): the store the controller opened is not usable any more —
  read-only, deleted or replaced (a table it created is missing), corrupt, or permission denied.
  Running on would write into a void or lose the offsets, so the controller stops (``StoreLost``,
  non-zero exit) and a supervisor restarts it against a store someone has fixed.
- anything else is the event's own fault (a value the schema refuses, a bug a message triggers):
  ``controller/service.py`` isolates it and dead-letters it as ``processing_error``.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from sqlalchemy import exc as sa_exc

from cliffguard.core.declared import bounded, check_declared


class StoreLost(RuntimeError):
    """The store is gone, read-only, replaced or empty where it must not be: stop the controller."""


# Lower-case fragments of sqlite3.OperationalError messages (SQLite's error strings).
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database or disk is full",
                     "locking protocol")
_SQLITE_LOST = ("readonly database", "read-only", "unable to open database file", "disk i/o error",
                "no such table", "malformed", "file is not a database", "database file was replaced",
                "database was deleted")
# PostgreSQL SQLSTATEs: read-only transaction, insufficient privilege, undefined table/schema,
# database does not exist.
_PG_LOST_SQLSTATES = frozenset({"25006", "42501", "42P01", "3F000", "3D000"})


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, the DBAPI error SQLAlchemy wraps, and their causes (no cycles)."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [getattr(e, "orig", None), e.__cause__]
    return out


def _pg_error(e: BaseException) -> bool:
    return type(e).__module__.startswith("psycopg")


def is_store_lost(exc: BaseException) -> bool:
    """The store itself is unusable (see the module docstring): retrying cannot help."""
    for e in _chain(exc):
        if isinstance(e, StoreLost):
            return True
        if isinstance(e, sqlite3.Error) and any(s in str(e).lower() for s in _SQLITE_LOST):
            return True
        if _pg_error(e) and getattr(e, "sqlstate", None) in _PG_LOST_SQLSTATES:
            return True
    return False


def is_transient(exc: BaseException) -> bool:
    """Busy or briefly unreachable: keep the batch and try again later (never a dead letter)."""
    if is_store_lost(exc):
        return False
    for e in _chain(exc):
        if isinstance(e, sa_exc.DBAPIError) and e.connection_invalidated:
            return True
        if isinstance(e, (sa_exc.TimeoutError, sa_exc.DisconnectionError)):
            return True
        if isinstance(e, sqlite3.OperationalError) and any(s in str(e).lower() for s in _SQLITE_TRANSIENT):
            return True
        if _pg_error(e):
            import psycopg

            # OperationalError covers connection loss, admin shutdown, serialization failure,
            # deadlock, lock timeout and insufficient resources: all pass with time.
            if isinstance(e, psycopg.OperationalError):
                return True
    return False


def is_store_error(exc: BaseException) -> bool:
    """Transient or lost: a database problem, never the event's fault."""
    return is_transient(exc) or is_store_lost(exc)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential backoff: ``initial_s``, doubling per failure, never above ``max_s``."""

    initial_s: float = bounded(0.2, gt=0)
    max_s: float = 5.0

    def __post_init__(self) -> None:
        check_declared(self)
        if self.max_s < self.initial_s:
            raise ValueError("max_s: must be >= initial_s")

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (1-based)."""
        return min(self.max_s, self.initial_s * 2 ** min(max(failures - 1, 0), 30))
