"""Is the store the controller opened still there and writable?

SQLite keeps writing happily into a database file that was deleted (the open descriptor keeps the
unlinked inode alive) or replaced: every commit "succeeds" and is lost at the next start. So the
guard remembers the file's identity (device, inode) when the controller opens it and compares it
after every commit and every tick (one ``stat``), and refuses to open a new pooled connection to a
different file.

Why stop rather than go on: a WAL database's wal-index (``-shm``) is memory-mapped by every
connection, and a ``-shm`` truncated under a live mapping kills the process with SIGBUS (reproduced
with ``os.truncate(db + "-shm", 0)`` under an open connection). SQLite rebuilds (truncates) the
``-shm`` when a connection believes it is the first on a database; a deleted, replaced or read-only
database file is where that belief can go wrong, so the controller opens no new connection to one.
(A read-only bind mount and a replaced file did not raise SIGBUS when tried here; the original
report's exact trigger is not reproduced, only this mechanism.)

A file or directory that turned read-only (permissions, or a read-only mount over the path, which
connections opened before do not see) fails ``os.access(W_OK)`` in the same check.

``probe_write`` is a real write rolled back (the Alembic version row updated to itself): a
read-only file, a read-only PostgreSQL transaction or missing privileges fail it with the
database's own message, which ``StoreLost`` carries to the operator.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url

from cliffguard.controller.store.errors import StoreLost, is_store_lost


def sqlite_path(engine: Engine) -> Path | None:
    """The database file of a SQLite engine (None for PostgreSQL or an in-memory database)."""
    url = make_url(engine.url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return None
    return Path(url.database).expanduser().resolve()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class StoreGuard:
    """Watches one engine's store; ``check`` raises ``StoreLost`` when it is gone or replaced."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.path = sqlite_path(engine)
        self._identity = _identity(self.path) if self.path is not None else None
        if self.path is not None:
            # do_connect runs before sqlite3.connect: a replaced file is never opened (see above)
            event.listen(engine, "do_connect", self._before_connect)

    def _before_connect(self, *_args: object) -> None:
        self.check()

    def check(self) -> None:
        """Raise ``StoreLost`` if the SQLite file is no longer the one opened (cheap: one stat)."""
        if self.path is None:
            return
        now = _identity(self.path)
        if self._identity is None:
            self._identity = now  # created by the first connection (a fresh store)
            return
        if now is None:
            raise StoreLost(f"store {self.path}: the database was deleted while the controller ran "
                            "(commits since then went nowhere); restore it or start on a new store")
        if now != self._identity:
            raise StoreLost(f"store {self.path}: the database file was replaced while the controller ran "
                            "(another file now has its name); restart the controller to use it")
        for what in (self.path, self.path.parent):  # the directory holds the -wal and -shm files
            if not os.access(what, os.W_OK):
                raise StoreLost(f"store {self.path}: {what} became read-only while the controller ran "
                                "(a read-only mount or permissions); connections opened before keep "
                                "writing to it, new ones cannot: make it writable and restart")

    def probe_write(self) -> None:
        """A write rolled back; raise ``StoreLost`` with the database's message if it fails for
        a reason retrying cannot fix (read-only, no privilege, tables missing)."""
        self.check()
        try:
            with self.engine.connect() as conn:
                with conn.begin() as tx:
                    conn.execute(text("UPDATE alembic_version SET version_num = version_num"))
                    tx.rollback()
        except Exception as exc:
            if is_store_lost(exc):
                raise StoreLost(f"store {self.describe()} is not writable: {_first_line(exc)}") from exc
            raise

    def describe(self) -> str:
        return str(self.path) if self.path is not None else self.engine.url.render_as_string(hide_password=True)


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    return f"{type(orig).__name__}: {str(orig).splitlines()[0] if str(orig) else ''}"
