"""Engines, migrations and transactions on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import IntegrityError, OperationalError

from cliffguard.controller.store.db import (
    Store,
    StoreConfig,
    alembic_config,
    init_db,
    make_engine,
    schema_at_head,
    session_scope,
)
from cliffguard.controller.store.models import Base, RunRow, StepMetricRow


def test_store_config_defaults_to_a_sqlite_file():
    assert StoreConfig().url == "sqlite:///cliffguard.db"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"url": "not a url"}, "url"),
        ({"url": "mysql://u@h/db"}, "url"),
        ({"busy_timeout_ms": -1}, "busy_timeout_ms"),
        ({"pool_size": 0}, "pool_size"),
    ],
)
def test_store_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        StoreConfig(**kwargs)


def test_sqlite_connections_use_wal_foreign_keys_and_busy_timeout(sqlite_url):
    engine = make_engine(StoreConfig(url=sqlite_url, busy_timeout_ms=1234))
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 1234
    engine.dispose()


def test_sqlite_file_directory_is_created(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'a' / 'b' / 'store.db'}")
    init_db(engine)
    assert (tmp_path / "a" / "b" / "store.db").exists()
    engine.dispose()


def test_sqlite_writer_waits_for_a_lock_instead_of_failing(sqlite_url):
    engine = make_engine(StoreConfig(url=sqlite_url, busy_timeout_ms=5000))
    init_db(engine)
    holder = engine.raw_connection()
    holder.execute("BEGIN IMMEDIATE")  # take the write lock
    holder.execute(
        "INSERT INTO runs (id, status, recovery_state, world_size, last_step, lr_scale, config, "
        "controller_state, downsampled_below) VALUES ('held', 'running', 'running', 1, 0, 1.0, '{}', '{}', 0)"
    )
    release = threading.Timer(0.3, holder.commit)
    release.start()
    t0 = time.monotonic()
    with session_scope(engine) as s:
        s.add(RunRow(id="waiter"))
    waited = time.monotonic() - t0
    release.join()
    holder.close()
    assert waited >= 0.2
    with session_scope(engine) as s:
        assert set(s.scalars(select(RunRow.id))) == {"held", "waiter"}
    engine.dispose()


def test_sqlite_without_busy_timeout_fails_on_a_held_lock(sqlite_url):
    engine = make_engine(StoreConfig(url=sqlite_url, busy_timeout_ms=0))
    init_db(engine)
    holder = engine.raw_connection()
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(OperationalError, match="locked"):
        with session_scope(engine) as s:
            s.add(RunRow(id="waiter"))
    holder.rollback()
    holder.close()
    engine.dispose()


def _diffs(engine):
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(ctx, Base.metadata)


@pytest.fixture
def fresh(db_url):
    """A freshly migrated database of each kind, for tests that change the schema itself."""
    eng = make_engine(db_url)
    init_db(eng)
    yield eng
    eng.dispose()


def test_migrations_create_exactly_the_models_schema(fresh):
    engine = fresh
    assert _diffs(engine) == []
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables
    assert "alembic_version" in tables


def test_init_db_twice_is_harmless_and_keeps_data(engine):
    with session_scope(engine) as s:
        s.add(RunRow(id="keep"))
    init_db(engine)
    with session_scope(engine) as s:
        assert s.get(RunRow, "keep") is not None


def test_downgrade_to_base_then_upgrade_again(fresh):
    engine = fresh
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    init_db(engine)
    assert _diffs(engine) == []


def test_foreign_keys_are_enforced(engine):
    with pytest.raises(IntegrityError):
        with session_scope(engine) as s:
            s.add(StepMetricRow(run_id="no-such-run", step=1, rank=0, ts=1.0))


def test_deleting_a_run_cascades_to_its_rows(engine):
    with session_scope(engine) as s:
        s.add(RunRow(id="gone"))
        s.flush()
        s.add(StepMetricRow(run_id="gone", step=1, rank=0, ts=1.0))
    with session_scope(engine) as s:
        s.execute(RunRow.__table__.delete().where(RunRow.id == "gone"))
    with session_scope(engine) as s:
        assert s.scalars(select(StepMetricRow)).all() == []


def test_session_scope_commits_on_success_and_rolls_back_on_error(engine):
    with session_scope(engine) as s:
        s.add(RunRow(id="committed"))
    with pytest.raises(RuntimeError):
        with session_scope(engine) as s:
            s.add(RunRow(id="rolled-back"))
            s.flush()
            raise RuntimeError("boom")
    with session_scope(engine) as s:
        assert set(s.scalars(select(RunRow.id))) == {"committed"}


def test_store_open_migrates_and_objects_stay_readable_after_commit(db_url):
    store = Store.open(db_url)
    try:
        with store.session() as s:
            run = RunRow(id="r", world_size=4)
            s.add(run)
        assert run.world_size == 4  # expire_on_commit=False: readable after the transaction
        with store.session() as s:
            assert s.get(RunRow, "r").world_size == 4
    finally:
        store.close()


@pytest.mark.slow
def test_concurrent_init_db_from_several_processes_ends_at_head(db_url):
    """The demo starts the controller and the dashboard together; both migrate at start."""
    code = (
        "import sys; from controller.store.db import init_db, make_engine; init_db(make_engine(sys.argv[1]))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, db_url], stderr=subprocess.PIPE) for _ in range(3)]
    outcomes = [(p.wait(timeout=120), p.stderr.read().decode()) for p in procs]
    assert [rc for rc, _ in outcomes] == [0, 0, 0], outcomes
    engine = make_engine(db_url)
    assert schema_at_head(engine) and _diffs(engine) == []
    engine.dispose()


def test_concurrent_init_db_from_threads_of_one_process(sqlite_url):
    engines = [make_engine(sqlite_url) for _ in range(3)]
    errors: list[BaseException] = []

    def migrate(eng):
        try:
            init_db(eng)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and schema_at_head(engines[0])
    for e in engines:
        e.dispose()


def test_in_memory_sqlite_is_one_database_shared_by_threads():
    engine = make_engine("sqlite://")
    init_db(engine)
    with session_scope(engine) as s:
        s.add(RunRow(id="mem"))
    seen: list[str] = []
    t = threading.Thread(target=lambda: seen.extend(session_scope_ids(engine)))
    t.start()
    t.join()
    assert seen == ["mem"]
    engine.dispose()


def session_scope_ids(engine) -> list[str]:
    with session_scope(engine) as s:
        return list(s.scalars(select(RunRow.id)))


def test_masked_url_hides_the_password_in_any_url():
    from cliffguard.controller.store.db import masked_url

    assert masked_url("postgresql+psycopg://u:s3cret@h:5432/db") == "postgresql+psycopg://u:***@h:5432/db"
    assert "s3cret" not in masked_url("not a url://u:s3cret@h/0")
    assert masked_url("sqlite:///a.db") == "sqlite:///a.db"


@pytest.mark.postgres
@pytest.mark.parametrize("source", ["PGPASSWORD", "PGPASSFILE"])
def test_the_postgres_password_comes_from_the_environment_or_a_pgpass_file(pg_url, tmp_path, monkeypatch, source):
    from sqlalchemy.engine import URL, make_url

    url = make_url(pg_url)
    if not url.password:
        pytest.skip("the test URL has no password to move out of it")
    if source == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", url.password)
    else:
        pgpass = tmp_path / "pgpass"
        pgpass.write_text(f"{url.host}:{url.port or 5432}:{url.database}:{url.username}:{url.password}\n")
        pgpass.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(pgpass))
        monkeypatch.delenv("PGPASSWORD", raising=False)
    bare = URL.create(url.drivername, username=url.username, host=url.host, port=url.port,
                      database=url.database).render_as_string(hide_password=False)
    assert f":{url.password}@" not in bare
    eng = make_engine(bare)
    try:
        with eng.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        eng.dispose()
