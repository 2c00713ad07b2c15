"""What the product reports about itself: Prometheus metrics, OpenTelemetry traces,
lifecycle events, and the egress daemon's decisions ingested into both.

metrics.py           the Prometheus registry (tool calls, sandboxes, egress, tokens, ...)
telemetry.py         OpenTelemetry traces (GenAI / MCP semantic conventions)
lifecycle_events.py  sandbox lifecycle events into the audit trail and the metrics
egress_ingest.py     the egress daemon's audit log, followed into the metrics
"""
