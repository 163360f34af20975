import os
import uuid

import pytest

from cliffguard.hpo.storage import StorageError, prepare, search_path_schema, study_storage, with_schema


def test_sqlite_store_gets_a_file_beside_it(tmp_path):
    assert study_storage(None, f"sqlite:///{tmp_path}/store.db", "runs") == f"sqlite:///{tmp_path}/optuna.db"


def test_default_is_a_file_in_the_out_dir():
    assert study_storage(None, None, "runs") == "sqlite:///runs/optuna.db"


def test_postgres_store_gets_its_own_schema():
    url = study_storage(None, "postgresql+psycopg://u:p@h:5432/db?sslmode=disable", "runs")
    assert url.startswith("postgresql+psycopg://u:p@h:5432/db?")
    assert "sslmode=disable" in url
    assert search_path_schema(url) == "optuna"


def test_explicit_storage_wins():
    assert study_storage("sqlite:///x.db", "postgresql://h/db", "runs") == "sqlite:///x.db"


@pytest.mark.parametrize("storage,db,option", [("mysql://h/db", None, "--storage"), (None, "redis://h", "--db"),
                                               (None, "sqlite:///:memory:", "--db")])
def test_unusable_urls_name_the_option(storage, db, option):
    with pytest.raises(StorageError, match=option):
        study_storage(storage, db, "runs")


@pytest.mark.postgres
def test_postgres_schema_is_created_and_separate_from_the_store():
    import optuna
    import sqlalchemy as sa

    base = os.environ.get("CLIFFGUARD_TEST_PG_URL")
    if not base:
        pytest.skip("CLIFFGUARD_TEST_PG_URL not set")
    schema = f"optuna_{uuid.uuid4().hex[:10]}"
    url = with_schema(base, schema)
    engine = sa.create_engine(base)
    try:
        prepare(url)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        optuna.create_study(study_name="s", storage=url, load_if_exists=True)
        optuna.create_study(study_name="s", storage=url, load_if_exists=True)  # a second worker
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names(schema=schema))
        assert {"studies", "alembic_version"} <= tables
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()
