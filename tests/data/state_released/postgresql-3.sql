-- src/agentbox/state/migrations.py: migration 3
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
