"""Desktop mode: what a desktop inside a sandbox costs to start, to screenshot, to keep.

    .venv/bin/python bench/bench_desktop.py [--quick] [--write]   (as root)

Measured in the same run, interleaved iteration by iteration:

* **tool path**: ``desktop_start`` through ``Gateway.call_tool`` (in process: policy,
  audit included) on a sandbox without a desktop: Xvnc and openbox started inside the
  sandbox with ``agentbox-nsexec enter``, ready when Xvnc greets on its port in the
  sandbox's netns and openbox manages the screen; then ``desktop_screenshot`` (full size
  and scaled to 512 px wide), then ``desktop_stop``;
* **host baseline**: the same Xvnc and openbox started directly on the host (a free
  display and loopback port), ready by the same two checks; the same screenshot program
  run directly on the host.

Memory per desktop: the PSS of the desktop's processes (what ``desktop_start`` reports)
and the growth of the sandbox's cgroup memory. Writes nothing to docs unless ``--write``
(the ``<!-- desktop:begin -->`` section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from agentbox import Sandbox  # noqa: E402
from agentbox.config.settings import GatewaySettings  # noqa: E402
from agentbox.desktop import actions  # noqa: E402
from agentbox.desktop.manager import XPROP, XVNC  # noqa: E402
from agentbox.gateway.app import create_app  # noqa: E402
from common import bench_home, percentile, progress, write_doc_section  # noqa: E402

SIZE = "1024x768"


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class HostDesktop:
    """Xvnc + openbox straight on the host: the baseline."""

    def __init__(self) -> None:
        self.display = f":{100 + secrets.randbelow(400)}"
        self.port = _free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = {**os.environ, "DISPLAY": self.display}

    def start(self) -> None:
        self.procs.append(subprocess.Popen(
            [XVNC, self.display, "-geometry", SIZE, "-depth", "24", "-SecurityTypes", "None",
             "-localhost", "-interface", "127.0.0.1", "-rfbport", str(self.port),
             "-nolisten", "tcp"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    if s.recv(12) == b"RFB 003.008\n":
                        break
            except OSError:
                time.sleep(0.01)
        self.procs.append(subprocess.Popen(
            ["/usr/bin/openbox", "--sm-disable"], env=self.env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))  # fmt: skip
        while "window id" not in subprocess.run(
            [XPROP, "-root", "_NET_SUPPORTING_WM_CHECK"], env=self.env,
            capture_output=True, text=True, check=False,
        ).stdout:  # fmt: skip
            time.sleep(0.01)

    def screenshot(self, width: int, height: int) -> bytes:
        argv = [
            actions.PYTHON,
            "-I",
            "-c",
            actions.SCREENSHOT_PY,
            self.display,
            str(width),
            str(height),
        ]
        return subprocess.run(argv, capture_output=True, check=True).stdout

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.kill()
            proc.wait()
        self.procs.clear()


def run(home: Path, n: int) -> dict[str, list[float]]:
    settings = GatewaySettings.model_validate(
        {"audit": {"path": str(home / "audit.jsonl")}, "sandbox": {"desktop": {"size": SIZE}}}
    )
    operator = secrets.token_hex(24)
    app = create_app(settings, operator_token=operator, home=home)
    gateway = app.state.parts.gateway
    principal = gateway.tokens.authenticate(operator)
    sb = Sandbox.create(memory="1GiB", disk="512MiB", network="none", home=home)
    cgroup = gateway.runtime.layout.sandbox(sb.id)

    def call(tool: str, **arguments: Any) -> dict[str, Any]:
        args = {**arguments, "sandbox_id": sb.id}
        return dict(asyncio.run(gateway.call_tool(principal, tool, args)).result)

    out: dict[str, list[float]] = {k: [] for k in (
        "start", "host_start", "shot", "host_shot", "shot_512", "host_shot_512",
        "pss", "cgroup_growth",
    )}  # fmt: skip
    host = HostDesktop()
    try:
        for i in range(-1, n):  # -1: warm-up
            progress(f"desktop {i + 1}/{n}")
            before = cgroup.memory_current()
            start = time.perf_counter()
            started = call("desktop_start")
            start_ms = ms_since(start)
            shots = []
            for width in (None, 512):
                start = time.perf_counter()
                call("desktop_screenshot", **({"width": width} if width else {}))
                shots.append(ms_since(start))
            status = call("desktop_start")  # running: its memory now
            growth = cgroup.memory_current() - before
            call("desktop_stop")
            start = time.perf_counter()
            host.start()
            host_start_ms = ms_since(start)
            host_shots = []
            for size in ((1024, 768), (512, 384)):
                start = time.perf_counter()
                host.screenshot(*size)
                host_shots.append(ms_since(start))
            host.stop()
            if i < 0:
                continue
            assert started["started"] is True
            out["start"].append(start_ms)
            out["host_start"].append(host_start_ms)
            out["shot"].append(shots[0])
            out["shot_512"].append(shots[1])
            out["host_shot"].append(host_shots[0])
            out["host_shot_512"].append(host_shots[1])
            out["pss"].append(status["memory_bytes"] / 2**20)
            out["cgroup_growth"].append(growth / 2**20)
    finally:
        host.stop()
        gateway.desktops.close_all()
        app.state.parts.audit.close()
        sb.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    n = 5 if args.quick else 15
    with bench_home("desktop") as home:
        r = run(home, n)

    def row(what: str, ours: str, base: str | None, unit: str = "ms") -> str:
        a, b = r[ours], r[base] if base else None
        cells = f"{percentile(a, 50):.0f} / {percentile(a, 95):.0f}"
        if b is None:
            return f"| {what}, p50 / p95 {unit} | {cells} | | |"
        ratio = statistics.median(a) / statistics.median(b)
        return (
            f"| {what}, p50 / p95 {unit} | {cells} | {percentile(b, 50):.0f} / "
            f"{percentile(b, 95):.0f} | {ratio:.2f}x |"
        )

    table = "\n".join([
        "| measure | in the sandbox (tool path) | host (direct) | ratio p50 |",
        "|---|---|---|---|",
        row("desktop start (Xvnc + openbox, ready)", "start", "host_start"),
        row(f"screenshot {SIZE}", "shot", "host_shot"),
        row("screenshot scaled to 512x384", "shot_512", "host_shot_512"),
        row("memory per desktop: PSS of its processes", "pss", None, "MiB"),
        row("memory per desktop: sandbox cgroup growth", "cgroup_growth", None, "MiB"),
    ])  # fmt: skip
    print(table)
    if args.write:
        write_doc_section(
            "desktop", "Desktop: Xvnc + openbox inside the sandbox", "bench_desktop.py",
            "--quick" if args.quick else "",
            f"{n} runs each way, interleaved, screen {SIZE}. Tool path: `desktop_start`, "
            "`desktop_screenshot` (PNG made inside the sandbox by python3-pil, compression "
            "level 1) and `desktop_stop` through `Gateway.call_tool`; host: the same Xvnc, "
            "openbox and screenshot program run directly. The host was shared with other "
            "engineers' work: the numbers are noisy.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
