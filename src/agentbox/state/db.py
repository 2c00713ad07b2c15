"""What a store needs from a database, whichever it is.

Stores write portable SQL with ``?`` placeholders and run it on ``conn()`` (reads and
single statements, autocommit) or inside ``tx()`` (a write transaction). What differs
between SQLite and PostgreSQL is answered here, in one place:

* ``tx(lock=KEY)`` serialises the transactions that read-then-write (admission, slot
  choice, budget crossings): SQLite's ``BEGIN IMMEDIATE`` already locks the whole file;
  PostgreSQL takes a transaction-scoped advisory lock on ``KEY``.
* ``skip_locked``: appended to a ``SELECT`` inside ``tx()`` that picks one row to take
  (the task queue): PostgreSQL workers then pass over rows another worker holds.
* ``json_text`` / ``json_int``: a field of a JSON document kept in a TEXT column.

Both sides support ``INSERT … ON CONFLICT`` (upserts) and ``RETURNING``, so those are
written once. A connection to PostgreSQL that broke (the server restarted) raises
:class:`~agentbox.errors.StateUnavailable` at most once and is replaced on the next call.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal, Protocol
from urllib.parse import parse_qsl, urlsplit


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """Rows index by position and by column name, and ``dict(row)`` works (sqlite3.Row)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


class Database(ABC):
    dialect: ClassVar[Literal["sqlite", "postgresql"]]
    skip_locked: ClassVar[str]
    json_text_sql: ClassVar[str]  # json_text's SQL, with {column} and {key}
    json_int_sql: ClassVar[str]
    _local: threading.local  # this thread's connection, as ``conn``

    @abstractmethod
    def conn(self) -> Connection:
        """This thread's connection, in autocommit: each statement sees committed state."""

    @abstractmethod
    def tx(self, lock: str | None = None) -> AbstractContextManager[Connection]:
        """A write transaction: committed on exit, rolled back on an exception. With
        ``lock``, transactions holding the same key run one at a time."""

    def ping(self) -> None:
        """One round trip; raises ``StateUnavailable`` when the database cannot answer."""
        self.conn().execute("SELECT 1").fetchone()

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @classmethod
    def json_text(cls, column: str, key: str) -> str:
        """SQL for ``column``'s JSON field ``key`` as text (NULL when absent)."""
        return cls.json_text_sql.format(column=column, key=key)

    @classmethod
    def json_int(cls, column: str, key: str) -> str:
        """SQL for ``column``'s JSON field ``key`` as an integer (NULL when absent)."""
        return cls.json_int_sql.format(column=column, key=key)


def state_url_error(url: str) -> str | None:
    """Why ``url`` is no ``gateway.state`` value, or None when it is one."""
    if url == "sqlite":
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        return "expected sqlite (the home's files) or postgresql://USER@HOST:PORT/DATABASE"
    pooler = [v for k, v in parse_qsl(parts.query) if k == "pooler"]
    if pooler and pooler != ["transaction"]:
        return (
            "pooler= takes one value, transaction (PgBouncer's pool_mode = transaction); "
            "drop it to talk to PostgreSQL, or to a pooler in session mode"
        )
    if parts.password:
        return (
            "a password in the URL would sit in the configuration file: put it in "
            "$PGPASSWORD or a ~/.pgpass file (libpq reads both), and drop it from the URL"
        )
    return None
