"""``cliffguard dashboard --db URL``: serve the Streamlit dashboard over a store.

Runs ``streamlit run dashboard/app.py`` as a child process, headless and without usage
statistics. The store URL (and any ``--config`` file) reach the app through the environment
(``CLIFFGUARD_DASHBOARD__DB_URL``, ``CLIFFGUARD_CONFIG``): Streamlit owns the child's argv. The
operator token is read by the app from ``CLIFFGUARD_OPERATOR_TOKEN``, never from flags (flags show
up in ``ps``). Every key (``core.deployment.KEY_ENVS``) is removed from the child's environment: the dashboard only
writes unsigned requests, and only the controller signs.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from cliffguard.core.deployment import scrub_keys  # the dashboard process holds no key

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
ENV_DB_URL = "CLIFFGUARD_DASHBOARD__DB_URL"  # dashboard.config reads it (kept here to avoid importing streamlit)


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("dashboard", help="serve the Streamlit dashboard over a store")
    p.add_argument("--db", default=os.environ.get(ENV_DB_URL, "sqlite:///cliffguard.db"),
                   help="SQLAlchemy URL of the store (default sqlite:///cliffguard.db)")
    p.add_argument("--port", type=int, default=8501, help="port to serve on (default 8501)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--config", default=None, help="TOML file with a [dashboard] section")
    p.add_argument("--data-report", default=None, help="a `cliffguard data --report` JSON for the data-quality page")
    p.add_argument("--data-manifest", default=None, help="a `cliffguard data --out` manifest (curriculum, weights)")
    p.add_argument("--slurm-dir", default=None, help="a `cliffguard slurm up` directory whose queue the queue view shows")
    return p


def without_command_secret(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a dashboard process: everything but key material (``core.deployment.KEY_ENVS``)."""
    return scrub_keys(env)


def streamlit_command(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The child's argv and environment (pure, for tests)."""
    argv = [
        sys.executable, "-m", "streamlit", "run", str(APP),
        "--server.headless=true",
        f"--server.port={args.port}",
        f"--server.address={args.host}",
        "--browser.gatherUsageStats=false",
        "--server.fileWatcherType=none",
        "--server.runOnSave=false",
        "--global.developmentMode=false",
        "--client.toolbarMode=minimal",
        "--theme.base=light",
    ]
    env = without_command_secret(os.environ)
    env[ENV_DB_URL] = args.db
    env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
    if args.config:
        env["CLIFFGUARD_CONFIG"] = str(Path(args.config).resolve())
    for flag, var in (("data_report", "CLIFFGUARD_DASHBOARD__DATA_REPORT"),
                      ("data_manifest", "CLIFFGUARD_DASHBOARD__DATA_MANIFEST"),
                      ("slurm_dir", "CLIFFGUARD_DASHBOARD__SLURM_DIR")):
        if getattr(args, flag, None):
            env[var] = str(Path(getattr(args, flag)).resolve())
    return argv, env


def run(args: argparse.Namespace) -> int:
    from cliffguard.controller.store.db import StoreConfig

    try:
        StoreConfig(url=args.db)
    except ValueError as exc:
        print(f"cliffguard dashboard: --db {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print("cliffguard dashboard: --port must be 1..65535", file=sys.stderr)
        return 2
    argv, env = streamlit_command(args)
    proc = subprocess.Popen(argv, env=env)
    print(f"dashboard at http://{args.host}:{args.port} (Ctrl-C to stop)", flush=True)

    def _stop(*_: object) -> None:
        if proc.poll() is None:
            proc.terminate()

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        _stop()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
