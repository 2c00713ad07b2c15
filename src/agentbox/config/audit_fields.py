"""The audit record's own keys: the log writes them and a caller's extra fields can never
replace them; the settings check ``audit.fields`` against them. Here, below both, so that
the settings need not import the audit log (which imports the settings' types)."""

from __future__ import annotations

CALLER_FIELDS = ("actor", "session", "sandbox", "tool", "error")
RESERVED = frozenset(
    {
        "v",
        "seq",
        "ts",
        "prev",
        "hash",
        "decision",
        "args_hash",
        "exit_code",
        "duration_ms",
        "bytes_out",
        *CALLER_FIELDS,
    }
)
