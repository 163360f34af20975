"""``cliffguard dashboard``: the Streamlit child's argv/env, and bad flags refused up front."""

from __future__ import annotations

import argparse

from cliffguard.cli import build_parser
from cliffguard.commands import dashboard


def _args(*argv: str) -> argparse.Namespace:
    return build_parser(only="dashboard").parse_args(["dashboard", *argv])


def test_streamlit_is_headless_without_usage_stats_and_gets_the_db_by_env(tmp_path, monkeypatch):
    monkeypatch.setenv("CLIFFGUARD_COMMAND_SECRET", "a-secret-the-controller-needs")
    monkeypatch.setenv("CLIFFGUARD_OPERATOR_TOKEN", "tok")
    args = _args("--db", f"sqlite:///{tmp_path}/s.db", "--port", "8600", "--host", "0.0.0.0")
    argv, env = dashboard.streamlit_command(args)
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4].endswith("dashboard/app.py")
    assert "--server.headless=true" in argv and "--browser.gatherUsageStats=false" in argv
    assert "--server.port=8600" in argv and "--server.address=0.0.0.0" in argv
    assert env["CLIFFGUARD_DASHBOARD__DB_URL"] == f"sqlite:///{tmp_path}/s.db"
    # only the controller signs: the dashboard process never holds the command secret
    assert "CLIFFGUARD_COMMAND_SECRET" not in env and env["CLIFFGUARD_OPERATOR_TOKEN"] == "tok"


def test_defaults():
    args = _args()
    assert (args.port, args.host) == (8501, "127.0.0.1")


def test_bad_db_url_is_refused_before_starting(capsys):
    assert dashboard.run(_args("--db", "mysql://x/y")) == 2
    assert "not supported" in capsys.readouterr().err


def test_the_files_and_the_slurm_directory_reach_the_child_as_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = _args("--data-report", "r.json", "--data-manifest", "m.json", "--slurm-dir", "cluster")
    _, env = dashboard.streamlit_command(args)
    assert env["CLIFFGUARD_DASHBOARD__DATA_REPORT"] == str(tmp_path / "r.json")
    assert env["CLIFFGUARD_DASHBOARD__DATA_MANIFEST"] == str(tmp_path / "m.json")
    assert env["CLIFFGUARD_DASHBOARD__SLURM_DIR"] == str(tmp_path / "cluster")  # the child runs elsewhere
