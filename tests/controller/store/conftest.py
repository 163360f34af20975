"""A migrated store per test, on SQLite (a file of its own) and on PostgreSQL.

PostgreSQL tests get a schema of their own (``search_path``), so they never collide with other
test sessions sharing the database. Migrating takes about a second there, so the ``engine``
fixture migrates one schema per test session and empties its tables after each test; tests of
the migrations themselves use ``db_url``, a fresh empty schema per test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from cliffguard.controller.store.db import init_db, make_engine
from cliffguard.controller.store.models import Base


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@contextmanager
def _pg_schema(pg_url: str) -> Iterator[str]:
    """A URL whose connections see only a fresh schema (search_path), dropped afterwards."""
    schema = f"store_{uuid.uuid4().hex[:12]}"
    admin = make_engine(pg_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(pg_url).update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def pg_schema_url(pg_url) -> Iterator[str]:
    with _pg_schema(pg_url) as url:
        yield url


@pytest.fixture(scope="session")
def pg_migrated_url(pg_url) -> Iterator[str]:
    with _pg_schema(pg_url) as url:
        eng = make_engine(url)
        init_db(eng)
        eng.dispose()
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request) -> str:
    """The URL of an empty database of each supported kind."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def engine(request) -> Iterator[Engine]:
    """A store at the newest schema revision, on SQLite and on PostgreSQL, empty at the start."""
    if request.param == "sqlite":
        eng = make_engine(request.getfixturevalue("sqlite_url"))
        init_db(eng)
        try:
            yield eng
        finally:
            eng.dispose()
        return
    eng = make_engine(request.getfixturevalue("pg_migrated_url"))
    try:
        yield eng
    finally:
        names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        with eng.begin() as conn:
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        eng.dispose()
