"""A SQLite file that several processes share (the daemon, the CLI, SDK users): WAL, one
connection per thread (reused: opening one costs ~0.2 ms), and short ``BEGIN IMMEDIATE``
write transactions, so writers queue instead of failing.

Each store creates its own tables when it opens its file (``CREATE … IF NOT EXISTS``,
from :mod:`agentbox.state.tables`, and the columns a file from an older release lacks):
whoever touches a home first, the CLI, the SDK or the gateway, finds it ready, with no
migration step to run on a single host."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar, Literal

from agentbox.state.db import Database
from agentbox.state.tables import Table, render


class SqliteDB(Database):
    dialect: ClassVar[Literal["sqlite", "postgresql"]] = "sqlite"
    skip_locked: ClassVar[str] = ""  # BEGIN IMMEDIATE: one writer at a time already
    json_text_sql: ClassVar[str] = "json_extract({column}, '$.{key}')"
    json_int_sql: ClassVar[str] = "CAST(json_extract({column}, '$.{key}') AS INTEGER)"

    def __init__(self, path: Path, tables: Sequence[Table], *, synchronous: str = "NORMAL") -> None:
        """``synchronous``: NORMAL (a power cut may lose the last commits, never corrupts)
        or FULL (each commit on disk: tokens and approvals, as they always were)."""
        self.path = path
        self._synchronous = synchronous
        path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self.conn().executescript(render("sqlite", *tables))  # idempotent; commits itself
        for table in tables:
            self._add_late_columns(table)

    def _add_late_columns(self, table: Table) -> None:
        """The columns a file from before them lacks, added in place (once: the check
        runs again under the write lock, another process may have just added them)."""
        late = table.late_columns()
        if not late or set(late) <= self._columns(table.name):
            return
        with self.tx() as db:
            have = self._columns(table.name)
            for name, spec in late.items():
                if name not in have:
                    db.execute(f"ALTER TABLE {table.name} ADD COLUMN {spec}")

    def _columns(self, table: str) -> set[str]:
        return {row[1] for row in self.conn().execute(f"PRAGMA table_info({table})")}

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


def database(
    where: Path | Database, tables: Sequence[Table], *, synchronous: str = "NORMAL"
) -> Database:
    """A store's database: ``where`` itself when shared, else the SQLite file at ``where``
    with the store's ``tables``."""
    if isinstance(where, Database):
        return where
    return SqliteDB(where, tables, synchronous=synchronous)
