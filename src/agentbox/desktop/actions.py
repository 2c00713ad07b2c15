"""What a desktop tool runs inside the sandbox: xdotool argvs and the screenshot program.

Pure functions, no I/O. Coordinates arrive in the *space* of the agent's last screenshot
(the size it asked for) and are mapped here onto the screen's pixels, so an agent that
scales its screenshots down (as Anthropic's computer-use tool advises) clicks where it saw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentbox.errors import InvalidRequest

XDOTOOL = "/usr/bin/xdotool"
PYTHON = "/usr/bin/python3"  # Debian's, with python3-pil: the screenshot program's
BUTTONS = {"left": "1", "middle": "2", "right": "3"}
# X's wheel buttons: what a scroll of one notch is.
WHEEL = {"up": "4", "down": "5", "left": "6", "right": "7"}
# xdotool key names and chords: "Return", "ctrl+s", "alt+Tab", "ctrl+shift+t", several
# separated by spaces. Only names (never an option: argv ends options with "--").
_KEY = re.compile(r"^[A-Za-z0-9_]+(\+[A-Za-z0-9_]+)*$")
MAX_KEYS = 16
TYPE_DELAY_MS = 8  # between typed characters: X clients drop events sent faster
MAX_SIDE = 8192

# Runs in the sandbox with the template's python3 and Debian's python3-pil (XCB grab):
# the screen's pixels never reach a parser on the host, only the PNG it prints.
SCREENSHOT_PY = """\
import io, sys
from PIL import Image, ImageGrab
im = ImageGrab.grab(xdisplay=sys.argv[1])
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


def scroll(x: int, y: int, direction: str, amount: int) -> list[str]:
    if direction not in WHEEL:
        raise InvalidRequest(f"direction must be one of {', '.join(WHEEL)}, got {direction!r}")
    return [*move(x, y), "click", "--repeat", str(amount), WHEEL[direction]]


def type_text(text: str) -> list[str]:
    if "\x00" in text:
        raise InvalidRequest("text must not contain NUL characters")
    return [XDOTOOL, "type", "--delay", str(TYPE_DELAY_MS), "--", text]


def key(keys: str) -> list[str]:
    names = keys.split()
    if not names or len(names) > MAX_KEYS or not all(_KEY.match(n) for n in names):
        raise InvalidRequest(
            f"{keys[:80]!r} is not a key: use xdotool names and chords such as Return, "
            f"Escape, ctrl+s, alt+Tab, ctrl+shift+t (up to {MAX_KEYS}, space-separated)"
        )
    return [XDOTOOL, "key", "--delay", "20", "--", *names]


def geometry(text: str) -> tuple[int, int]:
    """``"1280x800"`` as (1280, 800)."""
    w, sep, h = text.partition("x")
    if not sep or not w.isdigit() or not h.isdigit():
        raise InvalidRequest(f"a screen size looks like 1280x800, got {text!r}")
    size = int(w), int(h)
    if not all(64 <= v <= MAX_SIDE for v in size):
        raise InvalidRequest(f"each side of the screen must be 64-{MAX_SIDE} pixels, got {text}")
    return size
