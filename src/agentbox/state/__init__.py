"""Where shared state lives: SQLite files in the home (one host, the default) or one
PostgreSQL database (many gateways and nodes). Each store (sandbox registry, tokens,
approvals, usage ledger, task queue, E2B keys) speaks to a :class:`~agentbox.state.db.Database`
and never to a driver; the dialect differences live in that class.

    Database            db.py        the interface the stores use; dialect hooks
    ├── SqliteDB        sqlite.py    a file per store, schema created on open
    └── PostgresDB      postgres.py  one database, schema from `agentbox db migrate`
    migrations.py                    PostgreSQL's numbered schema versions
"""

from __future__ import annotations

from agentbox.state.db import Database, state_url_error

__all__ = ["Database", "open_shared", "state_url_error"]


def open_shared(url: str) -> Database | None:
    """The shared database ``url`` names (``gateway.state``), or None for ``sqlite``: each
    store then keeps its own file in the home, as on a single host."""
    if url == "sqlite":
        return None
    from agentbox.state.postgres import PostgresDB  # psycopg loads only in cluster mode

    return PostgresDB(url)
