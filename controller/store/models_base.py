"""The declarative base every model shares (one MetaData, constraint names Alembic can find)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData, func
from sqlalchemy.orm import DeclarativeBase

# Named constraints: Alembic's batch mode (SQLite) can only drop or alter constraints it can name.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _now() -> Any:
    return func.now()
