"""A real gateway on a free loopback port, in a thread of the test process."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agentbox.config.settings import parse_settings
from agentbox.egressd import daemon as egressd
from agentbox.gateway.app import create_app
from agentbox.runtime.host import release_home_mounts
from agentbox.runtime.runtime import Runtime

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
POLICY_YAML = """
gateway:
  listen: 127.0.0.1:{port}
  auth:
    operator_token_env: AGENTBOX_TEST_OPERATOR_TOKEN
    ttl_seconds: 600
    rate_limit_per_minute: 100000
  state: {state}
sandbox:
  template: default
tools:
  - name: terminal.run
    cwd: /workspace
    timeout_ms: {timeout_ms}
    allow: [bash, sh, git, ls, cat, echo, printf, python3, "true", sleep, pwd, id, grep, wc, mkdir, rm, head, env, seq]
    deny: [shutdown, reboot, mkfs, iptables, curl]
    max_output_bytes: 65536
    approval:
      - "rm -rf *"
      - "git push --force*"
      - "* | sh"
    approval_timeout: {approval_timeout}
  - name: fs.read
    root: /
    max_bytes: 1048576
  - name: fs.write
    root: /workspace
    require_diff_summary: true
    protected: [".git/hooks/**", ".git/config", ".mcp.json", ".envrc"]
redaction:
  detectors: default
  literals_from_env: [AGENTBOX_TEST_PLANTED_SECRET]
audit:
  path: {audit_path}
  fsync: always
"""


class ServerLog(logging.Handler):
    """Every record of WARNING or more, or with a traceback, that a gateway in this
    process logs: its own and uvicorn's ("Exception in ASGI application", "response
    already completed"), whose loggers do not propagate to the root."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or record.exc_info:
            self.records.append(record)

    def lines(self) -> list[str]:
        return [f"{r.name}: {r.getMessage()}" for r in self.records]


@contextlib.contextmanager
def server_log_handler() -> Iterator[ServerLog]:
    handler = ServerLog()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


@contextlib.contextmanager
def throwaway_home(prefix: str) -> Iterator[Path]:
    """A fresh AGENTBOX_HOME under /var/tmp for a gateway process of one test. At the end
    the egress daemon it started is stopped, its sandboxes destroyed, its mounts released
    and the directory removed."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))
    path.chmod(0o711)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((path / egressd.PID_FILE).read_text()), signal.SIGTERM)
        runtime = Runtime(path)
        for record in runtime.store.list():
            with contextlib.suppress(Exception):
                runtime.destroy(record.id)
        release_home_mounts(path)
        shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RunningGateway:
    url: str
    port: int
    operator_token: str
    home: Path
    audit_path: Path
    app: Any

    def client(
        self, token: str | None = None, headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx2.Client:
        merged = {"Authorization": f"Bearer {token}"} if token else {}
        merged.update(headers or {})
        return httpx2.Client(base_url=self.url, headers=merged, timeout=120, **kwargs)

    def operator(self) -> httpx2.Client:
        return self.client(self.operator_token)

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[str]:
        """A small sandbox the operator creates through the API, destroyed at the end."""
        with self.operator() as op:
            sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()["id"]
            yield sid
            op.delete(f"/v1/sandboxes/{sid}")


def wait_removed(home: Path, *sandbox_ids: str, timeout: float = 120.0) -> None:
    """Until a gateway's destroys of ``sandbox_ids`` have finished on the host: it answers
    once their processes are dead and removes the rest after (runtime/teardown.py); the
    record goes last."""
    from agentbox.runtime.store import Store

    store = Store(home / "state.db")
    deadline = time.monotonic() + timeout
    while any(store.get(sid) is not None for sid in sandbox_ids):
        if time.monotonic() > deadline:
            raise AssertionError(f"{sandbox_ids}: not removed from the host in {timeout} s")
        time.sleep(0.02)


def issue(gw: RunningGateway, sandbox: str, **body: Any) -> str:
    """A session token for ``sandbox`` (``body``: more fields of the token request)."""
    with gw.operator() as op:
        return str(op.post("/v1/tokens", json={"sandbox": sandbox, **body}).json()["token"])


@contextlib.asynccontextmanager
async def mcp_client(gw: RunningGateway, token: str, mode: str = "auto",
                     **kwargs: Any) -> AsyncIterator[Client]:  # fmt: skip
    """The official MCP client over Streamable HTTP with ``token`` (``mode``, ``kwargs``:
    the Client's, e.g. ``elicitation_callback``)."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
        async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=h), mode=mode,
                          **kwargs) as client:  # fmt: skip
            yield client


@contextlib.contextmanager
def running_gateway(
    home: Path,
    tmp: Path,
    approval_timeout: str = "20s",
    env: dict[str, str] | None = None,
    extra_yaml: str = "",
    timeout_ms: int = 30000,
    terminals: bool = False,
    state: str = "sqlite",
) -> Iterator[RunningGateway]:
    """A gateway with the test policy (plus ``extra_yaml``: more top-level sections, or a
    ``sandbox:`` section that replaces the policy's), its environment set for its
    lifetime only. ``timeout_ms``: the longest a command may run (a pip install needs
    more than the default on a loaded machine). ``terminals``: terminal.run's switch for
    interactive terminals (pty processes). ``state``: its ``gateway.state``."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in (env or {}).items():
            mp.setenv(key, value)
        yield from _serve(home, tmp, approval_timeout, mp, extra_yaml, timeout_ms, terminals, state)


def _serve(
    home: Path,
    tmp: Path,
    approval_timeout: str,
    monkeypatch: Any,
    extra_yaml: str = "",
    timeout_ms: int = 30000,
    terminals: bool = False,
    state: str = "sqlite",
) -> Iterator[RunningGateway]:
    port = free_port()
    token = "op-" + secrets.token_hex(16)
    monkeypatch.setenv("AGENTBOX_TEST_OPERATOR_TOKEN", token)
    audit_path = tmp / "audit" / "audit.jsonl"
    text = POLICY_YAML.format(port=port, audit_path=audit_path, approval_timeout=approval_timeout,
                              timeout_ms=timeout_ms, state=state)  # fmt: skip
    if terminals:
        text = text.replace(
            "  - name: terminal.run\n", "  - name: terminal.run\n    terminals: true\n"
        )
    if extra_yaml.lstrip().startswith("sandbox:"):
        text = text.replace("sandbox:\n  template: default\n", "")
    text += extra_yaml
    settings = parse_settings(text, "test-gateway.yaml")
    app = create_app(settings, operator_token=token, home=home)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the gateway thread died at start"
        assert time.monotonic() < deadline, "the gateway did not start within 30 s"
        time.sleep(0.01)
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", port, token, home, audit_path, app)
    finally:
        server.should_exit = True
        thread.join(30)


class GatewayProcess:
    """``agentbox serve`` as a real process (to be killed and restarted). ``config`` is a
    YAML template with ``{port}`` and ``{home}`` (``{{``/``}}`` for braces); the operator
    token is read from ``GATEWAY_PROCESS_TOKEN``."""

    def __init__(self, home: Path, config: str, env: dict[str, str] | None = None) -> None:
        self.home = home
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.config = home / "gateway.yaml"
        self.config.write_text(config.format(port=self.port, home=home))
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env or {}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **self.env, "AGENTBOX_HOME": str(self.home),
               "GATEWAY_PROCESS_TOKEN": self.token}  # fmt: skip
        env.pop("AGENTBOX_URL", None)
        self.proc = subprocess.Popen([AGENTBOX, "serve", "--config", str(self.config)], env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the gateway exited at start"
            with contextlib.suppress(httpx2.TransportError):
                if httpx2.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise AssertionError("the gateway did not start in 60 s")

    def client(self) -> httpx2.Client:
        return httpx2.Client(base_url=self.url, timeout=60,
                             headers={"Authorization": f"Bearer {self.token}"})  # fmt: skip

    def kill(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(60)
