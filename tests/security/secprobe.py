"""Helpers of the security suite: run a probe inside a sandbox, name its host uid, and
describe host secrets a sandbox must never see."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox import Sandbox
from agentbox.runtime.host import UID_BASE


def host_uid(sb: Sandbox) -> int:
    """The host uid every process of ``sb`` runs as."""
    return UID_BASE + sb.info().slot


def run_python(sb: Sandbox, script: str, *, timeout: float = 30.0, pty: bool = False) -> Any:
    """Run ``script`` with the sandbox's python3; it must print one JSON value last."""
    r = sb.commands.run(["python3", "-c", script], timeout=timeout, pty=pty)
    assert r.exit_code == 0, f"probe failed ({r.exit_code}): {r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def dir_entries(sb: Sandbox, path: str) -> list[str] | str:
    """The names in directory ``path`` inside the sandbox, or the errno name that refused
    the listing. Python's listdir, not ``ls``: ``ls`` fails on the gvisor tier (EINVAL,
    docs/design.md), and a check that a name is absent from its empty output passes
    without having looked."""
    script = (
        "import errno, json, os, sys\n"
        "try:\n    print(json.dumps(sorted(os.listdir(sys.argv[1]))))\n"
        "except OSError as e:\n    print(json.dumps(errno.errorcode.get(e.errno, str(e))))"
    )
    r = sb.commands.run(["python3", "-c", script, path], timeout=30)
    assert r.exit_code == 0 and not r.timed_out, f"listing {path} failed: {r.stdout}{r.stderr}"
    found: list[str] | str = json.loads(r.stdout.strip().splitlines()[-1])
    return found


@dataclass(frozen=True)
class HostSecret:
    """World-readable files on the host holding a random value: only the sandbox's root,
    not file permissions, keeps them from a sandbox."""

    value: str
    name: str
    dir: Path  # /var/tmp/NAME (0755)
    file: Path  # /var/tmp/NAME/secret.txt (0644)
    tmp_file: Path  # /tmp/NAME.txt (0644)
    root_file: Path  # /root/NAME.txt

    @property
    def files(self) -> list[Path]:
        return [self.file, self.tmp_file, self.root_file]


def not_on(tier: str, unsupported: str, reason: str) -> None:
    """Skip on tier ``unsupported``, saying why the attack does not apply there (a skip,
    never a pass: keep these few, each with its reason)."""
    import pytest

    if tier == unsupported:
        pytest.skip(f"does not apply on the {tier} tier: {reason}")
