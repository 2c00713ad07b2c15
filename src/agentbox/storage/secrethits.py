"""The pre-filter's one pass in C (``secrethits.c``), loaded through ctypes.

Python's ``bytes.find`` is fast per needle, but the secret scan has ~50 needles, and a
bytes regex with a class at its start runs at tens of MB/s: on every byte of a snapshot
that is the slowest stage. The C pass looks at each byte once. It is built with the host
C compiler on first use and cached under ``$AGENTBOX_HOME/lib`` by the hash of its source
(like ``isolation.launcher``); without a compiler the scan uses the Python pass instead
(``secretwindows``): the same hits, slower.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path

from agentbox.config.host import agentbox_home

SOURCE = "secrethits.c"
_MAX_OUT = 4096  # hits returned per call; more: called again from the last one


def _build(lib_dir: Path) -> Path | None:
    source = resources.files("agentbox.storage").joinpath(SOURCE).read_bytes()
    digest = hashlib.sha256(source + b"\0shared").hexdigest()[:16]
    library = lib_dir / f"agentbox-secrethits-{digest}.so"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        lib_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib_dir) as tmp:
            src, out = Path(tmp) / SOURCE, Path(tmp) / "secrethits.so"
            src.write_bytes(source)
            built = subprocess.run(
                [compiler, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(src)],
                capture_output=True,
                check=False,
            )
            if built.returncode != 0:
                return None
            os.replace(out, library)  # atomic: concurrent builders agree on the result
    except OSError:
        return None
    return library


@functools.cache
def _function() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    library = _build(agentbox_home() / "lib")
    if library is None:
        return None
    fn = ctypes.CDLL(str(library)).secret_hits
    fn.restype = ctypes.c_size_t
    fn.argtypes = [
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_uint32),
        ctypes.c_size_t,
    ]
    return fn


def available() -> bool:
    return _function() is not None


def program(needles: list[list[tuple[frozenset[int], int]]]) -> bytes:
    """Needles (each a list of (byte set, repeat count)) in the C pass's layout."""
    out = bytearray(len(needles).to_bytes(4, "little"))
    for needle in needles:
        out += len(needle).to_bytes(4, "little")
        for byte_set, count in needle:
            bits = bytearray(32)
            for b in byte_set:
                bits[b >> 3] |= 1 << (b & 7)
            out += bits + count.to_bytes(4, "little")
    return bytes(out)


class Unsupported(Exception):
    """The program has more needles than the C pass holds (256, 32 per first byte)."""


def hits(data: bytes, lo: int, hi: int, prog: bytes) -> list[tuple[int, int]]:
    """(offset, needle index) of every match starting in [lo, hi), in order."""
    fn = _function()
    assert fn is not None
    at = (ctypes.c_uint64 * _MAX_OUT)()
    which = (ctypes.c_uint32 * _MAX_OUT)()
    found: list[tuple[int, int]] = []
    while lo < hi:
        n = fn(data, len(data), lo, hi, prog, at, which, _MAX_OUT)
        if n == ctypes.c_size_t(-1).value:
            raise Unsupported
        found.extend(zip(at[:n], which[:n], strict=True))
        if n < _MAX_OUT:
            break
        lo = at[n - 1]  # again from there: it may hold more hits than were returned
    return found


__all__ = ["Unsupported", "available", "hits", "program"]
