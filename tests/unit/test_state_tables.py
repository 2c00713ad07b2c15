"""The tables declared once (src/agentbox/state/tables.py) make the same databases the
released SQL text made (tests/data/state_released/): a SQLite home and a PostgreSQL
database created by an older agentbox must go on as they were, and a new one must be
their twin.

Schemas are compared as the databases describe themselves (``sqlite_master`` and
``PRAGMA`` on SQLite, ``information_schema`` and ``pg_indexes`` on PostgreSQL), not as
text: comments and line breaks differ, the tables must not."""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from agentbox.gateway.auth import TokenStore
from agentbox.models.providers.budget import BudgetLedger
from agentbox.policy.approvals import ApprovalStore
from agentbox.runtime.store import Store
from agentbox.state.migrations import LATEST, MIGRATIONS
from agentbox.state.postgres import migrate
from agentbox.state.sqlite import SqliteDB
from agentbox.state.tables import E2B_PAUSES, E2B_SANDBOXES, E2B_SNAPSHOTS
from agentbox.tasks.store import TaskStore
from agentbox.volumes.store import VolumeStore
from pgkit import PgServer

RELEASED = Path(__file__).resolve().parents[1] / "data" / "state_released"
# The stores' SQLite text, and the columns policy/approvals.py then added in place.
SQLITE_RELEASED = (RELEASED / "sqlite.sql").read_text()
APPROVALS_ADDED = (("scope", "TEXT"), ("detail", "TEXT"), ("used_at", "REAL"))
POSTGRES_RELEASED = [(RELEASED / f"postgresql-{v}.sql").read_bytes() for v in (1, 2, 3, 4)]


def _sql_shape(sql: str) -> str:
    """A CREATE statement without its comments and layout (an ``ALTER TABLE … ADD
    COLUMN`` appends to the stored text with its own spacing)."""
    sql = " ".join(re.sub(r"--[^\n]*", "", sql).split())
    return re.sub(r"\s*([(),])\s*", r"\1", sql)


def sqlite_schema(path: Path) -> dict[str, Any]:
    with sqlite3.connect(path) as db:
        objects = db.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
        ).fetchall()
        schema: dict[str, Any] = {}
        for kind, name, table, sql in objects:
            entry: dict[str, Any] = {"type": kind, "table": table, "sql": _sql_shape(sql or "")}
            if kind == "table":
                entry["columns"] = db.execute(f"PRAGMA table_info({name})").fetchall()
                entry["indexes"] = sorted(
                    (row[1], row[2], row[3], db.execute(f"PRAGMA index_info({row[1]})").fetchall())
                    for row in db.execute(f"PRAGMA index_list({name})")
                )
            schema[name] = entry
    db.close()
    return schema


def released_sqlite(path: Path, *, first_release: bool = False) -> None:
    """A home's tables as the released stores made them; ``first_release``: before the
    columns the stores later added in place."""
    script = SQLITE_RELEASED
    if first_release:  # the usage ledger's table before prompt-cache accounting
        script = re.sub(r"\n    cache_(read|write)_tokens [^\n]*", "", script)
        script = script.replace("priced INTEGER NOT NULL,", "priced INTEGER NOT NULL")
    with sqlite3.connect(path) as db:
        db.executescript(script)
        if not first_release:
            for name, kind in APPROVALS_ADDED:
                db.execute(f"ALTER TABLE gateway_approvals ADD COLUMN {name} {kind}")
    db.close()


def open_every_store(path: Path) -> None:
    """Every store that keeps a table in a SQLite home, on one file."""
    opened = [
        Store(path).db,
        VolumeStore(path).db,
        TokenStore(path, "operator-token", 3600).db,
        ApprovalStore(path).db,
        BudgetLedger(path).db,
        TaskStore(path).db,
        SqliteDB(path, (E2B_SANDBOXES, E2B_PAUSES)),  # gateway/e2b/access.py's
        SqliteDB(path, (E2B_SNAPSHOTS,)),  # gateway/e2b/snapshots.py's
    ]
    for db in opened:
        db.close()


def test_a_new_sqlite_home_is_the_twin_of_a_released_one(tmp_path: Path) -> None:
    released_sqlite(tmp_path / "released.db")
    open_every_store(tmp_path / "new.db")
    want = sqlite_schema(tmp_path / "released.db")
    assert len(want) == 18 and sqlite_schema(tmp_path / "new.db") == want


def test_a_first_release_sqlite_home_gains_the_later_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    released_sqlite(path, first_release=True)
    today = time.strftime("%Y-%m-%d", time.gmtime())  # the ledger drops what is too old
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO usage (at, day, project, provider, model, input_tokens, output_tokens,"
            " cost_nanousd, priced) VALUES (1, ?, 'p', 'x', 'm', 5, 6, 7, 1)",
            (today,),
        )
    db.close()
    before = sqlite_schema(path)
    assert "scope" not in str(before["gateway_approvals"]["columns"])
    assert "cache_read_tokens" not in str(before["usage"]["columns"])
    open_every_store(path)
    open_every_store(path)  # a second open finds nothing to add
    released_sqlite(tmp_path / "released.db")
    assert sqlite_schema(path) == sqlite_schema(tmp_path / "released.db")
    with sqlite3.connect(path) as db:
        row = db.execute("SELECT input_tokens, cache_read_tokens FROM usage").fetchone()
    db.close()
    assert row == (5, 0)  # the row kept, the new column at its default


def postgres_schema(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as db:
        columns = db.execute(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
            " column_default, is_identity, identity_generation FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name <> 'schema_version'"
            " ORDER BY table_name, ordinal_position"
        ).fetchall()
        indexes = db.execute(
            "SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'"
            " AND tablename <> 'schema_version' ORDER BY indexname"
        ).fetchall()
        constraints = db.execute(
            "SELECT c.table_name, c.constraint_type, k.column_name, k.ordinal_position"
            " FROM information_schema.table_constraints c JOIN"
            " information_schema.key_column_usage k USING (constraint_schema, constraint_name)"
            " WHERE c.table_schema = 'public' AND c.table_name <> 'schema_version'"
            " ORDER BY 1, 2, 3"
        ).fetchall()
        functions = db.execute(
            "SELECT p.proname, pg_get_functiondef(p.oid) FROM pg_proc p"
            " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public'"
        ).fetchall()
    return {"columns": columns, "indexes": indexes, "constraints": constraints,
            "functions": functions}  # fmt: skip


def released_migrate(url: str, upto: int) -> None:
    """What the released ``agentbox db migrate`` did, to version ``upto``."""
    with psycopg.connect(url) as db:
        db.execute(
            "CREATE TABLE schema_version (version BIGINT PRIMARY KEY, name TEXT NOT NULL,"
            " applied_at DOUBLE PRECISION NOT NULL)"
        )
        for version, sql in enumerate(POSTGRES_RELEASED[:upto], start=1):
            db.execute(sql)
            name = MIGRATIONS[version - 1][1]
            db.execute(
                "INSERT INTO schema_version VALUES (%s, %s, %s)", (version, name, time.time())
            )


@pytest.mark.parametrize("released_upto", [LATEST, 1])
def test_a_migrated_postgresql_is_the_twin_of_a_released_one(
    postgres: PgServer, released_upto: int
) -> None:
    old, new = postgres.new_database(), postgres.new_database()
    released_migrate(old, released_upto)
    assert len(POSTGRES_RELEASED) == LATEST  # a new migration: compare it here
    # A database the release migrated part way takes the rest from this one.
    assert migrate(old) == (released_upto, list(range(released_upto + 1, LATEST + 1)))
    assert migrate(new) == (0, list(range(1, LATEST + 1)))
    want = postgres_schema(old)
    assert len({row[0] for row in want["columns"]}) == 17 and want["functions"]
    assert postgres_schema(new) == want
