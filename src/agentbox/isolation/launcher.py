"""Build (once) and locate ``agentbox-nsexec``, the C launcher in ``nsexec.c``.

The binary is compiled with the host C compiler on first use and cached under
``$AGENTBOX_HOME/lib`` by the hash of its source, so an upgrade rebuilds it and two
versions never mix.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from agentbox.digest import sha256_hex
from agentbox.errors import HostUnsupported

SOURCE = "nsexec.c"
# The header the sources share (closing fds where close_range is missing): copied beside
# the source it is built with, and part of the binary's hash (runtime/quick_exec.py
# spells that hash again, without importing this).
HEADERS = ("closefds.h",)


def _source(name: str = SOURCE) -> bytes:
    # Beside this module, as the package installs them (not importlib.resources: its
    # import and first lookup were a tenth of the first create in a process).
    return Path(__file__).with_name(name).read_bytes()


def nsexec_path(lib_dir: Path) -> Path:
    """Path of the compiled launcher, compiling it if this source has not been built yet."""
    return static_binary(lib_dir, SOURCE, "agentbox-nsexec")


def static_binary(lib_dir: Path, source_name: str, stem: str) -> Path:
    """Path of the static build of C source ``source_name`` (this package's), built
    on first use (also the gVisor tier's exec agent, ``gvisor_agent.c``)."""
    source = _source(source_name)
    headers = {name: _source(name) for name in HEADERS}
    digest = sha256_hex(source + b"".join(headers.values()) + b"\0static")[:16]
    binary = lib_dir / f"{stem}-{digest}"
    if binary.exists():
        return binary
    import shutil  # here, as tempfile: only a build (once per host and version) needs them
    import tempfile

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise HostUnsupported(
            f"no C compiler found to build {stem}; install gcc and libc6-dev "
            "(the install script does: scripts/install.sh)"
        )
    lib_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib_dir) as tmp:
        src = Path(tmp) / source_name
        src.write_bytes(source)
        for name, text in headers.items():
            (Path(tmp) / name).write_bytes(text)
        out = Path(tmp) / stem
        result = subprocess.run(
            # Static: the same binary is the init of sandboxes whose template has another
            # libc (an imported Alpine image) or none at all.
            [compiler, "-O2", "-static", "-Wall", "-Werror", "-o", str(out), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise HostUnsupported(f"building {stem} failed:\n{result.stderr}")
        out.chmod(0o755)
        os.replace(out, binary)  # atomic: concurrent builders agree on the result
    return binary
