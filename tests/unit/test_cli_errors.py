"""The CLI's one error style: every command reports an agentbox error as
``error[code]: message`` on stderr and a non-zero exit, through ``cli.errors``."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from agentbox.cli.audit_commands import audit
from agentbox.cli.errors import error_line, reports_errors
from agentbox.cli.main import cli
from agentbox.errors import InvalidRequest, SecretsFound


def _leaves(group: click.Group, ctx: click.Context, prefix: str) -> list[tuple[str, click.Command]]:
    found = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        if isinstance(command, click.Group):
            found += _leaves(command, click.Context(command, parent=ctx), f"{prefix}{name} ")
        else:
            found.append((prefix + name, command))
    return found


def test_every_command_reports_errors_in_the_one_style() -> None:
    leaves = _leaves(cli, click.Context(cli), "")
    assert len(leaves) > 30  # the whole tree was loaded
    plain = [name for name, c in leaves if not hasattr(c.callback, "reports_errors")]
    assert not plain, f"commands that print errors their own way (or not at all): {plain}"


def test_a_missing_audit_log_is_a_typed_error(tmp_path: Path) -> None:
    """Was ``error: no audit log at …`` (the second style)."""
    result = CliRunner(mix_stderr=False).invoke(audit, ["tail", str(tmp_path / "none.jsonl")])
    assert result.exit_code == 1
    assert result.stderr.startswith("error[file_not_found]: no audit log at "), result.stderr


def test_the_exit_status_and_the_line(capsys: pytest.CaptureFixture[str]) -> None:
    @reports_errors(exit_code=3)
    def refused() -> None:
        raise SecretsFound("found 1 secret: /workspace/k:1: AWS Access Key")

    with pytest.raises(SystemExit) as exited:
        refused()
    assert exited.value.code == 3
    err = capsys.readouterr().err
    assert err == "error[secrets_found]: found 1 secret: /workspace/k:1: AWS Access Key\n"
    assert error_line(InvalidRequest("bad")) == "error[invalid_request]: bad"
