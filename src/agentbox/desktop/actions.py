"""What a desktop tool runs inside the sandbox: xdotool argvs and the screenshot program.

Pure functions, no I/O. Coordinates arrive in the *space* of the agent's last screenshot
(the size it asked for) and are mapped here onto the screen's pixels, so an agent that
scales its screenshots down (as Anthropic's computer-use tool advises) clicks where it saw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentbox.errors import InvalidRequest, SandboxError

XDOTOOL = "/usr/bin/xdotool"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-pil: the screenshot program's
BUTTONS = {"left": "1", "middle": "2", "right": "3"}
# X's wheel buttons: what a scroll of one notch is.
WHEEL = {"up": "4", "down": "5", "left": "6", "right": "7"}
# xdotool key names and chords: "Return", "ctrl+s", "alt+Tab", "ctrl+shift+t", several
# separated by spaces. Only names (never an option: argv ends options with "--").
_KEY = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$")
MAX_KEYS = 16
# xdotool chains commands: in any argv it takes a word that names one of its commands
# (compared case-insensitively, even after "--") as the start of that command, so a "key"
# named exec would run a program past the command policy. No key is named like these.
XDOTOOL_COMMANDS = frozenset([
    "behave", "behave_screen_edge", "click", "exec", "get_desktop", "get_desktop_for_window",
    "get_desktop_viewport", "get_num_desktops", "getactivewindow", "getdisplaygeometry",
    "getmouselocation", "getwindowfocus", "getwindowgeometry", "getwindowname", "getwindowpid",
    "help", "key", "keydown", "keyup", "mousedown", "mousemove", "mousemove_relative",
    "mouseup", "search", "selectwindow", "set_desktop", "set_desktop_for_window",
    "set_desktop_viewport", "set_num_desktops", "set_window", "sleep", "type", "version",
    "windowactivate", "windowclose", "windowfocus", "windowkill", "windowmap", "windowminimize",
    "windowmove", "windowraise", "windowreparent", "windowsize", "windowunmap",
])  # fmt: skip
TYPE_DELAY_MS = 8  # between typed characters: X clients drop events sent faster
MAX_SIDE = 8192

# Runs in the sandbox with the template's python3 and Debian's python3-pil (XCB grab):
# the screen's pixels never reach a parser on the host, only the PNG it prints.
SCREENSHOT_PY = """\
import io, sys
from PIL import Image, ImageGrab
# A zoom passes the region (left, top, right, bottom) in the screen's pixels.
bbox = tuple(int(v) for v in sys.argv[4:8]) or None
im = ImageGrab.grab(bbox=bbox, xdisplay=sys.argv[1])
size = (int(sys.argv[2]), int(sys.argv[3]))
if size != im.size:
    im = im.resize(size, Image.BILINEAR)
out = io.BytesIO()
im.save(out, "PNG", compress_level=1)
sys.stdout.buffer.write(out.getvalue())
"""


@dataclass(frozen=True)
class Space:
    """The coordinate space of the last screenshot an agent took, over the screen's."""

    width: int
    height: int
    screen_width: int
    screen_height: int

    def to_screen(self, x: int, y: int) -> tuple[int, int]:
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise InvalidRequest(
                f"({x}, {y}) is outside the screenshot's {self.width}x{self.height}; "
                "use coordinates from the latest desktop_screenshot"
            )
        sx = min(self.screen_width - 1, round(x * self.screen_width / self.width))
        sy = min(self.screen_height - 1, round(y * self.screen_height / self.height))
        return sx, sy

    def from_screen(self, sx: int, sy: int) -> tuple[int, int]:
        """A point of the screen in this space (where the pointer is, for the agent)."""
        x = min(self.width - 1, round(sx * self.width / self.screen_width))
        y = min(self.height - 1, round(sy * self.height / self.screen_height))
        return x, y

    def region_to_screen(self, x0: int, y0: int, x1: int, y1: int) -> tuple[int, int, int, int]:
        """The rectangle from (x0, y0) to (x1, y1) (its far edge excluded, so a region may
        end at the screenshot's width and height) in the screen's pixels, at least one."""
        if not (0 <= x0 < x1 <= self.width and 0 <= y0 < y1 <= self.height):
            raise InvalidRequest(
                f"the region ({x0}, {y0})-({x1}, {y1}) is not a rectangle inside the "
                f"screenshot's {self.width}x{self.height}: x < to_x <= width, y < to_y <= "
                "height, in the latest desktop_screenshot's pixels"
            )
        sx0, sy0 = self.to_screen(x0, y0)
        sx1 = max(sx0 + 1, min(self.screen_width, round(x1 * self.screen_width / self.width)))
        sy1 = max(sy0 + 1, min(self.screen_height, round(y1 * self.screen_height / self.height)))
        return sx0, sy0, sx1, sy1


def fit(screen: tuple[int, int], width: int | None, height: int | None) -> tuple[int, int]:
    """The size a screenshot is scaled to: within ``width`` x ``height`` (either may be
    absent), the screen's aspect ratio kept, never larger than the screen."""
    sw, sh = screen
    scale = 1.0
    if width is not None:
        scale = min(scale, width / sw)
    if height is not None:
        scale = min(scale, height / sh)
    return max(1, round(sw * scale)), max(1, round(sh * scale))


def zoom_size(region: tuple[int, int], width: int | None, height: int | None) -> tuple[int, int]:
    """A zoom's size: the region at full resolution (the screen's pixels), or scaled to
    fit ``width`` x ``height`` (aspect kept), larger too: a zoom is for reading small text."""
    rw, rh = region
    if width is None and height is None:
        return rw, rh
    scale = min(width / rw if width is not None else float("inf"),
                height / rh if height is not None else float("inf"))  # fmt: skip
    return max(1, min(MAX_SIDE, round(rw * scale))), max(1, min(MAX_SIDE, round(rh * scale)))


def button(name: str) -> str:
    if name not in BUTTONS:
        raise InvalidRequest(f"button must be one of {', '.join(BUTTONS)}, got {name!r}")
    return BUTTONS[name]


def move(x: int, y: int) -> list[str]:
    # Never --sync: it waits for a motion event, and a move to where the pointer already
    # is makes none (xdotool then hangs until the call's timeout).
    return [XDOTOOL, "mousemove", str(x), str(y)]


def click(x: int, y: int, which: str, clicks: int) -> list[str]:
    return [*move(x, y), "click", "--repeat", str(clicks), "--delay", "80", button(which)]


def drag(start: tuple[int, int], end: tuple[int, int], which: str) -> list[str]:
    b = button(which)
    return [
        *move(*start), "mousedown", b,
        "mousemove", str(end[0]), str(end[1]), "mouseup", b,
    ]  # fmt: skip


def mouse_down(at: tuple[int, int] | None, which: str) -> list[str]:
    """Press (and hold) a button, at ``at`` or where the pointer is; prints where."""
    first = move(*at) if at is not None else [XDOTOOL]
    return [*first, "mousedown", button(which), *LOCATION[1:]]


def mouse_up(at: tuple[int, int] | None, which: str) -> list[str]:
    first = move(*at) if at is not None else [XDOTOOL]
    return [*first, "mouseup", button(which), *LOCATION[1:]]


# Prints X=..., Y=... (the pointer's place on the screen); chained after an action too.
LOCATION = [XDOTOOL, "getmouselocation", "--shell"]


def location(output: str) -> tuple[int, int]:
    """The pointer's (x, y) from getmouselocation --shell's output."""
    values = dict(line.partition("=")[::2] for line in output.splitlines())
    try:
        return int(values["X"]), int(values["Y"])
    except (KeyError, ValueError):
        raise SandboxError(f"xdotool did not say where the pointer is: {output[:200]!r}") from None


def scroll(x: int, y: int, direction: str, amount: int) -> list[str]:
    if direction not in WHEEL:
        raise InvalidRequest(f"direction must be one of {', '.join(WHEEL)}, got {direction!r}")
    return [*move(x, y), "click", "--repeat", str(amount), WHEEL[direction]]


def type_text(text: str) -> list[str]:
    if "\x00" in text:
        raise InvalidRequest("text must not contain NUL characters")
    return [XDOTOOL, "type", "--delay", str(TYPE_DELAY_MS), "--", text]


def key(keys: str) -> list[str]:
    return [XDOTOOL, "key", "--delay", "20", "--", *_names(keys)]


def hold_key(keys: str, duration_s: float) -> list[str]:
    """Press ``keys`` (chords: all their keys), hold them ``duration_s``, release them: one
    xdotool run, so the release never depends on a second call arriving."""
    names = _names(keys)
    return [
        XDOTOOL, "keydown", "--delay", "0", "--", *names,
        "sleep", f"{duration_s:g}",
        "keyup", "--delay", "0", "--", *reversed(names),
    ]  # fmt: skip


def _names(keys: str) -> list[str]:
    names = keys.split()
    if (
        not names
        or len(names) > MAX_KEYS
        or not all(_KEY.match(n) and n.lower() not in XDOTOOL_COMMANDS for n in names)
    ):
        raise InvalidRequest(
            f"{keys[:80]!r} is not a key: use xdotool names and chords such as Return, "
            f"Escape, ctrl+s, alt+Tab, ctrl+shift+t (up to {MAX_KEYS}, space-separated)"
        )
    return names


def geometry(text: str) -> tuple[int, int]:
    """``"1280x800"`` as (1280, 800)."""
    w, sep, h = text.partition("x")
    if not sep or not w.isdigit() or not h.isdigit():
        raise InvalidRequest(f"a screen size looks like 1280x800, got {text!r}")
    size = int(w), int(h)
    if not all(64 <= v <= MAX_SIDE for v in size):
        raise InvalidRequest(f"each side of the screen must be 64-{MAX_SIDE} pixels, got {text}")
    return size
