"""The state database's schema as released before src/agentbox/state/tables.py declared
it: each store's SQLite text and PostgreSQL's migrations, kept verbatim (from commit
1aa86c9) so tests/unit/test_state_tables.py can check that the declarations still make
the same databases. Never edit: users' databases were made by this text."""

from __future__ import annotations

# src/agentbox/runtime/store.py
SQLITE_RUNTIME = """
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    slot INTEGER NOT NULL UNIQUE,
    state TEXT NOT NULL,
    template TEXT NOT NULL,
    template_digest TEXT NOT NULL,
    init_pid INTEGER,
    init_start_time INTEGER,
    created_at REAL NOT NULL,
    expires_at REAL,
    spec TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS sandboxes_expiry ON sandboxes (expires_at);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    sandbox TEXT NOT NULL,
    type TEXT NOT NULL,
    reason TEXT NOT NULL,
    actor TEXT NOT NULL,
    details TEXT NOT NULL
);
"""

# src/agentbox/volumes/store.py
SQLITE_VOLUMES = """
CREATE TABLE IF NOT EXISTS volumes (
    name TEXT PRIMARY KEY,
    image TEXT NOT NULL,
    size INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS volume_mounts (
    volume TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    path TEXT NOT NULL,
    mode TEXT NOT NULL,
    PRIMARY KEY (volume, sandbox)
);
"""

# src/agentbox/gateway/auth.py
SQLITE_TOKENS = """
CREATE TABLE IF NOT EXISTS gateway_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    sandbox TEXT NOT NULL,
    tools TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    revoked_at REAL
);
CREATE INDEX IF NOT EXISTS gateway_tokens_sandbox ON gateway_tokens (sandbox);
"""

# src/agentbox/policy/approvals.py
SQLITE_APPROVALS = """
CREATE TABLE IF NOT EXISTS gateway_approvals (
    id TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    tool TEXT NOT NULL,
    summary TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    rule TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    deadline REAL NOT NULL,
    decided_at REAL,
    decided_by TEXT
);
"""

# src/agentbox/policy/egress_grants.py
SQLITE_EGRESS_GRANTS = """
CREATE TABLE IF NOT EXISTS egress_grants (
    scope TEXT NOT NULL,        -- 'sandbox' (owner: a sandbox id) or 'always' (a project)
    owner TEXT NOT NULL,
    host TEXT NOT NULL,         -- a normalised name, matched exactly
    approval TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (scope, owner, host)
);
"""

# src/agentbox/gateway/e2b/access.py
SQLITE_E2B_ACCESS = """
CREATE TABLE IF NOT EXISTS e2b_sandboxes (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    alias TEXT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS e2b_pauses (
    id TEXT PRIMARY KEY,
    pause_at REAL,
    timeout_s REAL NOT NULL,
    keep_memory INTEGER NOT NULL,
    auto_resume INTEGER NOT NULL
);
"""

# src/agentbox/gateway/e2b/snapshots.py
SQLITE_E2B_SNAPSHOTS = """
CREATE TABLE IF NOT EXISTS e2b_snapshots (
    id TEXT NOT NULL,
    project TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    names TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (id, project)
);
"""

# src/agentbox/models/providers/budget.py
SQLITE_USAGE = """
CREATE TABLE IF NOT EXISTS usage (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    day TEXT NOT NULL,
    project TEXT NOT NULL,
    sandbox TEXT,
    task TEXT,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL,
    cost_nanousd INTEGER NOT NULL,
    priced INTEGER NOT NULL,
    cache_read_tokens INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS usage_by_day ON usage (day, project);
CREATE TABLE IF NOT EXISTS budget_alerts (
    day TEXT NOT NULL,
    project TEXT NOT NULL,
    threshold REAL NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (day, project, threshold)
);
"""

# src/agentbox/tasks/store.py
SQLITE_TASKS = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    project TEXT NOT NULL,
    template TEXT NOT NULL,
    goal TEXT NOT NULL,
    state TEXT NOT NULL,
    max_steps INTEGER NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    sandbox TEXT,
    worker TEXT,
    lease_until REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    steps INTEGER NOT NULL DEFAULT 0,
    tool_calls INTEGER NOT NULL DEFAULT 0,
    tool_errors INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    failure TEXT,
    result TEXT
);
CREATE INDEX IF NOT EXISTS tasks_state ON tasks (state, created_at);
CREATE TABLE IF NOT EXISTS task_steps (
    task TEXT NOT NULL,
    n INTEGER NOT NULL,
    at REAL NOT NULL,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    tokens_in INTEGER NOT NULL,
    tokens_out INTEGER NOT NULL,
    cost_usd REAL NOT NULL,
    PRIMARY KEY (task, n)
);
"""

# policy/approvals.py added these to gateway_approvals on open (ALTER TABLE … ADD COLUMN)
SQLITE_APPROVALS_ADDED = (("scope", "TEXT"), ("detail", "TEXT"), ("used_at", "REAL"))
# models/providers/budget.py added these to usage when a file lacked them
SQLITE_USAGE_ADDED = (
    ("cache_read_tokens", "INTEGER NOT NULL DEFAULT 0"),
    ("cache_write_tokens", "INTEGER NOT NULL DEFAULT 0"),
)


# src/agentbox/state/migrations.py
POSTGRES_V1_INITIAL = """
CREATE TABLE sandboxes (
    id TEXT PRIMARY KEY,
    slot BIGINT NOT NULL UNIQUE,
    state TEXT NOT NULL,
    template TEXT NOT NULL,
    template_digest TEXT NOT NULL,
    init_pid BIGINT,
    init_start_time BIGINT,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    spec TEXT NOT NULL
);
CREATE INDEX sandboxes_expiry ON sandboxes (expires_at);
CREATE TABLE events (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    sandbox TEXT NOT NULL,
    type TEXT NOT NULL,
    reason TEXT NOT NULL,
    actor TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE TABLE gateway_tokens (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    sandbox TEXT NOT NULL,
    tools TEXT,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);
CREATE INDEX gateway_tokens_sandbox ON gateway_tokens (sandbox);
CREATE TABLE gateway_approvals (
    id TEXT PRIMARY KEY,
    sandbox TEXT NOT NULL,
    tool TEXT NOT NULL,
    summary TEXT NOT NULL,
    args_hash TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    rule TEXT,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    deadline DOUBLE PRECISION NOT NULL,
    decided_at DOUBLE PRECISION,
    decided_by TEXT,
    scope TEXT,
    detail TEXT,
    used_at DOUBLE PRECISION
);
CREATE INDEX gateway_approvals_pending ON gateway_approvals (status, deadline);
CREATE TABLE egress_grants (
    scope TEXT NOT NULL,
    owner TEXT NOT NULL,
    host TEXT NOT NULL,
    approval TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (scope, owner, host)
);
CREATE TABLE usage (
    id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    day TEXT NOT NULL,
    project TEXT NOT NULL,
    sandbox TEXT,
    task TEXT,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    input_tokens BIGINT NOT NULL,
    output_tokens BIGINT NOT NULL,
    cost_nanousd BIGINT NOT NULL,
    priced BIGINT NOT NULL,
    cache_read_tokens BIGINT NOT NULL DEFAULT 0,
    cache_write_tokens BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX usage_by_day ON usage (day, project);
CREATE TABLE budget_alerts (
    day TEXT NOT NULL,
    project TEXT NOT NULL,
    threshold DOUBLE PRECISION NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (day, project, threshold)
);
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    project TEXT NOT NULL,
    template TEXT NOT NULL,
    goal TEXT NOT NULL,
    state TEXT NOT NULL,
    max_steps BIGINT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    started_at DOUBLE PRECISION,
    finished_at DOUBLE PRECISION,
    sandbox TEXT,
    worker TEXT,
    lease_until DOUBLE PRECISION,
    cancel_requested BIGINT NOT NULL DEFAULT 0,
    steps BIGINT NOT NULL DEFAULT 0,
    tool_calls BIGINT NOT NULL DEFAULT 0,
    tool_errors BIGINT NOT NULL DEFAULT 0,
    tokens_in BIGINT NOT NULL DEFAULT 0,
    tokens_out BIGINT NOT NULL DEFAULT 0,
    cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0,
    attempts BIGINT NOT NULL DEFAULT 0,
    failure TEXT,
    result TEXT
);
CREATE INDEX tasks_state ON tasks (state, created_at);
CREATE TABLE task_steps (
    task TEXT NOT NULL,
    n BIGINT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    action TEXT NOT NULL,
    result TEXT NOT NULL,
    tokens_in BIGINT NOT NULL,
    tokens_out BIGINT NOT NULL,
    cost_usd DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (task, n)
);
CREATE TABLE e2b_sandboxes (
    id TEXT PRIMARY KEY,
    key TEXT NOT NULL,
    alias TEXT NOT NULL,
    metadata TEXT NOT NULL
);
CREATE TABLE e2b_pauses (
    id TEXT PRIMARY KEY,
    pause_at DOUBLE PRECISION,
    timeout_s DOUBLE PRECISION NOT NULL,
    keep_memory BIGINT NOT NULL,
    auto_resume BIGINT NOT NULL
);
CREATE TABLE e2b_snapshots (
    id TEXT NOT NULL,
    project TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    names TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (id, project)
);
-- Cluster mode: each node's address, labels (e.g. the isolation tier),
-- capacity and last heartbeat, for placement and for declaring a silent node lost.
CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    labels TEXT NOT NULL DEFAULT '{}',
    capacity TEXT NOT NULL DEFAULT '{}',
    state TEXT NOT NULL DEFAULT 'ready',
    registered_at DOUBLE PRECISION NOT NULL,
    heartbeat_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX nodes_heartbeat ON nodes (state, heartbeat_at);
"""

# src/agentbox/state/migrations.py
POSTGRES_V2_CLUSTER = """
-- Cluster mode's sandbox registry: which node runs each sandbox (gateways route by it).
-- The node writes the row when it creates the sandbox and deletes it when it destroys
-- it; a gateway marks it lost when the node stops heartbeating.
CREATE TABLE cluster_sandboxes (
    id TEXT PRIMARY KEY,
    node TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX cluster_sandboxes_node ON cluster_sandboxes (node, state);
-- The database's clock, in seconds: heartbeats and their ages are measured on one clock
-- whatever the hosts' clocks say.
CREATE FUNCTION agentbox_now() RETURNS DOUBLE PRECISION LANGUAGE SQL VOLATILE
    AS $$ SELECT extract(epoch FROM clock_timestamp())::DOUBLE PRECISION $$;
"""

# src/agentbox/state/migrations.py
POSTGRES_V3_AUDIT_CHAINS = """
-- Cluster mode's audit: every gateway replica and node keeps its own hash chain (its
-- local JSONL file) and copies it here, so `agentbox audit verify --cluster` checks all
-- chains from any host. `audit_chains` is each chain's witness: the last seq and hash
-- its writer shipped, when (the database's clock) and whether it was closed cleanly.
CREATE TABLE audit_chains (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    host TEXT NOT NULL,
    path TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    head_seq BIGINT NOT NULL,
    head_hash TEXT NOT NULL,
    closed_at DOUBLE PRECISION
);
-- One row per record, its line exactly as the chain holds it (canonical JSON).
CREATE TABLE audit_records (
    chain TEXT NOT NULL,
    seq BIGINT NOT NULL,
    line TEXT NOT NULL,
    PRIMARY KEY (chain, seq)
);
"""

POSTGRES_MIGRATIONS = (POSTGRES_V1_INITIAL, POSTGRES_V2_CLUSTER, POSTGRES_V3_AUDIT_CHAINS)
