"""The SDK through the home's gateway over its unix socket (``AGENTBOX_URL=unix://...``):
a real ``agentbox serve`` on a free port and its home's socket, real sandboxes, and SDK
scripts as fresh interpreters, as users run them."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from agentbox.runtime.runtime import Runtime
from gateway_harness import AGENTBOX, free_port, throwaway_home

POOL_CONFIG = "sandbox:\n  warm_pool: 1\n"

# What a user's script does: every call through the socket, results printed as JSON.
SCRIPT = """
import io, json, sys, tarfile
from agentbox import Sandbox
from agentbox.client.sandbox import _runtime
from agentbox.runtime.requests import RunRequest

out = {}
sb = Sandbox.create()
out["id"], out["from_pool"] = sb.id, sb.record.from_pool
out["argv"] = sb.commands.run(["echo", "hi"]).stdout
r = sb.commands.run("echo oops >&2; exit 3")
out["shell"] = [r.stderr, r.exit_code]
sb.files.write("/workspace/a.txt", "hello")
out["read"] = sb.files.read("/workspace/a.txt")
out["light"] = sorted(m for m in ("httpx2", "agentbox.runtime.runtime", "sqlite3")
                      if m in sys.modules)
chunks = []
res = _runtime(None).commands(sb.id).run(
    RunRequest("for i in 1 2 3; do echo $i; sleep 0.05; done"),
    on_output=lambda stream, chunk: chunks.append([stream, chunk.decode()]),
)
out["streamed"], out["stream_result"] = chunks, res.stdout
buf = io.BytesIO()
sb.files.download_tar("/workspace", buf)
out["tar"] = sorted(tarfile.open(fileobj=io.BytesIO(buf.getvalue())).getnames())
try:
    sb.files.read("/workspace/missing")
except Exception as e:
    out["missing"] = [type(e).__name__, e.code]
sb.kill()
try:
    Sandbox.connect(sb.id)
except Exception as e:
    out["gone"] = [type(e).__name__, e.code]
print(json.dumps(out))
"""

# One call; the error it raised (class, code, message) as JSON, or "ok".
ONE_CALL = """
import json
from agentbox import Sandbox
try:
    Sandbox.list()
    print(json.dumps("ok"))
except Exception as e:
    print(json.dumps([type(e).__name__, getattr(e, "code", None), str(e)]))
"""


class ServeProcess:
    """``agentbox serve`` on a free loopback port and its home's socket."""

    def __init__(self, home: Path, config: str = "", *extra: str) -> None:
        self.home = home
        self.port = free_port()
        self.socket = home / "gateway.sock"
        self.log = home / f"serve-{self.port}.log"
        argv = [AGENTBOX, "serve", "--listen", f"127.0.0.1:{self.port}", *extra]
        if config:
            path = home / f"gateway-{self.port}.yaml"
            path.write_text(config)
            argv += ["--config", str(path)]
        env = {k: v for k, v in os.environ.items()
               if k not in ("AGENTBOX_OPERATOR_TOKEN", "AGENTBOX_URL", "AGENTBOX_TOKEN")}  # fmt: skip
        env["AGENTBOX_HOME"] = str(home)
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"agentbox serve exited at start: {self.log.read_text()[-2000:]}")
            try:
                healthy = httpx2.get(f"http://127.0.0.1:{self.port}/healthz", timeout=1)
                if healthy.status_code == 200 and self.socket.exists():
                    return
            except httpx2.TransportError:
                pass
            time.sleep(0.1)
        pytest.fail("agentbox serve did not start in 90 s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(60)


@pytest.fixture
def home(host_ready: None) -> Iterator[Path]:
    with throwaway_home("agentbox-sock-") as path:
        yield path


@pytest.fixture
def served(home: Path) -> Iterator[ServeProcess]:
    gateway = ServeProcess(home, POOL_CONFIG)
    try:
        gateway.wait_ready()
        deadline = time.monotonic() + 90  # the pool fills in the background
        while not any(r.state == "pooled" for r in Runtime(home).store.list()):
            assert time.monotonic() < deadline, "the warm pool did not fill in 90 s"
            time.sleep(0.1)
        yield gateway
    finally:
        gateway.stop()


def sdk(url: str | None, code: str, **env: str) -> object:
    """Run ``code`` as a new SDK process with ``AGENTBOX_URL=url`` (None: unset); its JSON
    output."""
    environ = {k: v for k, v in os.environ.items() if k not in ("AGENTBOX_TOKEN", "AGENTBOX_URL")}
    environ.update({"AGENTBOX_HOME": "/nonexistent-not-used", **env})
    if url is not None:
        environ["AGENTBOX_URL"] = url
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=180, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_sdk_over_the_socket_creates_runs_streams_files_and_kills(
    served: ServeProcess,
) -> None:
    st = os.stat(served.socket)
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
    banner = served.log.read_text()
    assert f"export AGENTBOX_URL=unix://{served.socket}" in banner
    # No AGENTBOX_TOKEN: the operator token beside the socket (the spelling with one slash
    # is accepted too); no home: nothing of the runtime is used on this side.
    out = sdk(f"unix:{served.socket}", SCRIPT)
    assert isinstance(out, dict)
    assert out["argv"] == "hi\n" and out["shell"] == ["oops\n", 3]
    assert out["read"] == "hello"
    assert out["light"] == []  # before the first streaming call
    assert [c for c in out["streamed"] if c[0] == "stdout"] and out["stream_result"] == "1\n2\n3\n"
    assert "".join(c[1] for c in out["streamed"]) == "1\n2\n3\n"
    assert any(name.endswith("a.txt") for name in out["tar"])
    assert out["missing"] == ["FileNotFound", "file_not_found"]
    assert out["gone"] == ["SandboxNotFound", "sandbox_not_found"]
    assert out["from_pool"] is True  # the gateway's warm pool answered the create


# A plain script: which backend served it (the runtime is imported only in-process), and
# whether the sandbox it made is on the gateway's audit trail.
PLAIN = """
import json, sys
from agentbox import Sandbox
with Sandbox.create() as sb:
    run = sb.commands.run(["echo", "hi"])
print(json.dumps({"id": sb.id, "stdout": run.stdout,
                  "in_process": "agentbox.runtime.runtime" in sys.modules}))
"""


def created_through(trail: Path, sandbox_id: str) -> bool:
    """The gateway audited a create request that made ``sandbox_id`` (a claim from its
    pool by an in-process create shows only the keeper's and lifecycle records)."""
    records = (json.loads(line) for line in trail.read_text().splitlines())
    return any(r.get("decision") == "sandbox_created" and r.get("sandbox") == sandbox_id
               for r in records)  # fmt: skip


def test_a_plain_script_and_the_cli_use_the_homes_gateway_when_one_serves_it(
    served: ServeProcess,
) -> None:
    """Without AGENTBOX_URL, the SDK and the CLI find the gateway serving their home (as
    docker's CLI finds dockerd): its policy, pool and audit apply. ``inprocess`` opts out;
    a dead gateway's socket is passed by, not an error."""
    home = {"AGENTBOX_HOME": str(served.home)}
    trail = served.home / "audit" / "audit.jsonl"
    found = sdk(None, PLAIN, **home)
    assert isinstance(found, dict) and found["stdout"] == "hi\n"
    assert found["in_process"] is False and created_through(trail, found["id"])
    env = {k: v for k, v in os.environ.items() if k != "AGENTBOX_URL"} | home
    listed = subprocess.run([AGENTBOX, "sandbox", "create"], env=env, capture_output=True,
                            text=True, timeout=120, check=True)  # fmt: skip
    cli_id = listed.stdout.strip()
    assert cli_id.startswith("sb-") and created_through(trail, cli_id)  # the CLI's create too
    subprocess.run([AGENTBOX, "sandbox", "rm", cli_id], env=env, timeout=120, check=True)
    tokens = subprocess.run([AGENTBOX, "token", "ls", "--json"], env=env, capture_output=True,
                            text=True, timeout=120, check=False)  # fmt: skip
    assert tokens.returncode == 0 and json.loads(tokens.stdout) == [], tokens.stderr

    opted_out = sdk("inprocess", PLAIN, **home)
    assert isinstance(opted_out, dict) and opted_out["stdout"] == "hi\n"
    assert opted_out["in_process"] is True and not created_through(trail, opted_out["id"])

    served.stop(signal.SIGKILL)  # its socket file stays, refusing connections
    assert served.socket.exists()
    alone = sdk(None, PLAIN, **home)
    assert isinstance(alone, dict) and alone["stdout"] == "hi\n" and alone["in_process"] is True


def test_errors_over_the_socket_are_typed_and_say_what_to_do(
    served: ServeProcess, tmp_path: Path
) -> None:
    url = f"unix://{served.socket}"
    assert sdk(url, ONE_CALL) == "ok"
    wrong = sdk(url, ONE_CALL, AGENTBOX_TOKEN="not-a-token")
    assert isinstance(wrong, list) and wrong[:2] == ["Unauthenticated", "unauthenticated"]
    missing = sdk(f"unix://{tmp_path}/gateway.sock", ONE_CALL)
    assert isinstance(missing, list) and missing[:2] == [
        "GatewayUnreachable",
        "gateway_unreachable",
    ]
    assert "no gateway socket at" in missing[2] and "agentbox serve" in missing[2]
    relative = sdk("unix://gateway.sock", ONE_CALL)
    assert isinstance(relative, list) and relative[0] == "InvalidRequest"
    # Over TCP a Host that is not the gateway's is refused (DNS rebinding); the socket
    # cannot be reached by a browser, and takes any.
    token = (served.home / "operator.token").read_text().strip()
    headers = {"Authorization": f"Bearer {token}", "Host": "evil.example:80"}
    tcp = httpx2.get(f"http://127.0.0.1:{served.port}/v1/sandboxes", headers=headers)
    assert tcp.status_code == 421
    over_socket = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(served.socket)))
    with over_socket:
        assert (
            over_socket.get("http://evil.example/v1/sandboxes", headers=headers).status_code == 200
        )
        assert over_socket.get("http://localhost/v1/sandboxes").status_code == 401


def test_a_dead_gateways_socket_is_replaced_and_a_stopped_one_removes_it(home: Path) -> None:
    path = home / "gateway.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))  # as a killed gateway leaves it: a socket file nobody accepts on
    stale.close()
    url = f"unix://{path}"
    refused = sdk(url, ONE_CALL)
    assert isinstance(refused, list) and refused[0] == "GatewayUnreachable"
    assert "refuses connections" in refused[2]
    first = ServeProcess(home)
    try:
        first.wait_ready()
        assert sdk(url, ONE_CALL) == "ok"
    finally:
        first.stop(signal.SIGKILL)  # nothing of it runs: its socket file stays
    assert path.exists() and sdk(url, ONE_CALL)[0] == "GatewayUnreachable"  # type: ignore[index]
    second = ServeProcess(home)
    try:
        second.wait_ready()
        assert sdk(url, ONE_CALL) == "ok"
    finally:
        second.stop()  # SIGTERM: a clean stop takes its socket file away
    assert not path.exists()
    gone = sdk(url, ONE_CALL)
    assert isinstance(gone, list) and "no gateway socket at" in gone[2]


def test_a_second_gateway_on_the_home_serves_tcp_and_leaves_the_socket_alone(
    served: ServeProcess,
) -> None:
    before = os.stat(served.socket).st_ino
    # A trail of its own: one writer extends an audit chain (as the suite's gateways have)
    second = ServeProcess(served.home, f"audit:\n  path: {served.home}/audit-2/audit.jsonl\n")
    try:
        second.wait_ready()  # it starts (as two gateways on one home did before the socket)
        said = second.log.read_text()
        assert f"another gateway (pid {served.proc.pid}) serves {served.home}" in said, said
        assert "this one listens on TCP only" in said and "export AGENTBOX_URL" not in said
        assert os.stat(served.socket).st_ino == before
        assert sdk(f"unix://{served.socket}", ONE_CALL) == "ok"
    finally:
        second.stop()
    # the second's stop leaves the first's socket, which still answers
    assert os.stat(served.socket).st_ino == before
    assert sdk(f"unix://{served.socket}", ONE_CALL) == "ok"
