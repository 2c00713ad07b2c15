"""The first seed's example chain, run as a batch task by the reference loop with a
scripted model: open a package's page in the browser, read the latest version, edit the
dependency manifest, install it, run the tests. Everything real: the sandbox, its egress
path, Chromium, pip, a package index served from a network namespace this test creates
(documentation address 203.0.113.10, reached through a /32 route only)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browserkit import require_browser
from fakeproviders import FakeProvider, Reply
from gateway_harness import RunningGateway, running_gateway
from nettopo import UPSTREAM_A, internet

PORT = 8000
INDEX = f"http://pkg.test:{PORT}"


def wheel(directory: Path, version: str) -> str:
    """A pure-Python wheel of the package ``demo`` (what pip installs)."""
    name = f"demo-{version}-py3-none-any.whl"
    info = f"demo-{version}.dist-info"
    files = {
        "demo/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A package page and a PEP 503 index with demo 1.0.0 and 1.2.0, served in the test
    internet's namespace."""
    require_browser()
    root = tmp_path_factory.mktemp("pkgindex")
    (root / "project" / "demo").mkdir(parents=True)
    (root / "project" / "demo" / "index.html").write_text(
        "<!doctype html><html><head><title>demo</title></head><body><main>"
        "<h1>demo</h1><p>Latest version: 1.2.0</p><p>Released 2026-11-01.</p>"
        "</main></body></html>"
    )
    simple = root / "simple" / "demo"
    simple.mkdir(parents=True)
    links = "".join(f'<a href="{w}">{w}</a>\n' for w in (wheel(simple, "1.0.0"),
                                                         wheel(simple, "1.2.0")))  # fmt: skip
    (simple / "index.html").write_text(f"<!doctype html><html><body>\n{links}</body></html>")
    with internet(tmp_path_factory.mktemp("pkgnet")) as world:
        server = subprocess.Popen(
            ["ip", "netns", "exec", world.netns, sys.executable, "-m", "http.server",
             str(PORT), "--bind", "0.0.0.0", "--directory", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(0.5)
            yield root
        finally:
            server.kill()
            server.wait()


def act(tool: str, **arguments: Any) -> Reply:
    return Reply(text=json.dumps({"tool": tool, "arguments": arguments}))


TEST_FILE = """import unittest
import demo

class DemoTest(unittest.TestCase):
    def test_latest(self):
        self.assertEqual(demo.__version__, "1.2.0")
"""
VENV = "/workspace/.venv"


def test_the_seed_chain_runs_as_a_task(
    tmp_path_factory: pytest.TempPathFactory,
    agentbox_home: Path,
    index: Path,
) -> None:
    with FakeProvider("openai") as model:
        sandbox = f"""sandbox:
  limits: {{memory: 1GiB, disk: 1GiB, idle_timeout: 0}}
  network:
    mode: allowlist
    allow: [pkg.test]
    ports: [{PORT}]
    hosts: {{pkg.test: {UPSTREAM_A}}}
providers:
  - name: scripted
    kind: openai
    base_url: {model.base_url}
    api_key_env: FAKE_KEY
    models: [fake-model]
tasks: {{workers: 1}}
"""
        model.script(
            act("fs_write", path="/workspace/requirements.txt", content="demo==1.0.0\n"),
            act("fs_write", path="/workspace/tests/test_demo.py", content=TEST_FILE),
            act("browser_open", url=f"{INDEX}/project/demo/"),
            act(
                "fs_edit", path="/workspace/requirements.txt", old="demo==1.0.0", new="demo==1.2.0"
            ),
            # the venv is used in a later call: a program path is resolved in the sandbox
            # when the command is checked, and before this call the venv does not exist yet
            act("terminal_run", timeout_ms=120000, command=f"python3 -m venv {VENV}"),
            act(
                "terminal_run",
                timeout_ms=120000,
                command=(
                    f"{VENV}/bin/python3 -m pip install -q"
                    " --disable-pip-version-check"
                    f" --index-url {INDEX}/simple --trusted-host pkg.test"
                    " -r /workspace/requirements.txt"
                ),
            ),
            act("terminal_run", command=f"cd /workspace && {VENV}/bin/python3 -m unittest -v"),
            Reply(text=json.dumps({"finish": "demo upgraded to 1.2.0; tests pass"})),
        )
        gw: RunningGateway
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwseed"),
                             env={"FAKE_KEY": "k"}, extra_yaml=sandbox) as gw:  # fmt: skip
            with gw.operator() as op:
                task_id = op.post("/v1/tasks", json={"goal": "upgrade demo to its latest "
                                  "version and make sure the tests pass"}).json()["id"]  # fmt: skip
                deadline = time.monotonic() + 240
                while time.monotonic() < deadline:
                    task = op.get(f"/v1/tasks/{task_id}").json()
                    if task["state"] in ("succeeded", "failed", "cancelled"):
                        break
                    time.sleep(0.5)
                steps = op.get(f"/v1/tasks/{task_id}/steps").json()
                try:
                    check(op, task, steps)
                finally:  # the task's sandbox goes, whatever the checks found
                    if task.get("sandbox"):
                        op.delete(f"/v1/sandboxes/{task['sandbox']}")


def check(op: Any, task: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    detail = json.dumps(steps)[:3000]
    assert task["state"] == "succeeded", (task, detail)
    opened = steps[2]["result"]
    assert "Latest version: 1.2.0" in json.dumps(opened), detail
    install, tests = steps[5]["result"], steps[6]["result"]
    assert install["exit_code"] == 0, install
    assert tests["exit_code"] == 0 and "OK" in tests["stderr"], tests
    manifest = op.get(f"/v1/sandboxes/{task['sandbox']}/files",
                      params={"path": "/workspace/requirements.txt"})  # fmt: skip
    assert "demo==1.2.0" in manifest.text
