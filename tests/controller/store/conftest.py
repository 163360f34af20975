"""A migrated store per test, on SQLite (a file) and on PostgreSQL (a schema of its own)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from controller.store.db import init_db, make_engine


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def pg_schema_url(pg_url) -> Iterator[str]:
    """A URL whose connections see only a fresh schema (search_path), dropped after the test."""
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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request) -> str:
    """The URL of an empty database of each supported kind."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_schema_url")


@pytest.fixture
def engine(db_url) -> Iterator[Engine]:
    """A store at the newest schema revision, on SQLite and on PostgreSQL."""
    eng = make_engine(db_url)
    init_db(eng)
    try:
        yield eng
    finally:
        eng.dispose()
