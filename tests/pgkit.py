"""A real PostgreSQL for tests (Debian's ``postgresql``: scripts/install.sh --dev): its
own cluster in a temp directory, on a free 127.0.0.1 port, run as the ``postgres`` user
(the server refuses root), torn down after the session. Loopback connections are trusted
without a password: only this host can reach it, for the length of the run.

``state`` runs a test on each backend: SQLite files in ``tmp_path``, then a fresh,
migrated PostgreSQL database.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agentbox.state.db import Database
from agentbox.state.postgres import migrate
from s3kit import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"


class PgServer:
    """``durable``: fsync on (benchmarks); tests run without it."""

    def __init__(self, base: Path, durable: bool = False, max_connections: int = 200) -> None:
        self.base = base
        self.durable = durable
        self.max_connections = max_connections
        self.data = base / "data"
        self.port = free_port()
        self.log = base / "server.log"

    def _run(self, *argv: str) -> None:
        done = subprocess.run(
            ["runuser", "-u", USER, "--", *argv],
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=120,
        )
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise AssertionError(f"{argv[0]} failed: {done.stderr or done.stdout}\n{log}")

    def init(self) -> None:
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-U", USER, "-A", "trust",
                  "-E", "UTF8", "--no-sync")  # fmt: skip

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
            f"-c fsync={'on' if self.durable else 'off'} -c max_connections={self.max_connections}"
        )
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                  "-o", options, "-w", "-t", "60", "start")  # fmt: skip

    def restart(self) -> None:
        """Stop (fast: every connection is cut) and start again on the same port."""
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.start()

    def stop(self) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(statement)  # type: ignore[arg-type] - test-made names only

    def new_database(self) -> str:
        """A fresh empty database (no schema yet); its URL."""
        name = "t_" + secrets.token_hex(6)
        self.sql(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PgServer]:
    for tool in ("initdb", "pg_ctl", "postgres"):
        if not (BIN / tool).exists():
            pytest.fail(
                f"{BIN / tool} is missing: install Debian's postgresql (scripts/install.sh --dev)"
            )
    with running_postgres() as server:
        yield server


@contextmanager
def running_postgres(max_connections: int = 200) -> Iterator[PgServer]:
    """A server of its own in a temp directory, torn down on exit."""
    base = Path(tempfile.mkdtemp(prefix="agentbox-pg-", dir="/var/tmp"))
    entry = pwd.getpwnam(USER)
    os.chown(base, entry.pw_uid, entry.pw_gid)
    server = PgServer(base, max_connections=max_connections)
    try:
        server.init()
        server.start()
        yield server
    finally:
        try:
            server.stop()
        finally:
            shutil.rmtree(base, ignore_errors=True)


@dataclass
class StateKit:
    """Where a test's stores keep their state on one backend."""

    backend: str
    tmp: Path
    url: str | None = None
    opened: list[Database] = field(default_factory=list)

    def where(self, name: str) -> Path | Database:
        """SQLite: the file ``name``.db; PostgreSQL: a connection to the test's database."""
        if self.url is None:
            return self.tmp / f"{name}.db"
        from agentbox.state.postgres import PostgresDB

        db = PostgresDB(self.url)
        self.opened.append(db)
        return db

    def arg(self, name: str) -> str:
        """The same place as a command-line argument (for another process)."""
        return self.url or str(self.tmp / f"{name}.db")


@pytest.fixture(params=["sqlite", "postgresql"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateKit]:
    if request.param == "sqlite":
        yield StateKit("sqlite", tmp_path)
        return
    server: PgServer = request.getfixturevalue("postgres")
    url = server.new_database()
    migrate(url)
    kit = StateKit("postgresql", tmp_path, url)
    yield kit
    for db in kit.opened:
        db.close()
    server.sql(f"DROP DATABASE {url.rsplit('/', 1)[1]} WITH (FORCE)")
