"""Desktop mode end to end: a real gateway over HTTP, real sandboxes, TigerVNC's Xvnc and
openbox inside them, a Tk page on the desktop that records its own clicks in /workspace.

The agent's side (desktop_* tools): the screenshot decodes and shows the page, a click in
a *scaled* screenshot's coordinates presses the button (the page's record and its pixels
both say so), the command policy applies to desktop_open, the per-host cap holds.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from PIL import Image

from agentbox.audit.log import read_records
from agentbox.client import vnc_forward
from gateway_harness import AGENTBOX, RunningGateway, running_gateway
from hostres import wait_for
from vnckit import handshake_status

# A full-screen button: red, green after a press, red after the next...; each press appends
# to a file, and
# each key pressed in its window is written to another.
APP = """\
import tkinter as tk

root = tk.Tk()
root.title("agentbox-desktop-test")
# The screen's size (the window manager's frame adds a title bar; the middle is ours).
root.geometry("%dx%d+0+0" % (root.winfo_screenwidth(), root.winfo_screenheight()))


presses = 0


def pressed():
    global presses
    presses += 1
    with open("/workspace/clicked.txt", "a") as f:
        f.write("clicked\\n")
    color = "#00c000" if presses % 2 else "#e00000"  # each press flips the colour
    button.configure(bg=color, activebackground=color)


button = tk.Button(root, text="Press", command=pressed, bg="#e00000",
                   activebackground="#e00000", relief="flat", bd=0, highlightthickness=0)
button.place(x=0, y=0, relwidth=1, relheight=1)


def key(event):
    with open("/workspace/keys.txt", "a") as f:
        f.write(event.keysym + "\\n")
    held(event, "down")


def held(event, what):  # each key's press and release, with the X server's time (ms)
    with open("/workspace/held.txt", "a") as f:
        f.write("%s %s %d\\n" % (what, event.keysym, event.time))


def pointer(what):  # the left button's press, motion while pressed, release (screen px)
    def record(event):
        with open("/workspace/pointer.txt", "a") as f:
            f.write("%s %d %d\\n" % (what, event.x_root, event.y_root))
    return record


root.bind_all("<Key>", key)
root.bind_all("<KeyRelease>", lambda event: held(event, "up"))
root.bind_all("<ButtonPress-1>", pointer("press"))
root.bind_all("<B1-Motion>", pointer("motion"))
root.bind_all("<ButtonRelease-1>", pointer("release"))
root.mainloop()
"""
DESKTOP_YAML = """
sandbox:
  template: default
  desktop:
    max_running: 1
"""


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    for program in ("/usr/bin/Xvnc", "/usr/bin/openbox", "/usr/bin/xdotool"):
        if not Path(program).exists():
            pytest.fail(f"{program} is missing: run scripts/install.sh (it installs desktops)")
    tmp = tmp_path_factory.mktemp("desktop-gw")
    with running_gateway(agentbox_home, tmp, extra_yaml=DESKTOP_YAML) as gateway:
        yield gateway


def create(gw: RunningGateway, **extra: Any) -> str:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "1GiB", "disk": "512MiB", **extra})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def destroy(gw: RunningGateway, sandbox: str) -> None:
    with gw.operator() as op:
        op.delete(f"/v1/sandboxes/{sandbox}")


@pytest.fixture(scope="module")
def box(gw: RunningGateway) -> Iterator[str]:
    sandbox = create(gw, desktop=True)
    try:
        yield sandbox
    finally:
        destroy(gw, sandbox)


def call(gw: RunningGateway, sandbox: str, tool: str, **arguments: Any) -> httpx2.Response:
    with gw.operator() as c:
        return c.post(f"/v1/tools/{tool}", json={"arguments": {**arguments, "sandbox_id": sandbox}})


def ok(gw: RunningGateway, sandbox: str, tool: str, **arguments: Any) -> dict[str, Any]:
    r = call(gw, sandbox, tool, **arguments)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def screenshot(gw: RunningGateway, sandbox: str, **size: int) -> Image.Image:
    shot = ok(gw, sandbox, "desktop_screenshot", **size)
    image = Image.open(io.BytesIO(base64.b64decode(shot["png_base64"])))
    assert image.format == "PNG" and image.size == (shot["width"], shot["height"])
    return image.convert("RGB")


def is_red(px: tuple[int, ...]) -> bool:
    return px[0] > 100 and px[1] < 40 and px[2] < 40


def is_green(px: tuple[int, ...]) -> bool:
    return px[1] > 90 and px[0] < 40 and px[2] < 40


def clicks(gw: RunningGateway, sandbox: str) -> int:
    r = call(gw, sandbox, "fs_read", path="/workspace/clicked.txt")
    if r.status_code == 404:
        return 0
    assert r.status_code == 200, r.text
    return str(r.json()["content"]).count("clicked")


@pytest.fixture(scope="module")
def page(gw: RunningGateway, box: str) -> str:
    """The Tk page, open and drawn on ``box``'s desktop."""
    ok(gw, box, "fs_write", path="/workspace/app.py", content=APP)
    ok(gw, box, "desktop_open", command="python3 /workspace/app.py")
    wait_for(lambda: is_red(screenshot(gw, box, width=256).getpixel((128, 96))), 60,
             "the Tk page to be drawn red")  # fmt: skip
    return box


def test_create_with_desktop_starts_it_inside_the_sandbox(gw: RunningGateway, box: str) -> None:
    status = ok(gw, box, "desktop_start")
    assert status["running"] is True and status["started"] is False  # create started it
    assert (status["width"], status["height"]) == (1024, 768) and status["display"] == ":1"
    assert status["memory_bytes"] > 1024 * 1024  # Xvnc and openbox, measured (PSS)
    # Xvnc runs as the sandbox's user, in its pid namespace: the sandbox's ps sees it.
    ps = ok(gw, box, "terminal_run", command="cat /proc/[0-9]*/comm")["stdout"].split()
    assert "Xvnc" in ps and "openbox" in ps


def test_the_screenshot_decodes_and_shows_the_page_at_the_size_asked(
    gw: RunningGateway, page: str
) -> None:
    full = screenshot(gw, page)
    assert full.size == (1024, 768) and is_red(full.getpixel((512, 384)))
    small = ok(gw, page, "desktop_screenshot", width=512)
    assert (small["width"], small["height"]) == (512, 384)  # the aspect ratio kept
    assert (small["screen_width"], small["screen_height"]) == (1024, 768)


def test_a_click_in_scaled_coordinates_presses_the_button(gw: RunningGateway, page: str) -> None:
    before = clicks(gw, page)
    screenshot(gw, page, width=256)  # the agent's coordinates are this 256x192 image's
    done = ok(gw, page, "desktop_click", x=128, y=96)
    assert done == {"done": True, "x": 128, "y": 96, "space": "256x192"}
    wait_for(lambda: clicks(gw, page) == before + 1, 30, "the page to record the click")
    wait_for(lambda: is_green(screenshot(gw, page, width=256).getpixel((128, 96))), 30,
             "the button to turn green")  # fmt: skip
    # Anthropic's double_click and triple_click: one call, that many presses recorded.
    ok(gw, page, "desktop_click", x=128, y=96, triple=True)
    wait_for(lambda: clicks(gw, page) == before + 4, 30, "the page to record a triple click")
    outside = call(gw, page, "desktop_click", x=300, y=96)  # beyond the 256 px screenshot
    assert outside.status_code == 400 and "desktop_screenshot" in outside.json()["error"]["message"]


def test_an_mcp_client_gets_the_screenshot_as_an_image_and_clicks_in_its_space(
    gw: RunningGateway, page: str
) -> None:
    """A real MCP client (the official SDK over Streamable HTTP) with the sandbox's session
    token: the screenshot is an image block of its own (PNG, at the size asked), and a
    click in that image's coordinates presses the button."""
    import anyio
    import mcp_types as types
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    token = issue(gw, page)
    before = clicks(gw, page)

    async def main() -> tuple[bytes, dict[str, Any]]:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=120) as http,
            Client(streamable_http_client(f"{gw.url}/mcp", http_client=http)) as client,
        ):
            listed = {t.name for t in (await client.list_tools()).tools}
            assert {"desktop_screenshot", "desktop_click", "desktop_move", "desktop_drag",
                    "desktop_scroll", "desktop_type", "desktop_key", "desktop_open",
                    "desktop_mouse_down", "desktop_mouse_up", "desktop_cursor_position",
                    "desktop_hold_key", "desktop_zoom"} <= listed  # fmt: skip
            zoom = await client.call_tool(
                "desktop_zoom", {"x": 0, "y": 0, "to_x": 64, "to_y": 48, "width": 128}
            )
            assert not zoom.is_error, zoom.content
            zoomed = [c for c in zoom.content if isinstance(c, types.ImageContent)]
            assert len(zoomed) == 1 and zoomed[0].mime_type == "image/png"
            size = Image.open(io.BytesIO(base64.b64decode(zoomed[0].data))).size
            assert size == (128, 96)
            shot = await client.call_tool("desktop_screenshot", {"width": 256})
            assert not shot.is_error, shot.content
            images = [c for c in shot.content if isinstance(c, types.ImageContent)]
            assert len(images) == 1 and images[0].mime_type == "image/png"
            assert "png_base64" not in shot.content[0].text  # type: ignore[union-attr]
            click = await client.call_tool("desktop_click", {"x": 128, "y": 96})
            assert not click.is_error, click.content
            return base64.b64decode(images[0].data), dict(click.structured_content or {})

    png, click = anyio.run(main)
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.size == (256, 192)
    pixel = image.convert("RGB").getpixel((128, 96))
    assert is_red(pixel) or is_green(pixel)  # the page's button, at the image's centre
    assert click["space"] == "256x192"
    wait_for(lambda: clicks(gw, page) == before + 1, 30, "the page to record the MCP click")


def keys(gw: RunningGateway, sandbox: str) -> list[str]:
    r = call(gw, sandbox, "fs_read", path="/workspace/keys.txt")
    return str(r.json()["content"]).split() if r.status_code == 200 else []


def test_keys_and_typing_reach_the_focused_window(gw: RunningGateway, page: str) -> None:
    screenshot(gw, page)  # full size: coordinates are the screen's again
    ok(gw, page, "desktop_move", x=512, y=384)
    ok(gw, page, "desktop_key", key="ctrl+a Return")
    assert ok(gw, page, "desktop_type", text="hi")["characters"] == 2
    want = ["Control_L", "a", "Return", "h", "i"]
    wait_for(lambda: keys(gw, page)[-5:] == want, 30, "the page to record the keys")
    bad = call(gw, page, "desktop_key", key="--clearmodifiers")
    assert bad.status_code == 400 and "xdotool" in bad.json()["error"]["message"]
    assert ok(gw, page, "desktop_scroll", x=10, y=10, direction="down")["done"] is True
    assert ok(gw, page, "desktop_drag", x=10, y=10, to_x=20, to_y=20)["done"] is True


def lines(gw: RunningGateway, sandbox: str, name: str) -> list[list[str]]:
    r = call(gw, sandbox, "fs_read", path=f"/workspace/{name}")
    return (
        [ln.split() for ln in str(r.json()["content"]).splitlines()] if r.status_code == 200 else []
    )


def test_a_drag_made_of_mouse_down_move_and_up(gw: RunningGateway, page: str) -> None:
    """Anthropic's left_mouse_down / mouse_move / left_mouse_up, in a scaled screenshot's
    space: the page records the press, the motion with the button held and the release
    where the agent put them (on the screen: twice the 512 px screenshot's)."""
    before = len(lines(gw, page, "pointer.txt"))
    screenshot(gw, page, width=512)
    down = ok(gw, page, "desktop_mouse_down", x=100, y=100)
    assert down == {"done": True, "x": 100, "y": 100, "space": "512x384",
                    "screen_x": 200, "screen_y": 200}  # fmt: skip
    ok(gw, page, "desktop_move", x=300, y=200)
    up = ok(gw, page, "desktop_mouse_up")  # where the pointer is
    assert (up["x"], up["y"], up["screen_x"], up["screen_y"]) == (300, 200, 600, 400)

    def recorded() -> list[list[str]]:
        new = lines(gw, page, "pointer.txt")[before:]
        return new if new and new[-1][0] == "release" else []

    events = wait_for(recorded, 30, "the page to record the release")
    assert events[0] == ["press", "200", "200"] and events[-1] == ["release", "600", "400"]
    assert ["motion", "600", "400"] in events[1:-1]  # moved with the button held
    half = call(gw, page, "desktop_mouse_down", x=10)
    assert half.status_code == 400 and "both x and y" in half.json()["error"]["message"]


def test_hold_key_presses_then_releases_after_the_duration(gw: RunningGateway, page: str) -> None:
    screenshot(gw, page)
    ok(gw, page, "desktop_move", x=512, y=384)
    before = len(lines(gw, page, "held.txt"))
    done = ok(gw, page, "desktop_hold_key", key="shift", duration=0.5)
    assert done == {"done": True, "keys": "shift", "duration": 0.5}

    def released() -> list[list[str]]:
        new = [e for e in lines(gw, page, "held.txt")[before:] if e[1] == "Shift_L"]
        return new if new and new[-1][0] == "up" else []

    events = wait_for(released, 30, "the page to record the key's release")
    assert events[0][0] == "down"
    # Held for the duration asked (the X server's event times, in ms): the semantics of
    # hold_key, not a speed measurement.
    assert int(events[-1][2]) - int(events[0][2]) >= 450
    bad = call(gw, page, "desktop_hold_key", key="a", duration=0)
    assert bad.status_code == 400


def test_cursor_position_is_in_the_screenshot_space(gw: RunningGateway, page: str) -> None:
    screenshot(gw, page, width=256)  # a quarter of the screen's 1024 px
    ok(gw, page, "desktop_move", x=50, y=60)
    at = ok(gw, page, "desktop_cursor_position")
    assert at == {"done": True, "x": 50, "y": 60, "space": "256x192",
                  "screen_x": 200, "screen_y": 240}  # fmt: skip


def test_zoom_shows_the_region_at_the_size_asked(gw: RunningGateway, page: str) -> None:
    full = screenshot(gw, page)  # the screen's own pixels: the region's truth
    box = (412, 334, 612, 434)  # the middle of the page: the button's "Press" label
    zoom = ok(gw, page, "desktop_zoom", x=412, y=334, to_x=612, to_y=434, width=400)
    png = Image.open(io.BytesIO(base64.b64decode(zoom["png_base64"])))
    assert png.format == "PNG" and png.size == (400, 200) == (zoom["width"], zoom["height"])
    assert zoom["screen_region"] == list(box)
    want = full.crop(box).resize((400, 200), Image.Resampling.BILINEAR)
    got = png.convert("RGB")
    diff = sum(abs(a - b) for a, b in zip(got.tobytes(), want.tobytes(), strict=True))
    diff /= 400 * 200 * 3
    assert diff < 8, diff  # the same picture (only the scaler's rounding differs)
    assert len(full.crop(box).getcolors(1 << 16) or ()) > 2  # the label: not one flat colour
    # In a scaled screenshot's space, without a size: the region at full resolution, and
    # the agent's space stays the screenshot's.
    screenshot(gw, page, width=512)
    native = ok(gw, page, "desktop_zoom", x=0, y=0, to_x=100, to_y=50)
    assert (native["width"], native["height"]) == (200, 100)
    assert native["screen_region"] == [0, 0, 200, 100]
    assert ok(gw, page, "desktop_move", x=500, y=380)["space"] == "512x384"
    empty = call(gw, page, "desktop_zoom", x=10, y=10, to_x=10, to_y=20)
    assert empty.status_code == 400 and "desktop_screenshot" in empty.json()["error"]["message"]


def test_metrics_count_the_desktops_and_their_memory(gw: RunningGateway, box: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with gw.operator() as op:
        text = op.get("/metrics").text
    gauges = {f.name: f.samples[0].value for f in text_string_to_metric_families(text)
              if f.name.startswith("agentbox_desktop")}  # fmt: skip
    assert gauges["agentbox_desktops_running"] == 1  # the module's (max_running: 1)
    assert gauges["agentbox_desktop_memory_bytes"] > 1024 * 1024  # Xvnc and openbox (PSS)


def test_desktop_open_is_held_to_the_command_policy(gw: RunningGateway, box: str) -> None:
    denied = call(gw, box, "desktop_open", command="curl http://127.0.0.1/")
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "policy_denied"


def test_the_per_host_cap_is_a_typed_error_and_stop_frees_it(gw: RunningGateway, box: str) -> None:
    other = create(gw)
    try:
        refused = call(gw, other, "desktop_start")
        assert refused.status_code == 503, refused.text
        error = refused.json()["error"]
        assert error["code"] == "desktop_capacity_exceeded" and "desktop_stop" in error["message"]
        missing = call(gw, other, "desktop_screenshot")
        assert missing.status_code == 409
        assert missing.json()["error"]["code"] == "desktop_not_running"
        # A create that asks for a desktop past the cap fails whole: no sandbox is left.
        with gw.operator() as op:
            before = {s["id"] for s in op.get("/v1/sandboxes").json()}
            r = op.post("/v1/sandboxes", json={"memory": "1GiB", "desktop": True})
            assert r.status_code == 503, r.text
            assert {s["id"] for s in op.get("/v1/sandboxes").json()} == before
    finally:
        destroy(gw, other)


# People: a real VNC client (vncdotool) through `agentbox sandbox desktop ID --vnc` -------
@pytest.fixture(scope="module")
def vnc_api() -> Iterator[Any]:
    from vncdotool import api

    yield api
    api.shutdown()  # the Twisted reactor's thread (one per process)


@contextlib.contextmanager
def forwarded(gw: RunningGateway, sandbox: str, token: str, *flags: str) -> Iterator[int]:
    """``agentbox sandbox desktop SANDBOX --vnc`` running; yields its local port."""
    env = {**os.environ, "AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": token}
    proc = subprocess.Popen(
        [AGENTBOX, "sandbox", "desktop", sandbox, "--vnc", "--port", "0", *flags],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, f"the forwarder said {line!r}"
        yield int(match.group(1))
    finally:
        proc.terminate()
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


def audit(gw: RunningGateway, sandbox: str, decision: str) -> list[dict[str, Any]]:
    return [
        r for r in read_records(gw.audit_path, limit=None)
        if r["sandbox"] == sandbox and r["decision"] == decision
    ]  # fmt: skip


def issue(gw: RunningGateway, sandbox: str, tools: list[str] | None = None) -> str:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox, "tools": tools})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


def test_a_vnc_client_through_the_gateway_sees_and_presses_the_button(
    gw: RunningGateway, page: str, vnc_api: Any
) -> None:
    before = clicks(gw, page)
    with forwarded(gw, page, gw.operator_token, "--control") as port:
        client = vnc_api.connect(f"127.0.0.1::{port}", timeout=60)
        try:
            client.refreshScreen()
            assert client.screen.size == (1024, 768)
            was_red = is_red(client.screen.convert("RGB").getpixel((700, 500)))
            assert was_red or is_green(client.screen.convert("RGB").getpixel((700, 500)))
            client.mouseMove(512, 384)
            client.mousePress(1)
            wait_for(lambda: clicks(gw, page) == before + 1, 30, "the page to record the click")

            def flipped() -> bool:  # away from the pointer, which the client draws in
                client.refreshScreen()
                pixel = client.screen.convert("RGB").getpixel((700, 500))
                return is_green(pixel) if was_red else is_red(pixel)

            wait_for(flipped, 30, "the VNC client to see the button change colour")
        finally:
            client.disconnect()
    wait_for(lambda: audit(gw, page, "desktop_control_ended"), 30, "the takeover's end audited")
    assert audit(gw, page, "desktop_control_started")[-1]["actor"] == "operator"


def test_a_viewer_token_watches_but_its_input_never_reaches_the_sandbox(
    gw: RunningGateway, page: str, vnc_api: Any
) -> None:
    viewer = issue(gw, page, ["desktop_view"])
    before = clicks(gw, page)
    with forwarded(gw, page, viewer) as port:
        client = vnc_api.connect(f"127.0.0.1::{port}", timeout=60)
        try:
            client.refreshScreen()
            assert client.screen.size == (1024, 768)
            client.mouseMove(512, 384)
            client.mousePress(1)
            client.refreshScreen()  # after the click's messages, in the same stream
        finally:
            client.disconnect()
    ended = wait_for(lambda: audit(gw, page, "desktop_view_ended"), 30, "the view's end audited")
    assert ended[-1]["input_dropped"] >= 2  # the move, the press and the release
    # The agent's next click is the first one the page sees.
    screenshot(gw, page)
    ok(gw, page, "desktop_click", x=512, y=384)
    wait_for(lambda: clicks(gw, page) >= before + 1, 30, "the agent's click")
    assert clicks(gw, page) == before + 1


def test_tokens_that_may_not_view_or_control_this_desktop_are_refused(
    gw: RunningGateway, page: str
) -> None:
    other = create(gw)
    try:
        foreign = issue(gw, other)  # a session token of another sandbox: every tool
        no_view = issue(gw, page, ["terminal_run"])
        viewer = issue(gw, page, ["desktop_view"])
        for token, query in ((foreign, ""), (no_view, ""), (viewer, "?control=true")):
            url = vnc_forward.vnc_url(gw.url, page, False) + query
            status = asyncio.run(handshake_status(url, token))
            assert status == 403, (token[:8], query)
        url = vnc_forward.vnc_url(gw.url, page, False)
        assert asyncio.run(handshake_status(url, viewer)) == 101
        # A page on another site cannot open it with a person's browser (CSWSH).
        assert asyncio.run(handshake_status(url, viewer, origin="http://evil.example")) == 403
    finally:
        destroy(gw, other)


def test_the_sdk_drives_a_desktop_in_process(agentbox_home: Path, host_ready: None) -> None:
    from agentbox import Sandbox

    with Sandbox.create(memory="1GiB", network="none", home=agentbox_home) as sb:
        assert sb.desktop.start("800x600")["started"] is True
        png = Image.open(io.BytesIO(sb.desktop.screenshot(width=400)))
        assert png.format == "PNG" and png.size == (400, 300)
        sb.desktop.click(10, 10)
        assert sb.desktop.cursor_position() == (10, 10)  # the 400 px screenshot's space
        assert sb.desktop.mouse_down(20, 30) == (20, 30)
        sb.desktop.move(40, 50)
        assert sb.desktop.mouse_up() == (40, 50)
        sb.desktop.hold_key("shift", 0.1)
        zoom = Image.open(io.BytesIO(sb.desktop.zoom(0, 0, 40, 30)))
        assert zoom.format == "PNG" and zoom.size == (80, 60)  # the screen's full resolution
        assert sb.desktop.stop() == {"stopped": True}


def test_the_sdk_over_the_gateway_sees_the_page(
    gw: RunningGateway, page: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentbox import Sandbox

    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    sb = Sandbox.connect(page)  # a gateway backend: POST /v1/tools/desktop_*
    image = Image.open(io.BytesIO(sb.desktop.screenshot(width=256))).convert("RGB")
    assert image.size == (256, 192)
    assert is_red(image.getpixel((128, 96))) or is_green(image.getpixel((128, 96)))


def test_an_idle_desktop_is_stopped_and_frees_its_place(
    agentbox_home: Path, host_ready: None
) -> None:
    from agentbox import Sandbox
    from agentbox.desktop.manager import DesktopConfig, DesktopManager
    from agentbox.runtime.runtime import Runtime

    manager = DesktopManager(Runtime(agentbox_home), DesktopConfig(idle_timeout=0.5, max_running=1))
    with Sandbox.create(memory="1GiB", network="none", home=agentbox_home) as sb:
        try:
            assert manager.start(sb.id)["started"] is True
            wait_for(lambda: not manager.status(sb.id)["running"], 30, "the idle desktop to stop")
            assert manager.running_count() == 0
            ps = sb.commands.run("cat /proc/[0-9]*/comm").stdout.split()
            assert "cat" in ps and "Xvnc" not in ps  # cat: the listing saw itself
        finally:
            manager.close_all()


def test_the_console_shows_the_desktop_and_a_person_takes_control(
    gw: RunningGateway, page: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The console's noVNC view in real Chromium: it shows the page, a click while
    watching does nothing, a click after taking control presses the button."""
    from playwright.sync_api import sync_playwright

    from browserkit import require_browser

    require_browser()
    artifacts = Path(os.environ.get("AGENTBOX_TEST_ARTIFACTS") or tmp_path) / "desktop"
    artifacts.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--disable-background-networking", "--no-first-run",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        ])  # fmt: skip
        try:
            tab = browser.new_page(viewport={"width": 1200, "height": 1000})
            errors: list[str] = []
            tab.on("pageerror", lambda e: errors.append(str(e)))

            def connect(control: bool) -> None:
                tab.fill("#token", gw.operator_token)
                tab.fill("#sandbox", page)
                tab.set_checked("#control", control)
                tab.click("#connect-button")
                mode = "control" if control else "view"
                tab.wait_for_selector(f"body[data-connected={mode}]", timeout=30_000)

            def shows_the_page() -> bool:
                shot = tab.locator("#screen canvas").screenshot()
                pixel = Image.open(io.BytesIO(shot)).convert("RGB").getpixel((700, 500))
                return is_red(pixel) or is_green(pixel)

            tab.goto(f"{gw.url}/console/desktop.html")
            tab.wait_for_selector("body[data-ready]", state="attached")
            connect(control=False)
            wait_for(shows_the_page, 30, "the console to show the desktop")
            tab.screenshot(path=str(artifacts / "console-desktop.png"))
            with capsys.disabled():
                print(f"\n[desktop console screenshot] {artifacts / 'console-desktop.png'}")
            before = clicks(gw, page)
            tab.locator("#screen canvas").click(position={"x": 700, "y": 500})  # watching
            connect(control=True)
            tab.locator("#screen canvas").click(position={"x": 700, "y": 500})
            wait_for(lambda: clicks(gw, page) >= before + 1, 30, "the person's click")
            assert clicks(gw, page) == before + 1  # the click made while watching never landed
            assert not errors
        finally:
            browser.close()
    wait_for(lambda: audit(gw, page, "desktop_view_ended"), 30, "the console's view audited")


# Last: it stops the module's desktop.
def test_stop_ends_every_desktop_process_and_start_brings_it_back(
    gw: RunningGateway, box: str
) -> None:
    sandbox = create(gw)
    try:
        ok(gw, box, "desktop_stop")  # the module's desktop frees the one place
        assert ok(gw, sandbox, "desktop_start")["started"] is True
        ok(gw, sandbox, "desktop_open", command="sleep 1000")
        assert ok(gw, sandbox, "desktop_stop") == {"stopped": True}
        ps = ok(gw, sandbox, "terminal_run", command="cat /proc/[0-9]*/comm")["stdout"].split()
        assert "cat" in ps and not {"Xvnc", "openbox", "sleep"} & set(ps)  # with its control
        assert call(gw, sandbox, "desktop_screenshot").status_code == 409
        # Started again in the same sandbox: the killed X server's socket is not mistaken
        # for the new one's (openbox would start too early and never manage the screen).
        assert ok(gw, sandbox, "desktop_start")["started"] is True
        assert screenshot(gw, sandbox).size == (1024, 768)
        # The GUI browser: Chromium, headed on the desktop, shows a page of the sandbox.
        ok(gw, sandbox, "fs_write", path="/workspace/blue.html",
           content="<html><body style='background:#0000e0'></body></html>")  # fmt: skip
        ok(gw, sandbox, "desktop_open", url="file:///workspace/blue.html")

        def blue() -> bool:
            r, g, b = screenshot(gw, sandbox, width=256).getpixel((128, 120))
            return b > 150 and r < 40 and g < 40

        wait_for(blue, 90, "Chromium to show the blue page on the desktop")
        ps = ok(gw, sandbox, "terminal_run", command="cat /proc/[0-9]*/comm")["stdout"].split()
        assert "chromium" in ps  # inside the sandbox's pid namespace
    finally:
        destroy(gw, sandbox)
