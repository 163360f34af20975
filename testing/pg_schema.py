"""A migrated store in a PostgreSQL schema of its own, inside the one shared test database.

Tests and benchmarks run side by side on one server: each store gets a fresh schema (the URL's
``search_path``), so nothing one of them writes is seen by another, and the schema is dropped
afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from cliffguard.controller.store.db import init_db, make_engine


def create_schema(pg_url: str, prefix: str) -> tuple[Engine, str]:
    """A new schema named ``<prefix>_<random>``, migrated: its engine and its URL (password kept)."""
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = make_engine(pg_url)
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    finally:
        admin.dispose()
    url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
        hide_password=False)
    engine = make_engine(url)
    init_db(engine)
    return engine, url


def drop_schema(engine: Engine) -> None:
    """Dispose of ``engine`` and drop the schema its URL's ``search_path`` names (none on SQLite)."""
    options = engine.url.query.get("options", "")
    schema = "" if engine.url.get_backend_name() == "sqlite" else str(options).partition("search_path=")[2]
    engine.dispose()
    if not schema:
        return
    admin = make_engine(engine.url.update_query_dict({"options": "-csearch_path=public"})
                        .render_as_string(hide_password=False))
    try:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


@contextmanager
def pg_schema_store(pg_url: str, prefix: str) -> Iterator[tuple[Engine, str]]:
    """``create_schema`` for the ``with`` block, dropped after it."""
    engine, url = create_schema(pg_url, prefix)
    try:
        yield engine, url
    finally:
        drop_schema(engine)
