-- src/agentbox/state/migrations.py: migration 2
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
