"""An imported image (docker save format) runs as a sandbox, even without a libc."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

from agentbox import Sandbox
from agentbox.runtime.templates import TemplateStore

HELLO_C = r"""
#include <stdio.h>
#include <unistd.h>
int main(void) { printf("hello from uid %d\n", getuid()); return 3; }
"""


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def _docker_save(path: Path, files: dict[str, tuple[bytes, int]]) -> None:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for name, (data, mode) in files.items():
            _add(t, name, data, mode)
    config = json.dumps({"config": {}, "rootfs": {"type": "layers"}}).encode()
    manifest = [{"Config": "config.json", "RepoTags": ["t:1"], "Layers": ["l1/layer.tar"]}]
    with tarfile.open(path, "w") as out:
        _add(out, "config.json", config)
        _add(out, "l1/layer.tar", layer.getvalue())
        _add(out, "manifest.json", json.dumps(manifest).encode())


def test_libc_free_image_runs(tmp_path: Path, agentbox_home: Path, host_ready: None) -> None:
    source = tmp_path / "hello.c"
    source.write_text(HELLO_C)
    binary = tmp_path / "hello"
    subprocess.run(["cc", "-static", "-O2", "-o", str(binary), str(source)], check=True)
    image = tmp_path / "image.tar"
    _docker_save(image, {"bin/hello": (binary.read_bytes(), 0o755)})

    TemplateStore(agentbox_home).import_image("static-hello", image)
    with Sandbox.create("static-hello", memory="64MiB", disk="32MiB", home=agentbox_home) as sb:
        r = sb.commands.run(["/bin/hello"])
        assert (r.stdout, r.exit_code) == ("hello from uid 1000\n", 3)
        # Only what the image holds: no host /usr, no shell.
        assert sb.commands.run(["/bin/sh", "-c", "true"]).exit_code == 127
