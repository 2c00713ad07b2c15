"""``agentbox cluster`` (the CA and certificates, the nodes table) and ``agentbox node``
(run a cluster node). docs/cluster.md has the configuration keys."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import click

from agentbox.cli.errors import reports_errors
from agentbox.cli.params import SuggestingGroup


@click.group("cluster", cls=SuggestingGroup)
def cluster() -> None:
    """Cluster mode: the certificate authority, node and gateway certificates, nodes."""


@cluster.command("init")
@click.argument("directory", type=click.Path(path_type=Path))
@reports_errors()
def init_command(directory: Path) -> None:
    """Make the cluster CA in DIRECTORY (ca.pem; ca.key, mode 0600: keep it off the nodes).

    \b
    Then one certificate per node and per gateway replica:
      agentbox cluster init /etc/agentbox/cluster
      agentbox cluster issue /etc/agentbox/cluster --node node-1 --host 10.0.0.5
      agentbox cluster issue /etc/agentbox/cluster --gateway gw-1
    """
    from agentbox.cluster.pki import init_ca

    click.echo(f"cluster CA: {init_ca(directory)}")


@cluster.command("issue")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--node", "node", help="Issue a node certificate with this name.")
@click.option("--gateway", "gateway", help="Issue a gateway certificate with this name.")
@click.option(
    "--host", "hosts", multiple=True, help="An address gateways dial the node at (repeat)."
)
@reports_errors()
def issue_command(
    directory: Path, node: str | None, gateway: str | None, hosts: tuple[str, ...]
) -> None:
    """Sign a node's or a gateway's certificate with DIRECTORY's CA (NAME.pem, NAME.key).

    A node's certificate serves the node API at the --host addresses only; a gateway's
    can call nodes and cannot serve as one.
    """
    from agentbox.cluster.pki import issue
    from agentbox.errors import InvalidRequest

    if (node is None) == (gateway is None):
        raise InvalidRequest("pass exactly one of --node NAME or --gateway NAME")
    name = node or gateway
    assert name is not None
    cert, key = issue(directory, name, "node" if node else "gateway", list(hosts))
    click.echo(f"{cert}\n{key}")


@cluster.command("nodes")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gateway YAML.")
@click.option("--json", "as_json", is_flag=True, help="Print the nodes as JSON.")
@reports_errors()
def nodes_command(config_path: Path | None, as_json: bool) -> None:
    """The cluster's nodes: state, address, sandboxes, free memory, last heartbeat."""
    from agentbox.cluster.registry import Registry
    from agentbox.config.settings import load_settings
    from agentbox.errors import InvalidConfig
    from agentbox.state import open_shared

    db = open_shared(load_settings(config_path).gateway.state)
    if db is None:
        raise InvalidConfig("gateway.state is sqlite: no cluster (see docs/cluster.md)")
    nodes = Registry(db).nodes()
    if as_json:
        click.echo(json.dumps([n.to_dict() for n in nodes], indent=2))
        return
    for n in nodes:
        free = int(n.capacity.get("memory_free_bytes", 0)) >> 20
        click.echo(
            f"{n.id:<16} {n.state:<12} {n.address:<28} "
            f"{n.capacity.get('sandboxes', 0):>4} sandboxes {free:>7} MiB free "
            f"{n.heartbeat_age:6.1f}s ago"
        )


@click.command("node")
@click.option("--config", "config_path", type=click.Path(path_type=Path), help="Gateway YAML.")
@reports_errors()
def node(config_path: Path | None) -> None:
    """Run a cluster node: sandboxes on this host, the node API (mutual TLS), heartbeats.

    \b
    The config needs gateway.state (PostgreSQL) and cluster.node (see docs/cluster.md);
    the operator token is the cluster's ($AGENTBOX_OPERATOR_TOKEN).
    Example:
      agentbox node --config /etc/agentbox/node.yaml
    """
    import uvicorn

    from agentbox.cli.gateway_commands import _operator_token
    from agentbox.cluster.node_api import create_node_app, uvicorn_tls
    from agentbox.config.host import agentbox_home
    from agentbox.config.settings import load_settings

    settings = load_settings(config_path)
    home = agentbox_home()
    app, heartbeat = create_node_app(
        settings, operator_token=_operator_token(settings, home), home=home
    )
    assert settings.cluster is not None and settings.cluster.node is not None
    listen = settings.cluster.node.listen
    host, _, port = listen.rpartition(":")
    click.echo(f"agentbox: node {settings.cluster.node.id} on https://{listen}", err=True)
    gc.collect()
    gc.freeze()  # as `agentbox serve` (see there)
    chain = app.state.audit_chain
    chain.start()  # before serving: a replaced home's chain is refused here
    heartbeat.start()
    try:
        uvicorn.run(
            app,
            host=host.strip("[]"),
            port=int(port),
            log_level="warning",
            access_log=False,  # as `agentbox serve` (see there)
            proxy_headers=False,
            **uvicorn_tls(settings),
        )
    finally:
        heartbeat.stop()
        chain.stop()  # the audit log is closed by now: ship its last records, mark closed
