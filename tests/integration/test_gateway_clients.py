"""The SDK and the CLI through a gateway (AGENTBOX_URL), with the same typed errors."""

from __future__ import annotations

import io
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from agentbox import Sandbox
from agentbox.errors import PolicyDenied, SandboxNotFound
from gateway_harness import RunningGateway, running_gateway

AGENTBOX = str(Path(sys.executable).parent / "agentbox")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("cl"), "20s") as running:
        yield running


def cli(
    gw: RunningGateway, *args: str, token: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": token or gw.operator_token}
    env.pop("AGENTBOX_HOME", None)  # nothing local: everything goes through the gateway
    return subprocess.run([AGENTBOX, *args], capture_output=True, text=True, env=env, timeout=120)


def test_sdk_through_the_gateway(gw: RunningGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    with Sandbox.create(memory="128MiB", disk="64MiB") as sb:
        r = sb.commands.run("echo $GREETING from $(pwd)", env={"GREETING": "hi"}, cwd="/tmp")
        assert (r.stdout, r.exit_code) == ("hi from /tmp\n", 0)
        sb.files.write("/workspace/data.bin", bytes(range(256)))
        assert sb.files.read_bytes("/workspace/data.bin") == bytes(range(256))
        sb.files.write("/workspace/t.txt", "alpha beta")
        assert sb.files.edit("/workspace/t.txt", "beta", "gamma") == 1
        assert sb.files.read("/workspace/t.txt") == "alpha gamma"
        assert sorted(e.name for e in sb.files.list("/workspace")) == ["data.bin", "t.txt"]
        shell = sb.shell()
        shell.run("cd /tmp")
        assert shell.run("pwd").stdout == "/tmp\n"
        archive = io.BytesIO()
        assert sb.files.download_tar("/workspace", archive) == 3  # workspace/, 2 files
        sb.files.write("/workspace/.bashrc", "alias ls=rm")  # a shell on the host runs it
        withheld: list[tuple[str, str]] = []
        assert sb.files.download_tar("/workspace", io.BytesIO(), withheld=withheld) == 3
        assert [p for p, _ in withheld] == ["workspace/.bashrc"]
        everything = io.BytesIO()
        assert sb.files.download_tar("/workspace", everything, include_unsafe=True) == 4
        sb.files.remove("/workspace/.bashrc")
        sb.files.remove("/workspace/t.txt")
        archive.seek(0)
        assert sb.files.upload_tar("/workspace/restored", archive) == 3
        assert sb.files.read("/workspace/restored/workspace/t.txt") == "alpha gamma"
        with pytest.raises(PolicyDenied):  # fs.write's root is /workspace
            archive.seek(0)
            sb.files.upload_tar("/etc", archive)
        proc = sb.commands.start("echo background")
        assert proc.wait(timeout=30).exit_code == 0
        assert proc.read().text == "background\n"
        with pytest.raises(PolicyDenied) as err:
            sb.commands.run("curl http://example.invalid")
        assert err.value.details["rule"]
        assert sb.id in [r.id for r in Sandbox.list()]
    with pytest.raises(SandboxNotFound):
        Sandbox.connect(sb.id)


def test_cli_through_the_gateway(gw: RunningGateway) -> None:
    created = cli(gw, "sandbox", "create", "--memory", "128MiB", "--disk", "64MiB")
    assert created.returncode == 0, created.stderr
    sandbox_id = created.stdout.strip()
    try:
        r = cli(gw, "sandbox", "exec", sandbox_id, "--", "sh", "-c", "echo out; exit 5")
        assert (r.stdout, r.returncode) == ("out\n", 5)
        token = cli(gw, "token", "issue", "--sandbox", sandbox_id, "--ttl", "600",
                    "--tools", "terminal_run")  # fmt: skip
        assert token.returncode == 0, token.stderr
        assert token.stdout.startswith("abx_") and token.stdout.count("\n") == 1  # only the token
        session = token.stdout.strip()
        r = cli(gw, "sandbox", "exec", sandbox_id, "--", "id", "-u", token=session)
        assert r.stdout == "1000\n"
        denied = cli(gw, "sandbox", "rm", sandbox_id, token=session)
        assert denied.returncode == 1 and "insufficient_scope" in denied.stderr
        listed = cli(gw, "token", "ls", "--sandbox", sandbox_id)
        assert session not in listed.stdout and "terminal_run" in listed.stdout
    finally:
        assert cli(gw, "sandbox", "rm", sandbox_id).returncode == 0


def test_cli_approvals(gw: RunningGateway) -> None:
    sandbox_id = cli(gw, "sandbox", "create", "--disk", "64MiB").stdout.strip()
    try:
        session = cli(gw, "token", "issue", "--sandbox", sandbox_id).stdout.strip()
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        waiting = threading.Thread(
            target=lambda: result.setdefault(
                "r",
                cli(gw, "sandbox", "exec", sandbox_id, "--", "rm", "-rf", "/tmp/x", token=session),
            ),
        )
        waiting.start()
        approval_id = ""
        for _ in range(500):  # bounded: the request appears within a second
            listed = cli(gw, "approvals", "ls", "--status", "pending")
            mine = [line for line in listed.stdout.splitlines() if sandbox_id in line]
            if mine:  # other tests' approvals may be pending in the same home
                approval_id = mine[0].split()[0]
                break
        assert approval_id.startswith("ap-"), "no pending approval appeared"
        assert "rm -rf /tmp/x" in mine[0]
        refused = cli(gw, "approvals", "approve", approval_id, token=session)
        assert refused.returncode == 1 and "insufficient_scope" in refused.stderr
        assert cli(gw, "approvals", "approve", approval_id).returncode == 0
        waiting.join(60)
        assert result["r"].returncode == 0, result["r"].stderr
    finally:
        cli(gw, "sandbox", "rm", sandbox_id)


def test_serve_refuses_a_public_bind_without_tls(tmp_path: Path) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(tmp_path), "AGENTBOX_OPERATOR_TOKEN": "x" * 32}
    r = subprocess.run([AGENTBOX, "serve", "--listen", "0.0.0.0:8849"], capture_output=True,
                       text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 1
    assert "non-loopback bind needs both gateway.tls" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("gateway:\n  lisen: 127.0.0.1:1\n")
    r = subprocess.run([AGENTBOX, "serve", "--config", str(bad)], capture_output=True,
                       text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 1 and f"{bad}:2: gateway.lisen: unknown key" in r.stderr


def test_serve_on_embedded_defaults_generates_an_operator_token(tmp_path: Path) -> None:
    from gateway_harness import free_port

    # Sandbox uids must traverse to the home: not under pytest's /tmp/pytest-of-root, which
    # every pytest session starting on the host sets back to mode 0700.
    home = Path(tempfile.mkdtemp(prefix="agentbox-embedded-", dir="/var/tmp"))
    home.chmod(0o711)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "AGENTBOX_OPERATOR_TOKEN"}
    env["AGENTBOX_HOME"] = str(home)
    proc = subprocess.Popen([AGENTBOX, "serve", "--listen", f"127.0.0.1:{port}"], env=env,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):  # bounded: the gateway starts within seconds
            try:
                if httpx2.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx2.TransportError:
                if proc.poll() is not None:
                    pytest.fail(f"agentbox serve exited at start: {proc.communicate()[1][-2000:]}")
                time.sleep(0.05)
        token_file = home / "operator.token"
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        token = token_file.read_text().strip()
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx2.get(f"{url}/v1/sandboxes", headers=headers).status_code == 200
        assert httpx2.get(f"{url}/v1/sandboxes").status_code == 401
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
    assert "generated an operator token" in stderr and token not in stderr


def test_serve_with_tls_says_https_and_serves_it(tmp_path: Path) -> None:
    """The address `agentbox serve` prints is one a client can use as printed."""
    from agentbox.cluster import pki
    from gateway_harness import free_port

    home = Path(tempfile.mkdtemp(prefix="agentbox-tls-", dir="/var/tmp"))
    home.chmod(0o711)
    ca = pki.init_ca(tmp_path / "pki")
    cert, key = pki.issue(tmp_path / "pki", "gateway", "node", ["127.0.0.1"])  # server auth
    config = tmp_path / "gateway.yaml"
    config.write_text(f"gateway:\n  tls:\n    cert_file: {cert}\n    key_file: {key}\n")
    port = free_port()
    env = {**os.environ, "AGENTBOX_HOME": str(home), "AGENTBOX_OPERATOR_TOKEN": "t" * 32}
    argv = [AGENTBOX, "serve", "--config", str(config), "--listen", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        banner = ""
        for _ in range(50):  # bounded: a few lines before the banner at most
            banner = proc.stderr.readline()
            if "gateway on" in banner or not banner:
                break
        assert f"gateway on https://127.0.0.1:{port}" in banner, banner
        url = banner.split("gateway on ", 1)[1].split()[0]
        for _ in range(300):  # bounded: the gateway starts within seconds
            try:
                response = httpx2.get(
                    f"{url}/healthz", timeout=1, verify=ssl.create_default_context(cafile=str(ca))
                )
                break
            except httpx2.TransportError:
                assert proc.poll() is None, "agentbox serve exited at start"
                time.sleep(0.05)
        assert response.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        shutil.rmtree(home, ignore_errors=True)
