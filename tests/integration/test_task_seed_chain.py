"""The first seed's example chain, run as a batch task by the reference loop with a
scripted model: open a package's page in the browser, read the latest version, edit the
dependency manifest, install it, run the tests. Everything real: the sandbox, its egress
path, Chromium, pip, a package index served from a network namespace this test creates
(documentation address 203.0.113.10, reached through a /32 route only)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browserkit import require_browser
from fakeproviders import FakeProvider, Reply
from gateway_harness import RunningGateway, running_gateway
from pkgindex import (
    INDEX,
    INSTALL,
    INSTALL_TIMEOUT_MS,
    MAKE_VENV,
    NETWORK_YAML,
    PROJECT_TEST,
    REQUIREMENTS,
    RUN_TESTS,
    package_site,
)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_browser()
    with package_site(tmp_path_factory.mktemp("pkgsite")) as root:
        yield root


def act(tool: str, **arguments: Any) -> Reply:
    return Reply(text=json.dumps({"tool": tool, "arguments": arguments}))


def test_the_seed_chain_runs_as_a_task(
    tmp_path_factory: pytest.TempPathFactory,
    agentbox_home: Path,
    index: Path,
) -> None:
    with FakeProvider("openai") as model:
        sandbox = f"""sandbox:
  limits: {{memory: 1GiB, disk: 1GiB, idle_timeout: 0}}
{NETWORK_YAML}providers:
  - name: scripted
    kind: openai
    base_url: {model.base_url}
    api_key_env: FAKE_KEY
    models: [fake-model]
tasks: {{workers: 1, on_end: stop}}
"""
        model.script(
            act("fs_write", path="/workspace/requirements.txt", content=REQUIREMENTS),
            act("fs_write", path="/workspace/tests/test_demo.py", content=PROJECT_TEST),
            act("browser_open", url=f"{INDEX}/project/demo/"),
            act(
                "fs_edit", path="/workspace/requirements.txt", old="demo==1.0.0", new="demo==1.2.0"
            ),
            act("terminal_run", timeout_ms=INSTALL_TIMEOUT_MS, command=MAKE_VENV),
            act("terminal_run", timeout_ms=INSTALL_TIMEOUT_MS, command=INSTALL),
            act("terminal_run", command=RUN_TESTS),
            Reply(text=json.dumps({"finish": "demo upgraded to 1.2.0; tests pass"})),
        )
        gw: RunningGateway
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("gwseed"),
                             env={"FAKE_KEY": "k"}, extra_yaml=sandbox,
                             timeout_ms=INSTALL_TIMEOUT_MS) as gw:  # fmt: skip
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
    assert tests["exit_code"] == 0 and "Ran 1 test" in tests["stderr"], tests
    assert tests["stderr"].rstrip().endswith("OK"), tests
    # on_end: stop keeps the task's disk (the worker stops it just after the task ends);
    # resumed, its edit is there.
    for _ in range(600):
        if op.get(f"/v1/sandboxes/{task['sandbox']}").json()["state"] == "stopped":
            break
        time.sleep(0.05)
    assert op.post(f"/v1/sandboxes/{task['sandbox']}/resume").status_code == 200
    manifest = op.get(f"/v1/sandboxes/{task['sandbox']}/files",
                      params={"path": "/workspace/requirements.txt"})  # fmt: skip
    assert "demo==1.2.0" in manifest.text
