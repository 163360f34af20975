"""Engines, schema setup and transactions for the store.

SQLite (the default, one file next to the controller) and PostgreSQL (by URL, for several
controller instances) behind the same SQLAlchemy engine. Each SQLite connection is put into
WAL mode (readers such as the dashboard never block the controller's writer), with foreign keys
enforced and a busy timeout so a second writer waits instead of failing with "database is locked".

The schema is owned by the Alembic migrations shipped inside the package
(``controller/store/migrations``); ``init_db`` upgrades a database to the newest revision, so a
fresh file and a database made by an older cliffguard both end up at the current schema.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from cliffguard.controller.store.json_text import column_json
from cliffguard.core.declared import bounded, check_declared

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


@dataclass(kw_only=True, slots=True)
class StoreConfig:
    """Where the controller's state lives."""

    url: str = "sqlite:///cliffguard.db"
    """SQLAlchemy URL: ``sqlite:///path.db`` (default, a file in the working directory) or
    ``postgresql+psycopg://user@host/db`` at scale. Leave the password out of it: psycopg takes it
    from ``PGPASSWORD`` or the pgpass file (``~/.pgpass``, ``PGPASSFILE``), as libpq does."""
    echo: bool = False
    """Log every SQL statement (debugging only)."""
    busy_timeout_ms: int = bounded(10_000, ge=0)
    """SQLite: how long a writer waits for a lock held by another connection before failing."""
    pool_size: int = bounded(5, ge=1)
    """PostgreSQL: connections kept open per engine."""

    def __post_init__(self) -> None:
        check_declared(self)
        try:
            url = make_url(self.url)
        except ArgumentError as exc:
            raise ValueError(f"url: not a SQLAlchemy URL ({exc})") from None
        if url.get_backend_name() not in ("sqlite", "postgresql"):
            raise ValueError(
                f"url: backend {url.get_backend_name()!r} is not supported (sqlite or postgresql)"
            )


def masked_url(url: str) -> str:
    """``url`` fit for a log line or a printout: its password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not a SQLAlchemy URL: mask a ``user:password@`` part if there is one
        return re.sub(r"(//[^:/@]+:)[^@/]*@", r"\1***@", url)


def _sqlite_pragmas(busy_timeout_ms: int, in_memory: bool):
    def on_connect(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            if not in_memory:  # an in-memory database has no WAL
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")  # durable at each checkpoint; safe with WAL
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        finally:
            cur.close()

    return on_connect


def make_engine(cfg_or_url: StoreConfig | str) -> Engine:
    """An engine for the configured database (SQLite pragmas applied on every new connection)."""
    cfg = cfg_or_url if isinstance(cfg_or_url, StoreConfig) else StoreConfig(url=cfg_or_url)
    url = make_url(cfg.url)
    if url.get_backend_name() == "sqlite":
        in_memory = url.database in (None, "", ":memory:")
        # a URI filename (``file:PATH?mode=ro``, with ``uri=true``) names an existing file: no folder
        # made for it (a relative "file:" folder appeared in the working directory)
        if not in_memory and not url.database.startswith("file:"):
            Path(url.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # The dashboard and the controller's threads share one engine; sqlite3's same-thread check
        # only guards against sharing a connection, which the pool already prevents.
        # In memory: one shared connection (StaticPool), else every pooled connection or thread
        # would get a database of its own.
        pool = {"poolclass": StaticPool} if in_memory else {}
        engine = create_engine(url, echo=cfg.echo, connect_args={"check_same_thread": False},
                               json_serializer=column_json, **pool)
        event.listen(engine, "connect", _sqlite_pragmas(cfg.busy_timeout_ms, in_memory))
        return engine
    return create_engine(url, echo=cfg.echo, pool_pre_ping=True, pool_size=cfg.pool_size,
                         json_serializer=column_json)


def alembic_config(engine: Engine | None = None) -> Any:
    """The Alembic configuration of the shipped migrations (no alembic.ini file needed)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if engine is not None:
        # Percent signs in passwords would be read as interpolation by ConfigParser.
        cfg.set_main_option(
            "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
        )
    return cfg


# Arbitrary constant: the PostgreSQL advisory lock that serialises schema upgrades.
_MIGRATION_LOCK = 0x636C6966  # "clif"


def schema_at_head(engine: Engine) -> bool:
    """Whether the database is at the newest revision of the shipped migrations."""
    current, head, _ = schema_revisions(engine)
    return current == head


def schema_revisions(engine: Engine) -> tuple[str | None, str, set[str]]:
    """The database's schema revision (None: no cliffguard schema), the shipped head, and every
    revision the shipped migrations know. Reads only (nothing is created or upgraded)."""
    from alembic.migration import MigrationContext
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config())
    known = {rev.revision for rev in script.walk_revisions()}
    with engine.connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, script.get_current_head() or "", known


_upgrade_lock = threading.Lock()  # Alembic's migration context is process-global


def init_db(engine: Engine, *, attempts: int = 10) -> None:
    """Bring the database to the newest schema revision (Alembic ``upgrade head``).

    Safe when several processes start at once (the controller and the dashboard of a demo, or
    several controller instances): on PostgreSQL an advisory lock serialises the upgrades (its
    DDL is transactional, so the second one then finds the schema at head); on SQLite a process
    that loses the race sees "table already exists" and retries until the winner has finished
    (SQLite runs DDL outside transactions, so the loser may first see a half-built schema).
    """
    from alembic import command

    cfg = alembic_config(engine)
    for attempt in range(1, attempts + 1):
        try:
            with _upgrade_lock, engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK})
                cfg.attributes["connection"] = conn  # env.py migrates on this connection
                command.upgrade(cfg, "head")
            break
        except DBAPIError:
            if schema_at_head(engine):
                break  # another process upgraded it meanwhile
            if attempt == attempts:
                raise
            log.info("schema upgrade attempt %d lost a race; retrying", attempt, exc_info=True)
            time.sleep(0.5)
    log.info("store schema at head (%s)", engine.url.render_as_string(hide_password=True))


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: committed when the block ends, rolled back if it raises."""
    # expire_on_commit=False: rows read in a transaction stay readable after it ends
    # (the dashboard renders them after the session is closed).
    session = Session(engine, expire_on_commit=False)
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


class Store:
    """An engine plus the two things everyone does with it: set up the schema, open a transaction."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @classmethod
    def open(cls, cfg_or_url: StoreConfig | str, *, migrate: bool = True) -> Store:
        """Make the engine and (by default) upgrade the schema to head."""
        store = cls(make_engine(cfg_or_url))
        if migrate:
            store.init()
        return store

    def init(self) -> None:
        init_db(self.engine)

    def session(self) -> Any:
        """``with store.session() as s: ...`` — one committed (or rolled back) transaction."""
        return session_scope(self.engine)

    def close(self) -> None:
        self.engine.dispose()
