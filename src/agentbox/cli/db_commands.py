"""``agentbox db``: the state database's schema (PostgreSQL; SQLite needs nothing)."""

from __future__ import annotations

from pathlib import Path

import click

from agentbox.cli.errors import reports_errors
from agentbox.cli.output import print_json
from agentbox.cli.params import SuggestingGroup
from agentbox.errors import InvalidConfig


@click.group("db", cls=SuggestingGroup)
def db() -> None:
    """The shared state database: schema migrations for PostgreSQL."""


@db.command("migrate")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gateway YAML.")
@click.option("--url", help="postgresql://USER@HOST:PORT/DB (default: the config's gateway.state).")
@click.option(
    "--roles",
    is_flag=True,
    help="Also create the agentbox_gateway and agentbox_node roles (needs CREATEROLE) and "
    "apply their grants and row-level security (docs/cluster.md, Database roles).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@reports_errors()
def migrate_command(config_path: Path | None, url: str | None, roles: bool, as_json: bool) -> None:
    """Bring the PostgreSQL schema to this release (idempotent; safe to run again).

    Run it once before starting the gateways of a new release, from any one host: a
    gateway never migrates by itself, and refuses a schema older or newer than its own.
    The password comes from $PGPASSWORD or ~/.pgpass, never from the URL. With SQLite
    (gateway.state: sqlite, the default) there is nothing to do: each file keeps its
    own schema.

    \b
    Examples:
      agentbox db migrate --config /etc/agentbox/gateway.yaml
      agentbox db migrate --url postgresql://agentbox@db.internal:5432/agentbox
      agentbox db migrate --config /etc/agentbox/gateway.yaml --roles
    """
    from agentbox.config.settings import load_settings
    from agentbox.state.db import state_url_error
    from agentbox.state.migrations import LATEST
    from agentbox.state.postgres import migrate

    if url is None:
        url = load_settings(config_path).gateway.state
    elif problem := state_url_error(url):
        raise InvalidConfig(f"--url: {problem}")
    result: dict[str, object]
    if url == "sqlite":
        result = {"state": "sqlite", "applied": [], "version": None}
        message = "gateway.state is sqlite: nothing to migrate (each file keeps its schema)"
    else:
        before, applied = migrate(url)
        if roles:
            from agentbox.state.roles import apply_roles

            apply_roles(url)
        result = {"state": "postgresql", "before": before, "applied": applied, "version": LATEST}
        if roles:
            result["roles"] = True
        message = (
            f"schema version {LATEST}: applied {', '.join(map(str, applied))} (was {before})"
            if applied
            else f"schema version {LATEST}: up to date"
        ) + ("; roles agentbox_gateway and agentbox_node granted" if roles else "")
    if as_json:
        print_json(result)
    else:
        click.echo(message)
