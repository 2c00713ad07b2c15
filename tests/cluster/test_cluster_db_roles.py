"""Per-role database grants (``agentbox db migrate --roles``, src/agentbox/state/roles.py)
on a real PostgreSQL: a node logged in as its own role (named its node id, a member of
``agentbox_node``) does its own work through the real stores, and is refused the rest:
other nodes' rows, tokens for sandboxes it does not run, altering or deleting audit
copies, DDL, the single-host tables. A replica's role cannot alter audit copies either."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from clusterkit import AGENTBOX, add_node, running_cluster

from agentbox.cluster.registry import Registry
from agentbox.gateway.auth import TokenStore
from agentbox.state.postgres import PostgresDB
from pgkit import PgServer

Refused = psycopg.errors.InsufficientPrivilege  # 42501: a grant or a row policy said no


@dataclass
class Roles:
    server: PgServer
    database: str
    me: str  # a node's id and its login role
    other: str  # another node's
    gateway: str  # a replica's login role

    def url(self, role: str) -> str:
        return f"postgresql://{role}@127.0.0.1:{self.server.port}/{self.database}"

    def db(self, role: str) -> PostgresDB:
        return PostgresDB(self.url(role))


@pytest.fixture
def roles(postgres: PgServer) -> Iterator[Roles]:
    tag = secrets.token_hex(3)
    kit = Roles(postgres, f"t_{tag}", f"node-a-{tag}", f"node-b-{tag}", f"gw-{tag}")
    postgres.sql(f"CREATE DATABASE {kit.database}")
    owner = kit.url("postgres")
    done = subprocess.run(
        [AGENTBOX, "db", "migrate", "--url", owner, "--roles", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"roles": true' in done.stdout
    for node in (kit.me, kit.other):
        postgres.sql(f'CREATE ROLE "{node}" LOGIN IN ROLE agentbox_node')
    postgres.sql(f'CREATE ROLE "{kit.gateway}" LOGIN IN ROLE agentbox_gateway')
    try:
        yield kit
    finally:
        postgres.sql(f"DROP DATABASE {kit.database} WITH (FORCE)")
        for role in (kit.me, kit.other, kit.gateway):
            postgres.sql(f'DROP ROLE "{role}"')


def refused(db: PostgresDB, sql: str, params: tuple[object, ...] = ()) -> None:
    with pytest.raises(Refused):
        db.conn().execute(sql, params)


def test_a_node_does_its_own_work_and_nothing_of_another(roles: Roles) -> None:
    gateway, mine, theirs = roles.db(roles.gateway), roles.db(roles.me), roles.db(roles.other)
    try:
        Registry(theirs).heartbeat(roles.other, "https://127.0.0.2:9", {}, {})
        Registry(theirs).claim("sb-theirs", roles.other)
        theirs_token, _ = TokenStore(theirs, "op", 600).issue("sb-theirs")

        node = Registry(mine)
        node.heartbeat(roles.me, "https://127.0.0.1:9", {"zone": "a"}, {"sandboxes": 1})
        node.claim("sb-mine", roles.me)
        assert node.on_node(roles.me).keys() == {"sb-mine"}
        tokens = TokenStore(mine, "op", 600)
        token, info = tokens.issue("sb-mine")
        assert tokens.authenticate(token).sandbox_id == "sb-mine"
        # Another node's session token still authenticates here (listings and checks are
        # routed to any node); the row's hash alone could not.
        assert tokens.authenticate(theirs_token).sandbox_id == "sb-theirs"

        # Another node's rows: invisible to its registry reads, and unwritable.
        assert node.on_node(roles.other) == {}
        with pytest.raises(Refused):
            node.heartbeat(roles.other, "https://evil:9", {}, {})  # its existing row
        with pytest.raises(Refused):
            node.heartbeat("node-new", "https://evil:9", {}, {})  # a row in another's name
        with pytest.raises(Refused):
            node.claim("sb-stolen", roles.other)
        node.drop("sb-theirs", roles.other)  # no row of its own matches: nothing happens
        moved = mine.conn().execute(
            "UPDATE nodes SET address = 'https://evil:9' WHERE id = ?", (roles.other,)
        )
        assert moved.rowcount == 0  # the row policy hides it from this node's writes

        # Tokens: minted and revoked only for its own sandboxes.
        with pytest.raises(Refused):
            tokens.issue("sb-theirs")
        assert tokens.revoke_sandbox("sb-theirs") == 0
        refused(mine, "UPDATE gateway_tokens SET sandbox = 'sb-theirs' WHERE id = ?", (info.id,))
        refused(mine, "DELETE FROM gateway_tokens")

        # Audit copies: its own chain appended, nothing altered or deleted, no other chain.
        conn = mine.conn()
        conn.execute(
            "INSERT INTO audit_chains (id, kind, host, path, started_at, updated_at, head_seq,"
            " head_hash) VALUES (?, 'node', 'h', 'p', 0, 0, 1, 'x')",
            (f"node:{roles.me}",),
        )
        conn.execute("INSERT INTO audit_records VALUES (?, 1, '{}')", (f"node:{roles.me}",))
        refused(mine, "INSERT INTO audit_records VALUES (?, 1, '{}')", (f"node:{roles.other}",))
        refused(mine, "INSERT INTO audit_records VALUES ('replica:gw-1', 1, '{}')")
        refused(mine, "UPDATE audit_records SET line = '{}'")
        refused(mine, "DELETE FROM audit_records")
        refused(mine, "DELETE FROM audit_chains")

        # No DDL, no single-host tables, no schema changes.
        refused(mine, "CREATE TABLE stolen (x int)")
        refused(mine, "DROP TABLE nodes")
        refused(mine, "SELECT * FROM sandboxes")
        refused(mine, "DELETE FROM schema_version")

        # The replica's role: everything a replica does, but audit copies stay append-only.
        everything = Registry(gateway)
        assert {n.id for n in everything.nodes()} == {roles.me, roles.other}
        assert {p.sandbox for p in everything.sandboxes()} == {"sb-mine", "sb-theirs"}
        assert everything.sweep(3600.0) == []
        assert TokenStore(gateway, "op", 600).authenticate(token).sandbox_id == "sb-mine"
        refused(gateway, "DELETE FROM audit_records")
        refused(gateway, "UPDATE audit_records SET line = '{}'")
        refused(gateway, "DROP TABLE audit_records")
    finally:
        for db in (gateway, mine, theirs):
            db.close()


def test_a_real_node_under_its_own_role(
    roles: Roles, agentbox_home: Path, host_ready: None
) -> None:
    """A real ``agentbox node`` logged in as its role serves a sandbox end to end through
    a replica: placement, a session token it mints, a command, the destroy; its heartbeat
    and audit chain land; what it may not do stays refused (the test above)."""
    agentbox_home.chmod(0o711)  # node homes live under it, sandboxes traverse to them
    base = agentbox_home / f"roles-{secrets.token_hex(4)}"
    try:
        with running_cluster(roles.url("postgres"), base, nodes=0, gateways=1) as cluster:
            name = roles.me
            cluster.state_url = roles.url(roles.me)  # the node's config names its own role
            env = {**os.environ, "AGENTBOX_TEST_OPERATOR_TOKEN": cluster.token}
            add_node(cluster, name, 1, env)
            cluster.start_node(name)
            with cluster.client("gw-1") as c:
                made = c.post("/v1/sandboxes", json={"template": "default"})
                assert made.status_code == 201, made.text + cluster.nodes[name].tail()
                sandbox = made.json()["id"]
                issued = c.post("/v1/tokens", json={"sandbox": sandbox})
                session = issued.raise_for_status().json()["token"]
                r = c.post(
                    "/v1/tools/terminal_run",
                    json={"arguments": {"sandbox_id": sandbox, "command": "echo hi"}},
                    headers={"Authorization": f"Bearer {session}"},
                )
                assert r.status_code == 200 and r.json()["stdout"] == "hi\n", r.text
                assert c.delete(f"/v1/sandboxes/{sandbox}").status_code in (200, 204)
            owner = roles.db("postgres")
            try:
                conn = owner.conn()
                row = conn.execute(
                    "SELECT head_seq FROM audit_chains WHERE id = ?", (f"node:{name}",)
                ).fetchone()
                revoked = conn.execute(
                    "SELECT revoked_at FROM gateway_tokens WHERE sandbox = ?", (sandbox,)
                ).fetchone()
            finally:
                owner.close()
            assert row is not None  # its chain registered under its role
            assert revoked is not None and revoked[0] is not None  # revoked by the destroy
            assert "permission denied" not in cluster.nodes[name].tail()
            assert "row-level security" not in cluster.nodes[name].tail()
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)
