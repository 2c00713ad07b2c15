"""CLI for the gateway: ``serve``, ``mcp`` (stdio), ``token`` and ``approvals``.

``token`` and ``approvals`` talk to a running gateway: ``AGENTBOX_URL`` with the operator
token in ``AGENTBOX_TOKEN``, else the home's gateway when one serves its socket (the token
read beside it), else http://127.0.0.1:8848.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import math
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from agentbox import endpoint
from agentbox.cli.errors import reports_errors
from agentbox.cli.output import print_listing
from agentbox.cli.params import DURATION, SuggestingGroup
from agentbox.client.remote import GatewayClient, SocketGatewayClient, connect
from agentbox.config.host import agentbox_home
from agentbox.config.settings import GatewaySection, GatewaySettings, load_settings
from agentbox.errors import Conflict, InvalidConfig, InvalidRequest
from agentbox.gateway.auth import (
    OPERATOR_TOKEN_FILE,
    injected_operator_token,
    load_operator_token,
)

DEFAULT_URL = "http://127.0.0.1:8848"


def _client() -> GatewayClient | SocketGatewayClient:
    url = endpoint.gateway_url() or DEFAULT_URL
    return connect(url, os.environ.get("AGENTBOX_TOKEN"))


def _operator_token(settings: GatewaySettings, home: Path) -> str:
    """The injected operator token; on a first local run, one generated into a 0600 file."""
    injected = injected_operator_token(settings.gateway.auth)
    if injected is not None:
        return injected
    path = home / OPERATOR_TOKEN_FILE
    if not path.exists():
        home.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        click.echo(f"agentbox: generated an operator token in {path} (mode 0600)", err=True)
    click.echo(
        f"agentbox: operator token from {path}; clients: export AGENTBOX_TOKEN=$(cat {path})",
        err=True,
    )
    return load_operator_token(None, path)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gateway YAML.")
@click.option("--listen", help="HOST:PORT to bind (default 127.0.0.1:8848).")
@click.option(
    "--allow-public", is_flag=True, help="Allow a non-loopback bind (requires gateway.tls)."
)
@click.option(
    "--no-socket",
    is_flag=True,
    help="Do not listen on $AGENTBOX_HOME/gateway.sock (TCP only).",
)
@reports_errors()
def serve(
    config_path: Path | None, listen: str | None, allow_public: bool, no_socket: bool
) -> None:
    """Run the gateway: REST API, MCP at /mcp, health checks.

    \b
    Without --config it runs on embedded defaults. The operator token comes from
    $AGENTBOX_OPERATOR_TOKEN (or gateway.auth.operator_token_file); on a first local run
    without either, one is generated into $AGENTBOX_HOME/operator.token.
    \b
    It also listens on $AGENTBOX_HOME/gateway.sock (mode 0600): SDK scripts and CLI calls
    on this host with that home and no AGENTBOX_URL find it there and go through it (the
    token read from $AGENTBOX_TOKEN or the home's operator.token; AGENTBOX_URL=inprocess:
    the runtime in-process instead). One gateway per home owns it: a second one on the
    same home serves TCP only and says so (--no-socket: TCP only).
    \b
    Examples:
      agentbox serve
      agentbox serve --config /etc/agentbox/gateway.yaml --listen 127.0.0.1:9000
    """
    import uvicorn

    from agentbox.gateway import home_socket
    from agentbox.gateway.app import create_app

    settings = load_settings(config_path)
    if listen:
        try:
            section = GatewaySection.model_validate(
                {**settings.gateway.model_dump(), "listen": listen}
            )
        except ValueError as e:
            raise InvalidRequest(f"--listen {listen!r}: expected HOST:PORT") from e
        settings = settings.model_copy(update={"gateway": section})
    host, _, port = settings.gateway.listen.rpartition(":")
    tls = settings.gateway.tls
    if not _is_loopback(host) and (not allow_public or tls is None):
        raise InvalidConfig(
            f"refusing to listen on {host}: a non-loopback bind needs both "
            "gateway.tls (cert_file, key_file) and --allow-public"
        )
    home = agentbox_home()
    token = _operator_token(settings, home)
    # A replica has no sandbox of its own (and replicas may share a home): TCP only. A
    # second gateway on this home (a test's, a staging one) serves TCP and leaves the
    # first one's socket alone, as it did before there was a socket.
    sock = None
    if not no_socket and settings.cluster is None:
        try:
            sock = home_socket.bind(home)
        except Conflict as e:
            click.echo(f"agentbox: {e.message}; this one listens on TCP only", err=True)
    try:  # the socket file goes whatever stops the start (a schema to migrate, a port in use)
        app: Any
        if settings.cluster is not None:  # a replica: no sandbox here (docs/cluster.md)
            from agentbox.cluster.gateway_app import create_cluster_app

            app = create_cluster_app(settings, operator_token=token, home=home)
        else:
            app = create_app(settings, operator_token=token, home=home)
        scheme = "https" if tls else "http"
        served = f"{scheme}://{settings.gateway.listen}"
        click.echo(f"agentbox: gateway on {served} (MCP at /mcp)", err=True)
        if sock is not None:
            click.echo(
                f"agentbox: and on {sock.path} (0600): SDK scripts and CLI calls on this "
                f"host with AGENTBOX_HOME={home} use it (with another home: "
                f"export AGENTBOX_URL={sock.url})",
                err=True,
            )
        # What is alive now lives as long as the process (modules, the app, its routes and
        # schemas: ~140k objects). Frozen out of the collector's view, the occasional full
        # collection no longer walks them all: 100-500 ms each on a loaded 2-core host, one
        # stalled event loop for every call in flight; after the freeze, under a millisecond.
        gc.collect()
        gc.freeze()
        config = uvicorn.Config(
            app,
            host=host.strip("[]"),
            port=int(port),
            log_level="warning",
            # Its INFO lines never showed at "warning", yet each request built one (the client
            # address, the quoted path): the audit trail is the record of every call.
            access_log=False,
            proxy_headers=False,  # nothing sits in front; X-Forwarded-For must not be trusted
            ssl_certfile=str(tls.cert_file) if tls else None,
            ssl_keyfile=str(tls.key_file) if tls else None,
        )
        home_socket.serve(config, sock)
    finally:
        if sock is not None:
            sock.close()


@click.command("mcp")
@click.option("--sandbox", "sandbox_id", help="Serve this sandbox (default: create one).")
@click.option("--template", default="default", show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@reports_errors()
def mcp_stdio(sandbox_id: str | None, template: str, config_path: Path | None) -> None:
    """Serve MCP over stdio, for clients that spawn their servers (runs as root).

    \b
    Without --sandbox a fresh sandbox is created and destroyed when the client leaves.
    When a gateway serves this home, it relays to it (the gateway's policy and audit log
    apply) with the operator token: $AGENTBOX_OPERATOR_TOKEN, the config's token file, or
    $AGENTBOX_HOME/operator.token.
    Example (a client's server entry):  {"command": "/usr/local/bin/agentbox", "args": ["mcp"]}
    """
    from agentbox.gateway.stdio import serve_stdio

    serve_stdio(load_settings(config_path), sandbox_id, template)


@click.group(cls=SuggestingGroup)
def token() -> None:
    """Issue, list and revoke session tokens (talks to the gateway)."""


@token.command("issue")
@click.option("--sandbox", "sandbox_id", required=True, help="The sandbox the token is bound to.")
@click.option(
    "--ttl", type=DURATION, help="Lifetime: 8h, 30m, 3600 (seconds); default from the config."
)
@click.option("--tools", help="Comma-separated tools it may use (default: all).")
@reports_errors()
def token_issue(sandbox_id: str, ttl: float | None, tools: str | None) -> None:
    """Print a new session token (and nothing else) on stdout.

    \b
    Example:
      export AGENTBOX_TOKEN=$(cat $AGENTBOX_HOME/operator.token)
      agentbox token issue --sandbox sb-123 --ttl 8h --tools terminal_run,fs_read
    """
    body: dict[str, Any] = {"sandbox": sandbox_id, "ttl": None if ttl is None else math.ceil(ttl)}
    if tools:
        body["tools"] = [t.strip() for t in tools.split(",") if t.strip()]
    click.echo(_client().request("POST", "/v1/tokens", json=body)["token"])


@token.command("ls")
@click.option("--sandbox", "sandbox_id")
@click.option("--json", "as_json", is_flag=True)
@reports_errors()
def token_ls(sandbox_id: str | None, as_json: bool) -> None:
    """List session tokens (never their values)."""
    tokens = _client().request(
        "GET", "/v1/tokens", params={"sandbox": sandbox_id} if sandbox_id else None
    )
    if as_json:
        click.echo(json.dumps(tokens, indent=2))
        return
    for t in tokens:
        state = "revoked" if t["revoked"] else "active"
        click.echo(f"{t['id']:<18} {t['sandbox']:<18} {state:<8} {','.join(t['tools'] or ['*'])}")


@token.command("revoke")
@click.argument("token_id")
@reports_errors()
def token_revoke(token_id: str) -> None:
    """Revoke a session token by its id."""
    _client().request("DELETE", f"/v1/tokens/{token_id}")


@click.group(cls=SuggestingGroup)
def approvals() -> None:
    """Decide commands and egress names waiting for approval (operator token)."""


@approvals.command("ls")
@click.option("--status", type=click.Choice(["pending", "approved", "denied", "expired"]))
@click.option("--json", "as_json", is_flag=True)
@reports_errors()
def approvals_ls(status: str | None, as_json: bool) -> None:
    """List approvals (pending first is what you usually want: --status pending)."""
    _listing(
        "/v1/approvals", {"status": status} if status else None, as_json,
        lambda a: f"{a['id']:<16} {a['status']:<9} {a['sandbox']:<16} {a['summary']}",
    )  # fmt: skip


def _listing(
    path: str, params: dict[str, str] | None, as_json: bool, line: Callable[[Any], str]
) -> None:
    """GET a list from the gateway: as JSON, or one line per item."""
    print_listing(_client().request("GET", path, params=params), as_json, line)


def _decide(approval_id: str, verdict: str, scope: str = "once") -> None:
    result = _client().request(
        "POST", f"/v1/approvals/{approval_id}/{verdict}", params={"scope": scope}
    )
    scoped = f" ({result['scope']})" if result.get("scope") not in (None, "once") else ""
    click.echo(f"{result['id']} {result['status']}{scoped}")


@approvals.command("approve")
@click.argument("approval_id")
@click.option(
    "--scope",
    type=click.Choice(["once", "sandbox", "always"]),
    default="once",
    show_default=True,
    help="Egress approvals: the connections held now, this name for the sandbox's life, "
    "or the project's allowlist (kept across restarts).",
)
@reports_errors()
def approvals_approve(approval_id: str, scope: str) -> None:
    """Let the waiting command run, or the held connections through."""
    _decide(approval_id, "approve", scope)


@approvals.command("deny")
@click.argument("approval_id")
@reports_errors()
def approvals_deny(approval_id: str) -> None:
    """Refuse the waiting command (the agent gets an error saying so)."""
    _decide(approval_id, "deny")


@approvals.command("allowlist")
@click.option("--project", help="One project's names only.")
@click.option("--json", "as_json", is_flag=True)
@reports_errors()
def approvals_allowlist(project: str | None, as_json: bool) -> None:
    """Names approved with --scope always (egress mode ask), per project."""
    _listing(
        "/v1/egress/allowlist", {"project": project} if project else None, as_json,
        lambda g: f"{g['owner']:<16} {g['host']:<40} {g['decided_by']} ({g['approval']})",
    )  # fmt: skip


@approvals.command("forget")
@click.argument("host")
@click.option("--project", default="default", show_default=True)
@reports_errors()
def approvals_forget(host: str, project: str) -> None:
    """Take HOST off a project's egress allowlist (its sandboxes will ask again)."""
    _client().request("DELETE", f"/v1/egress/allowlist/{project}/{host}")
    click.echo(f"{host} removed from project {project}'s allowlist")
