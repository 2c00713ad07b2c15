"""AsyncSandbox mirrors Sandbox."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentbox import AsyncSandbox


def test_async_sandbox_round_trip(agentbox_home: Path, host_ready: None) -> None:
    async def main() -> tuple[str, str, int, bool]:
        async with await AsyncSandbox.create(
            memory="128MiB", disk="64MiB", home=agentbox_home
        ) as sb:
            await sb.files.write("/workspace/a.txt", "async")
            results = await asyncio.gather(
                *(sb.commands.run(f"cat a.txt; echo {i}") for i in range(4))
            )
            shell = await sb.shell()
            await shell.run("cd /tmp")
            where = await shell.run("pwd")
            listed = sb.id in [r.id for r in await AsyncSandbox.list(home=agentbox_home)]
            return results[3].stdout, where.stdout, results[0].exit_code, listed

    out, where, code, listed = asyncio.run(main())
    assert (out, where, code, listed) == ("async3\n", "/tmp\n", 0, True)
