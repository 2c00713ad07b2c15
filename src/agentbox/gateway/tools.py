"""The tools the gateway exposes, defined once for MCP and REST alike.

Each ``ToolSpec`` carries its JSON input and output schemas, MCP annotations, the policy
it is checked against, and a handler that does the work on the runtime. Names match
``[a-zA-Z0-9_-]{1,64}`` so every MCP client accepts them. Stateful things (background
processes, shell sessions, browser pages) are explicit handles in arguments and results.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from agentbox.browser.manager import BrowserManager
from agentbox.errors import HostUnsupported
from agentbox.runtime.output import CommandResult, OutputCallback
from agentbox.runtime.runtime import Runtime

PolicyKind = Literal["command", "fs_read", "fs_write", "browser", "none"]
Handler = Callable[["ToolCall"], dict[str, Any]]


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


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool
    handler: Handler
    policy: PolicyKind
    open_world: bool = False
    # Short, bounded and never waiting on the sandbox: may run on the event loop thread
    # when it reads at most INLINE_MAX_BYTES (a worker-thread hop costs more than the call).
    inline: bool = False

    def annotations(self) -> dict[str, bool]:
        return {
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": self.open_world,
        }


def _obj(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    props = dict(properties)
    props["sandbox_id"] = {
        "type": "string",
        "description": "Sandbox to act on. Session tokens may omit it (their own sandbox).",
    }
    return {
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": False,
    }


def _out(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required or list(properties)}


STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
PATH = {
    "type": "string",
    "minLength": 1,
    "description": "Path in the sandbox (relative: /workspace)",
}
RESULT_SCHEMA = _out(
    {
        "stdout": STR,
        "stderr": STR,
        "exit_code": INT,
        "timed_out": BOOL,
        "truncated": BOOL,
        "duration_ms": {"type": "number"},
    }
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
        "symlink_target": {"type": ["string", "null"]},
    },
}


def result_dict(r: CommandResult) -> dict[str, Any]:
    return {
        "stdout": r.stdout,
        "stderr": r.stderr,
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "truncated": r.truncated,
        "duration_ms": round(r.duration_ms, 3),
    }


# handlers -------------------------------------------------------------------------------
def terminal_run(call: ToolCall) -> dict[str, Any]:
    result = call.runtime.commands(call.sandbox_id).run(
        call.args["command"],
        cwd=call.args.get("cwd"),
        env=call.args.get("env"),
        stdin=call.args.get("stdin"),
        timeout=call.timeout_s,
        max_output_bytes=call.max_output_bytes,
        on_output=call.on_output,
    )
    return result_dict(result)


def process_start(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.processes(call.sandbox_id).start(
        call.args["command"],
        cwd=call.args.get("cwd"),
        env=call.args.get("env"),
        stdin=bool(call.args.get("stdin")),
    )
    return {"process_id": info.id, "running": True}


def process_read(call: ToolCall) -> dict[str, Any]:
    table = call.runtime.processes(call.sandbox_id)
    pid = call.args["process_id"]
    limit = min(int(call.args.get("limit", call.max_output_bytes)), call.max_output_bytes)
    out = table.read_output(
        pid, call.args.get("stream", "stdout"), call.args.get("offset", 0), limit
    )
    info = table.get(pid)
    return {
        "data": out.text,
        "next_offset": out.next_offset,
        "running": info.running,
        "exit_code": info.exit_code,
    }


def process_write(call: ToolCall) -> dict[str, Any]:
    written = call.runtime.processes(call.sandbox_id).write_stdin(
        call.args["process_id"], call.args["data"]
    )
    return {"written": written}


def process_signal(call: ToolCall) -> dict[str, Any]:
    table = call.runtime.processes(call.sandbox_id)
    table.signal(call.args["process_id"], call.args.get("signal", "SIGTERM"))
    return {"process_id": call.args["process_id"], "signalled": True}


def process_list(call: ToolCall) -> dict[str, Any]:
    return {"processes": [p.to_dict() for p in call.runtime.processes(call.sandbox_id).list()]}


def shell_create(call: ToolCall) -> dict[str, Any]:
    session = call.runtime.sessions(call.sandbox_id).create(call.args.get("cwd", "/workspace"))
    return {"session_id": session}


def shell_run(call: ToolCall) -> dict[str, Any]:
    result = call.runtime.sessions(call.sandbox_id).run(
        call.args["session_id"],
        call.args["command"],
        timeout=call.timeout_s,
        max_output_bytes=call.max_output_bytes,
    )
    return result_dict(result)


def shell_close(call: ToolCall) -> dict[str, Any]:
    call.runtime.sessions(call.sandbox_id).close(call.args["session_id"])
    return {"session_id": call.args["session_id"], "closed": True}


def fs_read(call: ToolCall) -> dict[str, Any]:
    files = call.runtime.files(call.sandbox_id)
    length = call.args.get("length")
    cap = call.max_output_bytes
    length = cap if length is None else min(int(length), cap)
    data, size = files.read_sized(call.args["path"], int(call.args.get("offset", 0)), length)
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode(), "base64"
    return {
        "path": call.args["path"],
        "content": content,
        "encoding": encoding,
        "size": size,
        "truncated": int(call.args.get("offset", 0)) + len(data) < size,
    }


def _payload(args: dict[str, Any]) -> bytes:
    if args.get("encoding") == "base64":
        return base64.b64decode(args["content"], validate=True)
    return str(args["content"]).encode()


def fs_write(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.files(call.sandbox_id).write(
        call.args["path"], _payload(call.args), mode=call.args.get("mode", "overwrite")
    )
    return {"path": info.path, "size": info.size}


def fs_edit(call: ToolCall) -> dict[str, Any]:
    count = call.args.get("count", 1)
    n = call.runtime.files(call.sandbox_id).edit(
        call.args["path"], call.args["old"], call.args["new"], count
    )
    return {"path": call.args["path"], "replacements": n}


def fs_list(call: ToolCall) -> dict[str, Any]:
    entries = call.runtime.files(call.sandbox_id).list(
        call.args.get("path", "/workspace"), int(call.args.get("depth", 1))
    )
    return {"entries": [e.to_dict() for e in entries]}


def fs_stat(call: ToolCall) -> dict[str, Any]:
    return call.runtime.files(call.sandbox_id).stat(call.args["path"]).to_dict()


def fs_remove(call: ToolCall) -> dict[str, Any]:
    call.runtime.files(call.sandbox_id).remove(
        call.args["path"], recursive=bool(call.args.get("recursive"))
    )
    return {"path": call.args["path"], "removed": True}


def fs_move(call: ToolCall) -> dict[str, Any]:
    info = call.runtime.files(call.sandbox_id).move(
        call.args["path"], call.args["destination"], overwrite=bool(call.args.get("overwrite"))
    )
    return info.to_dict()


def fs_mkdir(call: ToolCall) -> dict[str, Any]:
    return call.runtime.files(call.sandbox_id).mkdir(call.args["path"]).to_dict()


# browser ----------------------------------------------------------------------------------
BROWSER_TIMEOUT_S = 60.0  # per browser operation, within the gateway's timeout ceiling
DEFAULT_TEXT_CHARS = 20_000


def _browser(call: ToolCall) -> tuple[BrowserManager, float]:
    if call.browsers is None:
        raise HostUnsupported("the browser tools run in the gateway (agentbox serve / mcp)")
    return call.browsers, min(call.timeout_s, BROWSER_TIMEOUT_S)


def _max_chars(call: ToolCall) -> int:
    return min(int(call.args.get("max_chars", DEFAULT_TEXT_CHARS)), call.max_output_bytes)


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
        bool(call.args.get("text")),
    )


def browser_click(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    return browsers.click(call.sandbox_id, call.args["handle"], call.args["ref"], timeout)


def browser_type(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    a = call.args
    return browsers.type_text(
        call.sandbox_id, a["handle"], a["ref"], a["text"], bool(a.get("submit")), timeout
    )


def browser_press(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    a = call.args
    return browsers.press(call.sandbox_id, a["handle"], a["key"], a.get("ref"), timeout)


def browser_screenshot(call: ToolCall) -> dict[str, Any]:
    browsers, timeout = _browser(call)
    return browsers.screenshot(
        call.sandbox_id, call.args["handle"], bool(call.args.get("full_page")), timeout
    )


def browser_close(call: ToolCall) -> dict[str, Any]:
    browsers, _ = _browser(call)
    return browsers.close(call.sandbox_id, call.args["handle"])


COMMAND = {"type": "string", "minLength": 1, "description": "A bash command line"}
ENV = {"type": "object", "additionalProperties": {"type": "string"}}
TIMEOUT_MS = {"type": "integer", "minimum": 1, "description": "Wall-clock limit in milliseconds"}
PROCESS_ID = {"type": "string", "description": "Handle returned by process_start"}
SESSION_ID = {"type": "string", "description": "Handle returned by shell_create"}
BROWSER_HANDLE = {
    "type": "string",
    "pattern": "^br-[0-9a-f]{12}$",
    "description": "Handle returned by browser_open (one page)",
}
ELEMENT_REF = {
    "type": "string",
    "pattern": "^(f[0-9]+)?e[0-9]+$",
    "description": "An element ref from the latest browser_snapshot, e.g. e12",
}
MAX_CHARS = {
    "type": "integer",
    "minimum": 1,
    "description": f"Cap on the text returned (default {DEFAULT_TEXT_CHARS} characters)",
}
PAGE_STATE = {
    "handle": STR,
    "url": STR,
    "title": STR,
}
ACTION_RESULT = _out({**PAGE_STATE, "navigated": BOOL})

TOOLS: list[ToolSpec] = [
    ToolSpec(
        "terminal_run",
        "Run a command",
        "Run a bash command in the sandbox and wait for it. Returns stdout, stderr and the exit "
        "code; the command's whole process tree is killed at the timeout.",
        _obj(
            {
                "command": COMMAND,
                "cwd": PATH,
                "timeout_ms": TIMEOUT_MS,
                "stdin": STR,
                "env": ENV,
            },
            ["command"],
        ),
        RESULT_SCHEMA,
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=terminal_run,
        policy="command",
    ),
    ToolSpec(
        "process_start",
        "Start a background process",
        "Start a command in the background; returns a process_id handle for process_read, "
        "process_write, process_signal.",
        _obj({"command": COMMAND, "cwd": PATH, "env": ENV, "stdin": BOOL}, ["command"]),
        _out({"process_id": STR, "running": BOOL}),
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=process_start,
        policy="command",
    ),
    ToolSpec(
        "process_read",
        "Read a background process's output",
        "Output of a background process from a byte offset; pass next_offset back to continue.",
        _obj(
            {
                "process_id": PROCESS_ID,
                "stream": {"enum": ["stdout", "stderr"]},
                "offset": {"type": "integer", "minimum": 0},
                "limit": {"type": "integer", "minimum": 1},
            },
            ["process_id"],
        ),
        _out(
            {
                "data": STR,
                "next_offset": INT,
                "running": BOOL,
                "exit_code": {"type": ["integer", "null"]},
            }
        ),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=process_read,
        policy="none",
    ),
    ToolSpec(
        "process_write",
        "Write to a background process's stdin",
        "Send text to the stdin of a process started with stdin=true.",
        _obj({"process_id": PROCESS_ID, "data": STR}, ["process_id", "data"]),
        _out({"written": INT}),
        read_only=False,
        destructive=False,
        idempotent=False,
        handler=process_write,
        policy="none",
    ),
    ToolSpec(
        "process_signal",
        "Signal a background process",
        "Send a signal (default SIGTERM; SIGKILL kills its whole tree).",
        _obj({"process_id": PROCESS_ID, "signal": STR}, ["process_id"]),
        _out({"process_id": STR, "signalled": BOOL}),
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=process_signal,
        policy="none",
    ),
    ToolSpec(
        "process_list",
        "List background processes",
        "Background processes of the sandbox.",
        _obj({}, []),
        _out({"processes": {"type": "array"}}),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=process_list,
        policy="none",
    ),
    ToolSpec(
        "shell_create",
        "Open a shell session",
        "Open a persistent shell: cd and export carry over between shell_run calls.",
        _obj({"cwd": PATH}, []),
        _out({"session_id": STR}),
        read_only=False,
        destructive=False,
        idempotent=False,
        handler=shell_create,
        policy="none",
    ),
    ToolSpec(
        "shell_run",
        "Run in a shell session",
        "Run a bash command in a shell session (its cwd and environment persist).",
        _obj(
            {"session_id": SESSION_ID, "command": COMMAND, "timeout_ms": TIMEOUT_MS},
            ["session_id", "command"],
        ),
        RESULT_SCHEMA,
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=shell_run,
        policy="command",
    ),
    ToolSpec(
        "shell_close",
        "Close a shell session",
        "Forget a shell session.",
        _obj({"session_id": SESSION_ID}, ["session_id"]),
        _out({"session_id": STR, "closed": BOOL}),
        read_only=False,
        destructive=False,
        idempotent=True,
        handler=shell_close,
        policy="none",
    ),
    ToolSpec(
        "fs_read",
        "Read a file",
        "Read a file (UTF-8 text, or base64 for binary) from an optional byte offset/length.",
        _obj(
            {
                "path": PATH,
                "offset": {"type": "integer", "minimum": 0},
                "length": {"type": "integer", "minimum": 0},
            },
            ["path"],
        ),
        _out(
            {
                "path": STR,
                "content": STR,
                "encoding": {"enum": ["utf-8", "base64"]},
                "size": INT,
                "truncated": BOOL,
            }
        ),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=fs_read,
        policy="fs_read",
        inline=True,
    ),
    ToolSpec(
        "fs_write",
        "Write a file",
        "Create, overwrite or append to a file (parents are created).",
        _obj(
            {
                "path": PATH,
                "content": STR,
                "mode": {"enum": ["overwrite", "append", "create"]},
                "encoding": {"enum": ["utf-8", "base64"]},
            },
            ["path", "content"],
        ),
        _out({"path": STR, "size": INT, "diff": STR}, ["path", "size"]),
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=fs_write,
        policy="fs_write",
    ),
    ToolSpec(
        "fs_edit",
        "Edit a file",
        "Replace an exact string; fails unless it occurs exactly `count` times (default 1).",
        _obj(
            {
                "path": PATH,
                "old": {"type": "string", "minLength": 1},
                "new": STR,
                "count": {"type": "integer", "minimum": 1},
            },
            ["path", "old", "new"],
        ),
        _out({"path": STR, "replacements": INT, "diff": STR}, ["path", "replacements"]),
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=fs_edit,
        policy="fs_write",
    ),
    ToolSpec(
        "fs_list",
        "List a directory",
        "Entries of a directory, optionally recursive (depth).",
        _obj({"path": PATH, "depth": {"type": "integer", "minimum": 1, "maximum": 10}}, []),
        _out({"entries": {"type": "array", "items": FILE_INFO}}),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=fs_list,
        policy="fs_read",
    ),
    ToolSpec(
        "fs_stat",
        "Stat a path",
        "Type, size, mode and mtime of a path.",
        _obj({"path": PATH}, ["path"]),
        FILE_INFO | {"required": ["path", "type", "size"]},
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=fs_stat,
        policy="fs_read",
    ),
    ToolSpec(
        "fs_remove",
        "Remove a path",
        "Remove a file, or a directory with recursive=true.",
        _obj({"path": PATH, "recursive": BOOL}, ["path"]),
        _out({"path": STR, "removed": BOOL}),
        read_only=False,
        destructive=True,
        idempotent=True,
        handler=fs_remove,
        policy="fs_write",
    ),
    ToolSpec(
        "fs_move",
        "Move a path",
        "Move or rename a file or directory.",
        _obj({"path": PATH, "destination": PATH, "overwrite": BOOL}, ["path", "destination"]),
        FILE_INFO | {"required": ["path"]},
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=fs_move,
        policy="fs_write",
    ),
    ToolSpec(
        "fs_mkdir",
        "Make a directory",
        "Create a directory and its parents.",
        _obj({"path": PATH}, ["path"]),
        FILE_INFO | {"required": ["path"]},
        read_only=False,
        destructive=False,
        idempotent=True,
        handler=fs_mkdir,
        policy="fs_write",
    ),
    ToolSpec(
        "browser_open",
        "Open a web page",
        "Open a URL in a headless browser inside the sandbox (its network policy applies to "
        "every request and redirect). Without handle a new page is opened and its handle "
        "returned; with handle that page navigates. Returns the final url, HTTP status, "
        "title and the page's readable text (cut at max_chars, then truncated=true).",
        _obj(
            {
                "url": {"type": "string", "minLength": 1, "maxLength": 8192},
                "handle": BROWSER_HANDLE,
                "max_chars": MAX_CHARS,
            },
            ["url"],
        ),
        _out(
            {
                **PAGE_STATE,
                "status": {"type": ["integer", "null"]},
                "text": STR,
                "truncated": BOOL,
            }
        ),
        read_only=False,
        destructive=False,
        idempotent=False,
        handler=browser_open,
        policy="browser",
        open_world=True,
    ),
    ToolSpec(
        "browser_snapshot",
        "Snapshot a page's elements",
        "A compact accessibility tree of the page: landmarks, headings, links, buttons and "
        "inputs, each with a ref (e12) for browser_click / browser_type / browser_press. "
        "Refs stay valid until the page navigates or changes; then take a new snapshot. "
        "text=true also returns the page's readable text.",
        _obj({"handle": BROWSER_HANDLE, "text": BOOL, "max_chars": MAX_CHARS}, ["handle"]),
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
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=browser_snapshot,
        policy="browser",
    ),
    ToolSpec(
        "browser_click",
        "Click an element",
        "Click the element with this ref (from browser_snapshot). Returns the page's url and "
        "title and whether it navigated.",
        _obj({"handle": BROWSER_HANDLE, "ref": ELEMENT_REF}, ["handle", "ref"]),
        ACTION_RESULT,
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=browser_click,
        policy="browser",
        open_world=True,
    ),
    ToolSpec(
        "browser_type",
        "Type into a field",
        "Replace the value of a text field (or choose a select option by its label) with "
        "text; submit=true then presses Enter.",
        _obj(
            {"handle": BROWSER_HANDLE, "ref": ELEMENT_REF, "text": STR, "submit": BOOL},
            ["handle", "ref", "text"],
        ),
        ACTION_RESULT,
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=browser_type,
        policy="browser",
        open_world=True,
    ),
    ToolSpec(
        "browser_press",
        "Press a key",
        "Press a key or chord (Enter, Tab, ArrowDown, Control+A, ...) on the element with ref, "
        "or on whatever has focus.",
        _obj(
            {
                "handle": BROWSER_HANDLE,
                "key": {"type": "string", "minLength": 1, "maxLength": 64},
                "ref": ELEMENT_REF,
            },
            ["handle", "key"],
        ),
        ACTION_RESULT,
        read_only=False,
        destructive=True,
        idempotent=False,
        handler=browser_press,
        policy="browser",
        open_world=True,
    ),
    ToolSpec(
        "browser_screenshot",
        "Screenshot a page",
        "A PNG of the viewport (full_page=true: the whole page), base64 in png_base64.",
        _obj({"handle": BROWSER_HANDLE, "full_page": BOOL}, ["handle"]),
        _out(
            {
                **PAGE_STATE,
                "mime_type": {"const": "image/png"},
                "width": INT,
                "height": INT,
                "png_base64": STR,
            }
        ),
        read_only=True,
        destructive=False,
        idempotent=True,
        handler=browser_screenshot,
        policy="browser",
    ),
    ToolSpec(
        "browser_close",
        "Close a page",
        "Close the page (its browser context, cookies included). The browser itself stops "
        "with its last page; idle pages close by themselves.",
        _obj({"handle": BROWSER_HANDLE}, ["handle"]),
        _out({"handle": STR, "closed": BOOL}),
        read_only=False,
        destructive=False,
        idempotent=True,
        handler=browser_close,
        policy="browser",
    ),
]

TOOLS_BY_NAME = {t.name: t for t in TOOLS}
