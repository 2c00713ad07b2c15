-- src/agentbox/runtime/store.py: _SCHEMA
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
-- src/agentbox/volumes/store.py: _SCHEMA
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
-- src/agentbox/gateway/auth.py: _SCHEMA
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
-- src/agentbox/policy/approvals.py: _SCHEMA
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
-- src/agentbox/policy/egress_grants.py: _SCHEMA
CREATE TABLE IF NOT EXISTS egress_grants (
    scope TEXT NOT NULL,        -- 'sandbox' (owner: a sandbox id) or 'always' (a project)
    owner TEXT NOT NULL,
    host TEXT NOT NULL,         -- a normalised name, matched exactly
    approval TEXT NOT NULL,
    decided_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (scope, owner, host)
);
-- src/agentbox/gateway/e2b/access.py: _SCHEMA
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
-- src/agentbox/gateway/e2b/snapshots.py: _SCHEMA
CREATE TABLE IF NOT EXISTS e2b_snapshots (
    id TEXT NOT NULL,
    project TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    names TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (id, project)
);
-- src/agentbox/models/providers/budget.py: _SCHEMA
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
-- src/agentbox/tasks/store.py: _SCHEMA
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
