"""The async SDK is typed (it was ``Any``): the type checker sees every awaited method with
the sync method's parameters and result, and refuses a wrong argument."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

SNIPPET = """
from typing import assert_type

from agentbox import AsyncSandbox
from agentbox.client.sandbox import AsyncCommandHandle, AsyncShell
from agentbox.runtime.files import FileInfo
from agentbox.runtime.output import CommandResult
from agentbox.runtime.processes import ProcessInfo, ProcessOutput
from agentbox.runtime.store import SandboxRecord


async def use() -> None:
    sb = await AsyncSandbox.create("default", memory="128MiB", network="none")
    assert_type(sb, AsyncSandbox)
    assert_type(await AsyncSandbox.connect(sb.id), AsyncSandbox)
    assert_type(await sb.info(), SandboxRecord)
    assert_type(await sb.commands.run(["echo", "x"], timeout=5, max_output_bytes=10), CommandResult)
    handle = await sb.commands.start("sleep 1", env={"A": "1"}, stdin=True)
    assert_type(handle, AsyncCommandHandle)
    assert_type(await handle.send_stdin("y"), int)
    assert_type(await handle.read("stdout", 0), ProcessOutput)
    assert_type(await handle.wait(timeout=1), ProcessInfo)
    assert_type(await sb.files.write("/w/a", "x", perms=0o600, make_parents=False), FileInfo)
    assert_type(await sb.files.read("/w/a"), str)
    shell = await sb.shell(cwd="/tmp", env={"A": "1"})
    assert_type(shell, AsyncShell)
    assert_type(await shell.run("pwd", stdin="x", max_output_bytes=100), CommandResult)
    assert_type(await sb.fork(), AsyncSandbox)
    await sb.commands.run("x", timeout="5")  # the one error expected
"""


def test_async_sandbox_is_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "uses_async_sdk.py"
    source.write_text(SNIPPET)
    src = str(Path(__file__).resolve().parents[2] / "src")
    monkeypatch.setenv("MYPYPATH", src)  # this tree's sources, as the project's mypy sees them
    out, err, status = api.run(
        ["--strict", "--python-version", "3.11", "--no-error-summary", "--config-file", "",
         "--cache-dir", str(Path(src).parent / ".mypy_cache"), str(source)]
    )  # fmt: skip
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert len(errors) == 1 and 'Argument "timeout"' in errors[0], out + err
    assert status == 1
