"""An imported image (docker save format) runs as a sandbox, even without a libc."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.runtime.host import UID_BASE
from agentbox.runtime.template_tiers import TIERS
from agentbox.runtime.templates import TemplateStore
from imagekit import docker_save, static_binary

HELLO_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("hello from uid %d\n", getuid()); return 3; }
"""


@pytest.mark.parametrize("tier", TIERS)
def test_libc_free_image_runs(
    tmp_path: Path, agentbox_home: Path, host_ready: None, tier: str
) -> None:
    """On gvisor too: every command there runs under the exec agent's own static wrapper,
    nothing of the template's (util-linux's unshare was needed before)."""
    binary = static_binary(tmp_path, "hello", HELLO_C)
    image = docker_save(tmp_path / "image.tar", {"bin/hello": (binary, 0o755)})

    TemplateStore(agentbox_home).import_image("static-hello", image)
    with Sandbox.create("static-hello", memory="64MiB", disk="32MiB", isolation=tier,
                        home=agentbox_home) as sb:  # fmt: skip
        # gvisor: the sandbox user is its host uid (no user namespace under the Sentry)
        uid = 1000 if tier == "namespaces" else UID_BASE + sb.info().slot
        r = sb.commands.run(["/bin/hello"])
        assert (r.stdout, r.exit_code) == (f"hello from uid {uid}\n", 3)
        # Only what the image holds: no host /usr, no shell.
        assert sb.commands.run(["/bin/sh", "-c", "true"]).exit_code == 127
