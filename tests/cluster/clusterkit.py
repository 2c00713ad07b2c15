"""A real cluster for tests and bench/bench_cluster.py: a PostgreSQL database (tests/pgkit.py),
a cluster CA, N ``agentbox node`` processes (each its own AGENTBOX_HOME under the run's
home, its own loopback port) and M ``agentbox serve`` replicas, all separate processes
reached over real sockets. Waits poll a condition with a deadline; nothing sleeps blind.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2

from agentbox.cluster import pki
from agentbox.state.postgres import migrate

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
START_TIMEOUT_S = 90.0
HEARTBEAT_S = 0.5
LOST_AFTER_S = 3.0

_COMMON = """
gateway:
  listen: 127.0.0.1:{port}
  state: {state}
  auth:
    operator_token_env: AGENTBOX_TEST_OPERATOR_TOKEN
    rate_limit_per_minute: 1000000
sandbox:
  network: none
  warm_pool: {warm}
tools:
  - name: terminal.run
    cwd: /workspace
    timeout_ms: 60000
  - name: fs.read
    root: /
  - name: fs.write
    root: /workspace
cluster:
  ca_file: {pki}/ca.pem
  cert_file: {pki}/{name}.pem
  key_file: {pki}/{name}.key
  heartbeat_seconds: {heartbeat}
  lost_after_seconds: {lost_after}
"""
_NODE = """
  node:
    id: {name}
    listen: 127.0.0.1:{node_port}
    advertise: https://127.0.0.1:{node_port}
    labels: {{zone: z{index}}}
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float = START_TIMEOUT_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except (httpx2.HTTPError, OSError) as e:
            last = e
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what} (last error: {last})")


@dataclass
class Proc:
    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    home: Path
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out = self.log.open("ab")
        self.popen = subprocess.Popen(
            self.argv, env=self.env, stdout=out, stderr=out, stdin=subprocess.DEVNULL
        )
        out.close()

    def kill9(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


@dataclass
class Cluster:
    base: Path
    state_url: str
    token: str
    nodes: dict[str, Proc] = field(default_factory=dict)
    node_urls: dict[str, str] = field(default_factory=dict)
    gateways: dict[str, Proc] = field(default_factory=dict)
    gateway_urls: dict[str, str] = field(default_factory=dict)

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    def client(self, gateway: str, timeout: float = 120.0) -> httpx2.Client:
        return httpx2.Client(
            base_url=self.gateway_urls[gateway],
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=timeout,
        )

    def node_context(self, cert: str) -> ssl.SSLContext:
        """A client context with ``cert`` (a gateway's, or a node's to show refusal)."""
        return pki.client_context(
            self.pki / "ca.pem", self.pki / f"{cert}.pem", self.pki / f"{cert}.key"
        )

    def nodes_table(self) -> list[dict[str, Any]]:
        with self.client(next(iter(self.gateways))) as c:
            response = c.get("/v1/cluster/nodes")
            response.raise_for_status()
            return list(response.json())

    def node_state(self, name: str) -> str | None:
        for row in self.nodes_table():
            if row["id"] == name:
                return str(row["state"])
        return None

    def start_node(self, name: str) -> None:
        proc = self.nodes[name]
        proc.start()

        def ready() -> bool:
            assert proc.popen is not None
            if proc.popen.poll() is not None:
                raise AssertionError(f"node {name} exited:\n{proc.tail()}")
            with httpx2.Client(verify=self.node_context("gw-1"), timeout=5) as c:
                if c.get(self.node_urls[name] + "/healthz").status_code != 200:
                    return False
            return self.node_state(name) == "ready"

        wait_for(f"node {name}", ready)

    def start_gateway(self, name: str) -> None:
        proc = self.gateways[name]
        proc.start()

        def ready() -> bool:
            assert proc.popen is not None
            if proc.popen.poll() is not None:
                raise AssertionError(f"gateway {name} exited:\n{proc.tail()}")
            return httpx2.get(self.gateway_urls[name] + "/healthz", timeout=5).status_code == 200

        wait_for(f"gateway {name}", ready)


def placed(cluster: Cluster) -> dict[str, str]:
    """sandbox id -> node, from the joined listing of every node."""
    with cluster.client("gw-1") as c:
        return {r["id"]: r["node"] for r in c.get("/v1/sandboxes").raise_for_status().json()}


def destroy_all(cluster: Cluster, ids: list[str]) -> None:
    with cluster.client("gw-1") as c:
        for sandbox in ids:
            c.delete(f"/v1/sandboxes/{sandbox}")


def _config(
    cluster: Cluster,
    name: str,
    port: int,
    warm: int,
    node: str = "",
    extra: str = "",
    heartbeat: float = HEARTBEAT_S,
) -> Path:
    text = _COMMON.format(
        port=port,
        state=cluster.state_url,
        pki=cluster.pki,
        name=name,
        heartbeat=heartbeat,
        lost_after=max(LOST_AFTER_S, 6 * heartbeat),
        warm=warm,
    )
    path = cluster.base / f"{name}.yaml"
    path.write_text(text + node + extra)
    return path


@contextlib.contextmanager
def running_cluster(
    pg_url: str,
    base: Path,
    nodes: int = 3,
    gateways: int = 2,
    warm: int | dict[str, int] = 0,
    extra_yaml: str = "",
    env: dict[str, str] | None = None,
    heartbeat: float = HEARTBEAT_S,
) -> Iterator[Cluster]:
    """``pg_url``: an empty database (migrated here). Node homes live under ``base``.
    ``extra_yaml``: more top-level sections for every part (providers, tasks);
    ``heartbeat``: seconds (tests beat fast to detect a dead node fast); ``warm``: every
    node's warm pool size, or per node name (absent: none)."""
    migrate(pg_url)
    base.mkdir(parents=True, exist_ok=True)
    base.chmod(0o711)  # sandboxes run as their own uids: they traverse to their node's home
    cluster = Cluster(base, pg_url, secrets.token_urlsafe(24))
    pki.init_ca(cluster.pki)
    env = {**os.environ, **(env or {}), "AGENTBOX_TEST_OPERATOR_TOKEN": cluster.token}
    for i in range(1, nodes + 1):
        name = f"node-{i}"
        size = warm.get(name, 0) if isinstance(warm, dict) else warm
        add_node(cluster, name, i, env, size, extra_yaml, heartbeat)
    for i in range(1, gateways + 1):
        name, port = f"gw-{i}", free_port()
        pki.issue(cluster.pki, name, "gateway", [])
        home = base / name
        home.mkdir(parents=True)
        config = _config(cluster, name, port, 0, "", extra_yaml, heartbeat)
        cluster.gateways[name] = Proc(
            name,
            [AGENTBOX, "serve", "--config", str(config)],
            {**env, "AGENTBOX_HOME": str(home)},
            base / f"{name}.log",
            home,
        )
        cluster.gateway_urls[name] = f"http://127.0.0.1:{port}"
    try:
        for name in cluster.gateways:
            cluster.start_gateway(name)
        for name in cluster.nodes:
            cluster.start_node(name)
        yield cluster
    finally:
        for proc in [*cluster.gateways.values(), *cluster.nodes.values()]:
            proc.stop()
        for proc in cluster.nodes.values():
            _clean_home(proc.home)


def add_node(
    cluster: Cluster,
    name: str,
    index: int,
    env: dict[str, str],
    warm: int = 0,
    extra: str = "",
    heartbeat: float = HEARTBEAT_S,
) -> None:
    """A node's certificate, home and config (its ``gateway.state`` is ``cluster.state_url``
    now), not started yet: ``cluster.start_node(name)``."""
    port = free_port()
    pki.issue(cluster.pki, name, "node", ["127.0.0.1"])
    home = cluster.base / name
    home.mkdir(parents=True)
    node_block = _NODE.format(name=name, node_port=port, index=index)
    config = _config(cluster, name, free_port(), warm, node_block, extra, heartbeat)
    cluster.nodes[name] = Proc(
        name,
        [AGENTBOX, "node", "--config", str(config)],
        {**env, "AGENTBOX_HOME": str(home)},
        cluster.base / f"{name}.log",
        home,
    )
    cluster.node_urls[name] = f"https://127.0.0.1:{port}"


def _clean_home(home: Path) -> None:
    """Destroy what a node left (a killed one leaves its sandboxes) and its mounts."""
    from agentbox.runtime.host import release_home_mounts
    from agentbox.runtime.runtime import Runtime

    if not (home / "sandboxes").exists():
        return
    runtime = Runtime(home)
    for record in runtime.store.list():
        try:
            runtime.destroy(record.id, actor="test")
        except Exception as e:  # keep going: the rest must go too
            print(f"could not destroy leftover sandbox {record.id}: {e}")
    release_home_mounts(home)
