"""Where the study lives: Optuna's RDB storage beside the controller's store, never inside it.

Optuna and the store both keep an Alembic ``alembic_version`` table, so they cannot share one
schema. For a SQLite store the study gets its own file beside it (``optuna.db``); for PostgreSQL
the same server and database with ``search_path=optuna`` (the schema is created if missing).
Without a store the study file is ``<out_dir>/optuna.db``. ``--storage URL`` wins over all.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SCHEMES = ("sqlite", "postgresql")
OPTUNA_SCHEMA = "optuna"


class StorageError(ValueError):
    """A storage or store URL this command cannot use (the message names the option)."""


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.split("+", 1)[0]


def _sqlite_beside(url: str, option: str) -> str:
    path = url.split("///", 1)[1] if "///" in url else ""
    if not path or path.startswith(":memory:"):
        raise StorageError(f"{option}: an in-memory SQLite store has no directory for the study's file")
    return f"sqlite:///{Path(path).parent / 'optuna.db'}"


def with_schema(url: str, schema: str = OPTUNA_SCHEMA) -> str:
    """A PostgreSQL URL whose connections use ``schema`` (libpq ``options=-csearch_path=...``)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urlunsplit(parts._replace(query=urlencode(query)))


def study_storage(storage: str | None, db: str | None, out_dir: str | Path) -> str:
    """The Optuna storage URL from ``--storage`` / ``--db`` / the output directory."""
    if storage:
        if _scheme(storage) not in SCHEMES:
            raise StorageError(f"--storage: unknown scheme {urlsplit(storage).scheme!r} (use sqlite:/// or postgresql://)")
        return storage
    if db:
        scheme = _scheme(db)
        if scheme == "sqlite":
            return _sqlite_beside(db, "--db")
        if scheme == "postgresql":
            return with_schema(db)
        raise StorageError(f"--db: unknown scheme {urlsplit(db).scheme!r} (use sqlite:/// or postgresql://)")
    return f"sqlite:///{Path(out_dir) / 'optuna.db'}"


def search_path_schema(url: str) -> str | None:
    for key, value in parse_qsl(urlsplit(url).query):
        if key == "options" and "search_path=" in value:
            return value.split("search_path=", 1)[1].split()[0].split(",")[0]
    return None


def prepare(url: str) -> None:
    """Make the storage usable: the SQLite file's directory, or the PostgreSQL schema."""
    scheme = _scheme(url)
    if scheme == "sqlite":
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and not path.startswith(":memory:"):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        return
    schema = search_path_schema(url)
    if scheme != "postgresql" or schema is None:
        return
    import re

    import sqlalchemy as sa

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", schema):
        raise StorageError(f"--storage: schema {schema!r} is not a plain identifier")

    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    finally:
        engine.dispose()
