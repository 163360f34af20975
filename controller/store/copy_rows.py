"""Bulk INSERT ... ON CONFLICT DO NOTHING: ``COPY`` on PostgreSQL (psycopg 3), one plain
executemany on SQLite (``insert_values`` picks).

``COPY`` is several times faster than a multi-row INSERT for a batch of step rows, but it cannot
skip a row that conflicts. So the rows are copied into a temporary table shaped like the target
(created once per connection and column list, emptied at every commit) and moved across with one
``INSERT ... SELECT ... ON CONFLICT DO NOTHING``: still idempotent, and rolled back with the
caller's transaction like any other write. Values bypass SQLAlchemy's type processing, so JSON
columns are wrapped here; every other column of the tables this serves is a plain number, string
or boolean.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from sqlalchemy import JSON, Table
from sqlalchemy.orm import Session


def copy_supported(session: Session) -> bool:
    """Whether the session's connection is PostgreSQL through psycopg 3 (the driver with ``copy``)."""
    bind = session.get_bind()
    return bind.dialect.name == "postgresql" and bind.dialect.driver == "psycopg"


def copy_insert_new(session: Session, table: Table, columns: tuple[str, ...] | list[str], rows: list[list[Any]],
                    conflict: list[str]) -> int:
    """Insert ``rows`` (values in ``columns`` order) into ``table``, skipping any that conflict on
    ``conflict``, in the session's transaction; returns how many were inserted."""
    if not rows:
        return 0
    from psycopg.types.json import Json

    cols = list(columns)
    json_at = [i for i, c in enumerate(cols) if isinstance(table.c[c].type, JSON)]
    names = ", ".join(f'"{c}"' for c in cols)
    tmp = f"_copy_{table.name}_{zlib.crc32(names.encode()):08x}"  # one per column list
    raw = session.connection().connection.driver_connection
    with raw.cursor() as cur:
        # only the copied columns, and none of the target's NOT NULL constraints (the id)
        cur.execute(f'CREATE TEMP TABLE IF NOT EXISTS "{tmp}" ON COMMIT DELETE ROWS AS '
                    f'SELECT {names} FROM "{table.name}" WITH NO DATA')
        with cur.copy(f'COPY "{tmp}" ({names}) FROM STDIN') as cp:
            write = cp.write_row
            for row in rows:
                for i in json_at:  # in place: insert_values' rows are the caller's to give
                    if row[i] is not None:
                        row[i] = Json(row[i])
                write(row)
        on = ", ".join(f'"{c}"' for c in conflict)
        cur.execute(f'INSERT INTO "{table.name}" ({names}) SELECT {names} FROM "{tmp}" ON CONFLICT ({on}) DO NOTHING')
        inserted = cur.rowcount
        cur.execute(f'TRUNCATE "{tmp}"')  # a second batch in the same transaction starts empty
    return inserted


def insert_values(session: Session, table: Table, columns: tuple[str, ...] | list[str], rows: list[list[Any]],
                  conflict: list[str]) -> int:
    """Insert ``rows`` (values in ``columns`` order) into ``table`` unless they conflict on
    ``conflict``; returns how many were inserted. ``COPY`` on PostgreSQL with psycopg, else one
    DB-API executemany of a statement built once: SQLAlchemy's per-row parameter processing
    costs more than SQLite's insert itself. JSON values are encoded here; the row lists of
    a JSON column may be changed in place."""
    if not rows:
        return 0
    if copy_supported(session):
        return copy_insert_new(session, table, columns, rows, conflict)
    cols = list(columns)
    bind = session.get_bind()
    if bind.dialect.name != "sqlite":
        from cliffguard.controller.store.upsert import insert_for

        stmt = insert_for(session, table).on_conflict_do_nothing(index_elements=conflict)
        return session.connection().execute(stmt, [dict(zip(cols, row, strict=True)) for row in rows]).rowcount
    dumps = getattr(bind.dialect, "_json_serializer", None) or json.dumps
    json_at = [i for i, c in enumerate(cols) if isinstance(table.c[c].type, JSON)]
    names = ", ".join(f'"{c}"' for c in cols)
    sql = (f'INSERT INTO "{table.name}" ({names}) VALUES ({", ".join("?" * len(cols))}) '
           f'ON CONFLICT ({", ".join(conflict)}) DO NOTHING')
    for v in rows if json_at else ():
        for i in json_at:
            if v[i] is not None:
                v[i] = dumps(v[i])
    raw = session.connection().connection.driver_connection
    cur = raw.cursor()
    try:
        cur.executemany(sql, rows)
        return cur.rowcount
    finally:
        cur.close()
