"""Which database errors are transient (retry), which mean the store is lost (stop)."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from cliffguard.controller.store.errors import Backoff, StoreLost, is_store_error, is_store_lost, is_transient


def wrapped(orig: BaseException) -> DBAPIError:
    return OperationalError("UPDATE x", {}, orig)


def real_sqlite_error(sql: str, path) -> DBAPIError:
    eng = create_engine(f"sqlite:///{path}")
    try:
        with eng.begin() as conn:
            conn.execute(text(sql))
    except DBAPIError as exc:
        return exc
    finally:
        eng.dispose()
    raise AssertionError(f"{sql} did not fail")


@pytest.mark.parametrize("message", ["database is locked", "database table is locked", "database or disk is full"])
def test_sqlite_busy_errors_are_transient(message):
    exc = wrapped(sqlite3.OperationalError(message))
    assert is_transient(exc) and not is_store_lost(exc)


def test_a_real_sqlite_lock_is_transient(tmp_path):
    db = tmp_path / "s.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    eng = create_engine(f"sqlite:///{db}", connect_args={"timeout": 0.05})
    try:
        with pytest.raises(DBAPIError) as info, eng.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
        assert is_transient(info.value)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        eng.dispose()


@pytest.mark.parametrize("message", ["attempt to write a readonly database", "unable to open database file",
                                     "disk I/O error", "no such table: runs", "database disk image is malformed"])
def test_sqlite_errors_of_a_broken_store_mean_it_is_lost(message):
    exc = wrapped(sqlite3.OperationalError(message))
    assert is_store_lost(exc) and not is_transient(exc) and is_store_error(exc)


def test_a_real_missing_table_means_the_store_is_lost(tmp_path):
    assert is_store_lost(real_sqlite_error("INSERT INTO runs VALUES (1)", tmp_path / "empty.db"))


@pytest.mark.parametrize("cls", [psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
                                 psycopg.errors.AdminShutdown, psycopg.errors.LockNotAvailable,
                                 psycopg.OperationalError])
def test_postgres_connection_and_concurrency_errors_are_transient(cls):
    assert is_transient(wrapped(cls("x")))


@pytest.mark.parametrize("cls", [psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.UndefinedTable,
                                 psycopg.errors.InsufficientPrivilege])
def test_postgres_read_only_missing_tables_and_privileges_mean_the_store_is_lost(cls):
    exc = wrapped(cls("x"))
    assert is_store_lost(exc) and not is_transient(exc)


def test_an_invalidated_connection_is_transient():
    exc = OperationalError("SELECT 1", {}, Exception("server closed the connection"), connection_invalidated=True)
    assert is_transient(exc)


def test_the_events_own_faults_are_neither():
    for exc in (IntegrityError("INSERT", {}, sqlite3.IntegrityError("UNIQUE constraint failed")),
                OverflowError("Python int too large to convert to SQLite INTEGER"), ValueError("x")):
        assert not is_store_error(exc)
    assert is_store_lost(StoreLost("gone"))


def test_backoff_doubles_up_to_its_cap():
    b = Backoff(0.2, 1.0)
    assert [b.delay(n) for n in range(1, 6)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.delay(10_000) == 1.0
    with pytest.raises(ValueError, match="max_s"):
        Backoff(1.0, 0.5)
