"""Small container images for integration tests: ``docker save`` tarballs holding static
binaries (no libc needed in the image), built from C source with the host's ``cc``."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    tar.addfile(info, io.BytesIO(data))


def docker_save(path: Path, files: dict[str, tuple[bytes, int]]) -> Path:
    """A one-layer ``docker save`` tarball with ``files`` (path -> (content, mode))."""
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
    return path


def static_binary(workdir: Path, name: str, c_source: str) -> bytes:
    """``c_source`` compiled statically: runs in an image that holds nothing else."""
    source = workdir / f"{name}.c"
    source.write_text(c_source)
    binary = workdir / name
    subprocess.run(["cc", "-static", "-O2", "-o", str(binary), str(source)], check=True)
    return binary.read_bytes()
