"""Attack 2b — the caller's environment reaches the host-side launcher, which runs as root.

``commands.run/start(env=...)`` and ``Sandbox.create(env=...)`` are agent-controlled, and
the same environment is given to ``agentbox-nsexec enter`` while it is still host root in
the host's mount namespace. A dynamically linked launcher would honour ``LD_PRELOAD``
or ``LD_AUDIT`` there and run the agent's code as host root (the agent can plant a shared
object in its workspace; its host path leaks through /proc/self/mountinfo). Covers: a
library whose constructor drops a marker on the host, named by LD_PRELOAD or LD_AUDIT
for foreground, pty and background commands and for the sandbox's own env,
is never loaded by the launcher.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.runtime.runtime import Runtime

CONSTRUCTOR = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
  int fd = open(MARKER, O_WRONLY | O_CREAT, 0644);
  if (fd >= 0) close(fd);
}
unsigned int la_version(unsigned int v) { planted(); return v; }
"""


@pytest.fixture
def planted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(shared object, marker): the object creates the marker wherever it is loaded."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler is needed (it also builds agentbox-nsexec)"
    marker = Path("/var/tmp") / f"agentbox-preload-marker-{secrets.token_hex(6)}"
    source = tmp_path / "planted.c"
    source.write_text(CONSTRUCTOR)
    lib = Path("/var/tmp") / f"agentbox-planted-{secrets.token_hex(6)}.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(source)],
        check=True,
    )
    lib.chmod(0o755)
    # Control: the object does work when a dynamic program loads it.
    subprocess.run(["true"], env={"LD_PRELOAD": str(lib)}, check=True)
    assert marker.exists(), "the planted library does not work: the test would prove nothing"
    marker.unlink()
    try:
        yield lib, marker
    finally:
        lib.unlink(missing_ok=True)
        marker.unlink(missing_ok=True)


CALLS: dict[str, Callable[[Sandbox, dict[str, str]], Any]] = {
    "run": lambda sb, env: sb.commands.run("true", env=env),
    "run-pty": lambda sb, env: sb.commands.run("true", env=env, pty=True),
    "start": lambda sb, env: sb.commands.start("true", env=env).wait(timeout=30),
    "session": lambda sb, env: sb.shell(env=env).run("true"),
}


@pytest.mark.parametrize("variable", ["LD_PRELOAD", "LD_AUDIT"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_loader_variables_never_reach_the_root_launcher(
    shared_sandbox: Sandbox, planted: tuple[Path, Path], variable: str, call: str
) -> None:
    lib, marker = planted
    # The call must run (nothing refuses these variables: they are the command's own), so
    # that a failure for another reason cannot pass for the launcher resisting them.
    CALLS[call](shared_sandbox, {variable: str(lib)})
    assert not marker.exists(), f"{variable} made the host-side launcher load agent code"


def test_sandbox_env_never_reaches_the_root_launcher(
    runtime: Runtime, agentbox_home: Path, planted: tuple[Path, Path]
) -> None:
    lib, marker = planted
    sb = Sandbox.create(
        memory="64MiB", disk="32MiB", env={"LD_PRELOAD": str(lib)}, home=agentbox_home
    )
    try:
        # The control: the variable reached the sandbox's commands.
        assert sb.commands.run("printenv LD_PRELOAD").stdout.strip() == str(lib)
        sb.commands.start("true").wait(timeout=30)
    finally:
        sb.kill()
    assert not marker.exists(), "the sandbox's LD_PRELOAD made the launcher load agent code"
