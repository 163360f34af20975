"""An operator's command opens the store that is there (cliffguard/commands/store_open.py): it never
creates one, says when a schema is older (and upgrades it, as the controller would) or unknown."""

from __future__ import annotations

import sqlite3

import pytest
from alembic import command

from cliffguard.cli import main
from cliffguard.controller.store.db import Store, StoreConfig, alembic_config, make_engine, schema_revisions


@pytest.fixture(autouse=True)
def _no_config(monkeypatch):
    monkeypatch.delenv("CLIFFGUARD_CONFIG", raising=False)


@pytest.mark.parametrize("argv", [["status"], ["status", "some-run"], ["badbatches", "r"], ["report", "r"],
                                  ["alerts"], ["nodes"], ["command", "r", "pause"]])
def test_a_command_pointed_at_no_store_says_where_it_looked_and_creates_nothing(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--db", f"sqlite:///{tmp_path / 'elsewhere.db'}"]) == 2
    assert f"no store at {tmp_path / 'elsewhere.db'}" in capsys.readouterr().out
    assert main(argv) == 2  # the default, ./cliffguard.db
    assert f"no store at {tmp_path / 'cliffguard.db'}" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_an_older_schema_is_upgraded_and_said_an_unknown_one_is_refused_untouched(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    cfg = alembic_config(engine)
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002")
    _, head, _ = schema_revisions(engine)
    engine.dispose()
    assert main(["status", "--db", url]) == 0
    err = capsys.readouterr().err
    assert f"upgraded the store at {url} from schema revision 0002 to {head}" in err
    store = Store.open(StoreConfig(url=url), migrate=False)
    assert schema_revisions(store.engine)[0] == head
    store.close()
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'zz99'")
    assert main(["status", "--db", url]) == 2
    assert "schema revision zz99, unknown to this cliffguard" in capsys.readouterr().out
    with sqlite3.connect(tmp_path / "old.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == "zz99"


def test_a_database_with_no_cliffguard_schema_is_no_store(tmp_path, capsys):
    with sqlite3.connect(tmp_path / "other.db") as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    assert main(["status", "--db", f"sqlite:///{tmp_path / 'other.db'}"]) == 2
    assert "holds no cliffguard schema" in capsys.readouterr().out
