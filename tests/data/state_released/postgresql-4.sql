-- src/agentbox/state/migrations.py: migration 4
-- Retention of the audit copies (`agentbox audit prune --cluster`): where a chain's copy
-- was cut. The first record kept links to `hash` (its `prev`), so verification starts
-- here and reports what lies before as pruned; only the owner role writes this table.
CREATE TABLE audit_checkpoints (
    chain TEXT PRIMARY KEY,
    seq BIGINT NOT NULL,
    hash TEXT NOT NULL,
    pruned_at DOUBLE PRECISION NOT NULL,
    records_pruned BIGINT NOT NULL
);
