"""The stores on PostgreSQL (``gateway.state: postgresql://…``): many gateway replicas
and nodes share one database.

Each thread has its own handle (``conn()``, like the SQLite side, so store code is the
same), in autocommit; a handle holds a connection only for a statement or a transaction,
and gives it back to the process's idle connections after (at most ``IDLE_MAX`` kept).
A process's connections are thus about its concurrent statements, not every thread that
ever touched the database: a node's request threads (64 for tools, 40 for sync routes)
held one each, and 50 agents on three nodes kept 129 connections open, more than
PostgreSQL's default ``max_connections`` of 100. The schema comes from ``agentbox db
migrate`` (see :mod:`agentbox.state.migrations`) and is checked once per process: a
replica never migrates by itself.

Behind PgBouncer in transaction mode (``…/agentbox?pooler=transaction``: docs/cluster.md,
"Connections"), no statement is prepared: consecutive statements of one client may run on
different server connections, where a statement prepared on another does not exist.
Nothing else here needs a session: locks are transaction-scoped advisory locks.

When the server restarts, every open connection breaks. An idle connection the server
hung up on (a restart, ``idle_session_timeout``, ``pg_terminate_backend``) says so on its
socket before anything is sent, and is replaced then: no statement is lost to it. A
connection that breaks while in use is dropped and the call that found it retried once on
a new one when that is safe (a ``SELECT`` outside a transaction, or the ``BEGIN`` that
opens one); otherwise the call raises :class:`~agentbox.errors.StateUnavailable`
(retryable) and the next call reconnects.
"""

from __future__ import annotations

import hashlib
import select
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
IDLE_MAX = 8  # idle connections a process keeps; more are made while statements overlap
_IDLE = psycopg.pq.TransactionStatus.IDLE


def _hung_up(raw: psycopg.Connection[Any]) -> bool:
    """An idle connection with something to read was hung up on: nothing was asked of it,
    so what waits is the server's goodbye (FATAL 57P01 on a restart) or end of file. One
    poll, no round trip; a false alarm (a stray notice) costs one reconnect."""
    if raw.closed or raw.broken:
        return True
    poller = select.poll()
    poller.register(raw.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


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
    """One thread's handle; ``execute`` speaks the stores' SQL. ``raw`` is the connection
    it holds: during a statement, and from ``BEGIN`` to its end."""

    def __init__(self, db: PostgresDB) -> None:
        self._db = db
        self.generation = db.generation
        self.raw: psycopg.Connection[Row] | None = None
        self.in_tx = False

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()
            self.raw = None

    def __del__(self) -> None:
        # Its thread ended (thread-locals go with it): hang up rather than leak the socket.
        raw = getattr(self, "raw", None)  # None: no connection held
        if raw is not None:
            raw.close()

    def held(self) -> psycopg.Connection[Row]:
        """The connection, taken from the idle ones (or made) if none is held."""
        if self.raw is None:
            self.raw, self.generation = self._db.borrow()
        return self.raw

    def release(self) -> None:
        """Give the connection back unless a transaction is open on it (the cursor a
        statement returned keeps its rows: psycopg reads them all at ``execute``)."""
        raw = self.raw
        if raw is not None and not self.in_tx and raw.info.transaction_status == _IDLE:
            self.raw = None
            self._db.give_back(raw, self.generation)

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> psycopg.Cursor[Row]:
        retry = not self.in_tx and sql.lstrip()[:6].upper() in ("SELECT", "BEGIN")
        try:
            return self.held().execute(_sql(sql), tuple(parameters))
        except psycopg.OperationalError as e:
            self._db.drop(self)
            if not retry:
                raise self._db.unavailable(e) from e
        finally:
            self.release()
        fresh = self._db.conn()  # the server may be back already: one more try
        try:
            return fresh.held().execute(_sql(sql), tuple(parameters))
        except psycopg.OperationalError as e:
            self._db.drop(fresh)
            raise self._db.unavailable(e) from e
        finally:
            fresh.release()


class PostgresDB(Database):
    dialect: ClassVar[Literal["sqlite", "postgresql"]] = "postgresql"
    skip_locked: ClassVar[str] = " FOR UPDATE SKIP LOCKED"
    json_text_sql: ClassVar[str] = "({column}::jsonb ->> '{key}')"
    json_int_sql: ClassVar[str] = "({column}::jsonb ->> '{key}')::bigint"

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
        self._idle: list[tuple[psycopg.Connection[Row], int]] = []
        self._idle_lock = threading.Lock()
        # Bumped whenever a thread finds its connection broken: the server went away, so
        # every other connection is stale too and is replaced before its next statement,
        # instead of each thread failing one call of its own (a pool of 64 request
        # threads would fail 64 calls after a PostgreSQL restart).
        self.generation = 0

    def __del__(self) -> None:
        # Dropped without close() (a test's, a command's): hang up the idle connections.
        for raw, _ in getattr(self, "_idle", ()):
            raw.close()

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

    def borrow(self) -> tuple[psycopg.Connection[Row], int]:
        """An idle connection of the current generation, else a new one."""
        while True:
            with self._idle_lock:
                if not self._idle:
                    break
                raw, generation = self._idle.pop()
            if generation == self.generation and not _hung_up(raw):
                return raw, generation
            raw.close()  # from before the server went away
        generation = self.generation
        return self.connect(), generation

    def give_back(self, raw: psycopg.Connection[Row], generation: int) -> None:
        if generation == self.generation and not (raw.closed or raw.broken):
            with self._idle_lock:
                if len(self._idle) < IDLE_MAX:
                    self._idle.append((raw, generation))
                    return
        raw.close()

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
        if conn.raw is not None:
            conn.raw.close()
            conn.raw = None
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None

    def conn(self) -> _Conn:
        conn: _Conn | None = getattr(self._local, "conn", None)
        raw = conn.raw if conn is not None else None
        # Mid-transaction a stale generation is left alone: the transaction's own
        # statements find out, and roll back.
        stale = conn is not None and conn.generation != self.generation and not conn.in_tx
        if conn is not None and raw is not None and (raw.closed or raw.broken or stale):
            raw.close()
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
            raw = conn.raw
            if raw is not None and not (raw.closed or raw.broken):
                raw.execute("ROLLBACK")
                conn.release()
            raise
        conn.in_tx = False
        conn.execute("COMMIT")

    def close(self) -> None:
        """This thread's connection and the idle ones (a later call connects again)."""
        super().close()
        with self._idle_lock:
            idle, self._idle = self._idle, []
        for raw, _ in idle:
            raw.close()


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
            before = _version(conn.held()) or 0
            if before > LATEST:
                check_version(conn.held(), db.where)  # raises: newer than we know
            applied = []
            for version, name, sql in MIGRATIONS:
                if version <= before:
                    continue
                conn.held().execute(sql)  # DDL is transactional: all or nothing
                conn.execute(
                    "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
                applied.append(version)
        return before, applied
    finally:
        db.close()
