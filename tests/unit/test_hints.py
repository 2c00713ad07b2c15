"""The hint table names only what exists: tools and their arguments, SDK methods, CLI
commands; and an error's hint survives the wire to be spelled again."""

from __future__ import annotations

import re

import click
import pytest

from agentbox import hints
from agentbox.cli.main import cli
from agentbox.client.sandbox import Commands, Files, Sandbox
from agentbox.errors import AgentboxError, EditMismatch
from agentbox.gateway.tools import TOOLS_BY_NAME
from agentbox.hints import ACTIONS, Hint

SDK_OWNERS = {"sb": Sandbox, "sb.files": Files, "sb.commands": Commands, "Sandbox": Sandbox}


@pytest.mark.parametrize("name", sorted(ACTIONS))
def test_every_spelling_names_something_that_exists(name: str) -> None:
    action = ACTIONS[name]
    if action.tool is not None:
        props = TOOLS_BY_NAME[action.tool].input_schema["properties"]
        assert set(action.tool_args) <= set(props)
    else:
        assert action.rest and re.match(r"^(GET|POST|PUT|DELETE) /v1/", action.rest)
    for call in re.findall(r"`((?:sb|Sandbox)[\w.]*)\(", action.sdk or ""):
        owner, _, method = call.rpartition(".")
        assert callable(getattr(SDK_OWNERS[owner], method, None)), call
    for command in re.findall(r"`agentbox ([a-z]+(?: [a-z]+)?)", action.cli or ""):
        group: click.Command | None = cli
        for word in command.split():
            assert isinstance(group, click.Group), command
            group = group.get_command(click.Context(cli), word)
        assert group is not None, command


def test_a_hint_is_spelled_per_surface_and_survives_the_wire() -> None:
    e = EditMismatch(
        "found 2", hint=Hint("fs_edit_count", {"count": 2}, "to replace both, {call}"), found=2
    )
    assert (
        str(e)
        == e.message
        == "found 2; to replace both, pass `count=2` to `sb.files.edit` (`count=None`: all)"
    )
    assert hints.render(e, "mcp") == 'found 2; to replace both, call `fs_edit` with {"count": 2}'
    assert hints.render(e, "cli") == "found 2"  # the CLI has no edit: no hint beats a wrong one
    wire = e.to_dict("rest")
    assert "POST /v1/tools/fs_edit" in wire["message"]
    back = AgentboxError.from_dict(wire)
    assert type(back) is EditMismatch and back.message == e.message and back.details == e.details
    # A hint this version does not know (a newer peer): the reason still reads right.
    wire["details"]["hint"]["action"] = "from_the_future"
    assert AgentboxError.from_dict(wire).message == "found 2"


def test_a_hint_must_name_an_action_and_its_place() -> None:
    with pytest.raises(ValueError):
        Hint("fs_lsit", {}, "{call} to see")
    with pytest.raises(ValueError):
        Hint("fs_list", {"path": "/"}, "see what exists")
