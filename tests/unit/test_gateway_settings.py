"""Gateway configuration: the example contract loads; mistakes name file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbox.config.settings import GatewaySettings, load_settings, parse_settings
from agentbox.errors import InvalidConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.example.yaml"
CONTRACT = Path(__file__).resolve().parents[3] / "shared" / "gateway.example.yaml"


def example_text() -> str:
    assert EXAMPLE.exists(), f"the configuration contract is missing at {EXAMPLE}"
    return EXAMPLE.read_text()


def test_the_example_contract_loads_completely() -> None:
    s = load_settings(EXAMPLE)
    assert s.gateway.listen == "127.0.0.1:8848"
    assert s.sandbox.limits.memory == 2 * 1024**3 and s.sandbox.limits.idle_timeout == 900
    run = s.tool("terminal.run")
    assert run.allow and "git" in run.allow and run.approval_timeout == 300
    assert s.tool("fs.write").protected[0] == ".git/hooks/**"
    assert s.tool("browser.open").viewport == "1280x800"
    assert [p.kind for p in s.providers] == ["anthropic", "openai", "openai"]
    assert s.budgets[0].alert_at == [0.5, 0.8, 1.0]


def test_the_shipped_example_is_the_contract() -> None:
    # The contract lives beside the repository in development and CI; users get the copy.
    # The copy configures exactly what the contract does; it may spell out defaults the
    # contract leaves implicit and say more in comments (how patterns match).
    if CONTRACT.exists():
        assert load_settings(EXAMPLE) == load_settings(CONTRACT)
    assert EXAMPLE.exists()


def test_no_file_means_embedded_defaults() -> None:
    assert load_settings(None) == GatewaySettings()
    assert parse_settings("") == GatewaySettings()


def test_unknown_key_names_file_line_and_key() -> None:
    text = example_text().replace("    pids: 512\n", "    pids: 512\n    pidz: 3\n")
    with pytest.raises(InvalidConfig) as err:
        parse_settings(text, "gw.yaml")
    line = text.splitlines().index("    pidz: 3") + 1
    assert err.value.message.startswith(f"gw.yaml:{line}: sandbox.limits.pidz: unknown key")


def test_bad_value_names_what_was_expected() -> None:
    text = example_text().replace("fsync: always", "fsync: sometimes")
    with pytest.raises(InvalidConfig) as err:
        parse_settings(text, "gw.yaml")
    assert "audit.fsync" in err.value.message and "'always' or 'batch'" in err.value.message
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "fsync: sometimes" in t)
    assert err.value.details["line"] == line


def test_bad_value_inside_a_tool_entry() -> None:
    text = example_text().replace("viewport: 1280x800", "viewport: huge")
    with pytest.raises(InvalidConfig) as err:
        parse_settings(text, "gw.yaml")
    assert "tools.1.viewport" in err.value.message and "WIDTHxHEIGHT" in err.value.message


def test_unknown_tool_and_bad_size() -> None:
    with pytest.raises(InvalidConfig, match=r"tools\.0"):
        parse_settings("tools:\n  - name: terminal.explode\n")
    with pytest.raises(InvalidConfig, match="memory"):
        parse_settings("sandbox:\n  limits:\n    memory: lots\n")


def test_duplicate_keys_and_broken_yaml() -> None:
    with pytest.raises(InvalidConfig, match=r"x.yaml:3: duplicate key 'gateway.listen'"):
        parse_settings("gateway:\n  listen: 127.0.0.1:1\n  listen: 127.0.0.1:2\n", "x.yaml")
    with pytest.raises(InvalidConfig, match="not valid YAML"):
        parse_settings("gateway: [unclosed\n")
    with pytest.raises(InvalidConfig, match="top level must be a mapping"):
        parse_settings("- a\n- b\n")


def test_secrets_cannot_be_configured_inline() -> None:
    with pytest.raises(InvalidConfig, match="operator_token: unknown key"):
        parse_settings("gateway:\n  auth:\n    operator_token: hunter2\n")


def test_extra_allowed_hosts_for_a_public_name() -> None:
    from agentbox.gateway.app import allowed_hosts

    s = parse_settings("gateway:\n  allowed_hosts: [agentbox.example.com:8848]\n")
    hosts = allowed_hosts(s.gateway.listen, s.gateway.allowed_hosts)
    assert "agentbox.example.com:8848" in hosts and "127.0.0.1:8848" in hosts


def test_unknown_audit_fields_are_refused_with_the_choices() -> None:
    from agentbox.config.settings import AuditSettings

    with pytest.raises(ValueError, match=r"unknown audit fields \['actr'\]; choose from"):
        AuditSettings(fields=["ts", "actr"])


def test_the_extensions_example_parses() -> None:
    extensions = EXAMPLE.with_name("gateway.lifecycle.yaml")
    s = load_settings(extensions)
    assert s.sandbox.warm_pool == {"default": 4}
    assert s.sandbox.admission.max_sandboxes == 200
    assert s.lifecycle.webhooks[0].secret_env == "AGENTBOX_WEBHOOK_SECRET"
    assert s.snapshots.max_age == 30 * 86400
