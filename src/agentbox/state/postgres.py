"""The stores on PostgreSQL (``gateway.state: postgresql://…``): many gateway replicas
and nodes share one database.

One connection per thread, in autocommit (like the SQLite side, so store code is the
same); the schema comes from ``agentbox db migrate`` (see :mod:`agentbox.state.migrations`)
and is checked once per process: a replica never migrates by itself.

Behind PgBouncer in transaction mode (``…/agentbox?pooler=transaction``: docs/cluster.md,
"Connections"), no statement is prepared: consecutive statements of one client may run on
different server connections, where a statement prepared on another does not exist.
Nothing else here needs a session: locks are transaction-scoped advisory locks.

When the server restarts, every open connection breaks. A broken connection is dropped
and the call that found it retried once on a new one when that is safe (a ``SELECT``
outside a transaction, or the ``BEGIN`` that opens one); otherwise the call raises
:class:`~agentbox.errors.StateUnavailable` (retryable) and the next call reconnects.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from decimal import Decimal
from functools import lru_cache
from typing import Any, ClassVar, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg.rows import RowMaker

from agentbox.errors import StateUnavailable
from agentbox.state.db import Database

CONNECT_TIMEOUT_S = 5


class Row(tuple[Any, ...]):
    """A result row as sqlite3.Row has it: by position, by column name, and ``dict(row)``."""

    _names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(self._names[key] if isinstance(key, str) else key)

    def keys(self) -> list[str]:
        return list(self._names)


def _plain(value: Any) -> Any:
    # SUM() over BIGINT is NUMERIC in PostgreSQL; the stores (and SQLite) deal in int/float.
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


def _row_factory(cursor: psycopg.Cursor[Any]) -> RowMaker[Row]:
    names = {c.name: i for i, c in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> Row:
        row = Row(_plain(v) for v in values)
        row._names = names
        return row

    return make


@lru_cache(maxsize=512)
def _sql(portable: str) -> str:
    """``?`` placeholders (the stores' portable spelling) as psycopg's ``%s``."""
    return portable.replace("%", "%%").replace("?", "%s")


def split_pooler(url: str) -> tuple[str, str | None]:
    """``url`` without agentbox's own ``pooler=`` parameter (libpq knows no such key),
    and that parameter's value (None: no pooler between us and PostgreSQL)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    pooler = [v for k, v in query if k == "pooler"]
    rest = urlencode([(k, v) for k, v in query if k != "pooler"])
    return urlunsplit(parts._replace(query=rest)), (pooler[-1] if pooler else None)


def _lock_key(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class _Conn:
    """One thread's connection; ``execute`` speaks the stores' SQL."""

    def __init__(self, db: PostgresDB) -> None:
        self._db = db
        self.generation = db.generation
        self.raw = db.connect()
        self.in_tx = False

    def __del__(self) -> None:
        # Its thread ended (thread-locals go with it): hang up rather than leak the socket.
        raw = getattr(self, "raw", None)  # None: the connection was never made
        if raw is not None:
            raw.close()

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Row]:
        retry = not self.in_tx and sql.lstrip()[:6].upper() in ("SELECT", "BEGIN")
        try:
            return self.raw.execute(_sql(sql), tuple(parameters))
        except psycopg.OperationalError as e:
            self._db.drop(self)
            if not retry:
                raise self._db.unavailable(e) from e
        fresh = self._db.conn()  # the server may be back already: one more try
        try:
            return fresh.raw.execute(_sql(sql), tuple(parameters))
        except psycopg.OperationalError as e:
            self._db.drop(fresh)
            raise self._db.unavailable(e) from e


class PostgresDB(Database):
    dialect: ClassVar[Literal["sqlite", "postgresql"]] = "postgresql"
    skip_locked: ClassVar[str] = " FOR UPDATE SKIP LOCKED"

    def __init__(self, url: str, *, check_schema: bool = True) -> None:
        self.url = url
        self._conninfo, pooler = split_pooler(url)
        # psycopg prepares a statement run 5 times on a connection; through a transaction
        # pooler the next run may land on a server connection that never saw it.
        self._prepare_threshold = None if pooler == "transaction" else 5
        parts = urlsplit(url)
        self.where = f"{parts.hostname or 'localhost'}:{parts.port or 5432}{parts.path}"
        self._check_schema = check_schema
        self._checked = False
        self._local = threading.local()
        # Bumped whenever a thread finds its connection broken: the server went away, so
        # every other thread's connection is stale too and is replaced before its next
        # statement, instead of each thread failing one call of its own (a pool of 64
        # request threads would fail 64 calls after a PostgreSQL restart).
        self.generation = 0

    def connect(self) -> psycopg.Connection[Row]:
        try:
            raw = psycopg.connect(
                self._conninfo,
                autocommit=True,
                prepare_threshold=self._prepare_threshold,
                row_factory=_row_factory,
                connect_timeout=CONNECT_TIMEOUT_S,
                application_name="agentbox",
            )
        except psycopg.OperationalError as e:
            raise self.unavailable(e) from e
        if self._check_schema and not self._checked:
            from agentbox.state.migrations import check_version

            try:
                check_version(raw, self.where)
            except BaseException:
                raw.close()
                raise
            self._checked = True
        return raw

    def unavailable(self, e: Exception) -> StateUnavailable:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return StateUnavailable(
            f"the state database (PostgreSQL at {self.where}) is unreachable: {first}; "
            "retry in a moment, and check that the server runs if it persists",
            retry_after=1.0,
        )

    def drop(self, conn: _Conn) -> None:
        if conn.generation == self.generation:
            self.generation += 1  # a racing increment is as good: staleness is all it says
        conn.raw.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def conn(self) -> _Conn:
        conn: _Conn | None = getattr(self._local, "conn", None)
        # Mid-transaction a stale generation is left alone: the transaction's own
        # statements find out, and roll back.
        stale = conn is not None and conn.generation != self.generation and not conn.in_tx
        if conn is not None and (conn.raw.closed or conn.raw.broken or stale):
            conn.raw.close()
            self._local.conn = conn = None
        if conn is None:
            conn = self._local.conn = _Conn(self)
        return conn

    @contextmanager
    def tx(self, lock: str | None = None) -> Iterator[_Conn]:
        conn = self.conn()
        conn.execute("BEGIN")  # may land on a fresh connection: take the current one
        conn = self.conn()
        conn.in_tx = True
        try:
            if lock is not None:
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_lock_key(lock),))
            yield conn
        except BaseException:
            conn.in_tx = False
            if not (conn.raw.closed or conn.raw.broken):
                conn.raw.execute("ROLLBACK")
            raise
        conn.in_tx = False
        conn.execute("COMMIT")

    def close(self) -> None:
        conn: _Conn | None = getattr(self._local, "conn", None)
        if conn is not None:
            conn.raw.close()
            self._local.conn = None

    @staticmethod
    def json_text(column: str, key: str) -> str:
        return f"({column}::jsonb ->> '{key}')"

    @staticmethod
    def json_int(column: str, key: str) -> str:
        return f"({column}::jsonb ->> '{key}')::bigint"


def migrate(url: str) -> tuple[int, list[int]]:
    """Bring the database at ``url`` to ``LATEST``: (the version it had, those applied)."""
    from agentbox.state.migrations import _LOCK, LATEST, MIGRATIONS, _version, check_version

    db = PostgresDB(url, check_schema=False)
    try:
        with db.tx() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(?)", (_lock_key(_LOCK),))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_version (version BIGINT PRIMARY KEY,"
                " name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
            )
            before = _version(conn.raw) or 0
            if before > LATEST:
                check_version(conn.raw, db.where)  # raises: newer than we know
            applied = []
            for version, name, sql in MIGRATIONS:
                if version <= before:
                    continue
                conn.raw.execute(sql)  # DDL is transactional: all or nothing
                conn.execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
                applied.append(version)
        return before, applied
    finally:
        db.close()
