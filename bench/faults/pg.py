"""A throwaway PostgreSQL cluster for the suite: initdb into a temp dir, pg_ctl on a free port,
removed afterwards (the way scripts/test.sh prepares the distribution's cluster for the tests).

Run as root, the server runs as the ``postgres`` user (PostgreSQL refuses root). Host
connections need the password (scram-sha-256), so a scenario can check a URL without one works
only through PGPASSWORD / a pgpass file.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from cliffguard.controller.broker import free_port


def _bindir() -> Path:
    root = Path("/usr/lib/postgresql")
    if root.is_dir():
        versions = sorted((p for p in root.iterdir() if (p / "bin" / "initdb").exists()),
                          key=lambda p: int(p.name) if p.name.isdigit() else 0)
        if versions:
            return versions[-1] / "bin"
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("no PostgreSQL server binaries (initdb) found; pass --pg-url")


class ThrowawayPostgres:
    """``with ThrowawayPostgres() as pg: pg.url`` (a SQLAlchemy URL with the password)."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = free_port()
        self.password = secrets.token_hex(12)
        self.root = Path(tempfile.mkdtemp(prefix="cliffguard-faults-pg-"))
        self.data = self.root / "data"
        self._user: pwd.struct_passwd | None = pwd.getpwnam("postgres") if os.geteuid() == 0 else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres:{self.password}@127.0.0.1:{self.port}/faults"

    def url_without_password(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/faults"

    def _run(self, *argv: str) -> None:
        if self._user is not None:
            argv = ("runuser", "-u", "postgres", "--", *argv)
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> ThrowawayPostgres:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self._user is not None:
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)
            os.chown(pwfile, self._user.pw_uid, self._user.pw_gid)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--pwfile", str(pwfile),
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        pwfile.unlink()
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "start")
        self._run(str(self.bindir / "createdb"), "-h", str(self.root), "-p", str(self.port), "-U", "postgres", "faults")
        return self

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            for _ in range(20):  # the server's files go once it has exited
                try:
                    shutil.rmtree(self.root)
                    break
                except OSError:
                    time.sleep(0.25)

    def __enter__(self) -> ThrowawayPostgres:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
