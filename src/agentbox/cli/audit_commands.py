"""``agentbox audit ...``: verify the hash chain of the audit trail and read its tail.

Read-only: these commands never open the log for writing, so they are safe next to a
running gateway. PATH defaults to ``$AGENTBOX_AUDIT_PATH``, else
``$AGENTBOX_HOME/audit/audit.jsonl`` (``AGENTBOX_HOME`` defaults to /var/lib/agentbox).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import click

from agentbox.audit.log import canonical_json, default_audit_path, follow, read_records, verify
from agentbox.cli.errors import reports_errors
from agentbox.cli.params import SuggestingGroup
from agentbox.errors import FileNotFound, InvalidRequest

_PATH = click.argument(
    "path", required=False, type=click.Path(dir_okay=False, path_type=Path), metavar="[PATH]"
)


@click.group("audit", cls=SuggestingGroup)
def audit() -> None:
    """Check and read the gateway's tamper-evident audit trail.

    PATH is the active log file (rotated files ``PATH.1``, ``PATH.2``, … and the head
    file sit next to it); it defaults to $AGENTBOX_AUDIT_PATH, else
    $AGENTBOX_HOME/audit/audit.jsonl.
    """


@audit.command("verify")
@_PATH
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option(
    "--cluster", "cluster", is_flag=True,
    help="Check every chain of the cluster (the copies in PostgreSQL); needs --config.",
)  # fmt: skip
@click.option(
    "--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
    help="A cluster process's config (gateway.state, cluster:), with --cluster.",
)  # fmt: skip
@reports_errors()
def verify_command(
    path: Path | None, as_json: bool, cluster: bool, config_path: Path | None
) -> None:
    """Prove that no record was altered, removed, reordered or inserted.

    Checks every rotated file in order, the hash chain and the head file. Exits 0 and
    prints "ok: N records", or exits 1 and names the first bad record: file, line, seq
    and why.

    A log rewritten wholesale by someone who also rewrote the head still verifies;
    compare with the copy the remote log service received to rule that out.

    \b
    Examples:
      agentbox audit verify
      agentbox audit verify /var/log/agentbox/audit.jsonl
      agentbox audit verify --json | jq .first_bad
      agentbox audit verify --cluster --config /etc/agentbox/gateway.yaml

    With --cluster, every gateway replica's and node's chain is checked from its copy in
    PostgreSQL (docs/cluster.md, "Audit"): one line per chain, exit 1 when any has a
    gap (records altered or missing, a truncated tail, a chain that stopped).
    """
    if cluster or config_path is not None:
        if path is not None or not cluster or config_path is None:
            raise InvalidRequest(
                "--cluster needs --config FILE (a cluster process's config) and no PATH; "
                "e.g. agentbox audit verify --cluster --config /etc/agentbox/gateway.yaml"
            )
        _verify_cluster(config_path, as_json)
        return
    target = path or default_audit_path()
    result = verify(target)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "path": str(target),
                    "ok": result.ok,
                    "records": result.records,
                    "first_bad": result.first_bad,
                    "file": result.file,
                    "line": result.line,
                    "reason": result.reason,
                    "torn": list(result.torn),
                }
            )
        )
    elif result.ok:
        click.echo(f"ok: {result.records} records")
        notes = result.reason.split("; ")[1:]
        for note in notes:
            click.echo(f"note: {note}", err=True)
    else:
        where = result.file or "?"
        if result.line is not None:
            where += f":{result.line}"
        seq = f"seq {result.first_bad}" if result.first_bad is not None else "seq ?"
        click.echo(f"FAILED: {where}: {seq}: {result.reason}")
        click.echo(f"({result.records} records verified before it)", err=True)
    if not result.ok:
        raise SystemExit(1)


def _verify_cluster(config_path: Path, as_json: bool) -> None:
    from agentbox.cluster.audit_verify import verify_cluster

    settings, db = _cluster_db(config_path)
    try:
        reports = verify_cluster(db, settings.cluster.lost_after_seconds)
    finally:
        db.close()
    failed = [r for r in reports if not r.ok]
    if as_json:
        chains = [r.to_dict() for r in reports]
        click.echo(json.dumps({"ok": bool(reports) and not failed, "chains": chains}))
    else:
        for r in reports:
            if r.ok:
                state = "closed" if r.closed else "open"
                pruned = f", pruned through seq {r.pruned_through}" if r.pruned_through else ""
                click.echo(f"ok: {r.chain}: {r.records} records ({state}{pruned})")
            for problem in r.problems:
                click.echo(f"FAILED: {r.chain}: {problem}")
        if not reports:
            click.echo("FAILED: no audit chain in the cluster's database")
    if failed or not reports:
        raise SystemExit(1)


@audit.command("prune")
@click.option(
    "--cluster", "cluster", is_flag=True, required=True,
    help="Prune the cluster's copies in PostgreSQL (the only kind there is to prune).",
)  # fmt: skip
@click.option(
    "--config", "config_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
    help="A cluster process's config (gateway.state, cluster:).",
)  # fmt: skip
@click.option(
    "--older-than-days", type=float, default=None,
    help="Default: the config's cluster.audit_retention_days.",
)  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@reports_errors()
def prune_command(
    cluster: bool, config_path: Path, older_than_days: float | None, as_json: bool
) -> None:
    """Delete the cluster's audit copies older than the retention, behind a checkpoint.

    Each chain is verified up to the cut first (a bad record is reported, never pruned);
    `agentbox audit verify --cluster` then starts at the checkpoint and reports what lies
    before it as pruned. Run it as the database's owner (e.g. a daily timer): the
    replicas' and nodes' roles cannot delete audit copies.

    \b
    Example:
      agentbox audit prune --cluster --config /etc/agentbox/gateway.yaml
    """
    from agentbox.cluster.audit_retention import prune

    settings, db = _cluster_db(config_path)
    assert settings.cluster is not None
    days = older_than_days if older_than_days is not None else settings.cluster.audit_retention_days
    if days is None or days <= 0:
        raise InvalidRequest(
            f"{config_path} sets no cluster.audit_retention_days: set it, or give "
            "--older-than-days N"
        )
    try:
        results = prune(db, days * 86400)
    finally:
        db.close()
    bad = [r for r in results if r.problem]
    if as_json:
        click.echo(json.dumps({"ok": not bad, "chains": [r.to_dict() for r in results]}))
    else:
        for r in results:
            if r.problem:
                click.echo(f"FAILED: {r.chain}: {r.problem}")
            else:
                click.echo(f"{r.chain}: {r.records} pruned, checkpoint at seq {r.through_seq}")
    if bad:
        raise SystemExit(1)


def _cluster_db(config_path: Path) -> tuple[Any, Any]:
    from agentbox.config.settings import load_settings
    from agentbox.state import open_shared

    settings = load_settings(config_path)
    db = open_shared(settings.gateway.state)
    if settings.cluster is None or db is None:
        raise InvalidRequest(
            f"{config_path} has no cluster section with a PostgreSQL gateway.state: give "
            "a cluster process's config, or verify one log: agentbox audit verify [PATH]"
        )
    return settings, db


def _human(rec: dict[str, Any]) -> str:
    parts = [f"{rec.get('seq', '?'):>7}", str(rec.get("ts", "?")), f"{rec.get('decision')!s:<18}"]
    for key in ("actor", "session", "sandbox", "tool"):
        if rec.get(key) is not None:
            parts.append(f"{key}={rec[key]}")
    if rec.get("exit_code") is not None:
        parts.append(f"exit={rec['exit_code']}")
    if rec.get("duration_ms") is not None:
        parts.append(f"{rec['duration_ms']}ms")
    if rec.get("bytes_out") is not None:
        parts.append(f"{rec['bytes_out']}B")
    if rec.get("error"):
        parts.append(f"error={json.dumps(rec['error'])}")
    return " ".join(parts)


@audit.command("tail")
@_PATH
@click.option(
    "-n", "--lines", "count", default=10, show_default=True, type=click.IntRange(min=0),
    help="How many of the newest records to print first.",
)  # fmt: skip
@click.option("-f", "--follow", "keep_following", is_flag=True, help="Keep printing new records.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print each record as one JSON line, as stored."
)
@reports_errors()
def tail_command(path: Path | None, count: int, keep_following: bool, as_json: bool) -> None:
    """Print the newest records; with -f, keep printing as they are appended.

    Follows across rotations. Stop with Ctrl-C. Records are shown as written; use
    "verify" to check that they were not tampered with.

    \b
    Examples:
      agentbox audit tail
      agentbox audit tail -n 50 --json | jq 'select(.decision == "denied")'
      agentbox audit tail -f /var/log/agentbox/audit.jsonl
    """
    target = path or default_audit_path()
    if not keep_following and not target.exists():
        raise FileNotFound(
            f"no audit log at {target}: pass its PATH, or set AGENTBOX_AUDIT_PATH or "
            "AGENTBOX_HOME as the gateway has them"
        )

    def show(rec: dict[str, Any]) -> None:
        click.echo(canonical_json(rec).decode() if as_json else _human(rec))

    recent = read_records(target, limit=max(count, 1))
    for rec in recent[len(recent) - count :] if count else []:
        show(rec)
    if not keep_following:
        return
    stop = threading.Event()
    try:
        for rec in follow(target, since_seq=recent[-1]["seq"] if recent else 0, stop=stop):
            show(rec)
    except KeyboardInterrupt:
        stop.set()
