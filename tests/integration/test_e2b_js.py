"""The unmodified E2B JS SDK (npm ``e2b`` 2.x, tests/js) against the gateway's ``/e2b``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway_harness import RunningGateway, running_gateway

JS = Path(__file__).parent.parent / "js"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(
        agentbox_home, tmp_path_factory.mktemp("e2bjs"), "20s", terminals=True
    ) as running:
        yield running


def run_js(gw: RunningGateway, script: str) -> dict[str, Any]:
    """Run ``script`` (in tests/js) with the three E2B variables; its last line, parsed."""
    node = shutil.which("node")
    assert node, "node is missing: scripts/install.sh --dev installs nodejs"
    assert (JS / "node_modules" / "e2b").is_dir(), "run scripts/install.sh --dev (npm ci)"
    env = {**os.environ, "E2B_API_URL": f"{gw.url}/e2b", "E2B_SANDBOX_URL": f"{gw.url}/e2b",
           "E2B_API_KEY": gw.operator_token}  # fmt: skip
    done = subprocess.run([node, script], cwd=JS, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def test_the_js_sdk_runs_commands_and_files(gw: RunningGateway) -> None:
    seen = run_js(gw, "e2b_smoke.mjs")
    assert seen["run"] == ["hi\n/home/user\n", "err\n", 0]
    assert seen["failed"] == 4
    assert seen["background"] == "bg\n"
    assert seen["read"] == "from js"
    assert seen["list"] == ["js.txt"]
    assert seen["listed"] is True
    assert "policy_denied" in seen["denied"] and "curl" in seen["denied"]


def test_the_js_sdk_drives_a_terminal_and_closes_stdin(gw: RunningGateway) -> None:
    seen = run_js(gw, "e2b_pty.mjs")
    assert seen["exit"] == 0
    assert "from-js-2" in seen["pty"]
    assert seen["pty"].index("24 80") < seen["pty"].index("43 132")
    assert seen["cat"] == ["piped to cat", 0]
    audit = [json.loads(line) for line in gw.audit_path.read_text().splitlines()]
    tools = {r["tool"] for r in audit if r.get("sandbox") == seen["id"]}
    assert {"process_start", "process_write", "process_resize"} <= tools
