"""The gateway's framing of a VNC viewer's bytes (agentbox.desktop.rfb) and the desktop
actions' argv building (agentbox.desktop.actions): no X server needed."""

from __future__ import annotations

import struct

import pytest

from agentbox.desktop import actions
from agentbox.desktop.rfb import RfbViolation, ViewerStream
from agentbox.errors import InvalidRequest

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x00"  # version, security None, not shared
KEY = struct.pack(">BBxxI", 4, 1, 0x61)
POINTER = struct.pack(">BBHH", 5, 1, 10, 20)
CUT = struct.pack(">BxxxI", 6, 3) + b"abc"
UPDATE = struct.pack(">BBHHHH", 3, 0, 0, 0, 1024, 768)
ENCODINGS = struct.pack(">BxH", 2, 2) + struct.pack(">ii", 0, -239)
RESIZE = struct.pack(">BxHHBx", 251, 800, 600, 1) + bytes(16)
INPUT = KEY + POINTER + CUT + RESIZE


def test_the_handshake_passes_with_the_shared_flag_forced() -> None:
    assert ViewerStream(control=False).feed(HANDSHAKE) == HANDSHAKE[:-1] + b"\x01"
    v33 = ViewerStream(control=False)
    assert v33.feed(b"RFB 003.003\n\x00") == b"RFB 003.003\n\x01"


def test_view_only_drops_every_input_message_and_keeps_the_rest() -> None:
    viewer = ViewerStream(control=False)
    viewer.feed(HANDSHAKE)
    assert viewer.feed(ENCODINGS + INPUT + UPDATE) == ENCODINGS + UPDATE
    assert viewer.dropped == 4


def test_control_passes_input_whole_even_split_byte_by_byte() -> None:
    viewer = ViewerStream(control=True)
    stream = HANDSHAKE + ENCODINGS + INPUT + UPDATE
    out = b"".join(viewer.feed(stream[i : i + 1]) for i in range(len(stream)))
    assert out == HANDSHAKE[:-1] + b"\x01" + ENCODINGS + INPUT + UPDATE


@pytest.mark.parametrize(
    "after_handshake",
    [
        bytes([200]) + bytes(16),  # an unknown message type could hide input
        struct.pack(">BxxxI", 6, 1 << 30),  # a clipboard over the cap
    ],
)
def test_what_cannot_be_framed_ends_the_connection(after_handshake: bytes) -> None:
    viewer = ViewerStream(control=True)
    viewer.feed(HANDSHAKE)
    with pytest.raises(RfbViolation):
        viewer.feed(after_handshake)


@pytest.mark.parametrize("hello", [b"RFB 003.008\n\x02", b"RFB 004.000\n", b"GET / HTTP/1.1\r\n"])
def test_only_security_none_and_known_versions_are_relayed(hello: bytes) -> None:
    with pytest.raises(RfbViolation):
        ViewerStream(control=True).feed(hello)


def test_coordinates_map_from_the_screenshot_onto_the_screen() -> None:
    space = actions.Space(512, 384, 1024, 768)
    assert space.to_screen(256, 192) == (512, 384)
    assert space.to_screen(511, 383) == (1022, 766)
    with pytest.raises(InvalidRequest, match="desktop_screenshot"):
        space.to_screen(512, 0)
    assert actions.fit((1024, 768), 512, None) == (512, 384)
    assert actions.fit((1024, 768), 4000, 300) == (400, 300)
    assert actions.fit((1024, 768), None, None) == (1024, 768)
    # Back from the screen (where the pointer is), and a zoom's region (far edges excluded).
    assert space.from_screen(1023, 767) == (511, 383)
    assert space.region_to_screen(0, 0, 512, 384) == (0, 0, 1024, 768)
    assert space.region_to_screen(10, 10, 11, 11) == (20, 20, 22, 22)
    for bad in ((10, 0, 10, 5), (0, 0, 513, 5), (5, 5, 4, 9)):
        with pytest.raises(InvalidRequest, match="desktop_screenshot"):
            space.region_to_screen(*bad)
    assert actions.zoom_size((200, 100), None, None) == (200, 100)  # full resolution
    assert actions.zoom_size((200, 100), 800, None) == (800, 400)  # larger: to read it
    assert actions.zoom_size((200, 100), 800, 100) == (200, 100)


@pytest.mark.parametrize(
    "keys",
    ["--clearmodifiers", "ctrl+", "a;b", "", " ", "+a", "exec", "a EXEC", "windowKill", "sleep"],
)
def test_key_names_are_names_never_options_nor_xdotool_commands(keys: str) -> None:
    with pytest.raises(InvalidRequest):
        actions.key(keys)
    with pytest.raises(InvalidRequest):
        actions.hold_key(keys, 1)


def test_argvs_end_options_before_text_and_keys() -> None:
    assert actions.key("ctrl+s Return")[-3:] == ["--", "ctrl+s", "Return"]
    assert actions.type_text("-rf /")[-2:] == ["--", "-rf /"]
    assert actions.click(1, 2, "right", 2)[-1] == "3"
    assert actions.scroll(1, 2, "up", 5)[-3:] == ["--repeat", "5", "4"]
    assert actions.hold_key("ctrl+a", 0.5)[1:] == [
        "keydown", "--delay", "0", "--", "ctrl+a", "sleep", "0.5",
        "keyup", "--delay", "0", "--", "ctrl+a",
    ]  # fmt: skip
    assert actions.mouse_down(None, "left")[1:] == ["mousedown", "1", "getmouselocation", "--shell"]
    assert actions.location("X=12\nY=34\nSCREEN=0\nWINDOW=5\n") == (12, 34)
