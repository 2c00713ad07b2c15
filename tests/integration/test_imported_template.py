"""An imported image (docker save format) runs as a sandbox, even without a libc."""

from __future__ import annotations

from pathlib import Path

from agentbox import Sandbox
from agentbox.runtime.templates import TemplateStore
from imagekit import docker_save, static_binary

HELLO_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("hello from uid %d\n", getuid()); return 3; }
"""


def test_libc_free_image_runs(tmp_path: Path, agentbox_home: Path, host_ready: None) -> None:
    binary = static_binary(tmp_path, "hello", HELLO_C)
    image = docker_save(tmp_path / "image.tar", {"bin/hello": (binary, 0o755)})

    TemplateStore(agentbox_home).import_image("static-hello", image)
    with Sandbox.create("static-hello", memory="64MiB", disk="32MiB", home=agentbox_home) as sb:
        r = sb.commands.run(["/bin/hello"])
        assert (r.stdout, r.exit_code) == ("hello from uid 1000\n", 3)
        # Only what the image holds: no host /usr, no shell.
        assert sb.commands.run(["/bin/sh", "-c", "true"]).exit_code == 127
