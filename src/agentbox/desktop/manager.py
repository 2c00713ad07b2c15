"""One virtual desktop per sandbox, running *inside* it: TigerVNC's Xvnc and openbox.

Xvnc is the X server and the VNC server in one process (no Xvfb + x11vnc pair copying
the framebuffer between them). It listens for VNC only on 127.0.0.1 of the sandbox's own
network namespace: nothing on the host listens, and the gateway reaches it with a socket
made in that namespace (:mod:`agentbox.network.ports`), as it reaches any sandbox port.
The X socket is in the sandbox's /tmp and its abstract socket in its netns, so every
desktop is display ``:1`` without two ever meeting.

Everything of a desktop (Xvnc, the window manager, apps opened with ``desktop_open``,
each xdotool and screenshot) runs through ``agentbox-nsexec enter``: the sandbox's
namespaces, uid, seccomp, memory and pids limits, network policy. The long-lived ones
share one cgroup leaf (``d<hex>``): stopping the desktop kills that leaf, its memory is
that leaf's processes' PSS, and the sandbox's end ends it (its cgroup goes).
"""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox.browser import launch
from agentbox.browser.manager import (
    CHROMIUM,
    FONTS_CONF,
    PROFILE_PREFIX,
    check_blocked,
    png_size,
)
from agentbox.desktop import actions
from agentbox.desktop.actions import Space
from agentbox.errors import (
    AgentboxError,
    DesktopCapacityExceeded,
    DesktopNotRunning,
    InvalidRequest,
    LimitExceeded,
    SandboxError,
)
from agentbox.network import plane, ports
from agentbox.runtime.commands import launch_error
from agentbox.runtime.requests import RunRequest

if TYPE_CHECKING:
    from agentbox.runtime.commands import CommandRunner
    from agentbox.runtime.runtime import Runtime

DISPLAY = ":1"
VNC_PORT = 5901  # 5900 + display, on the sandbox's loopback only
XVNC = "/usr/bin/Xvnc"
XPROP = "/usr/bin/xprop"
WINDOW_MANAGER = "/usr/bin/openbox"
LEAF_PREFIX = "d"
STATE_DIR = "/tmp/.agentbox-desktop"  # in the sandbox: the fontconfig file and its cache
MAX_SCREENSHOT_BYTES = 16 * 1024 * 1024
_RFB_HELLO = b"RFB 003.008\n"
# Xvnc and the window manager, as one script in the desktop's leaf: the window manager
# starts once the X socket exists, and the script lives as long as Xvnc.
_SESSION_SH = """\
# A killed X server leaves its socket and lock: the wait below would see the old socket.
rm -f "/tmp/.X11-unix/X${2#:}" "/tmp/.X${2#:}-lock"
"$1" "$2" -geometry "$3" -depth 24 -SecurityTypes None -localhost -interface 127.0.0.1 \
  -rfbport "$4" -AlwaysShared -nolisten tcp -desktop agentbox &
x=$!
n=0
while [ ! -S "/tmp/.X11-unix/X${2#:}" ]; do
  kill -0 "$x" 2>/dev/null || exit 1
  n=$((n+1)); [ "$n" -gt 400 ] && exit 1
  sleep 0.05
done
DISPLAY="$2" "$5" --sm-disable &
wait "$x"
"""


@dataclass(frozen=True)
class DesktopConfig:
    max_running: int = 4  # per host (this gateway): desktops are heavy
    size: str = "1024x768"  # XGA: what Anthropic advises for computer use
    start_timeout: float = 30.0
    # Stopped after this many seconds without a tool call or a viewer (0: never).
    idle_timeout: float = 900.0
    xvnc: str = XVNC
    window_manager: str = WINDOW_MANAGER
    chromium: str = CHROMIUM
    block_domains: tuple[str, ...] = ()  # as the browser tools': checked before a URL opens


@dataclass
class _Desktop:
    sandbox_id: str
    leaf: str
    logs: Path  # host-only (the sandbox's procs/ directory): nothing inside can forge them
    width: int
    height: int
    started_at: float
    space: Space
    last_used: float = field(default_factory=time.monotonic)
    viewers: int = 0


class DesktopManager:
    def __init__(self, runtime: Runtime, config: DesktopConfig | None = None) -> None:
        self.runtime = runtime
        self.config = config or DesktopConfig()
        self._desktops: dict[str, _Desktop] = {}
        self._lock = threading.Lock()
        self._starting: set[str] = set()
        self._stop = threading.Event()
        self._janitor: threading.Thread | None = None

    # lifecycle ------------------------------------------------------------------------
    def start(self, sandbox_id: str, size: str | None = None) -> dict[str, Any]:
        """Start the sandbox's desktop (an already running one is returned as it is)."""
        width, height = actions.geometry(size or self.config.size)
        runner = self.runtime.commands(sandbox_id)  # typed errors for a sandbox that is gone
        with self._lock:
            self._prune()
            d = self._desktops.get(sandbox_id)
            if d is not None:
                return self._info(d) | {"started": False}
            if sandbox_id in self._starting:
                raise InvalidRequest("this sandbox's desktop is starting; try again shortly")
            running = len(self._desktops) + len(self._starting)
            if running >= self.config.max_running:
                raise DesktopCapacityExceeded(
                    f"this host already runs {running} desktops (sandbox.desktop.max_running); "
                    "stop one with desktop_stop or try again later",
                    retry_after=30,
                )
            self._starting.add(sandbox_id)
        try:
            d = self._launch(sandbox_id, runner, width, height)
        finally:
            with self._lock:
                self._starting.discard(sandbox_id)
        with self._lock:
            self._desktops[sandbox_id] = d
            if self._janitor is None and self.config.idle_timeout > 0:
                self._janitor = threading.Thread(
                    target=self._reap_idle, name="desktop-janitor", daemon=True
                )
                self._janitor.start()
        self.runtime.event(sandbox_id, "desktop_started", "desktop_start", "gateway")
        return self._info(d) | {"started": True}

    def stop(self, sandbox_id: str, reason: str = "desktop_stop") -> dict[str, Any]:
        with self._lock:
            d = self._desktops.pop(sandbox_id, None)
        if d is None:
            return {"stopped": False}
        self._kill(d)
        self.runtime.event(sandbox_id, "desktop_stopped", reason, "gateway")
        return {"stopped": True}

    def status(self, sandbox_id: str) -> dict[str, Any]:
        with self._lock:
            self._prune()
            d = self._desktops.get(sandbox_id)
        if d is None:
            return {"running": False}
        return self._info(d)

    def running_count(self) -> int:
        with self._lock:
            self._prune()
            return len(self._desktops)

    def memory_total(self) -> tuple[int, int]:
        """How many desktops run on this host (this gateway) and the bytes they use
        together (the PSS of their processes): what /metrics reports."""
        with self._lock:
            self._prune()
            running = list(self._desktops.values())
        return len(running), sum(self._memory(d) for d in running)

    def close_sandbox(self, sandbox_id: str) -> None:
        """Before the sandbox is destroyed (its cgroup's end would end the desktop too)."""
        with contextlib.suppress(AgentboxError, OSError):
            self.stop(sandbox_id)

    def close_all(self) -> None:
        self._stop.set()
        with self._lock:
            ids = list(self._desktops)
        for sandbox_id in ids:
            self.close_sandbox(sandbox_id)

    # the agent's actions ----------------------------------------------------------------
    def screenshot(
        self, sandbox_id: str, width: int | None, height: int | None, timeout_s: float
    ) -> dict[str, Any]:
        d = self._get(sandbox_id)
        size = actions.fit((d.width, d.height), width, height)
        png = self._png(d, size, None, timeout_s)
        with self._lock:
            d.space = replace(d.space, width=size[0], height=size[1])
        return {
            "mime_type": "image/png",
            "width": size[0],
            "height": size[1],
            "screen_width": d.width,
            "screen_height": d.height,
            "png_base64": base64.b64encode(png).decode(),
        }

    def click(
        self, sandbox_id: str, x: int, y: int, button: str, clicks: int, timeout_s: float
    ) -> dict[str, Any]:
        d = self._get(sandbox_id)
        sx, sy = d.space.to_screen(x, y)
        self._act(d, actions.click(sx, sy, button, clicks), timeout_s)
        return self._done(d, x, y)

    def move(self, sandbox_id: str, x: int, y: int, timeout_s: float) -> dict[str, Any]:
        d = self._get(sandbox_id)
        self._act(d, actions.move(*d.space.to_screen(x, y)), timeout_s)
        return self._done(d, x, y)

    def drag(
        self, sandbox_id: str, start: tuple[int, int], end: tuple[int, int], button: str,
        timeout_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        d = self._get(sandbox_id)
        argv = actions.drag(d.space.to_screen(*start), d.space.to_screen(*end), button)
        self._act(d, argv, timeout_s)
        return self._done(d, *end)

    def scroll(
        self, sandbox_id: str, x: int, y: int, direction: str, amount: int, timeout_s: float
    ) -> dict[str, Any]:
        d = self._get(sandbox_id)
        self._act(d, actions.scroll(*d.space.to_screen(x, y), direction, amount), timeout_s)
        return self._done(d, x, y)

    def type_text(self, sandbox_id: str, text: str, timeout_s: float) -> dict[str, Any]:
        d = self._get(sandbox_id)
        self._act(d, actions.type_text(text), timeout_s)
        return {"done": True, "characters": len(text)}

    def key(self, sandbox_id: str, keys: str, timeout_s: float) -> dict[str, Any]:
        d = self._get(sandbox_id)
        self._act(d, actions.key(keys), timeout_s)
        return {"done": True, "keys": keys}

    def mouse_down(
        self, sandbox_id: str, at: tuple[int, int] | None, button: str, timeout_s: float
    ) -> dict[str, Any]:
        """Press and hold ``button`` (at ``at``, else where the pointer is)."""
        d = self._get(sandbox_id)
        point = d.space.to_screen(*at) if at is not None else None
        return self._pointer(d, actions.mouse_down(point, button), timeout_s)

    def mouse_up(
        self, sandbox_id: str, at: tuple[int, int] | None, button: str, timeout_s: float
    ) -> dict[str, Any]:
        d = self._get(sandbox_id)
        point = d.space.to_screen(*at) if at is not None else None
        return self._pointer(d, actions.mouse_up(point, button), timeout_s)

    def cursor_position(self, sandbox_id: str, timeout_s: float) -> dict[str, Any]:
        """Where the pointer is, in the latest screenshot's space."""
        d = self._get(sandbox_id)
        return self._pointer(d, actions.LOCATION, timeout_s)

    def hold_key(
        self, sandbox_id: str, keys: str, duration_s: float, timeout_s: float
    ) -> dict[str, Any]:
        d = self._get(sandbox_id)
        # The hold is part of the run: its timeout is the duration plus a tool's.
        self._act(d, actions.hold_key(keys, duration_s), duration_s + timeout_s)
        return {"done": True, "keys": keys, "duration": duration_s}

    def zoom(
        self, sandbox_id: str, region: tuple[int, int, int, int], width: int | None,
        height: int | None, timeout_s: float,
    ) -> dict[str, Any]:  # fmt: skip
        """A PNG of ``region`` (the latest screenshot's coordinates) at the screen's full
        resolution, or scaled to fit ``width`` x ``height``. The agent's coordinate space
        stays its last screenshot's."""
        d = self._get(sandbox_id)
        box = d.space.region_to_screen(*region)
        size = actions.zoom_size((box[2] - box[0], box[3] - box[1]), width, height)
        png = self._png(d, size, box, timeout_s)
        return {
            "mime_type": "image/png",
            "width": size[0],
            "height": size[1],
            "region": list(region),
            "screen_region": list(box),
            "png_base64": base64.b64encode(png).decode(),
        }

    def open(self, sandbox_id: str, command: str | None, url: str | None) -> dict[str, Any]:
        """Start an application on the desktop (in its leaf: it ends with the desktop):
        ``command`` through bash, or ``url`` in a headed Chromium."""
        d = self._get(sandbox_id)
        runner = self.runtime.commands(sandbox_id)
        if url is not None:
            argv = self._chromium_argv(sandbox_id, url)
        elif command:
            argv = ["/bin/bash", "-c", command]
        else:
            raise InvalidRequest("desktop_open needs a command or a url")
        name = "app-" + secrets.token_hex(4)
        self._spawn(runner, d.leaf, argv, d.logs / name, self._env(sandbox_id))
        return {"opened": True, "log": name}

    # the viewers' side ----------------------------------------------------------------
    def connect_vnc(self, sandbox_id: str) -> socket.socket:
        """A connected, non-blocking socket to the desktop's VNC server (in the sandbox's
        network namespace). Call from a worker thread."""
        d = self._get(sandbox_id)
        record = self.runtime.running(sandbox_id)[0]
        assert record.init_pid is not None
        sock = ports.connect_to_port(record.init_pid, VNC_PORT)
        with self._lock:
            d.viewers += 1  # a watched desktop is never idle
        return sock

    def disconnected(self, sandbox_id: str) -> None:
        """A viewer that ``connect_vnc`` let in has left."""
        with self._lock:
            d = self._desktops.get(sandbox_id)
            if d is not None:
                d.viewers = max(0, d.viewers - 1)
                d.last_used = time.monotonic()

    # internals ------------------------------------------------------------------------
    def _launch(self, sandbox_id: str, runner: CommandRunner, width: int, height: int) -> _Desktop:
        files = self.runtime.files(sandbox_id)
        for program in (self.config.xvnc, self.config.window_manager, actions.XDOTOOL, XPROP):
            if not files.exists(program):
                raise InvalidRequest(
                    f"this sandbox's template has no {program}; use the default template on "
                    "a host with tigervnc-standalone-server, openbox and xdotool "
                    "(scripts/install.sh installs them)"
                )
        # A desktop this manager does not know (a gateway that restarted, a crash between
        # launch and bookkeeping) would hold display :1 and the VNC port: it goes first.
        for stale in runner.cgroup.populated_leaves(LEAF_PREFIX):
            runner.cgroup.remove_leaf(stale)
        tag = secrets.token_hex(6)
        leaf = runner.cgroup.new_leaf(LEAF_PREFIX + tag)
        logs = runner.host.procs / f"desktop-{tag}"
        logs.mkdir(mode=0o700)
        argv = [
            "/bin/sh", "-c", _SESSION_SH, "desktop", self.config.xvnc, DISPLAY,
            f"{width}x{height}", str(VNC_PORT), self.config.window_manager,
        ]  # fmt: skip
        d = _Desktop(
            sandbox_id, leaf, logs, width, height, time.time(), Space(width, height, width, height)
        )
        try:
            self._spawn(runner, leaf, argv, logs / "session", self._env(sandbox_id))
            self._wait_ready(d)
        except BaseException:
            self._kill(d)
            raise
        return d

    def _spawn(
        self, runner: CommandRunner, leaf: str, argv: list[str], log: Path, env: dict[str, str]
    ) -> None:
        """Start ``argv`` detached in ``leaf`` (the launcher's waiting half writes
        ``log.exit``); its output goes to ``log.out``, a host-only file."""
        launcher = runner.launcher_argv(
            argv, leaf, "/home/user", exit_file=f"{log}.exit", setsid=True, detach=True
        )
        out = os.open(f"{log}.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            launched = subprocess.run(
                launcher,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=runner.environment(env),
                close_fds=True,
                start_new_session=True,
                check=False,
            )
        except OSError as e:
            raise launch_error(e) from None
        finally:
            os.close(out)
        if launched.returncode != 0:
            raise SandboxError(f"could not start {argv[0]} in the sandbox: {_tail(log)}")

    def _wait_ready(self, d: _Desktop) -> None:
        """Until Xvnc answers on its port with the RFB greeting (or the session ended)."""
        record = self.runtime.running(d.sandbox_id)[0]
        assert record.init_pid is not None
        deadline = time.monotonic() + self.config.start_timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if _ended(d.logs / "session"):
                raise SandboxError(f"the desktop did not start: {_tail(d.logs / 'session')}")
            with contextlib.suppress(AgentboxError, OSError):
                sock = ports.connect_to_port(record.init_pid, VNC_PORT, timeout=2.0)
                with sock:
                    sock.setblocking(True)
                    sock.settimeout(2.0)
                    if sock.recv(len(_RFB_HELLO)) == _RFB_HELLO and not _ended(d.logs / "session"):
                        break
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        else:
            raise SandboxError(
                f"the desktop did not answer within {self.config.start_timeout:g} s; "
                f"call desktop_start again ({_tail(d.logs / 'session')})"
            )
        # Then the window manager: a window mapped before it manages the screen can stay
        # unmapped for good (Tk waits for a MapNotify that never comes).
        runner = self.runtime.commands(d.sandbox_id)
        while time.monotonic() < deadline:
            probe = runner.run(RunRequest(
                [XPROP, "-root", "_NET_SUPPORTING_WM_CHECK"], env={"DISPLAY": DISPLAY},
                timeout=5, cwd="/tmp",
            ))  # fmt: skip
            if "window id" in probe.stdout:
                return
            if _ended(d.logs / "session"):
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.2)
        raise SandboxError(
            f"the desktop's window manager did not start within {self.config.start_timeout:g} s; "
            f"call desktop_start again ({_tail(d.logs / 'session')})"
        )

    def _chromium_argv(self, sandbox_id: str, url: str) -> list[str]:
        """Chromium, headed on the desktop, with the flags and proxy the headless browser
        tools use (:mod:`agentbox.browser.launch`)."""
        from agentbox.browser.manager import check_url

        check_url(url)
        record = self.runtime.running(sandbox_id)[0]
        network = record.spec.network
        proxy = None
        if network.mode != "none":
            check_blocked(network, self.config.block_domains)
            proxy = f"http://{self.runtime.net.proxy_address}:{plane.EXPLICIT_PORT}"
        profile = f"{PROFILE_PREFIX}desktop-{secrets.token_hex(4)}"
        args = launch.chromium_args(["--new-window", url], profile, proxy)
        return [self.config.chromium, *args]

    def _env(self, sandbox_id: str) -> dict[str, str]:
        """DISPLAY, and a fontconfig file where the template has none (the default
        template's /etc is synthesised): X clients render text with the host's fonts."""
        env = {"DISPLAY": DISPLAY}
        files = self.runtime.files(sandbox_id)
        if not files.exists("/etc/fonts/fonts.conf"):
            conf = f"{STATE_DIR}/fonts.conf"
            if not files.exists(conf):
                files.mkdir(STATE_DIR)
                files.write(conf, FONTS_CONF.format(cache=f"{STATE_DIR}/fontconfig").encode())
            env["FONTCONFIG_FILE"] = conf
        return env

    def _get(self, sandbox_id: str) -> _Desktop:
        self.runtime.running(sandbox_id)  # typed errors for a sandbox that is gone (+ touch)
        with self._lock:
            d = self._desktops.get(sandbox_id)
            if d is not None and not self._alive(d):
                del self._desktops[sandbox_id]
                d = None
        if d is None:
            raise DesktopNotRunning(
                "this sandbox has no desktop running; start one with desktop_start"
            )
        d.last_used = time.monotonic()
        return d

    def _reap_idle(self) -> None:
        """Stop desktops nobody used (no tool call, no viewer) for ``idle_timeout``."""
        idle = self.config.idle_timeout
        while not self._stop.wait(max(0.05, min(5.0, idle / 4))):
            now = time.monotonic()
            with self._lock:
                self._prune()
                ids = [
                    sandbox_id for sandbox_id, d in self._desktops.items()
                    if d.viewers == 0 and now - d.last_used >= idle
                ]  # fmt: skip
            for sandbox_id in ids:
                with contextlib.suppress(AgentboxError, OSError):
                    self.stop(sandbox_id, reason="idle")

    def _act(self, d: _Desktop, argv: list[str], timeout_s: float) -> None:
        result = self._run(d, argv, timeout_s, 64 * 1024)
        if result.exit_code != 0:
            raise SandboxError(f"{argv[1]} failed: {result.stderr.strip()[:500]}")

    def _run(self, d: _Desktop, argv: list[str], timeout_s: float, cap: int) -> Any:
        runner = self.runtime.commands(d.sandbox_id)
        result = runner.run(
            RunRequest(
                argv, env={"DISPLAY": DISPLAY}, timeout=timeout_s, max_output_bytes=cap, cwd="/tmp"
            )
        )
        if result.timed_out:
            raise SandboxError(f"{argv[0]} did not finish within {timeout_s:g} s; try again")
        if result.exit_code != 0 and not self._alive(d):
            raise DesktopNotRunning("the desktop ended (its X server exited); desktop_start again")
        if result.exit_code != 0:
            raise SandboxError(f"{argv[0]} failed: {result.stderr.strip()[:500]}")
        return result

    def _png(
        self, d: _Desktop, size: tuple[int, int], box: tuple[int, int, int, int] | None,
        timeout_s: float,
    ) -> bytes:  # fmt: skip
        """The screen (or ``box`` of it) as a PNG of ``size``, made inside the sandbox."""
        argv = [actions.PYTHON, "-I", "-c", actions.SCREENSHOT_PY, DISPLAY, *map(str, size)]
        argv += [str(v) for v in box or ()]
        result = self._run(d, argv, timeout_s, MAX_SCREENSHOT_BYTES)
        png: bytes = result.stdout_bytes
        if result.truncated:
            raise LimitExceeded(
                f"the screenshot is over {MAX_SCREENSHOT_BYTES} bytes; ask a smaller size"
            )
        got = png_size(png)
        if got != size:
            raise SandboxError(
                f"the screenshot is {got[0]}x{got[1]}, not the {size[0]}x{size[1]} asked"
            )
        return png

    def _pointer(self, d: _Desktop, argv: list[str], timeout_s: float) -> dict[str, Any]:
        """Run ``argv`` (it ends in getmouselocation) and say where the pointer is: in the
        latest screenshot's space, and on the screen."""
        result = self._run(d, argv, timeout_s, 64 * 1024)
        sx, sy = actions.location(result.stdout)
        x, y = d.space.from_screen(sx, sy)
        return {**self._done(d, x, y), "screen_x": sx, "screen_y": sy}

    def _done(self, d: _Desktop, x: int, y: int) -> dict[str, Any]:
        return {"done": True, "x": x, "y": y, "space": f"{d.space.width}x{d.space.height}"}

    def _info(self, d: _Desktop) -> dict[str, Any]:
        return {
            "running": True,
            "display": DISPLAY,
            "width": d.width,
            "height": d.height,
            "started_at": d.started_at,
            "memory_bytes": self._memory(d),
        }

    def memory(self, sandbox_id: str) -> int:
        """The PSS of the desktop's processes (Xvnc, window manager, opened apps), bytes."""
        with self._lock:
            d = self._desktops.get(sandbox_id)
        return 0 if d is None else self._memory(d)

    def _memory(self, d: _Desktop) -> int:
        total = 0
        for pid in self._pids(d):
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        return total

    def _pids(self, d: _Desktop) -> list[int]:
        leaf = self.runtime.layout.sandbox(d.sandbox_id).unified / d.leaf
        try:
            return [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
        except (FileNotFoundError, ValueError):
            return []

    def _alive(self, d: _Desktop) -> bool:
        cgroup = self.runtime.layout.sandbox(d.sandbox_id)
        return cgroup.populated(cgroup.unified / d.leaf)

    def _prune(self) -> None:
        """Forget desktops whose processes are gone (lock held): a sandbox destroyed
        elsewhere, or an agent that killed its X server, frees its place under the cap."""
        for sandbox_id, d in list(self._desktops.items()):
            if not self._alive(d):
                del self._desktops[sandbox_id]
                shutil.rmtree(d.logs, ignore_errors=True)

    def _kill(self, d: _Desktop) -> None:
        with contextlib.suppress(AgentboxError, OSError):
            self.runtime.layout.sandbox(d.sandbox_id).remove_leaf(d.leaf)
        shutil.rmtree(d.logs, ignore_errors=True)


def _ended(log: Path) -> bool:
    """Whether the launcher recorded the end of ``log``'s process (it creates the exit
    file at start and writes the status into it at the end)."""
    try:
        return bool(Path(f"{log}.exit").read_text().strip())
    except OSError:
        return False


def _tail(log: Path, size: int = 1500) -> str:
    try:
        with open(f"{log}.out", "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            text = f.read().decode("utf-8", errors="replace").strip()
    except OSError:
        return "no output"
    return " ".join(text.splitlines()[-8:]) or "no output"
