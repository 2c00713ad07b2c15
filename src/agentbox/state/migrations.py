"""PostgreSQL's schema, as numbered migrations applied by ``agentbox db migrate``.

Each migration is a number, a name and its SQL (the tables of
:mod:`agentbox.state.tables`, rendered for PostgreSQL); ``schema_version`` records the ones
applied. ``migrate`` applies the missing ones in one transaction under an advisory lock
(two runs at once: the second finds nothing to do) and refuses a database whose schema
is newer than this agentbox. A process opening the database checks the version and
never migrates by itself: gateway replicas of two releases must not race to change it.

A new migration is appended, never edited once released (tests/unit/test_state_tables.py
keeps the released text's schema). SQLite keeps creating its own tables on open (see
:mod:`agentbox.state.sqlite`) from the same declarations.
"""

from __future__ import annotations

from typing import Any

from agentbox.errors import SchemaMismatch
from agentbox.state import tables as t
from agentbox.state.tables import render

_V1_INITIAL = render(
    "postgresql",
    t.SANDBOXES, t.EVENTS, t.GATEWAY_TOKENS, t.GATEWAY_APPROVALS, t.EGRESS_GRANTS, t.USAGE,
    t.BUDGET_ALERTS, t.TASKS, t.TASK_STEPS, t.E2B_SANDBOXES, t.E2B_PAUSES, t.E2B_SNAPSHOTS,
    t.NODES,
)  # fmt: skip
# The database's clock, in seconds: heartbeats and their ages are measured on one clock
# whatever the hosts' clocks say.
_NOW = """
CREATE FUNCTION agentbox_now() RETURNS DOUBLE PRECISION LANGUAGE SQL VOLATILE
    AS $$ SELECT extract(epoch FROM clock_timestamp())::DOUBLE PRECISION $$;
"""
_V2_CLUSTER = render("postgresql", t.CLUSTER_SANDBOXES) + _NOW
_V3_AUDIT_CHAINS = render("postgresql", t.AUDIT_CHAINS, t.AUDIT_RECORDS)

_V4_AUDIT_CHECKPOINTS = render("postgresql", t.AUDIT_CHECKPOINTS)

# (version, name, SQL); append only.
MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (1, "initial", _V1_INITIAL),
    (2, "cluster registry", _V2_CLUSTER),
    (3, "cluster audit chains", _V3_AUDIT_CHAINS),
    (4, "audit checkpoints", _V4_AUDIT_CHECKPOINTS),
)
LATEST = MIGRATIONS[-1][0]
_LOCK = "agentbox:schema"


def _version(raw: Any) -> int | None:
    """The schema version of the database ``raw`` is connected to; None: never migrated."""
    if raw.execute("SELECT to_regclass('schema_version')").fetchone()[0] is None:
        return None
    return int(raw.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0])


def check_version(raw: Any, where: str) -> None:
    """Refuse to run on a database this agentbox has not migrated, or a newer one."""
    version = _version(raw)
    if version == LATEST:
        return
    if version is None or version < LATEST:
        raise SchemaMismatch(
            f"the state database at {where} has schema version {version or 0}, this agentbox "
            f"needs {LATEST}: run `agentbox db migrate` (with the same gateway.state), then "
            "start again",
            version=version or 0,
            expected=LATEST,
        )
    raise SchemaMismatch(
        f"the state database at {where} has schema version {version}, newer than this "
        f"agentbox knows ({LATEST}): upgrade agentbox on this host (a newer one migrated it)",
        version=version,
        expected=LATEST,
    )
