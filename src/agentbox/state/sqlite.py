"""A SQLite file that several processes share (the daemon, the CLI, SDK users): WAL, one
connection per thread (reused: opening one costs ~0.2 ms), and short ``BEGIN IMMEDIATE``
write transactions, so writers queue instead of failing.

Each store creates its own tables when it opens its file (``CREATE … IF NOT EXISTS``):
whoever touches a home first, the CLI, the SDK or the gateway, finds it ready, with no
migration step to run on a single host."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Literal

from agentbox.state.db import Database


class SqliteDB(Database):
    dialect: ClassVar[Literal["sqlite", "postgresql"]] = "sqlite"
    skip_locked: ClassVar[str] = ""  # BEGIN IMMEDIATE: one writer at a time already

    def __init__(self, path: Path, schema: str, *, synchronous: str = "NORMAL") -> None:
        """``synchronous``: NORMAL (a power cut may lose the last commits, never corrupts)
        or FULL (each commit on disk: tokens and approvals, as they always were)."""
        self.path = path
        self._synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.conn().executescript(schema)  # idempotent; executescript commits itself

    def conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    @contextmanager
    def tx(self, lock: str | None = None) -> Iterator[sqlite3.Connection]:
        db = self.conn()
        db.execute("BEGIN IMMEDIATE")  # one writer at a time, across processes: any lock
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @staticmethod
    def json_text(column: str, key: str) -> str:
        return f"json_extract({column}, '$.{key}')"

    @staticmethod
    def json_int(column: str, key: str) -> str:
        return f"CAST(json_extract({column}, '$.{key}') AS INTEGER)"


def database(where: Path | Database, schema: str, *, synchronous: str = "NORMAL") -> Database:
    """A store's database: ``where`` itself when shared, else the SQLite file at ``where``
    with the store's ``schema``."""
    if isinstance(where, Database):
        return where
    return SqliteDB(where, schema, synchronous=synchronous)
