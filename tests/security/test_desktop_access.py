"""Desktop mode: who may watch a sandbox's desktop, and that watching never drives it.

Covers: a session token of another sandbox, a token of this sandbox without
``desktop_view``, a revoked token, and a view-only token asking for control are refused
before the handshake, whether the token comes in the Authorization header or as the
browser's ``agentbox.bearer.`` subprotocol. A view-only viewer speaking raw RFB sends
input in every spelling the protocol has (KeyEvent, PointerEvent with buttons pressed,
ClientCutText, SetDesktopSize; one message per WebSocket frame, many in one frame, and
split byte by byte across frames): the page on the desktop records none of it, while the
same bytes from a ``desktop_control`` viewer do reach it (so the test's input is real).
A message type the gateway does not frame ends the connection rather than pass. The
agent's key tools (desktop_key, desktop_hold_key) refuse any word xdotool would take as
one of its commands (exec, windowkill, ...), so a key never runs a program.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import pytest

from agentbox.audit.log import read_records
from agentbox.client import vnc_forward
from gateway_harness import RunningGateway, running_gateway
from hostres import wait_for
from vnckit import handshake_status

# A full-screen button that appends to clicked.txt, and a key logger writing keys.txt.
APP = """\
import tkinter as tk
root = tk.Tk()
root.geometry("%dx%d+0+0" % (root.winfo_screenwidth(), root.winfo_screenheight()))
def pressed():
    with open("/workspace/clicked.txt", "a") as f:
        f.write("clicked\\n")
def key(event):
    with open("/workspace/keys.txt", "a") as f:
        f.write(event.keysym + "\\n")
button = tk.Button(root, text="Press", command=pressed)
button.place(x=0, y=0, relwidth=1, relheight=1)
root.bind_all("<Key>", key)
root.after(200, lambda: open("/workspace/ready.txt", "w").write("ready"))
root.mainloop()
"""
DESKTOP_YAML = """
sandbox:
  template: default
  desktop:
    max_running: 2
"""
KEY_A = 0x61  # keysym "a"


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("desktop-sec")
    with running_gateway(agentbox_home, tmp, extra_yaml=DESKTOP_YAML) as gateway:
        yield gateway


def _tool(gw: RunningGateway, sandbox: str, tool: str, **arguments: Any) -> httpx2.Response:
    with gw.operator() as op:
        return op.post(
            f"/v1/tools/{tool}", json={"arguments": {**arguments, "sandbox_id": sandbox}}
        )


def _count(gw: RunningGateway, sandbox: str, name: str, word: str) -> int:
    r = _tool(gw, sandbox, "fs_read", path=f"/workspace/{name}")
    return 0 if r.status_code == 404 else str(r.json()["content"]).split().count(word)


@pytest.fixture(scope="module")
def page(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "1GiB", "disk": "512MiB", "desktop": True})
        assert r.status_code == 201, r.text
        sandbox = str(r.json()["id"])
    try:
        assert (
            _tool(gw, sandbox, "fs_write", path="/workspace/app.py", content=APP).status_code == 200
        )
        r = _tool(gw, sandbox, "desktop_open", command="python3 /workspace/app.py")
        assert r.status_code == 200, r.text
        wait_for(lambda: _tool(gw, sandbox, "fs_read", path="/workspace/ready.txt").status_code
                 == 200, 60, "the Tk page")  # fmt: skip
        yield sandbox
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{sandbox}")


def _issue(gw: RunningGateway, sandbox: str, tools: list[str] | None = None) -> tuple[str, str]:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox, "tools": tools})
        assert r.status_code == 201, r.text
        return str(r.json()["token"]), str(r.json().get("id") or r.json().get("token_id"))


def test_tokens_that_may_not_watch_this_desktop_are_refused_in_every_spelling(
    gw: RunningGateway, page: str
) -> None:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "64MiB"})
        other = str(r.json()["id"])
    try:
        foreign, _ = _issue(gw, other)  # every tool, but another sandbox's
        no_view, _ = _issue(gw, page, ["terminal_run", "desktop_screenshot"])
        viewer, _ = _issue(gw, page, ["desktop_view"])
        revoked, revoked_id = _issue(gw, page, ["desktop_view", "desktop_control"])
        with gw.operator() as op:
            assert op.delete(f"/v1/tokens/{revoked_id}").status_code in (200, 204)
        view = vnc_forward.vnc_url(gw.url, page, False)
        control = vnc_forward.vnc_url(gw.url, page, True)
        for how in ("header", "subprotocol"):
            for token, url in ((foreign, view), (foreign, control), (no_view, view),
                               (viewer, control), (revoked, view), ("not-a-token", view)):  # fmt: skip
                status = asyncio.run(handshake_status(url, token, how=how))
                assert status in (401, 403), (how, token[:8], url)
            # the probe itself works
            assert asyncio.run(handshake_status(view, viewer, how=how)) == 101
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{other}")


class RawViewer:
    """An RFB client written out by hand: exactly the bytes a test chooses, framed as it
    chooses, over the gateway's WebSocket."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.buf = bytearray()

    async def read(self, n: int) -> bytes:
        while len(self.buf) < n:
            message = await asyncio.wait_for(self.ws.receive(), 30)
            if message.type != aiohttp.WSMsgType.BINARY:
                raise ConnectionError(f"the relay ended: {message.type} {message.data!r}")
            self.buf += message.data
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    async def handshake(self) -> tuple[int, int]:
        assert (await self.read(12)).startswith(b"RFB 003.")
        await self.ws.send_bytes(b"RFB 003.008\n")
        count = (await self.read(1))[0]
        if count == 0:  # the server refused: its reason follows
            (length,) = struct.unpack(">I", await self.read(4))
            raise ConnectionRefusedError((await self.read(length)).decode(errors="replace"))
        assert 1 in await self.read(count)
        await self.ws.send_bytes(b"\x01")
        assert await self.read(4) == b"\0\0\0\0"
        await self.ws.send_bytes(b"\x01")  # ClientInit: shared
        width, height = struct.unpack(">HH", await self.read(4))
        await self.read(16)
        (name_length,) = struct.unpack(">I", await self.read(4))
        await self.read(name_length)
        return width, height

    async def round_trip(self) -> None:
        """An update request answered: everything sent before it has been handled."""
        await self.ws.send_bytes(struct.pack(">BBHHHH", 3, 0, 0, 0, 8, 8))
        while True:
            kind = (await self.read(1))[0]
            if kind == 0:  # FramebufferUpdate: drain it (raw encoding after SetEncodings)
                _, count = struct.unpack(">BH", await self.read(3))
                for _ in range(count):
                    _, _, w, h, encoding = struct.unpack(">HHHHi", await self.read(12))
                    assert encoding == 0, encoding
                    await self.read(w * h * 4)
                return
            raise AssertionError(f"unexpected server message {kind}")


def _input_messages(x: int, y: int) -> list[bytes]:
    return [
        struct.pack(">BBHH", 5, 0, x, y),  # PointerEvent: move
        struct.pack(">BBHH", 5, 1, x, y),  # button 1 down
        struct.pack(">BBHH", 5, 0, x, y),  # button up: a click
        struct.pack(">BBHI", 4, 1, 0, KEY_A),  # KeyEvent down "a"
        struct.pack(">BBHI", 4, 0, 0, KEY_A),  # up
        struct.pack(">BxxxI", 6, 5) + b"hello",  # ClientCutText
    ]


async def _send_input(gw: RunningGateway, sandbox: str, token: str, control: bool) -> int:
    """Send every input spelling; returns how many messages went out."""
    url = vnc_forward.vnc_url(gw.url, sandbox, control)
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, headers={"Authorization": f"Bearer {token}"}) as ws,
    ):
        viewer = RawViewer(ws)
        width, height = await viewer.handshake()
        # 32-bit pixels, raw encoding only: updates are simple to drain.
        await ws.send_bytes(struct.pack(">Bxxx", 0) + bytes([32, 24, 0, 1]) +
                            struct.pack(">HHHBBB", 255, 255, 255, 16, 8, 0) + b"\0\0\0")  # fmt: skip
        await ws.send_bytes(struct.pack(">BxHi", 2, 1, 0))
        messages = _input_messages(width // 2, height // 2)
        for message in messages:  # one message per frame
            await ws.send_bytes(message)
        await ws.send_bytes(b"".join(messages))  # all in one frame
        for byte in b"".join(messages):  # split byte by byte
            await ws.send_bytes(bytes([byte]))
        resize = struct.pack(">BxHHBx", 251, width, height, 1) + struct.pack(
            ">IHHHHI", 0, 0, 0, width, height, 0
        )
        if not control:  # Xvnc ends a session that resizes without having said it can
            await ws.send_bytes(resize)  # SetDesktopSize
        await viewer.round_trip()
        return 3 * len(messages) + (not control)


def test_a_view_only_viewer_never_drives_the_desktop(gw: RunningGateway, page: str) -> None:
    viewer, viewer_id = _issue(gw, page, ["desktop_view"])
    clicks, keys = _count(gw, page, "clicked.txt", "clicked"), _count(gw, page, "keys.txt", "a")
    sent = asyncio.run(_send_input(gw, page, viewer, control=False))
    # Every input message was framed as such and dropped, whatever its framing.
    ended = wait_for(
        lambda: [r for r in _audit(gw, page, "desktop_view_ended") if r["session"] == viewer_id],
        30,
        "the view's end",
    )
    assert [r["input_dropped"] for r in ended] == [sent] and sent == 19
    assert (_count(gw, page, "clicked.txt", "clicked"), _count(gw, page, "keys.txt", "a")) == (
        clicks,
        keys,
    )
    # The same bytes from a viewer allowed to drive it reach the page: the input is real.
    # (Sent again while the page has seen none: on a loaded host its window may still be
    # settling when the first arrive.)
    driver, _ = _issue(gw, page, ["desktop_view", "desktop_control"])

    def reached() -> bool:
        return (_count(gw, page, "clicked.txt", "clicked") > clicks
                and _count(gw, page, "keys.txt", "a") > keys)  # fmt: skip

    for _ in range(6):
        asyncio.run(_send_input(gw, page, driver, control=True))
        with contextlib.suppress(AssertionError):
            wait_for(reached, 10, "a click and a key from the driver")
            break
    assert reached()


def _audit(gw: RunningGateway, sandbox: str, decision: str) -> list[dict[str, Any]]:
    return [
        r for r in read_records(gw.audit_path, limit=None)
        if r["sandbox"] == sandbox and r["decision"] == decision
    ]  # fmt: skip


@pytest.mark.parametrize("kind", [1, 7, 9, 127, 250, 252, 253, 255])
def test_a_message_the_gateway_does_not_frame_ends_the_connection(
    gw: RunningGateway, page: str, kind: int
) -> None:
    viewer, _ = _issue(gw, page, ["desktop_view"])

    async def probe() -> str:
        url = vnc_forward.vnc_url(gw.url, page, False)
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(url, headers={"Authorization": f"Bearer {viewer}"}) as ws,
        ):
            raw = RawViewer(ws)
            await raw.handshake()
            # An unknown type, then a key press: were the unknown one skipped, the key
            # would be framed from its bytes.
            await ws.send_bytes(bytes([kind, 0, 0, 0]) + struct.pack(">BBHI", 4, 1, 0, KEY_A))
            try:
                await raw.round_trip()
            except ConnectionError as e:
                return str(e)
            return "still open"

    assert asyncio.run(probe()) != "still open"


@pytest.mark.parametrize(
    ("tool", "keys"),
    [
        ("desktop_key", "exec touch pwned"),
        ("desktop_key", "a EXEC touch pwned"),  # xdotool compares its names case-blind
        ("desktop_key", "Return sleep 1 Exec touch pwned"),
        ("desktop_hold_key", "exec touch pwned"),
        ("desktop_hold_key", "shift windowkill"),
    ],
)
def test_a_key_named_like_an_xdotool_command_never_runs_it(
    gw: RunningGateway, page: str, tool: str, keys: str
) -> None:
    """xdotool chains commands in one argv: a "key" called exec would start a program in
    the sandbox (past the command policy), windowkill would close the page. Any word
    that names an xdotool command is refused, in every case and position."""
    extra = {"duration": 0.1} if tool == "desktop_hold_key" else {}
    r = _tool(gw, page, tool, key=keys, **extra)
    assert r.status_code == 400, r.text
    assert "xdotool" in r.json()["error"]["message"]
    ran = _tool(gw, page, "terminal_run", command="ls /tmp /workspace")
    assert "pwned" not in ran.json()["stdout"]
    assert _tool(gw, page, "desktop_screenshot").status_code == 200  # the desktop is still up
