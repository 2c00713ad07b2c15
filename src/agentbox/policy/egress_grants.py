"""Standing egress approvals: the names a person let a sandbox or a project reach.

Mode ``ask`` holds a connection to a name on neither list until someone decides; a
decision with scope ``sandbox`` or ``always`` is written here (by
:meth:`ApprovalStore.decide`, in the decision's transaction) so later connections to
that name pass without asking. ``always`` is the project's persistent allowlist: it lives
in the gateway's database, not in the YAML config (which a person edits and the gateway
never rewrites), survives gateway and egress daemon restarts, and is listed and revoked
with ``agentbox approvals allowlist``. It applies to the project's sandboxes in mode
``ask`` only: a sandbox in mode ``allowlist`` keeps exactly the list it was made with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentbox.state.db import Connection

Kind = Literal["sandbox", "always"]


@dataclass(frozen=True)
class Grant:
    scope: Kind
    owner: str
    host: str
    approval: str
    decided_by: str
    created_at: float

    def to_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def grant(
    db: Connection,
    scope: Kind,
    owner: str,
    host: str,
    approval: str,
    by: str,
    now: float,
) -> None:
    db.execute(
        "INSERT INTO egress_grants VALUES (?,?,?,?,?,?) ON CONFLICT (scope, owner, host)"
        " DO UPDATE SET approval = excluded.approval, decided_by = excluded.decided_by,"
        " created_at = excluded.created_at",
        (scope, owner, host, approval, by, now),
    )


def find(db: Connection, sandbox: str, project: str, host: str) -> Grant | None:
    row = db.execute(
        "SELECT scope, owner, host, approval, decided_by, created_at FROM egress_grants"
        " WHERE host = ? AND ((scope = 'sandbox' AND owner = ?) OR"
        " (scope = 'always' AND owner = ?)) ORDER BY scope LIMIT 1",
        (host, sandbox, project),
    ).fetchone()
    return None if row is None else Grant(*row)


def listing(db: Connection, project: str | None = None) -> list[Grant]:
    """The projects' persistent allowlists (scope ``always``), or one project's."""
    query = "SELECT scope, owner, host, approval, decided_by, created_at FROM egress_grants"
    query += " WHERE scope = 'always'" + (" AND owner = ?" if project else "")
    rows = db.execute(query + " ORDER BY owner, host", (project,) if project else ())
    return [Grant(*r) for r in rows.fetchall()]


def revoke(db: Connection, project: str, host: str) -> bool:
    """Take ``host`` off ``project``'s allowlist; False when it was not on it."""
    cursor = db.execute(
        "DELETE FROM egress_grants WHERE scope = 'always' AND owner = ? AND host = ?",
        (project, host),
    )
    return cursor.rowcount > 0


def forget_sandbox(db: Connection, sandbox: str) -> int:
    """Drop what was granted to ``sandbox`` alone (it is gone); the rows removed."""
    cursor = db.execute(
        "DELETE FROM egress_grants WHERE scope = 'sandbox' AND owner = ?", (sandbox,)
    )
    return cursor.rowcount
