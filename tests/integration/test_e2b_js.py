"""The unmodified E2B JS SDK (npm ``e2b`` 2.x, tests/js) against the gateway's ``/e2b``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_harness import RunningGateway, running_gateway

JS = Path(__file__).parent.parent / "js"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("e2bjs"), "20s") as running:
        yield running


def test_the_js_sdk_runs_commands_and_files(gw: RunningGateway) -> None:
    node = shutil.which("node")
    assert node, "node is missing: scripts/install.sh --dev installs nodejs"
    assert (JS / "node_modules" / "e2b").is_dir(), "run scripts/install.sh --dev (npm ci)"
    env = {**os.environ, "E2B_API_URL": f"{gw.url}/e2b", "E2B_SANDBOX_URL": f"{gw.url}/e2b",
           "E2B_API_KEY": gw.operator_token}  # fmt: skip
    done = subprocess.run([node, "e2b_smoke.mjs"], cwd=JS, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["run"] == ["hi\n/home/user\n", "err\n", 0]
    assert seen["failed"] == 4
    assert seen["background"] == "bg\n"
    assert seen["read"] == "from js"
    assert seen["list"] == ["js.txt"]
    assert seen["listed"] is True
    assert "policy_denied" in seen["denied"] and "curl" in seen["denied"]
