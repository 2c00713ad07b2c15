"""Least-privilege roles on PostgreSQL: ``agentbox db migrate --roles`` (docs/cluster.md,
"Database roles").

Two group roles, never logged in as themselves:

* ``agentbox_gateway``: the replicas. Every table, except that the audit copies are
  append-only (``audit_records``: read and insert; ``audit_chains``: no delete;
  ``audit_checkpoints``: read only). Pruning old audit copies (``agentbox audit prune
  --cluster``) runs as the owner, not a replica: whoever may cut a chain may also write
  where it was cut, and no running process can.
* ``agentbox_node``: the nodes. Each node logs in as a role named exactly its
  ``cluster.node.id``, a member of ``agentbox_node``; row-level security keys its rows on
  ``current_user``. A node writes only its own ``nodes`` row, its own registry rows and
  its own audit chain; it mints and revokes session tokens only for sandboxes it runs
  (it reads token rows: listings are routed to any node, and a row's hash cannot
  authenticate; it may also revoke the tokens of a sandbox that runs nowhere any more,
  since a destroy drops the registry row before revoking); it cannot delete or alter
  audit copies, run DDL or touch the single-host tables. The shared features a node
  serves (approvals, egress grants, usage and budgets of the batch tasks it runs, the
  task queue, E2B state) stay open to it. The single-host tables (``sandboxes``,
  ``events``: a node keeps its own in its home) are granted to no node.

The owner (the role that runs the migrations) bypasses row-level security, so a
deployment without these roles behaves as before. Applying is idempotent and re-grants
on every run: a table added by a later migration is covered by running it again.
Creating the group roles needs CREATEROLE (or a superuser) once.
"""

from __future__ import annotations

from agentbox.state.postgres import PostgresDB

GATEWAY = "agentbox_gateway"
NODE = "agentbox_node"

# The shared features' tables: both roles read and write them whole.
_SHARED = (
    "gateway_approvals",
    "egress_grants",
    "usage",
    "budget_alerts",
    "tasks",
    "task_steps",
    "e2b_sandboxes",
    "e2b_pauses",
    "e2b_snapshots",
)
_OWN_SANDBOX = "agentbox_sandbox_node(sandbox) = current_user"
# A node destroys the sandbox (its registry row goes) before revoking its tokens: it may
# revoke the tokens of a sandbox that runs nowhere any more, as well as its own.
_OWN_OR_GONE = "COALESCE(agentbox_sandbox_node(sandbox), current_user) = current_user"
# Which node runs a sandbox, whoever asks: a node's own reads of the registry see only
# its rows, and a policy must know whether another node's row exists.
_SANDBOX_NODE = (
    "CREATE OR REPLACE FUNCTION agentbox_sandbox_node(sandbox TEXT) RETURNS TEXT"
    " LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public"
    " AS $$ SELECT node FROM cluster_sandboxes WHERE id = sandbox $$"
)

# (table, policy name, command, role, USING, WITH CHECK)
_POLICIES: tuple[tuple[str, str, str, str, str | None, str | None], ...] = (
    ("nodes", "gateway_all", "ALL", GATEWAY, "true", "true"),
    ("nodes", "node_read", "SELECT", NODE, "true", None),
    ("nodes", "node_insert_own", "INSERT", NODE, None, "id = current_user"),
    ("nodes", "node_update_own", "UPDATE", NODE, "id = current_user", "id = current_user"),
    ("cluster_sandboxes", "gateway_all", "ALL", GATEWAY, "true", "true"),
    ("cluster_sandboxes", "node_own", "ALL", NODE, "node = current_user", "node = current_user"),
    ("gateway_tokens", "gateway_all", "ALL", GATEWAY, "true", "true"),
    ("gateway_tokens", "node_read", "SELECT", NODE, "true", None),
    ("gateway_tokens", "node_mint_own", "INSERT", NODE, None, _OWN_SANDBOX),
    ("gateway_tokens", "node_revoke_own", "UPDATE", NODE, _OWN_OR_GONE, _OWN_OR_GONE),
    ("audit_chains", "gateway_all", "ALL", GATEWAY, "true", "true"),
    ("audit_chains", "node_own", "ALL", NODE, "id = 'node:' || current_user",
     "id = 'node:' || current_user"),
    ("audit_records", "gateway_all", "ALL", GATEWAY, "true", "true"),
    ("audit_records", "node_own", "ALL", NODE, "chain = 'node:' || current_user",
     "chain = 'node:' || current_user"),
)  # fmt: skip


def statements() -> list[str]:
    """The SQL that creates the roles (when missing) and applies every grant and policy."""
    out = []
    for role in (GATEWAY, NODE):
        # Roles are the server's, not the database's: another database may have made it.
        out.append(
            "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = "  # noqa: S608
            f"'{role}') THEN CREATE ROLE {role} NOLOGIN; END IF; "
            "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        )
    out += [
        _SANDBOX_NODE,
        "REVOKE ALL ON FUNCTION agentbox_sandbox_node(TEXT) FROM PUBLIC",
        f"GRANT EXECUTE ON FUNCTION agentbox_sandbox_node(TEXT) TO {GATEWAY}, {NODE}",
        f"GRANT USAGE ON SCHEMA public TO {GATEWAY}, {NODE}",
        f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {GATEWAY}, {NODE}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {GATEWAY}",
        f"REVOKE UPDATE, DELETE ON audit_records FROM {GATEWAY}",
        f"REVOKE DELETE ON audit_chains FROM {GATEWAY}",
        f"REVOKE INSERT, UPDATE, DELETE ON schema_version, audit_checkpoints FROM {GATEWAY}",
        f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA public TO {GATEWAY}",
        f"GRANT SELECT ON schema_version, audit_checkpoints TO {NODE}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON {', '.join(_SHARED)} TO {NODE}",
        f"GRANT SELECT, INSERT, UPDATE ON nodes, audit_chains TO {NODE}",
        f"GRANT SELECT, INSERT, DELETE ON cluster_sandboxes TO {NODE}",
        f"GRANT SELECT, INSERT ON audit_records TO {NODE}",
        f"GRANT SELECT, INSERT, UPDATE (revoked_at) ON gateway_tokens TO {NODE}",
    ]
    for table in sorted({p[0] for p in _POLICIES}):
        out.append(f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    for table, name, command, role, using, check in _POLICIES:
        out.append(f"DROP POLICY IF EXISTS {name} ON {table}")
        sql = f"CREATE POLICY {name} ON {table} FOR {command} TO {role}"
        if using is not None:
            sql += f" USING ({using})"
        if check is not None:
            sql += f" WITH CHECK ({check})"
        out.append(sql)
    return out


def apply_roles(url: str) -> None:
    """Create the roles if missing and apply every grant and policy, in one transaction."""
    db = PostgresDB(url)
    try:
        with db.tx(lock="agentbox:schema") as conn:
            for sql in statements():
                conn.held().execute(sql)  # our own constant SQL, no parameters
    finally:
        db.close()
