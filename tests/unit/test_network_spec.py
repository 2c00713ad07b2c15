"""The one network spec: every field normalised by the checks the egress proxy applies, the
same refusals from NetworkSpec (create, config, REST) and EgressPolicy (the daemon), and
errors that name the field and the value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.config.settings import parse_settings
from agentbox.config.specs import NetworkSpec
from agentbox.egressd.daemon import PolicyBook
from agentbox.errors import InvalidConfig, InvalidRequest
from agentbox.gateway.rest import CreateSandbox
from agentbox.network.decision import EgressPolicy
from agentbox.network.modes import EGRESS_MODES
from agentbox.runtime.spec_input import spec_from
from agentbox.runtime.store import SandboxRecord
from network_variants import BAD_CREDENTIALS, INVALID


@pytest.mark.parametrize(("network", "field", "value"), INVALID)
def test_invalid_specs_are_refused_naming_field_and_value(
    network: dict[str, Any], field: str, value: Any
) -> None:
    with pytest.raises(InvalidRequest) as parsed:
        NetworkSpec.parse(network)
    assert parsed.value.details["field"] == f"network.{field}"
    assert parsed.value.details["value"] == value
    assert f"network.{field}" in parsed.value.message
    with pytest.raises(InvalidRequest) as created:  # what Runtime.create runs first
        spec_from({"network": network})
    assert created.value.details["field"] == f"network.{field}"
    assert created.value.message.startswith("invalid sandbox settings: network.")
    # The egress daemon's policy runs the same checks, so it refuses the same specs.
    with pytest.raises(InvalidRequest):
        EgressPolicy(**{"sandbox_id": "s", "mode": "allowlist", **network})


@pytest.mark.parametrize("credential", BAD_CREDENTIALS)
def test_invalid_credentials_are_refused(credential: dict[str, str]) -> None:
    with pytest.raises(InvalidRequest) as e:
        NetworkSpec.parse({"credentials": [credential]})
    assert e.value.details["field"].startswith("network.credentials.0")


def test_valid_specs_are_normalised_as_the_proxy_compares() -> None:
    spec = NetworkSpec.parse(
        {
            "mode": "allowlist",
            "allow": ["*.Bücher.TEST.", "PyPI.org"],
            "deny": ["ADS.example.com."],
            "hosts": {"A.Test.": "::1", "b.test": "::ffff:10.0.0.1", "c.test": "10.1.2.3"},
            "ports": [443, 8443],
        }
    )
    assert spec.allow == ("*.xn--bcher-kva.test", "pypi.org")
    assert spec.deny == ("ads.example.com",)
    # Internal addresses are accepted here: the proxy refuses them on every connection.
    assert spec.hosts == {"a.test": "::1", "b.test": "::ffff:a00:1", "c.test": "10.1.2.3"}
    assert spec.ports == (443, 8443)
    assert NetworkSpec.parse(spec) is spec
    assert NetworkSpec.parse(spec.model_dump(mode="json")) == spec  # idempotent
    assert NetworkSpec.parse("none") == NetworkSpec(mode="none")
    policy = EgressPolicy.from_spec("sb", spec)
    assert (policy.allow, policy.deny, dict(policy.hosts), policy.ports) == (
        spec.allow, spec.deny, spec.hosts, spec.ports,
    )  # fmt: skip
    with pytest.raises(Exception, match="frozen"):
        spec.mode = "open"  # type: ignore[misc]
    with pytest.raises(TypeError):
        spec.hosts["d.test"] = "203.0.113.1"  # type: ignore[index]


def test_the_rest_body_schema_describes_every_field() -> None:
    schema = CreateSandbox.model_json_schema()
    network = schema["$defs"]["NetworkSpec"]
    assert set(network["properties"]) == {
        "mode", "allow", "ports", "hosts", "deny", "credentials", "ask_timeout"
    }  # fmt: skip
    for name, field in network["properties"].items():
        assert field.get("description"), f"network.{name} has no description"
    assert network["properties"]["mode"]["enum"] == list(EGRESS_MODES)
    assert network["additionalProperties"] is False
    alternatives = schema["properties"]["network"]["anyOf"]
    assert {"$ref": "#/$defs/NetworkSpec"} in alternatives
    assert any(a.get("enum") == list(EGRESS_MODES) for a in alternatives)


def test_the_gateway_default_is_the_same_spec() -> None:
    settings = parse_settings(
        "sandbox:\n  network:\n    allow: [PyPI.org.]\n    deny: ['*.Ads.test']\n", "gw.yaml"
    )
    assert isinstance(settings.sandbox.network, NetworkSpec)
    assert settings.sandbox.network.allow == ("pypi.org",)
    assert settings.sandbox.network.deny == ("*.ads.test",)
    for bad, key in (
        ("allow: [ok.test, 'bad..name']", "allow.1"),
        ("hosts: {a.test: not-an-ip}", "hosts.a.test"),
        ("ports: [0]", "ports.0"),
    ):
        with pytest.raises(InvalidConfig) as e:
            parse_settings(f"sandbox:\n  network:\n    {bad}\n", "gw.yaml")
        assert e.value.details["key"] == f"sandbox.network.{key}"
        assert e.value.message.startswith(f"gw.yaml:3: sandbox.network.{key}: ")


def test_the_sdk_refuses_before_anything_is_made(tmp_path: Path) -> None:
    home = tmp_path / "home"  # never created: the spec is refused first
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(network={"allow": ["bad..name"]}, home=home)
    assert e.value.details["field"] == "network.allow.0"
    with pytest.raises(InvalidRequest):
        Sandbox.create(network="sometimes", home=home)
    assert not home.exists()


def _record(sandbox_id: str, spec: dict[str, Any]) -> SandboxRecord:
    return SandboxRecord(
        sandbox_id, 0, "running", "t", "d", None, None, 0.0, None, json.dumps(spec)
    )


def test_the_egress_daemon_turns_an_unparsable_record_into_no_egress(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A record written before the checks (or edited by hand) is logged once and gets mode
    none, instead of failing on every connection."""
    bad = {"network": {"mode": "open", "allow": ["bad..name"], "hosts": {"a.test": "x"}}}
    with caplog.at_level("WARNING", "agentbox.egress"):
        policy = PolicyBook._build(_record("sb-old", bad))
    assert policy.mode == "none" and policy.sandbox_id == "sb-old"
    assert "sb-old" in caplog.text and "bad..name" in caplog.text
    good = PolicyBook._build(_record("sb", {"network": {"mode": "open", "deny": ["X.test"]}}))
    assert (good.mode, good.deny) == ("open", ("x.test",))
