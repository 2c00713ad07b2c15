"""The CLI's short cuts at start-up: command groups that live in other modules load only
when one runs (``agentbox --help`` lists them with short help kept in ``cli.main``: it must
say what each command's own help says), and the plain ``sandbox exec ID -- ARGV`` runs
without click (tests/integration/test_cli.py checks it behaves the same)."""

from __future__ import annotations

import importlib

import click
from click.testing import CliRunner

from agentbox.cli.execute import plain_form
from agentbox.cli.main import _LAZY, cli


def test_static_short_help_is_each_commands_own() -> None:
    for name, (module, attribute, short) in _LAZY.items():
        command = getattr(importlib.import_module(module), attribute)
        assert command.name == name
        for limit in (40, 60, 1000):
            assert click.utils.make_default_short_help(short, limit) == (
                command.get_short_help_str(limit)
            ), name


def test_help_lists_every_command_and_each_lazy_one_runs() -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["--help"])
    assert listed.exit_code == 0, listed.output
    commands = listed.output.split("Commands:")[1]
    names = [line.split()[0] for line in commands.strip().splitlines()]
    assert names == sorted({*_LAZY, "doctor", "files", "recover", "sandbox"})
    for name in _LAZY:
        shown = runner.invoke(cli, [name, "--help"])
        assert shown.exit_code == 0 and f"Usage: cli {name}" in shown.output, shown.output
    suggested = runner.invoke(cli, ["snapshots"])
    assert "Did you mean 'snapshot'?" in suggested.output  # lazy names are suggested too


def test_only_the_plain_exec_form_skips_click() -> None:
    assert plain_form(["sandbox", "exec", "sb-1", "--", "ls", "-la"]) == ("sb-1", ["ls", "-la"])
    assert plain_form(["sandbox", "exec", "sb-1", "--", "--help"]) == ("sb-1", ["--help"])
    for args in (
        ["sandbox", "exec", "sb-1", "--timeout", "5", "--", "true"],  # an option: click
        ["sandbox", "exec", "--cwd", "/", "sb-1", "--", "true"],
        ["sandbox", "exec", "--help", "--", "true"],
        ["sandbox", "exec", "sb-1", "true"],  # no `--`: click says what it makes of it
        ["sandbox", "exec", "sb-1", "--"],  # no command: click's "missing argument"
        ["sandbox", "ls", "a", "--", "b"],
        ["files", "exec", "sb-1", "--", "true"],
    ):
        assert plain_form(args) is None, args
