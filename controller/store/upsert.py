"""Portable INSERT ... ON CONFLICT for the two supported databases.

SQLite (>= 3.24) and PostgreSQL share the ``ON CONFLICT (cols) DO NOTHING / DO UPDATE ... WHERE``
syntax, and SQLAlchemy exposes it through each dialect's own ``insert``; this picks the right one
for the session's connection so callers write one statement for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert_for(session: Session, model: Any) -> Any:
    """A dialect-specific ``insert(model)`` that supports ``on_conflict_do_nothing/do_update``."""
    name = session.get_bind().dialect.name
    if name == "sqlite":
        return sqlite.insert(model)
    if name == "postgresql":
        return postgresql.insert(model)
    raise NotImplementedError(f"the store supports sqlite and postgresql, not {name}")


_BUILT: dict[tuple[str, str], Any] = {}


def built_once(session: Session, name: str, build: Callable[[Session], Any]) -> Any:
    """The statement ``build(session)`` makes, built once per dialect and ``name`` and reused:
    the controller runs the same few statements with every batch, and constructing one (an
    upsert's ``excluded`` columns above all) costs more than SQLite takes to run it."""
    key = (session.get_bind().dialect.name, name)
    stmt = _BUILT.get(key)
    if stmt is None:
        stmt = _BUILT[key] = build(session)
    return stmt
