"""``sb.desktop``: the sandbox's desktop from the SDK, through the same tool actions.

Against a gateway (``AGENTBOX_URL``) each method is a ``POST /v1/tools/desktop_*``: the
gateway's policy, cap and audit apply. In process (no gateway) the actions
(``agentbox.desktop.tools``) run here with a ``DesktopManager`` of this process's own: the
desktop runs inside the sandbox all the same, and ends with it (or ``stop()``).
"""

from __future__ import annotations

import base64
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbox.desktop.manager import DesktopManager
    from agentbox.runtime.runtime import Runtime

_managers: dict[int, DesktopManager] = {}
_lock = threading.Lock()


def _manager(runtime: Runtime) -> DesktopManager:
    from agentbox.desktop.manager import DesktopManager

    with _lock:
        if id(runtime) not in _managers:
            _managers[id(runtime)] = DesktopManager(runtime)
        return _managers[id(runtime)]


class Desktop:
    """Start, look at and drive a sandbox's desktop (coordinates: the last screenshot's)."""

    def __init__(self, backend: Any, sandbox_id: str) -> None:
        self._backend = backend
        self._id = sandbox_id

    def _call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        args = {k: v for k, v in arguments.items() if v is not None}
        client = getattr(self._backend, "client", None)
        if client is not None:  # a gateway
            body = {"arguments": {**args, "sandbox_id": self._id}}
            result: dict[str, Any] = client.request("POST", f"/v1/tools/{tool}", json=body)
            return result
        # In-process: the same action the gateway's handler runs (agentbox.desktop.tools);
        # every defaulted argument is passed by the methods below.
        from agentbox.desktop.tools import ACTIONS, TIMEOUT_S

        return ACTIONS[tool](_manager(self._backend), self._id, args, TIMEOUT_S)

    def start(self, size: str | None = None) -> dict[str, Any]:
        """Start it (``size`` like ``"1024x768"``); a running one is returned as it is."""
        return self._call("desktop_start", size=size)

    def stop(self) -> dict[str, Any]:
        return self._call("desktop_stop")

    def screenshot(self, width: int | None = None, height: int | None = None) -> bytes:
        """A PNG scaled to fit ``width`` x ``height`` (pixels); later coordinates are its."""
        shot = self._call("desktop_screenshot", width=width, height=height)
        return base64.b64decode(shot["png_base64"])

    def click(
        self, x: int, y: int, button: str = "left", double: bool = False, triple: bool = False
    ) -> None:
        self._call("desktop_click", x=x, y=y, button=button, double=double, triple=triple)

    def move(self, x: int, y: int) -> None:
        self._call("desktop_move", x=x, y=y)

    def drag(self, x: int, y: int, to_x: int, to_y: int, button: str = "left") -> None:
        self._call("desktop_drag", x=x, y=y, to_x=to_x, to_y=to_y, button=button)

    def scroll(self, x: int, y: int, direction: str = "down", amount: int = 3) -> None:
        self._call("desktop_scroll", x=x, y=y, direction=direction, amount=amount)

    def type(self, text: str) -> None:
        self._call("desktop_type", text=text)

    def key(self, keys: str) -> None:
        """xdotool key names and chords: ``"Return"``, ``"ctrl+s"``, ``"alt+Tab"``."""
        self._call("desktop_key", key=keys)

    def mouse_down(
        self, x: int | None = None, y: int | None = None, button: str = "left"
    ) -> tuple[int, int]:
        """Press and hold ``button`` (at ``x``, ``y`` or where the pointer is); where."""
        done = self._call("desktop_mouse_down", x=x, y=y, button=button)
        return done["x"], done["y"]

    def mouse_up(
        self, x: int | None = None, y: int | None = None, button: str = "left"
    ) -> tuple[int, int]:
        done = self._call("desktop_mouse_up", x=x, y=y, button=button)
        return done["x"], done["y"]

    def cursor_position(self) -> tuple[int, int]:
        """Where the pointer is, in the last screenshot's pixels."""
        done = self._call("desktop_cursor_position")
        return done["x"], done["y"]

    def hold_key(self, keys: str, duration: float) -> None:
        """Hold ``keys`` (as :meth:`key`) down for ``duration`` seconds, then release them."""
        self._call("desktop_hold_key", key=keys, duration=duration)

    def zoom(
        self, x: int, y: int, to_x: int, to_y: int,
        width: int | None = None, height: int | None = None,
    ) -> bytes:  # fmt: skip
        """A PNG of the region at full resolution (or scaled to fit ``width`` x ``height``)."""
        shot = self._call(
            "desktop_zoom", x=x, y=y, to_x=to_x, to_y=to_y, width=width, height=height
        )
        return base64.b64decode(shot["png_base64"])

    def open(self, command: str | None = None, url: str | None = None) -> None:
        """Start an application on the desktop: a bash ``command``, or ``url`` in Chromium."""
        self._call("desktop_open", command=command, url=url)
