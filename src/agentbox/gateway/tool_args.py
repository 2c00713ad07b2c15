"""One pydantic argument model per gateway tool: the single declaration of what a tool
takes.

``input_schema(model)`` is the model's JSON Schema cleaned to what every MCP client
accepts (no ``$defs``/``$ref``, no generated titles, ``additionalProperties: false``,
descriptions kept): it is the tool's MCP ``inputSchema``, the REST route's request body
in the OpenAPI document, and what the gateway validates every call against (one
validator, so a bad argument gets the same typed error through REST and MCP).

Arguments whose default or maximum comes from the gateway's config (``timeout_ms``,
``max_output_bytes``, ...) are declared here with their type; ``tools.render_tools``
writes the configured default, maximum and description over them per gateway.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agentbox.runtime.commands import WORKSPACE


def _absent(schema: dict[str, Any]) -> None:
    """An optional argument without a default: absent means "not given" (``None`` only
    in Python). Its schema shows the value's type alone, as clients expect."""
    schema.pop("default", None)
    branches = [s for s in schema.pop("anyOf", []) if s.get("type") != "null"]
    if len(branches) == 1:
        schema.update({k: v for k, v in branches[0].items() if k not in schema})
    elif branches:
        schema["anyOf"] = branches


def optional(description: str, **extra: Any) -> Any:
    """A ``Field`` for an argument that may be left out (and has no default)."""
    return Field(default=None, description=description, json_schema_extra=_absent, **extra)


class ToolArgs(BaseModel):
    """Every tool takes ``sandbox_id`` (a session token's own sandbox when left out)."""

    model_config = ConfigDict(extra="forbid")

    sandbox_id: str | None = optional(
        "Sandbox to act on. Session tokens may omit it (their own sandbox)."
    )


NonEmpty = Annotated[str, Field(min_length=1)]
# A command line run by bash, or an argv run as is (no shell: what the SDK's list form means).
CommandOrArgv = Annotated[
    NonEmpty | Annotated[list[str], Field(min_length=1)],
    Field(
        description="A bash command line, or an argv list run without a shell "
        '(["python3", "-c", "print(1)"])'
    ),
]
Command = Annotated[str, Field(min_length=1, description="A bash command line")]
Path = Annotated[str, Field(min_length=1, description="Path in the sandbox (relative: /workspace)")]
Cwd = Annotated[
    str,
    Field(min_length=1, description=f"Working directory in the sandbox (relative: to {WORKSPACE})"),
]
Env = Annotated[dict[str, str], Field(description="Environment variables added for this command")]
ProcessId = Annotated[str, Field(description="Handle returned by process_start")]
SessionId = Annotated[str, Field(description="Handle returned by shell_create")]
BROWSER_HANDLE = "^br-[0-9a-f]{12}$"
BrowserHandle = Annotated[
    str, Field(pattern=BROWSER_HANDLE, description="Handle returned by browser_open (one page)")
]
ELEMENT_REF = "^(f[0-9]+)?e[0-9]+$"
ElementRef = Annotated[
    str,
    Field(
        pattern=ELEMENT_REF, description="An element ref from the latest browser_snapshot, e.g. e12"
    ),
]
Cols = Annotated[int, Field(ge=1, le=10_000, description="Columns")]
Rows = Annotated[int, Field(ge=1, le=10_000, description="Rows")]
Coord = Annotated[int, Field(ge=0, le=8191)]
X = Annotated[Coord, Field(description="x in the latest desktop_screenshot's pixels")]
Y = Annotated[Coord, Field(description="y in the latest desktop_screenshot's pixels")]
Button = Literal["left", "right", "middle"]
BUTTON: Any = Field(default="left", description="Mouse button")
# Configured arguments: their default, maximum and description are the gateway's.
TimeoutMs = Annotated[int, Field(ge=1)]
OutputBytes = Annotated[int, Field(ge=0)]
STDIN = "Text fed to the command's stdin, then end of input"
CONFIGURED = 0  # placeholder default of a configured argument; render_tools sets the real one


def flag(default: bool, description: str) -> Any:
    return Field(default=default, description=description)


class PtySize(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cols: Cols
    rows: Rows


# commands, processes, sessions ------------------------------------------------------------
class TerminalRun(ToolArgs):
    command: CommandOrArgv
    cwd: Cwd = WORKSPACE
    timeout_ms: TimeoutMs = CONFIGURED
    max_output_bytes: OutputBytes = CONFIGURED
    stdin: str | None = optional(f"{STDIN} (absent: an empty stdin, watched for prompts)")
    env: Env = {}
    pty: bool = flag(
        False,
        "true: run it on a terminal (programs that check for one behave as for a person); "
        "its output, stderr included, is in stdout",
    )


class ProcessStart(ToolArgs):
    command: CommandOrArgv
    cwd: Cwd = WORKSPACE
    env: Env = {}
    stdin: bool = flag(False, "true: keep its stdin open for process_write")
    pty: PtySize | None = Field(
        default=None,
        description="Run it on a terminal of this size ({cols, rows}); process_write types "
        "into it, process_read's stdout is its screen output",
    )


class OneProcess(ToolArgs):
    """The arguments of a tool that acts on one background process."""

    process_id: ProcessId


class ProcessRead(OneProcess):
    stream: Literal["stdout", "stderr"] = Field(
        default="stdout", description="Which output to read"
    )
    offset: int = Field(
        default=0, ge=0, description="Byte offset in the stream: 0, or the last next_offset"
    )
    limit: Annotated[int, Field(ge=1)] = CONFIGURED


class ProcessWrite(OneProcess):
    data: str = Field(default="", description='Text to send, e.g. "y\\n"')
    eof: bool = flag(False, "true: close its stdin after data (it reads EOF)")


class ProcessResize(OneProcess):
    cols: Cols
    rows: Rows


class ProcessSignal(OneProcess):
    signal: str = Field(
        default="SIGTERM",
        description="A signal name (SIGTERM, SIGINT, SIGKILL, ...) or number",
    )


class ProcessList(ToolArgs):
    pass


class ShellCreate(ToolArgs):
    cwd: Cwd = WORKSPACE
    env: Annotated[dict[str, str], Field(description="Environment variables of the session")] = {}


class ShellRun(ToolArgs):
    session_id: SessionId
    command: Command
    timeout_ms: TimeoutMs = CONFIGURED
    max_output_bytes: OutputBytes = CONFIGURED
    stdin: str | None = optional(f"{STDIN} (absent: an empty stdin)")


class ShellClose(ToolArgs):
    session_id: SessionId


# files ------------------------------------------------------------------------------------
class FsRead(ToolArgs):
    path: Path
    offset: int = Field(default=0, ge=0, description="Byte offset to read from")
    length: Annotated[int, Field(ge=0)] = CONFIGURED


class FsWrite(ToolArgs):
    path: Path
    content: str
    mode: Literal["overwrite", "append", "create"] = Field(
        default="overwrite",
        description="overwrite: replace the file; append: add to its end; create: fail if "
        "it exists",
    )
    encoding: Literal["utf-8", "base64"] = Field(
        default="utf-8", description="How content is written: text, or base64 of bytes"
    )
    perms: int = Field(
        default=0o644,
        ge=0,
        le=0o777,
        description="Permission bits of a file this call creates (420 = 0o644); an existing "
        "file keeps its own",
    )
    make_parents: bool = flag(True, "true: create missing parent directories")


class FsEdit(ToolArgs):
    path: Path
    old: str = Field(min_length=1, description="The exact text to replace, whitespace included")
    new: str = Field(description="The text to put in its place")
    count: int = Field(
        default=1,
        ge=1,
        description="How many times old occurs (and is replaced); the edit fails, changing "
        "nothing, if the file holds another number",
    )


class FsList(ToolArgs):
    path: Path = WORKSPACE
    depth: int = Field(
        default=1,
        ge=1,
        le=10,
        description="Levels to list: 1 the entries themselves, at most 10",
    )


class FsStat(ToolArgs):
    path: Path


class FsRemove(ToolArgs):
    path: Path
    recursive: bool = flag(False, "true: remove a directory and all below it")


class FsMove(ToolArgs):
    path: Path
    destination: Path
    overwrite: bool = flag(False, "true: replace what is at destination")


class FsMkdir(ToolArgs):
    path: Path
    parents: bool = flag(True, "true: create missing parent directories")
    exist_ok: bool = flag(True, "true: an existing directory is no error")


# browser ----------------------------------------------------------------------------------
MaxChars = Annotated[int, Field(ge=1)]


class BrowserOpen(ToolArgs):
    url: Annotated[str, Field(min_length=1, max_length=8192)]
    handle: Annotated[str, Field(pattern=BROWSER_HANDLE)] | None = optional(
        "A page from browser_open to navigate (absent: a new page)"
    )
    max_chars: MaxChars = CONFIGURED


class BrowserSnapshot(ToolArgs):
    handle: BrowserHandle
    text: bool = flag(False, "true: also return the page's readable text")
    max_chars: MaxChars = CONFIGURED


class BrowserClick(ToolArgs):
    handle: BrowserHandle
    ref: ElementRef


class BrowserType(ToolArgs):
    handle: BrowserHandle
    ref: ElementRef
    text: str = Field(description="The field's new value")
    submit: bool = flag(False, "true: press Enter afterwards")


class BrowserPress(ToolArgs):
    handle: BrowserHandle
    key: str = Field(
        min_length=1,
        max_length=64,
        description="A key or chord: Enter, Tab, ArrowDown, Control+A, ...",
    )
    ref: Annotated[str, Field(pattern=ELEMENT_REF)] | None = optional(
        "Element to press it on (absent: focus)"
    )


class BrowserScreenshot(ToolArgs):
    handle: BrowserHandle
    full_page: bool = False


class BrowserClose(ToolArgs):
    handle: BrowserHandle


# desktop ----------------------------------------------------------------------------------
Side = Annotated[int, Field(ge=16, le=8192)]
MAX_HOLD_S = 30.0


class DesktopStart(ToolArgs):
    size: Annotated[str, Field(pattern="^[0-9]{2,4}x[0-9]{2,4}$")] | None = optional(
        "Screen size, e.g. 1280x800 (default: the gateway's)"
    )


class DesktopStop(ToolArgs):
    pass


class DesktopScreenshot(ToolArgs):
    width: Side | None = optional("Maximum width of the PNG (default: the screen's)")
    height: Side | None = optional("Maximum height of the PNG")


class DesktopMove(ToolArgs):
    """A point on the screen; the pointer tools add to it."""

    x: X
    y: Y


class DesktopClick(DesktopMove):
    button: Button = BUTTON
    double: bool = flag(False, "true: double-click")
    triple: bool = flag(False, "true: triple-click (selects a line or paragraph)")


class DesktopDrag(DesktopMove):
    to_x: X
    to_y: Y
    button: Button = BUTTON


class DesktopScroll(DesktopMove):
    direction: Literal["down", "up", "left", "right"] = Field(
        default="down", description="Direction"
    )
    amount: int = Field(default=3, ge=1, le=50, description="Notches of the wheel")


class DesktopType(ToolArgs):
    text: str = Field(
        min_length=1, max_length=4096, description="The text, typed character by character"
    )


class DesktopKey(ToolArgs):
    key: str = Field(
        min_length=1,
        max_length=256,
        description="xdotool key names or chords, space-separated",
    )


class DesktopMouseButton(ToolArgs):
    """Anthropic's left_mouse_down / left_mouse_up: at the pointer, or at (x, y)."""

    x: X | None = optional("Move here first (default: press where the pointer is)")
    y: Y | None = optional("Move here first (with x)")
    button: Button = BUTTON


class DesktopCursorPosition(ToolArgs):
    pass


class DesktopHoldKey(DesktopKey):
    duration: float = Field(
        gt=0, le=MAX_HOLD_S, description=f"Seconds to hold the keys down (up to {MAX_HOLD_S:g})"
    )


class DesktopZoom(ToolArgs):
    """Anthropic's zoom: region [x0, y0, x1, y1] is our x, y, to_x, to_y."""

    x: X
    y: Y
    to_x: Annotated[Coord, Field(description="The region's right edge (excluded)")]
    to_y: Annotated[Coord, Field(description="The region's bottom edge (excluded)")]
    width: Side | None = optional("Scale the region to fit this width (default: full resolution)")
    height: Side | None = optional("Scale the region to fit this height")


class DesktopOpen(ToolArgs):
    command: Annotated[str, Field(min_length=1)] | None = optional("A bash command line")
    url: Annotated[str, Field(min_length=1, max_length=8192)] | None = optional(
        "An http(s) URL to open in Chromium on the desktop"
    )


# the schema -------------------------------------------------------------------------------
def input_schema(model: type[ToolArgs]) -> dict[str, Any]:
    """``model``'s JSON Schema as MCP clients take it: references inlined, the titles
    pydantic generates dropped, ``sandbox_id`` listed last (after the tool's own)."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})
    schema = _clean(raw, defs)
    props = schema["properties"]
    props["sandbox_id"] = props.pop("sandbox_id")
    return {
        "type": "object",
        "properties": props,
        "required": schema.get("required", []),
        "additionalProperties": False,
    }


def _clean(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_clean(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = copy.deepcopy(defs[node["$ref"].rsplit("/", 1)[1]])
        node = target | {k: v for k, v in node.items() if k != "$ref"}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" or (key == "type" and "enum" in node):
            continue  # generated titles; an enum's type (the values say it; as before)
        if key in ("properties", "$defs"):  # names of arguments, not schema keywords
            out[key] = {name: _clean(sub, defs) for name, sub in value.items()}
        elif key == "default":
            out[key] = value
        else:
            out[key] = _clean(value, defs)
    return out


ARGS: dict[str, type[ToolArgs]] = {
    "terminal_run": TerminalRun,
    "process_start": ProcessStart,
    "process_read": ProcessRead,
    "process_write": ProcessWrite,
    "process_resize": ProcessResize,
    "process_signal": ProcessSignal,
    "process_list": ProcessList,
    "shell_create": ShellCreate,
    "shell_run": ShellRun,
    "shell_close": ShellClose,
    "fs_read": FsRead,
    "fs_write": FsWrite,
    "fs_edit": FsEdit,
    "fs_list": FsList,
    "fs_stat": FsStat,
    "fs_remove": FsRemove,
    "fs_move": FsMove,
    "fs_mkdir": FsMkdir,
    "browser_open": BrowserOpen,
    "browser_snapshot": BrowserSnapshot,
    "browser_click": BrowserClick,
    "browser_type": BrowserType,
    "browser_press": BrowserPress,
    "browser_screenshot": BrowserScreenshot,
    "browser_close": BrowserClose,
    "desktop_start": DesktopStart,
    "desktop_stop": DesktopStop,
    "desktop_screenshot": DesktopScreenshot,
    "desktop_click": DesktopClick,
    "desktop_move": DesktopMove,
    "desktop_drag": DesktopDrag,
    "desktop_scroll": DesktopScroll,
    "desktop_type": DesktopType,
    "desktop_key": DesktopKey,
    "desktop_open": DesktopOpen,
    "desktop_mouse_down": DesktopMouseButton,
    "desktop_mouse_up": DesktopMouseButton,
    "desktop_cursor_position": DesktopCursorPosition,
    "desktop_hold_key": DesktopHoldKey,
    "desktop_zoom": DesktopZoom,
}
"""Each tool's argument model, by tool name."""
