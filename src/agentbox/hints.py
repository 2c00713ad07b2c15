"""What an error tells its caller to do next, spelled for the surface the caller uses.

An error names its next step as an *action* with arguments (``details["hint"]``:
``{"action", "args", "text"}``), never in one surface's syntax; each boundary renders it
with :func:`render`:

* MCP: the tool and its arguments, ``call `fs_list` with {"path": "/workspace"}``;
* REST: the same tool through ``POST /v1/tools/<name>``, or a route;
* CLI: the command, ``run `agentbox files ls ID /workspace```;
* SDK (in-process, or remote: the error is rebuilt from the wire): the method,
  ``call `sb.files.list('/workspace')```.

A surface with no way to do the action gets the error's reason without the hint. This
module imports nothing of agentbox: :mod:`agentbox.errors` builds on it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Surface = Literal["mcp", "rest", "cli", "sdk"]


@dataclass(frozen=True)
class Hint:
    """A next step: ``action`` (a key of ACTIONS) with ``args``, in a sentence ``text``
    whose ``{call}`` is the action as the caller's surface spells it."""

    action: str
    args: Mapping[str, Any]
    text: str

    def __post_init__(self) -> None:
        if self.action not in ACTIONS or "{call}" not in self.text:
            raise ValueError(f"a hint needs an action of ACTIONS and {{call}}: {self!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "args": dict(self.args), "text": self.text}

    @staticmethod
    def from_dict(data: object) -> Hint | None:
        if not isinstance(data, dict) or not isinstance(data.get("args"), dict):
            return None
        action, text = data.get("action"), data.get("text")
        if action not in ACTIONS or not isinstance(text, str):
            return None  # from a newer peer: the reason alone is still right
        return Hint(action, data["args"], text)


@dataclass(frozen=True)
class Action:
    """How each surface does one thing. ``tool``: the gateway tool (MCP and REST call it
    with the hint's args plus ``tool_args``); ``rest``: a route, for what is no tool;
    ``cli`` / ``sdk``: phrases whose ``{name}`` fields are the hint's args (shell-quoted,
    or as Python literals; ``{sandbox}`` is ID when the args do not name it)."""

    tool: str | None
    cli: str | None = None  # None: the surface has no way to do it
    sdk: str | None = None
    rest: str | None = None
    tool_args: Mapping[str, Any] = field(default_factory=dict)


ACTIONS: dict[str, Action] = {
    "fs_list": Action(
        "fs_list",
        cli="run `agentbox files ls {sandbox} {path}`",
        sdk="call `sb.files.list({path})`",
    ),
    "fs_stat": Action("fs_stat", sdk="call `sb.files.stat({path})`"),
    "fs_remove_tree": Action(
        "fs_remove",
        sdk="call `sb.files.remove({path}, recursive=True)`",
        tool_args={"recursive": True},
    ),
    "fs_edit_count": Action(
        "fs_edit", sdk="pass `count={count}` to `sb.files.edit` (`count=None`: all)"
    ),
    "fs_read_range": Action(
        "fs_read",
        cli="run `agentbox files read {sandbox} {path}` (it streams)",
        sdk="call `sb.files.read_stream({path})` or `sb.files.read({path}, offset=..., "
        "length=...)`",
        tool_args={"offset": 0},
    ),
    "fs_binary": Action(
        "fs_write",
        sdk="call `sb.files.read_bytes({path})` and `sb.files.write({path}, data)`",
        tool_args={"encoding": "base64"},
    ),
    "process_list": Action("process_list", sdk="call `sb.commands.list()`"),
    "process_start_stdin": Action(
        "process_start",
        sdk="call `sb.commands.start(command, stdin=True)`",
        tool_args={"stdin": True},
    ),
    "shell_create": Action("shell_create", sdk="call `sb.shell()`"),
    "sandbox_list": Action(
        None, cli="run `agentbox sandbox ls`", sdk="call `Sandbox.list()`", rest="GET /v1/sandboxes"
    ),
    "snapshot_list": Action(
        None,
        cli="run `agentbox snapshot ls`",
        sdk="call `Sandbox.snapshots()`",
        rest="GET /v1/snapshots",
    ),
    "volume_list": Action(
        None, cli="run `agentbox volume ls`", sdk="call `Volume.list()`", rest="GET /v1/volumes"
    ),
    "approval_list": Action(None, cli="run `agentbox approvals ls`", rest="GET /v1/approvals"),
    "task_list": Action(None, cli="run `agentbox task ls`", rest="GET /v1/tasks"),
    "sandbox_destroy": Action(
        None,
        cli="run `agentbox sandbox rm {sandbox}`",
        sdk="call `sb.kill()`",
        rest="DELETE /v1/sandboxes/{sandbox}",
    ),
}


def _shell_quote(value: str) -> str:
    """``shlex.quote``, imported when a CLI hint is rendered: every SDK and CLI process
    loads this module, few render a hint for a shell."""
    import shlex

    return shlex.quote(value)


_QUOTES: dict[Surface, Callable[[Any], str]] = {
    "mcp": str,
    "rest": str,
    "cli": lambda v: _shell_quote(str(v)),
    "sdk": repr,
}


def spell(hint: Hint, surface: Surface) -> str | None:
    """The hint's action as ``surface`` does it, or None when it cannot."""
    action = ACTIONS[hint.action]
    args = dict(hint.args)
    if surface in ("mcp", "rest") and action.tool is not None:
        args.pop("sandbox", None)  # a tool call names it in sandbox_id (or its token does)
        arguments = json.dumps(args | dict(action.tool_args))
        if surface == "rest":
            return f'send `POST /v1/tools/{action.tool}` with {{"arguments": {arguments}}}'
        return f"call `{action.tool}` with {arguments}"
    phrases = {
        "mcp": None,
        "rest": action.rest and f"send `{action.rest}`",
        "cli": action.cli,
        "sdk": action.sdk,
    }
    phrase = phrases[surface]
    if phrase is None:
        return None
    quote = _QUOTES[surface]
    return phrase.format_map({"sandbox": "ID"} | {k: quote(v) for k, v in args.items()})


class Explained(Protocol):
    """What :func:`render` reads of an error (an ``errors.AgentboxError``; described here
    because errors imports this module, never the other way)."""

    @property
    def reason(self) -> str: ...

    @property
    def details(self) -> dict[str, Any]: ...


def render(error: Explained, surface: Surface) -> str:
    """The error's message for a caller on ``surface``: its reason, then its hint."""
    hint = Hint.from_dict(error.details.get("hint"))
    call = spell(hint, surface) if hint else None
    if hint is None or call is None:
        return error.reason
    return f"{error.reason}; {hint.text.format(call=call)}"
