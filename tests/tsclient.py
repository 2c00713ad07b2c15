"""The official MCP TypeScript SDK client (tests/js, pinned in its package-lock.json).

``scripts/install.sh --dev`` installs it with ``npm ci``; :func:`ts_sdk` does the same when
the installed copy is missing or not the pinned version (it needs node and npm).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

JS = Path(__file__).resolve().parent / "js"


def ts_sdk() -> Path:
    """tests/js with its pinned packages installed (the SDK, the conformance suite, the
    Inspector, Node 22); the node script to run."""
    packages = json.loads((JS / "package-lock.json").read_text())["packages"]
    if not all(_installed(name, packages[f"node_modules/{name}"]["version"])
               for name in packages[""]["dependencies"]):  # fmt: skip
        npm = shutil.which("npm")
        assert npm, (
            "npm (node 20) is needed for the TypeScript SDK tests: apt-get install nodejs npm"
        )
        subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, check=True,
                       stdout=subprocess.DEVNULL)  # fmt: skip
    return JS / "mcp_client.mjs"


def _installed(name: str, version: str) -> bool:
    manifest = JS / "node_modules" / name / "package.json"
    return manifest.exists() and json.loads(manifest.read_text())["version"] == version


def run_ts_client(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """Run tests/js/mcp_client.mjs; its one JSON line, parsed."""
    node = shutil.which("node")
    assert node, "node (20) is needed for the TypeScript SDK tests"
    proc = subprocess.run(
        [node, str(ts_sdk()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"node exited {proc.returncode}: {proc.stderr[-4000:]}"
    return json.loads(lines[-1])
