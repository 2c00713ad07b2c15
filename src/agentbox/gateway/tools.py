# Whole on purpose: the one tool table MCP and REST read, each spec beside the handler it names
"""The tools the gateway exposes, defined once for MCP and REST alike.

Each ``ToolSpec`` carries its JSON input and output schemas, MCP annotations, the policy
it is checked against, and a handler that does the work on the runtime. Names match
``[a-zA-Z0-9_-]{1,64}`` so every MCP client accepts them. Stateful things (background
processes, shell sessions, browser pages) are explicit handles in arguments and results.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from agentbox.browser.manager import BrowserManager
from agentbox.config.settings import BrowserOpenTool, GatewaySettings, TerminalRunTool
from agentbox.desktop import tools as desktop_tools
from agentbox.desktop.manager import DesktopManager
from agentbox.errors import AgentboxError, FileNotFound, HostUnsupported
from agentbox.gateway import tool_args
from agentbox.runtime.commands import Cancellation
from agentbox.runtime.files import Guard, SandboxFiles
from agentbox.runtime.output import CommandResult, OutputCallback, OutputSaver
from agentbox.runtime.requests import RunRequest
from agentbox.runtime.requests_extra import SessionRunRequest, StartRequest
from agentbox.runtime.runtime import Runtime
from agentbox.units import human_size

PolicyKind = Literal["command", "fs_read", "fs_write", "browser", "desktop", "none"]
Handler = Callable[["ToolCall"], dict[str, Any]]


@dataclass(frozen=True)
class CommandOutput:
    """How much of a command's output a result keeps: ``cap`` bytes per stream (head and
    tail); a longer stream is saved whole (its first ``save_max_bytes``; 0: not saved)
    under ``save_dir`` in the sandbox, where the agent can page it with fs_read."""

    cap: int = 16_384
    save_dir: str = "/tmp/agentbox-output"
    save_max_bytes: int = 0


@dataclass(frozen=True)
class ToolLimits:
    """The configured limits that tool arguments are cut to: the gateway renders them into
    the argument descriptions and defaults it lists (:func:`render_tools`), and applies
    the same values to each call."""

    timeout_ms: int
    output_bytes: int  # per stream, when the call asks for nothing
    max_output_bytes: int
    read_max_bytes: int  # fs_read's cap per call
    write_max_bytes: int | None  # fs_write's cap (None: only the sandbox's disk)
    viewport: str

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> ToolLimits:
        run = settings.tool("terminal.run") or TerminalRunTool(name="terminal.run")
        read, write = settings.tool("fs.read"), settings.tool("fs.write")
        browser = settings.tool("browser.open") or BrowserOpenTool(name="browser.open")
        return cls(
            timeout_ms=run.timeout_ms,
            output_bytes=min(run.output_bytes, run.max_output_bytes),
            max_output_bytes=run.max_output_bytes,
            read_max_bytes=read.max_bytes if read else DEFAULT_READ_MAX,
            write_max_bytes=write.max_bytes if write else None,
            viewport=browser.viewport,
        )


DEFAULT_READ_MAX = 262_144  # fs_read's cap when no fs.read tool is configured


@dataclass(frozen=True)
class ToolCall:
    """What a handler sees: the runtime, the sandbox, validated arguments, and limits."""

    runtime: Runtime
    sandbox_id: str
    args: dict[str, Any]
    timeout_s: float
    max_output_bytes: int
    on_output: OutputCallback | None = None
    browsers: BrowserManager | None = None
    desktops: DesktopManager | None = None
    guard: Guard | None = None
    """File tools: the file policy, judged by the file layer at the resolved path."""
    output: CommandOutput = CommandOutput()
    # Human-readable notes on limits that cut what the call asked for.
    limits_applied: tuple[str, ...] = ()
    # Set when the caller gives up (MCP notifications/cancelled): the command is killed.
    cancel: Cancellation | None = None


@dataclass(frozen=True)
class Effect:
    """What a tool does to the sandbox and beyond, as MCP's tool annotations tell a client."""

    read_only: bool = False
    destructive: bool = False  # may lose data (overwrite, remove, run anything)
    idempotent: bool = False  # the same call again changes nothing more
    open_world: bool = False  # reaches outside the sandbox (the web)

    def annotations(self) -> dict[str, bool]:
        return {
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": self.open_world,
        }


READS = Effect(read_only=True, idempotent=True)
ADDS = Effect()
SETS = Effect(idempotent=True)
DESTROYS = Effect(destructive=True)
REMOVES = Effect(destructive=True, idempotent=True)
OPENS_WEB = Effect(open_world=True)
ACTS_ON_WEB = Effect(destructive=True, open_world=True)


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    effect: Effect
    handler: Handler
    policy: PolicyKind
    # Short, bounded and never waiting on the sandbox: may run on the event loop thread
    # when it reads at most INLINE_MAX_BYTES (a worker-thread hop costs more than the call).
    inline: bool = False

    def with_defaults(self, args: dict[str, Any]) -> dict[str, Any]:
        """``args`` completed with the schema's defaults: the handler reads its defaults
        from the schema the client was shown, so the two cannot differ."""
        props = self.input_schema["properties"]
        filled = {k: _fresh(v["default"]) for k, v in props.items() if "default" in v}
        return filled | args

    def annotations(self) -> dict[str, bool]:
        return self.effect.annotations()


def _out(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or list(properties)}


STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}


def nullable(kind: str) -> dict[str, Any]:
    """A value of ``kind`` or null, as ``anyOf`` (a ``type`` list is less portable: some
    clients map schemas onto a one-type dialect)."""
    return {"anyOf": [{"type": kind}, {"type": "null"}]}


NULL_STR = nullable("string")
NULL_INT = nullable("integer")
WAITING = {
    "waiting_for_input": BOOL,
    "prompt": NULL_STR | {"description": "What it printed last, when waiting for input"},
    "hint": {"type": "string", "description": "What to do next, when waiting for input"},
}
RESULT_SCHEMA = _out(
    {
        "stdout": STR,
        "stderr": STR,
        "exit_code": NULL_INT
        | {"description": "null while it runs on as process_id (it waited for input)"},
        "timed_out": BOOL,
        "truncated": BOOL,
        "duration_ms": {"type": "number"},
        "stdout_bytes_total": INT,
        "stderr_bytes_total": INT,
        "stdout_file": NULL_STR | {"description": "Sandbox path of the full stdout when cut"},
        "stderr_file": NULL_STR | {"description": "Sandbox path of the full stderr when cut"},
        "limits_applied": {
            "type": "array",
            "items": STR,
            "description": "Limits that cut what the call asked for (e.g. timeout_ms)",
        },
        **WAITING,
        "process_id": NULL_STR
        | {"description": "The command waits for input and runs on as this process"},
    },
    ["stdout", "stderr", "exit_code", "timed_out", "truncated", "duration_ms",
     "waiting_for_input"],
)  # fmt: skip
# What an agent should do about a command blocked reading its stdin.
ANSWER_HINT = (
    'answer it with process_write (e.g. data "y\\n"; the process was started with '
    "stdin=true), then process_read; or stop it with process_signal. Next time pass the "
    "answer in stdin, or use a non-interactive flag (-y, --yes, --no-input, --batch)."
)
FILE_INFO = {
    "type": "object",
    "properties": {
        "path": STR,
        "name": STR,
        "type": STR,
        "size": INT,
        "mode": INT,
        "mtime": {"type": "number"},
        "symlink_target": NULL_STR,
    },
}


def result_dict(r: CommandResult, call: ToolCall) -> dict[str, Any]:
    result = {
        "stdout": r.stdout,
        "stderr": r.stderr,
        "exit_code": None if r.process_id else r.exit_code,
        "timed_out": r.timed_out,
        "truncated": r.truncated,
        "duration_ms": round(r.duration_ms, 3),
        "stdout_bytes_total": r.stdout_total,
        "stderr_bytes_total": r.stderr_total,
        "stdout_file": r.stdout_file,
        "stderr_file": r.stderr_file,
        "limits_applied": list(call.limits_applied),
        "waiting_for_input": r.waiting_for_input,
    }
    if r.waiting_for_input:
        where = (
            f"it runs on as background process {r.process_id}"
            if r.process_id
            else ("it was stopped")
        )
        result |= {"prompt": r.prompt, "process_id": r.process_id,
                   "hint": f"The command is waiting for input; {where}: {ANSWER_HINT}"}  # fmt: skip
    return result


SAVED_OUTPUTS_KEPT = 20  # the newest files of save_dir; older ones go as new ones come


def _saver(call: ToolCall) -> OutputSaver | None:
    """Saves a cut stream through the file API, as the sandbox user: the sandbox's own
    permissions and disk quota apply, and the agent reads it back with fs_read. Only the
    newest SAVED_OUTPUTS_KEPT files stay, so forgotten ones do not fill the disk."""
    if not call.output.save_max_bytes or not call.output.cap:
        # cap 0: the caller asked for no output in the result (it streams it, like the
        # CLI's exec through a gateway), so there is nothing to page back either.
        return None
    name = "r-" + secrets.token_hex(6)

    def save(stream: str, chunks: Iterable[bytes]) -> str:
        files = call.runtime.files(call.sandbox_id)  # only when a stream was cut
        _prune_saved(files, call.output.save_dir)
        path = f"{call.output.save_dir}/{name}.{stream}"
        files.write(path, chunks, perms=0o600)
        return path

    return save


def _prune_saved(files: SandboxFiles, directory: str) -> None:
    try:
        saved = [e for e in files.list(directory) if e.type == "file"
                 and e.name.startswith("r-")]  # fmt: skip
    except FileNotFound:
        return
    saved.sort(key=lambda e: e.mtime)
    for old in saved[: max(0, len(saved) - SAVED_OUTPUTS_KEPT + 1)]:
        with contextlib.suppress(AgentboxError):
            files.remove(old.path)


def _fresh(default: Any) -> Any:
    """A schema default the handler may change without changing the schema: a copy of a
    list or dict; the rest as is (a deepcopy of each on every call showed in profiles)."""
    return default if type(default) in _IMMUTABLE else copy.deepcopy(default)


_IMMUTABLE = frozenset({str, int, float, bool, type(None)})


# handlers -------------------------------------------------------------------------------
def terminal_run(call: ToolCall) -> dict[str, Any]:
    request = RunRequest(
        call.args["command"],
        cwd=call.args["cwd"],
        env=call.args["env"],
        stdin=call.args.get("stdin"),
        timeout=call.timeout_s,
        max_output_bytes=call.output.cap,
        pty=call.args["pty"],
    )
    result = call.runtime.commands(call.sandbox_id).run(
        request,
        on_output=call.on_output,
        save=_saver(call),
        save_max_bytes=call.output.save_max_bytes,
        detect_input=True,
        # Built when a command waits for input, not on every call (a second runner and
        # its process table cost ~50 µs of the gateway's CPU per call).
        adopt=lambda live: call.runtime.processes(call.sandbox_id).adopt(live),
        cancel=call.cancel,
    )
    return result_dict(result, call)


def process_start(call: ToolCall) -> dict[str, Any]:
    pty = call.args.get("pty")
    request = StartRequest(
        call.args["command"],
        cwd=call.args["cwd"],
        env=call.args["env"],
        stdin=call.args["stdin"],
        pty=None if pty is None else (pty["cols"], pty["rows"]),
    )
    info = call.runtime.processes(call.sandbox_id).start(request)
    return {"process_id": info.id, "running": True}


def process_read(call: ToolCall) -> dict[str, Any]:
    table = call.runtime.processes(call.sandbox_id)
    pid = call.args["process_id"]
    limit = min(int(call.args["limit"]), call.max_output_bytes)
    out = table.read_output(pid, call.args["stream"], call.args["offset"], limit)
    info = table.get(pid)
    result = {
        "data": out.text,
        "next_offset": out.next_offset,
        "running": info.running,
        "exit_code": info.exit_code,
        "waiting_for_input": info.waiting_for_input,
    }
    if info.waiting_for_input:
        result |= {"prompt": info.prompt, "hint": f"It is waiting for input: {ANSWER_HINT}"}
    return result


def process_write(call: ToolCall) -> dict[str, Any]:
    table = call.runtime.processes(call.sandbox_id)
    pid, data = call.args["process_id"], call.args["data"]
    written = table.write_stdin(pid, data) if data or not call.args["eof"] else 0
    if call.args["eof"]:
        table.close_stdin(pid)
    return {"written": written}


def process_resize(call: ToolCall) -> dict[str, Any]:
    pid = call.args["process_id"]
    call.runtime.processes(call.sandbox_id).resize(pid, call.args["cols"], call.args["rows"])
    return {"process_id": pid, "cols": call.args["cols"], "rows": call.args["rows"]}


def process_signal(call: ToolCall) -> dict[str, Any]:
    table = call.runtime.processes(call.sandbox_id)
    pid = call.args["process_id"]
    delivered = table.signal(pid, call.args["signal"])
    info = table.get(pid)
    return {
        "process_id": pid,
        "signalled": delivered,
        "running": info.running,
        "exit_code": info.exit_code,
    }


def process_list(call: ToolCall) -> dict[str, Any]:
    return {"processes": [p.to_dict() for p in call.runtime.processes(call.sandbox_id).list()]}


def shell_create(call: ToolCall) -> dict[str, Any]:
    session = call.runtime.sessions(call.sandbox_id).create(call.args["cwd"], call.args["env"])
    return {"session_id": session}


def shell_run(call: ToolCall) -> dict[str, Any]:
    request = SessionRunRequest(
        call.args["session_id"],
        call.args["command"],
        timeout=call.timeout_s,
        stdin=call.args.get("stdin"),
        max_output_bytes=call.output.cap,
    )
    result = call.runtime.sessions(call.sandbox_id).run(
        request,
        save=_saver(call),
        save_max_bytes=call.output.save_max_bytes,
    )
    return result_dict(result, call)


def shell_close(call: ToolCall) -> dict[str, Any]:
    call.runtime.sessions(call.sandbox_id).close(call.args["session_id"])
    return {"session_id": call.args["session_id"], "closed": True}


def fs_read(call: ToolCall) -> dict[str, Any]:
    files = call.runtime.files(call.sandbox_id)
    offset = int(call.args["offset"])
    length = min(int(call.args["length"]), call.max_output_bytes)
    data, size = files.read_sized(call.args["path"], offset, length, guard=call.guard)
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode(), "base64"
    return {
        "path": call.args["path"],
        "content": content,
        "encoding": encoding,
        "size": size,
        "truncated": offset + len(data) < size,
    }


def payload(args: dict[str, Any]) -> bytes:
    """The bytes fs_write writes."""
    if args.get("encoding") == "base64":
        return base64.b64decode(args["content"], validate=True)
    return str(args["content"]).encode()


def fs_write(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.files(call.sandbox_id).write(
        call.args["path"],
        payload(call.args),
        mode=call.args["mode"],
        perms=call.args["perms"],
        make_parents=call.args["make_parents"],
        guard=call.guard,
    )
    return {"path": info.path, "size": info.size}


def fs_edit(call: ToolCall) -> dict[str, Any]:
    count = call.args["count"]
    n = call.runtime.files(call.sandbox_id).edit(
        call.args["path"], call.args["old"], call.args["new"], count, guard=call.guard
    )
    return {"path": call.args["path"], "replacements": n}


def fs_list(call: ToolCall) -> dict[str, Any]:
    entries = call.runtime.files(call.sandbox_id).list(
        call.args["path"], int(call.args["depth"]), guard=call.guard
    )
    return {"entries": [e.to_dict() for e in entries]}


def fs_stat(call: ToolCall) -> dict[str, Any]:
    return call.runtime.files(call.sandbox_id).stat(call.args["path"], guard=call.guard).to_dict()


def fs_remove(call: ToolCall) -> dict[str, Any]:
    call.runtime.files(call.sandbox_id).remove(
        call.args["path"], recursive=bool(call.args["recursive"]), guard=call.guard
    )
    return {"path": call.args["path"], "removed": True}


def fs_move(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.files(call.sandbox_id).move(
        call.args["path"],
        call.args["destination"],
        overwrite=bool(call.args["overwrite"]),
        guard=call.guard,
    )
    return info.to_dict()


def fs_mkdir(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.files(call.sandbox_id).mkdir(
        call.args["path"],
        parents=call.args["parents"],
        exist_ok=call.args["exist_ok"],
        guard=call.guard,
    )
    return info.to_dict()


# browser ----------------------------------------------------------------------------------
BROWSER_TIMEOUT_S = 60.0  # per browser operation, within the gateway's timeout ceiling
DEFAULT_TEXT_CHARS = 20_000


def _browser(call: ToolCall) -> tuple[BrowserManager, float]:
    if call.browsers is None:
        raise HostUnsupported("the browser tools run in the gateway (agentbox serve / mcp)")
    return call.browsers, min(call.timeout_s, BROWSER_TIMEOUT_S)


def _max_chars(call: ToolCall) -> int:
    return min(int(call.args["max_chars"]), call.max_output_bytes)


def browser_open(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    return browsers.open(
        call.sandbox_id, call.args["url"], call.args.get("handle"), timeout, _max_chars(call)
    )


def browser_snapshot(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    return browsers.snapshot(
        call.sandbox_id,
        call.args["handle"],
        timeout,
        _max_chars(call),
        bool(call.args["text"]),
    )


def browser_click(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    return browsers.click(call.sandbox_id, call.args["handle"], call.args["ref"], timeout)


def browser_type(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    a = call.args
    return browsers.type_text(
        call.sandbox_id, a["handle"], a["ref"], a["text"], bool(a["submit"]), timeout
    )


def browser_press(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    a = call.args
    return browsers.press(call.sandbox_id, a["handle"], a["key"], a.get("ref"), timeout)


def browser_screenshot(call: ToolCall) -> dict[str, Any]:
    """The PNG, and the same PNG saved beside the saved outputs (``file``; MCP clients get
    it as a resource link), or ``file`` None when it could not be saved (a full disk)."""
    browsers, timeout = _browser(call)
    shot = browsers.screenshot(
        call.sandbox_id, call.args["handle"], bool(call.args["full_page"]), timeout
    )
    files = call.runtime.files(call.sandbox_id)
    path = f"{call.output.save_dir}/r-{secrets.token_hex(6)}.png"
    try:
        _prune_saved(files, call.output.save_dir)
        files.write(path, [base64.b64decode(shot["png_base64"])], perms=0o600)
    except AgentboxError:
        return shot | {"file": None}
    return shot | {"file": path}


def browser_close(call: ToolCall) -> dict[str, Any]:
    browsers, _ = _browser(call)
    return browsers.close(call.sandbox_id, call.args["handle"])


# Arguments whose default or maximum comes from the gateway's config: render_tools puts
# the configured values into the schemas a gateway lists (and its handlers then read).
def _bounded_int(minimum: int, default: int, description: str) -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "default": default, "description": description}


def _timeout_ms(lim: ToolLimits) -> dict[str, Any]:
    return _bounded_int(
        1,
        lim.timeout_ms,
        f"Wall-clock limit in milliseconds; default and maximum {lim.timeout_ms} "
        "(a longer request is cut to it, and limits_applied says so)",
    )


def _max_output(lim: ToolLimits) -> dict[str, Any]:
    return _bounded_int(
        0,
        lim.output_bytes,
        f"Bytes of each stream the result keeps, head and tail; default "
        f"{lim.output_bytes} ({human_size(lim.output_bytes)}), at most {lim.max_output_bytes} "
        f"({human_size(lim.max_output_bytes)}). Longer output is saved whole in the sandbox: "
        "the result's stdout_file / stderr_file name it for fs_read (0: no output kept "
        "and none saved).",
    )


def _read_limit(lim: ToolLimits) -> dict[str, Any]:
    return _bounded_int(
        1,
        lim.max_output_bytes,
        f"Bytes to return at most; default and maximum {lim.max_output_bytes} "
        f"({human_size(lim.max_output_bytes)})",
    )


def _read_length(lim: ToolLimits) -> dict[str, Any]:
    return _bounded_int(
        0,
        lim.read_max_bytes,
        f"Bytes to read from offset; default and maximum {lim.read_max_bytes} "
        f"({human_size(lim.read_max_bytes)}): page a larger file with offset",
    )


def _content(lim: ToolLimits) -> dict[str, Any]:
    cap = (
        f"at most {lim.write_max_bytes} bytes ({human_size(lim.write_max_bytes)}) once decoded"
        if lim.write_max_bytes
        else "bounded by the sandbox's disk"
    )
    return {"type": "string", "description": f"The file's new content (see encoding); {cap}"}


def _text_chars(lim: ToolLimits) -> dict[str, Any]:
    default = min(DEFAULT_TEXT_CHARS, lim.max_output_bytes)
    return _bounded_int(
        1,
        default,
        f"Characters of page text returned at most; default {default}, "
        f"maximum {lim.max_output_bytes} (beyond: truncated=true)",
    )


def _full_page(lim: ToolLimits) -> dict[str, Any]:
    return {
        "type": "boolean",
        "default": False,
        "description": f"true: the whole page; false: the viewport ({lim.viewport} pixels)",
    }


def _url(lim: ToolLimits) -> dict[str, Any]:
    timeout = min(lim.timeout_ms / 1000, BROWSER_TIMEOUT_S)
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": 8192,
        "description": f"Absolute http(s) URL, at most 8192 characters; loading it times out "
        f"after {timeout:g} s",
    }


CONFIGURED: dict[str, Callable[[ToolLimits], dict[str, Any]]] = {
    "timeout_ms": _timeout_ms,
    "max_output_bytes": _max_output,
    "limit": _read_limit,
    "length": _read_length,
    "content": _content,
    "max_chars": _text_chars,
    "full_page": _full_page,
    "url": _url,
}
DEFAULT_LIMITS = ToolLimits.from_settings(GatewaySettings())


def configured_schema(schema: dict[str, Any], limits: ToolLimits) -> dict[str, Any]:
    """``schema`` with each configured argument (CONFIGURED) stating these limits."""
    props = schema["properties"]
    configured = {k: build(limits) for k, build in CONFIGURED.items() if k in props}
    return schema | {"properties": props | configured}


def _schema(model: type[tool_args.ToolArgs]) -> dict[str, Any]:
    """A tool's input schema: its argument model's, with the default limits."""
    return configured_schema(tool_args.input_schema(model), DEFAULT_LIMITS)


PAGE_STATE = {
    "handle": STR,
    "url": STR,
    "title": STR,
}
ACTION_RESULT = _out({**PAGE_STATE, "navigated": BOOL})


def _tool(
    handler: Handler, title: str, description: str, args: type[tool_args.ToolArgs],
    output: dict[str, Any], effect: Effect, policy: PolicyKind, *, inline: bool = False,
) -> ToolSpec:  # fmt: skip
    """A tool named after its handler, its input schema its argument model's."""
    return ToolSpec(handler.__name__, title, description, _schema(args), output, effect,
                    handler, policy, inline)  # fmt: skip


TOOLS: list[ToolSpec] = [
    _tool(
        terminal_run,
        "Run a command",
        "Run a bash command in the sandbox and wait for it. Returns stdout, stderr and the exit "
        "code; the command's whole process tree is killed at the timeout. Long output keeps "
        "its head and tail; the whole of it is saved in the sandbox (stdout_file / "
        "stderr_file) for fs_read. A command that waits for input (a prompt, an editor) "
        "returns early with waiting_for_input=true and runs on as a background process "
        "(process_id) that process_write can answer.",
        tool_args.TerminalRun,
        RESULT_SCHEMA,
        DESTROYS,
        "command",
    ),
    _tool(
        process_start,
        "Start a background process",
        "Start a command in the background; returns a process_id handle for process_read, "
        "process_write, process_signal.",
        tool_args.ProcessStart,
        _out({"process_id": STR, "running": BOOL}),
        DESTROYS,
        "command",
    ),
    _tool(
        process_read,
        "Read a background process's output",
        "Output of a background process from a byte offset; pass next_offset back to continue.",
        tool_args.ProcessRead,
        _out(
            {
                "data": STR,
                "next_offset": INT,
                "running": BOOL,
                "exit_code": NULL_INT,
                **WAITING,
            },
            ["data", "next_offset", "running", "exit_code", "waiting_for_input"],
        ),
        READS,
        "none",
    ),
    _tool(
        process_write,
        "Write to a background process's stdin",
        "Send text to the stdin of a process started with stdin=true (or type it into its "
        "terminal); eof=true then closes its stdin.",
        tool_args.ProcessWrite,
        _out({"written": INT}),
        ADDS,
        "none",
    ),
    _tool(
        process_resize,
        "Resize a background process's terminal",
        "Set the size of the terminal of a process started with pty; it gets SIGWINCH.",
        tool_args.ProcessResize,
        _out({"process_id": STR, "cols": INT, "rows": INT}),
        SETS,
        "none",
    ),
    _tool(
        process_signal,
        "Signal a background process",
        "Send a signal (default SIGTERM; SIGKILL kills its whole tree). signalled=false: "
        "the process had already ended (exit_code says how).",
        tool_args.ProcessSignal,
        _out(
            {
                "process_id": STR,
                "signalled": BOOL,
                "running": BOOL,
                "exit_code": NULL_INT,
            }
        ),
        DESTROYS,
        "none",
    ),
    _tool(
        process_list,
        "List background processes",
        "Background processes of the sandbox.",
        tool_args.ProcessList,
        _out({"processes": {"type": "array", "items": {"type": "object"}}}),
        READS,
        "none",
    ),
    _tool(
        shell_create,
        "Open a shell session",
        "Open a persistent shell: cd and export carry over between shell_run calls.",
        tool_args.ShellCreate,
        _out({"session_id": STR}),
        ADDS,
        "none",
    ),
    _tool(
        shell_run,
        "Run in a shell session",
        "Run a bash command in a shell session (its cwd and environment persist).",
        tool_args.ShellRun,
        RESULT_SCHEMA,
        DESTROYS,
        "command",
    ),
    _tool(
        shell_close,
        "Close a shell session",
        "Forget a shell session.",
        tool_args.ShellClose,
        _out({"session_id": STR, "closed": BOOL}),
        SETS,
        "none",
    ),
    _tool(
        fs_read,
        "Read a file",
        "Read a file (UTF-8 text, or base64 for binary) from an optional byte offset/length.",
        tool_args.FsRead,
        _out(
            {
                "path": STR,
                "content": STR,
                "encoding": {"enum": ["utf-8", "base64"]},
                "size": INT,
                "truncated": BOOL,
            }
        ),
        READS,
        "fs_read",
        inline=True,
    ),
    _tool(
        fs_write,
        "Write a file",
        "Create, overwrite or append to a file (missing parents are created unless "
        "make_parents=false).",
        tool_args.FsWrite,
        _out({"path": STR, "size": INT, "diff": STR}, ["path", "size"]),
        DESTROYS,
        "fs_write",
    ),
    _tool(
        fs_edit,
        "Edit a file",
        "Replace an exact string; fails unless it occurs exactly `count` times (default 1).",
        tool_args.FsEdit,
        _out({"path": STR, "replacements": INT, "diff": STR}, ["path", "replacements"]),
        DESTROYS,
        "fs_write",
    ),
    _tool(
        fs_list,
        "List a directory",
        "Entries of a directory, optionally recursive (depth).",
        tool_args.FsList,
        _out({"entries": {"type": "array", "items": FILE_INFO}}),
        READS,
        "fs_read",
    ),
    _tool(
        fs_stat,
        "Stat a path",
        "Type, size, mode and mtime of a path.",
        tool_args.FsStat,
        FILE_INFO | {"required": ["path", "type", "size"]},
        READS,
        "fs_read",
    ),
    _tool(
        fs_remove,
        "Remove a path",
        "Remove a file, or a directory with recursive=true.",
        tool_args.FsRemove,
        _out({"path": STR, "removed": BOOL}),
        REMOVES,
        "fs_write",
    ),
    _tool(
        fs_move,
        "Move a path",
        "Move or rename a file or directory.",
        tool_args.FsMove,
        FILE_INFO | {"required": ["path"]},
        DESTROYS,
        "fs_write",
    ),
    _tool(
        fs_mkdir,
        "Make a directory",
        "Create a directory (and its parents, unless parents=false).",
        tool_args.FsMkdir,
        FILE_INFO | {"required": ["path"]},
        SETS,
        "fs_write",
    ),
    _tool(
        browser_open,
        "Open a web page",
        "Open a URL in a headless browser inside the sandbox (its network policy applies to "
        "every request and redirect). Without handle a new page is opened and its handle "
        "returned; with handle that page navigates. Returns the final url, HTTP status, "
        "title and the page's readable text (cut at max_chars, then truncated=true).",
        tool_args.BrowserOpen,
        _out(
            {
                **PAGE_STATE,
                "status": NULL_INT,
                "text": STR,
                "truncated": BOOL,
            }
        ),
        OPENS_WEB,
        "browser",
    ),
    _tool(
        browser_snapshot,
        "Snapshot a page's elements",
        "A compact accessibility tree of the page: landmarks, headings, links, buttons and "
        "inputs, each with a ref (e12) for browser_click / browser_type / browser_press. "
        "Refs stay valid until the page navigates or changes; then take a new snapshot. "
        "text=true also returns the page's readable text.",
        tool_args.BrowserSnapshot,
        _out(
            {
                **PAGE_STATE,
                "snapshot": STR,
                "refs": INT,
                "truncated": BOOL,
                "text": STR,
                "text_truncated": BOOL,
            },
            ["handle", "url", "title", "snapshot", "refs", "truncated"],
        ),
        READS,
        "browser",
    ),
    _tool(
        browser_click,
        "Click an element",
        "Click the element with this ref (from browser_snapshot). Returns the page's url and "
        "title and whether it navigated.",
        tool_args.BrowserClick,
        ACTION_RESULT,
        ACTS_ON_WEB,
        "browser",
    ),
    _tool(
        browser_type,
        "Type into a field",
        "Replace the value of a text field (or choose a select option by its label) with "
        "text; submit=true then presses Enter.",
        tool_args.BrowserType,
        ACTION_RESULT,
        ACTS_ON_WEB,
        "browser",
    ),
    _tool(
        browser_press,
        "Press a key",
        "Press a key or chord (Enter, Tab, ArrowDown, Control+A, ...) on the element with ref, "
        "or on whatever has focus.",
        tool_args.BrowserPress,
        ACTION_RESULT,
        ACTS_ON_WEB,
        "browser",
    ),
    _tool(
        browser_screenshot,
        "Screenshot a page",
        "A PNG of the viewport (full_page=true: the whole page), base64 in png_base64.",
        tool_args.BrowserScreenshot,
        _out(
            {
                **PAGE_STATE,
                "mime_type": {"const": "image/png"},
                "width": INT,
                "height": INT,
                "png_base64": STR,
                "file": NULL_STR,
            }
        ),
        READS,
        "browser",
    ),
    _tool(
        browser_close,
        "Close a page",
        "Close the page (its browser context, cookies included). The browser itself stops "
        "with its last page; idle pages close by themselves.",
        tool_args.BrowserClose,
        _out({"handle": STR, "closed": BOOL}),
        SETS,
        "browser",
    ),
]

# desktop (Xvnc + openbox inside the sandbox; shaped like Anthropic's computer-use tool) ---
DESKTOP_TIMEOUT_S = desktop_tools.TIMEOUT_S


def _desktop_handler(name: str) -> Handler:
    """The handler of desktop tool ``name``: its action (``agentbox.desktop.tools``, which
    the SDK runs in-process too) on this gateway's desktops."""
    action = desktop_tools.ACTIONS[name]

    def handler(call: ToolCall) -> dict[str, Any]:
        if call.desktops is None:
            raise HostUnsupported("the desktop tools run in the gateway (agentbox serve / mcp)")
        timeout = min(call.timeout_s, DESKTOP_TIMEOUT_S)
        return action(call.desktops, call.sandbox_id, call.args, timeout)

    return handler


_POINTER_DONE = _out({"done": BOOL, "x": INT, "y": INT, "space": STR})
# Where the pointer is after the call: the screenshot's space, and the screen's pixels.
_POINTER_AT = _out(
    {"done": BOOL, "x": INT, "y": INT, "space": STR, "screen_x": INT, "screen_y": INT}
)
_DESKTOP_INFO = {
    "running": BOOL,
    "display": STR,
    "width": INT,
    "height": INT,
    "started_at": {"type": "number"},
    "memory_bytes": INT,
}


def _desktop_tool(
    name: str, title: str, description: str, inputs: dict[str, Any],
    output: dict[str, Any], handler: Handler, *, read_only: bool = False,
    policy: PolicyKind = "desktop",
) -> ToolSpec:  # fmt: skip
    effect = READS if read_only else DESTROYS
    return ToolSpec(name, title, description, inputs, output, effect, handler, policy)


TOOLS += [
    _desktop_tool(
        "desktop_start",
        "Start the desktop",
        "Start a virtual desktop (X display :1 with a window manager and a VNC server) "
        "inside the sandbox, under its limits; a running one is returned as it is. People "
        "watch it through the gateway; the other desktop_* tools act on it.",
        _schema(tool_args.DesktopStart),
        _out({**_DESKTOP_INFO, "started": BOOL}, ["running", "started"]),
        _desktop_handler("desktop_start"),
    ),
    _desktop_tool(
        "desktop_stop",
        "Stop the desktop",
        "Stop the sandbox's desktop and every application opened on it.",
        _schema(tool_args.DesktopStop),
        _out({"stopped": BOOL}),
        _desktop_handler("desktop_stop"),
    ),
    _desktop_tool(
        "desktop_screenshot",
        "Screenshot the desktop",
        "A PNG of the whole screen, scaled to fit within width x height (aspect kept). The "
        "coordinates of desktop_click/move/drag/scroll are in this screenshot's pixels.",
        _schema(tool_args.DesktopScreenshot),
        _out(
            {
                "mime_type": {"const": "image/png"},
                "width": INT,
                "height": INT,
                "screen_width": INT,
                "screen_height": INT,
                "png_base64": STR,
            }
        ),
        _desktop_handler("desktop_screenshot"),
        read_only=True,
    ),
    _desktop_tool(
        "desktop_click",
        "Click on the desktop",
        "Move the pointer to (x, y) and click (double=true: double-click; triple=true: "
        "triple-click).",
        _schema(tool_args.DesktopClick),
        _POINTER_DONE,
        _desktop_handler("desktop_click"),
    ),
    _desktop_tool(
        "desktop_move",
        "Move the pointer",
        "Move the pointer to (x, y).",
        _schema(tool_args.DesktopMove),
        _POINTER_DONE,
        _desktop_handler("desktop_move"),
    ),
    _desktop_tool(
        "desktop_drag",
        "Drag on the desktop",
        "Press a button at (x, y), move to (to_x, to_y) and release it there.",
        _schema(tool_args.DesktopDrag),
        _POINTER_DONE,
        _desktop_handler("desktop_drag"),
    ),
    _desktop_tool(
        "desktop_scroll",
        "Scroll on the desktop",
        "Scroll the wheel at (x, y): amount notches in direction.",
        _schema(tool_args.DesktopScroll),
        _POINTER_DONE,
        _desktop_handler("desktop_scroll"),
    ),
    _desktop_tool(
        "desktop_type",
        "Type text",
        "Type text with the keyboard into whatever has focus.",
        _schema(tool_args.DesktopType),
        _out({"done": BOOL, "characters": INT}),
        _desktop_handler("desktop_type"),
    ),
    _desktop_tool(
        "desktop_key",
        "Press keys",
        "Press a key or chord in xdotool names: Return, Escape, Tab, ctrl+s, alt+Tab, "
        "ctrl+shift+t; several separated by spaces.",
        _schema(tool_args.DesktopKey),
        _out({"done": BOOL, "keys": STR}),
        _desktop_handler("desktop_key"),
    ),
    _desktop_tool(
        "desktop_open",
        "Open an application",
        "Start an application on the desktop: command (a bash command line; the command "
        "policy applies) or url (opened in Chromium, headed, behind the sandbox's egress "
        "policy). It runs until it exits or the desktop stops.",
        _schema(tool_args.DesktopOpen),
        _out({"opened": BOOL, "log": STR}),
        _desktop_handler("desktop_open"),
    ),
    _desktop_tool(
        "desktop_mouse_down",
        "Press a mouse button",
        "Press and hold a button (default left) where the pointer is, or at (x, y); "
        "desktop_move then desktop_mouse_up make a drag of any path. Answers where.",
        _schema(tool_args.DesktopMouseButton),
        _POINTER_AT,
        _desktop_handler("desktop_mouse_down"),
    ),
    _desktop_tool(
        "desktop_mouse_up",
        "Release a mouse button",
        "Release a button pressed with desktop_mouse_down, where the pointer is or at (x, y).",
        _schema(tool_args.DesktopMouseButton),
        _POINTER_AT,
        _desktop_handler("desktop_mouse_up"),
    ),
    _desktop_tool(
        "desktop_cursor_position",
        "Where the pointer is",
        "The pointer's place, in the latest desktop_screenshot's pixels (x, y) and the "
        "screen's (screen_x, screen_y).",
        _schema(tool_args.DesktopCursorPosition),
        _POINTER_AT,
        _desktop_handler("desktop_cursor_position"),
        read_only=True,
    ),
    _desktop_tool(
        "desktop_hold_key",
        "Hold keys down",
        "Press a key or chord (xdotool names, as desktop_key), hold it for duration "
        "seconds, then release it; answers once released.",
        _schema(tool_args.DesktopHoldKey),
        _out({"done": BOOL, "keys": STR, "duration": {"type": "number"}}),
        _desktop_handler("desktop_hold_key"),
    ),
    _desktop_tool(
        "desktop_zoom",
        "Zoom into the desktop",
        "A PNG of the region from (x, y) to (to_x, to_y) (the latest screenshot's pixels) "
        "at the screen's full resolution, or scaled to fit width x height: for text too "
        "small to read in a scaled screenshot. Coordinates stay the screenshot's.",
        _schema(tool_args.DesktopZoom),
        _out(
            {
                "mime_type": {"const": "image/png"},
                "width": INT,
                "height": INT,
                "region": {"type": "array", "items": INT},
                "screen_region": {"type": "array", "items": INT},
                "png_base64": STR,
            }
        ),
        _desktop_handler("desktop_zoom"),
        read_only=True,
    ),
]

TOOLS_BY_NAME = {t.name: t for t in TOOLS}


def render_tools(limits: ToolLimits) -> list[ToolSpec]:
    """The tools as a gateway with these limits lists them: each configured argument
    (CONFIGURED) states that gateway's default and maximum. Built once per app."""
    return [
        dataclasses.replace(spec, input_schema=configured_schema(spec.input_schema, limits))
        for spec in TOOLS
    ]
