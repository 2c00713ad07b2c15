"""The desktop tools' actions: one function per ``desktop_*`` tool, over a
``DesktopManager``. The gateway's handlers call them after policy, caps and audit; the SDK
(``sb.desktop``) calls them in-process: one behaviour, below both.

``args`` are the tool's arguments with their defaults filled; ``timeout_s`` bounds a
command run inside the sandbox (in seconds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from agentbox.errors import InvalidRequest

if TYPE_CHECKING:
    from agentbox.desktop.manager import DesktopManager

TIMEOUT_S = 30.0  # the most a desktop action waits, whatever the call's own limit

Args = Mapping[str, Any]
Action = Callable[["DesktopManager", str, Args, float], dict[str, Any]]


def start(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.start(sandbox_id, a.get("size"))


def stop(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.stop(sandbox_id)


def screenshot(
    desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float
) -> dict[str, Any]:
    return desktops.screenshot(sandbox_id, a.get("width"), a.get("height"), timeout)


def click(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    clicks = 3 if a["triple"] else 2 if a["double"] else 1
    return desktops.click(sandbox_id, a["x"], a["y"], a["button"], clicks, timeout)


def move(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.move(sandbox_id, a["x"], a["y"], timeout)


def drag(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    start, end = (a["x"], a["y"]), (a["to_x"], a["to_y"])
    return desktops.drag(sandbox_id, start, end, a["button"], timeout)


def scroll(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.scroll(sandbox_id, a["x"], a["y"], a["direction"], a["amount"], timeout)


def type_text(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.type_text(sandbox_id, a["text"], timeout)


def key(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.key(sandbox_id, a["key"], timeout)


def _at(a: Args, tool: str) -> tuple[int, int] | None:
    x, y = a.get("x"), a.get("y")
    if x is None and y is None:
        return None
    if x is None or y is None:
        raise InvalidRequest(f"{tool} takes both x and y, or neither (where the pointer is)")
    return int(x), int(y)


def mouse_down(
    desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float
) -> dict[str, Any]:
    return desktops.mouse_down(sandbox_id, _at(a, "desktop_mouse_down"), a["button"], timeout)


def mouse_up(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.mouse_up(sandbox_id, _at(a, "desktop_mouse_up"), a["button"], timeout)


def cursor_position(
    desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float
) -> dict[str, Any]:
    return desktops.cursor_position(sandbox_id, timeout)


def hold_key(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.hold_key(sandbox_id, a["key"], float(a["duration"]), timeout)


def zoom(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    region = (a["x"], a["y"], a["to_x"], a["to_y"])
    return desktops.zoom(sandbox_id, region, a.get("width"), a.get("height"), timeout)


def open_app(desktops: DesktopManager, sandbox_id: str, a: Args, timeout: float) -> dict[str, Any]:
    return desktops.open(sandbox_id, a.get("command"), a.get("url"))


ACTIONS: dict[str, Action] = {
    "desktop_start": start,
    "desktop_stop": stop,
    "desktop_screenshot": screenshot,
    "desktop_click": click,
    "desktop_move": move,
    "desktop_drag": drag,
    "desktop_scroll": scroll,
    "desktop_type": type_text,
    "desktop_key": key,
    "desktop_mouse_down": mouse_down,
    "desktop_mouse_up": mouse_up,
    "desktop_cursor_position": cursor_position,
    "desktop_hold_key": hold_key,
    "desktop_zoom": zoom,
    "desktop_open": open_app,
}
