"""Placement (cluster/placement.py) and the cluster CA's certificates (cluster/pki.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from agentbox.cluster import pki
from agentbox.cluster.placement import rank, warm_counts
from agentbox.cluster.registry import Node
from agentbox.config.settings import parse_settings
from agentbox.errors import CapacityExceeded, InvalidRequest


def node(name: str, sandboxes: int = 0, free: int = 8 << 30, **kw: object) -> Node:
    capacity = {"sandboxes": sandboxes, "memory_free_bytes": free, "templates": ["default"]}
    capacity.update(kw.pop("capacity", {}))  # type: ignore[call-overload]
    return Node(
        name,
        f"https://{name}:8849",
        dict(kw.pop("labels", {})),  # type: ignore[call-overload]
        capacity,
        str(kw.pop("state", "ready")),
        float(kw.pop("age", 0.5)),  # type: ignore[arg-type]
    )


def ids(nodes: list[Node]) -> list[str]:
    return [n.id for n in nodes]


def ranked(nodes: list[Node], **kw: object) -> list[str]:
    args: dict[str, object] = {
        "template": "default", "isolation": None, "labels": {}, "lost_after": 10.0, "placed": {}
    }  # fmt: skip
    args.update(kw)
    return ids(rank(nodes, **args))  # type: ignore[arg-type]


def test_emptiest_first_counting_what_this_replica_placed_since() -> None:
    nodes = [node("a", sandboxes=3), node("b", sandboxes=1), node("c", sandboxes=2)]
    assert ranked(nodes) == ["b", "c", "a"]
    assert ranked(nodes, placed={"b": 2}) == ["c", "a", "b"]  # ties: most free memory
    assert ranked([node("x", free=1), node("y", free=2)]) == ["y", "x"]


def test_template_holders_first_and_only_live_nodes() -> None:
    nodes = [
        node("cold", capacity={"templates": []}),
        node("warm", sandboxes=5),
        node("silent", age=30),
        node("gone", state="unreachable"),
    ]
    assert ranked(nodes) == ["warm", "cold"]


def test_a_node_with_a_warm_sandbox_first_less_what_this_replica_sent_to_claim() -> None:
    pool = {"pools": [{"template": "default", "size": 2, "ready": 2, "ids": ["sb-1", "sb-2"]}]}
    nodes = [node("busy", sandboxes=4, capacity=pool), node("idle")]
    warm = warm_counts(nodes, "default", {"env": {"A": "1"}}, {})
    assert warm == {"busy": 2}
    assert ranked(nodes, warm=warm) == ["busy", "idle"]  # a claim beats an empty node
    assert warm_counts(nodes, "default", {}, {"busy": 2}) == {}  # both already sent there
    assert warm_counts(nodes, "other", {}, {}) == {}  # another template's pool
    # A request naming a launch-time setting may not match the pool's key: not steered.
    assert warm_counts(nodes, "default", {"memory": "1g"}, {}) == {}
    assert ranked(nodes, warm={}) == ["idle", "busy"]


def test_isolation_tier_and_labels_filter() -> None:
    nodes = [node("plain"), node("vm", labels={"isolation": "namespaces, gvisor", "zone": "b"})]
    assert ranked(nodes, isolation="gvisor") == ["vm"]
    assert ranked(nodes, labels={"zone": "b"}) == ["vm"]
    with pytest.raises(CapacityExceeded, match="isolation gvisor, zone=a"):
        ranked(nodes, isolation="gvisor", labels={"zone": "a"})


def test_certificates_keep_roles_apart(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    with pytest.raises(InvalidRequest, match="already holds"):
        pki.init_ca(tmp_path)  # replacing the CA would orphan every certificate
    with pytest.raises(InvalidRequest, match="--host"):
        pki.issue(tmp_path, "n1", "node", [])
    node_cert, node_key = pki.issue(tmp_path, "n1", "node", ["10.0.0.5", "n1.internal"])
    gw_cert, _ = pki.issue(tmp_path, "gw", "gateway", [])
    assert oct(node_key.stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / pki.CA_KEY).stat().st_mode & 0o777) == "0o600"

    def usage(path: Path) -> list[x509.ObjectIdentifier]:
        cert = x509.load_pem_x509_certificate(path.read_bytes())
        return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)

    assert usage(node_cert) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert usage(gw_cert) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    sans = x509.load_pem_x509_certificate(node_cert.read_bytes()).extensions
    names = sans.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(v) for v in names.get_values_for_type(x509.IPAddress)] == ["10.0.0.5"]
    assert names.get_values_for_type(x509.DNSName) == ["n1.internal"]


def test_cluster_settings_need_shared_state() -> None:
    tls = "ca_file: /c/ca.pem, cert_file: /c/g.pem, key_file: /c/g.key"
    shared = "gateway: {state: 'postgresql://a@db:5432/a'}\n"
    with pytest.raises(InvalidRequest, match="postgresql"):
        parse_settings(f"cluster: {{{tls}}}\n")
    settings = parse_settings(shared + f"cluster: {{{tls}}}\n")
    assert settings.cluster is not None and settings.cluster.node is None
    node = "node: {id: n1, advertise: 'http://n1:8849'}"  # the node API is TLS only
    with pytest.raises(InvalidRequest, match=r"cluster\.node\.advertise"):
        parse_settings(shared + f"cluster: {{{tls}, {node}}}\n")


def test_cluster_cli_makes_the_ca_and_certificates(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from agentbox.cli.main import cli

    runner = CliRunner()
    made = runner.invoke(cli, ["cluster", "init", str(tmp_path / "ca")])
    assert made.exit_code == 0 and "ca.pem" in made.output, made.output
    node = runner.invoke(
        cli, ["cluster", "issue", str(tmp_path / "ca"), "--node", "n1", "--host", "10.0.0.5"]
    )
    assert node.exit_code == 0 and (tmp_path / "ca" / "n1.pem").exists(), node.output
    both = runner.invoke(cli, ["cluster", "issue", str(tmp_path / "ca"), "--node", "a",
                               "--gateway", "b"])  # fmt: skip
    assert both.exit_code == 1 and "exactly one" in both.output
    again = runner.invoke(cli, ["cluster", "init", str(tmp_path / "ca")])
    assert again.exit_code == 1 and "error[invalid_request]" in again.output
