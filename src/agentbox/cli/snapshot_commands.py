"""``agentbox snapshot``: take, restore, list and delete sandbox snapshots."""

from __future__ import annotations

from pathlib import Path

import click

from agentbox.cli.errors import fail, reports_errors
from agentbox.cli.output import backend as _runtime
from agentbox.cli.output import print_json, print_listing
from agentbox.cli.params import SuggestingGroup
from agentbox.errors import SecretsFound
from agentbox.runtime.snapshots import beyond_retention
from agentbox.units import parse_duration


@click.group(cls=SuggestingGroup)
def snapshot() -> None:
    """Snapshots: a sandbox's writable layer and /workspace, scanned for secrets and kept
    (zstd, content-addressed) in the snapshot store.

    \b
    The store: the gateway's `gateway.store` (through a gateway), else $AGENTBOX_STORE
    (file:///path or s3://bucket/prefix, with the usual AWS_* variables and
    AGENTBOX_S3_ENDPOINT for S3-compatible servers), else $AGENTBOX_HOME/snapshots.
    """


@snapshot.command("create")
@click.argument("sandbox_id")
@click.option("--redact", is_flag=True, help="Replace found secrets with [REDACTED:kind].")
@click.option(
    "--allow-list",
    "allow_list",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Findings to accept: one a line, a path glob, PATH:LINE or kind=KIND.",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Keep running processes too (gvisor tier: runsc checkpoint; see docs/design.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as a JSON object.")
@reports_errors()
def snapshot_create(
    sandbox_id: str, redact: bool, allow_list: Path | None, memory: bool, as_json: bool
) -> None:
    """Snapshot a sandbox and print the snapshot id.

    The sandbox keeps running (its filesystem is frozen only for an instant). When the
    secret scan finds something, nothing is stored: the report (file, line, kind; never
    the value) goes to stderr and the exit status is 3.
    """
    allowlist = allow_list.read_text() if allow_list else None
    try:
        backend = _runtime()
        info = backend.snapshot(sandbox_id, redact=redact, allowlist=allowlist, memory=memory)
    except SecretsFound as e:  # the report (file, line, kind) is its message
        fail(e, exit_code=3)
    print_json(info.to_dict()) if as_json else click.echo(info.id)


@snapshot.command("restore")
@click.argument("snapshot_id")
@click.option("--json", "as_json", is_flag=True, help="Print the new sandbox as a JSON object.")
@reports_errors()
def snapshot_restore(snapshot_id: str, as_json: bool) -> None:
    """Create a sandbox with a snapshot's files and print its id."""
    record = _runtime().restore(snapshot_id)
    print_json(record.to_dict()) if as_json else click.echo(record.id)


@snapshot.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@reports_errors()
def snapshot_ls(as_json: bool) -> None:
    """List snapshots, oldest first."""
    print_listing(
        _runtime().list_snapshots(), as_json,
        lambda s: f"{s.id}  from {s.sandbox}  {s.files} entries  {s.size / 2**20:.1f} MiB",
        to_json=lambda s: s.to_dict(),
        empty="no snapshots (take one with `agentbox snapshot create SANDBOX`)",
    )  # fmt: skip


@snapshot.command("rm")
@click.argument("snapshot_ids", nargs=-1, required=True)
@reports_errors()
def snapshot_rm(snapshot_ids: tuple[str, ...]) -> None:
    """Delete snapshots from the store."""
    backend = _runtime()
    for snapshot_id in snapshot_ids:
        backend.delete_snapshot(snapshot_id)
        click.echo(snapshot_id)


@snapshot.command("prune")
@click.option("--keep", type=click.IntRange(min=0), help="Keep at most this many (the newest).")
@click.option("--older-than", help="Delete those older than this, e.g. 7d.")
@reports_errors()
def snapshot_prune(keep: int | None, older_than: str | None) -> None:
    """Apply a retention policy now (the gateway applies `snapshots:` after each one)."""
    if keep is None and older_than is None:
        raise click.UsageError("say --keep N, --older-than DURATION, or both")
    backend = _runtime()
    max_age = parse_duration(older_than, "--older-than") if older_than else None
    for snapshot_id in beyond_retention(backend.list_snapshots(), keep, max_age):
        backend.delete_snapshot(snapshot_id)
        click.echo(snapshot_id)
