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
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from agentbox.config.host import agentbox_home

SOURCE = "secrethits.c"


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
                [compiler, "-O3", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(out), str(src)],
                capture_output=True,
                check=False,
            )
            if built.returncode != 0:
                return None
            os.replace(out, library)  # atomic: concurrent builders agree on the result
    except OSError:
        return None
    return library


class _Library:
    """The C pass's functions, bound once per process."""

    def __init__(self, library: Path) -> None:
        lib = ctypes.CDLL(str(library))  # a CDLL call releases the GIL while it runs
        size = lib.secret_compiled_size
        size.restype = ctypes.c_size_t
        self.compiled_size = int(size())
        self.compile = lib.secret_compile
        self.compile.restype = ctypes.c_int
        self.compile.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        self.hits = lib.secret_hits
        self.hits.restype = ctypes.c_size_t
        self.hits.argtypes = [
            ctypes.c_char_p,  # buf
            ctypes.c_size_t,  # len
            ctypes.c_size_t,  # lo
            ctypes.c_size_t,  # hi
            ctypes.c_int,  # views
            ctypes.c_size_t,  # from
            ctypes.c_char_p,  # prog
            ctypes.c_char_p,  # compiled
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.POINTER(ctypes.c_uint8),
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        self.newlines = lib.secret_newlines
        self.newlines.restype = ctypes.c_size_t
        self.newlines.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t]


@functools.cache
def _library() -> _Library | None:
    library = _build(agentbox_home() / "lib")
    return None if library is None else _Library(library)


def available() -> bool:
    return _library() is not None


ELEMENT_TRAPS = {"s": 1, "k": 2, "i": 4}  # letters a fold trap can stand for (secrethits.c)


def program(needles: list[tuple[bool, list[tuple[frozenset[int], int]]]]) -> bytes:
    """Needles (each folded or not, and a list of (byte set, repeat count)) in the C
    pass's layout, with the bitmap of the two bytes each can start with."""
    out = bytearray(len(needles).to_bytes(4, "little"))
    pairs = bytearray(8192)
    for folded, needle in needles:
        out += int(folded).to_bytes(4, "little") + len(needle).to_bytes(4, "little")
        for byte_set, count in needle:
            bits = bytearray(32)
            for b in byte_set:
                bits[b >> 3] |= 1 << (b & 7)
            out += bits + count.to_bytes(4, "little") + _traps(byte_set).to_bytes(4, "little")
        for first, second in _starts(folded, needle):
            pair = first << 8 | second
            pairs[pair >> 3] |= 1 << (pair & 7)
    return bytes(out + pairs + _nibble_tables(pairs))


def _nibble_tables(pairs: bytearray) -> bytes:
    """The AVX2 loop's coarse filter of ``pairs``: first bytes in 8 buckets, chosen so few
    other pairs pass (a bucket lets through every pair whose bytes' low and high nibbles
    each occur among its own), as 4 tables of 16 bucket masks: first byte's low nibble,
    its high nibble, second byte's low nibble, its high nibble."""
    seconds: dict[int, set[int]] = {}
    for pair in range(65536):
        if pairs[pair >> 3] >> (pair & 7) & 1:
            seconds.setdefault(pair >> 8, set()).add(pair & 0xFF)

    def nibbles(values: set[int]) -> tuple[int, int]:
        lo = hi = 0
        for v in values:
            lo, hi = lo | 1 << (v & 15), hi | 1 << (v >> 4)
        return lo, hi

    # (first lo, first hi, second lo, second hi) nibble masks of each bucket
    buckets: list[tuple[int, int, int, int]] = [
        (*nibbles({a}), *nibbles(b)) for a, b in seconds.items()
    ]

    def cost(m: tuple[int, int, int, int]) -> int:
        return m[0].bit_count() * m[1].bit_count() * m[2].bit_count() * m[3].bit_count()

    while len(buckets) > 8:  # merge the two that let the fewest new pairs through
        best: tuple[int, int, int] | None = None
        for i in range(len(buckets)):
            for j in range(i + 1, len(buckets)):
                x, y = buckets[i], buckets[j]
                merged = (x[0] | y[0], x[1] | y[1], x[2] | y[2], x[3] | y[3])
                extra = cost(merged) - cost(x) - cost(y)
                if best is None or extra < best[0]:
                    best = (extra, i, j)
        assert best is not None
        _, i, j = best
        x, y = buckets[i], buckets[j]
        buckets[i] = (x[0] | y[0], x[1] | y[1], x[2] | y[2], x[3] | y[3])
        del buckets[j]
    tables = [bytearray(16) for _ in range(4)]
    for k, bucket in enumerate(buckets):
        for t, mask in enumerate(bucket):
            for nibble in range(16):
                if mask >> nibble & 1:
                    tables[t][nibble] |= 1 << k
    return b"".join(bytes(t) for t in tables)


_TRAPS = {1: (b"\xc5\xbf",), 2: (b"\xe2\x84\xaa",), 4: (b"\xc4\xb0", b"\xc4\xb1")}


def _traps(byte_set: frozenset[int]) -> int:
    return sum(bit for letter, bit in ELEMENT_TRAPS.items() if ord(letter) in byte_set)


def _starts(folded: bool, needle: list[tuple[frozenset[int], int]]) -> set[tuple[int, int]]:
    """The (first, second) bytes a match of the needle can start with."""
    if sum(count for _, count in needle) < 2 or (
        folded and any(b >= 0x80 for byte_set, _ in needle for b in byte_set)
    ):
        raise Unsupported  # no pair to filter on, or a fold trap would be ambiguous
    first = needle[0][0]
    second = first if needle[0][1] > 1 else needle[1][0]
    seconds = set(second)
    starts: set[tuple[int, int]] = set()
    if folded:
        for bit, traps in _TRAPS.items():
            if _traps(second) & bit:
                seconds |= {t[0] for t in traps}
            if _traps(first) & bit:
                starts |= {(t[0], t[1]) for t in traps}
    starts |= {(a, b) for a in first for b in seconds}
    return starts


class Unsupported(Exception):
    """A program the C pass cannot hold (over 256 needles, 32 per first byte, a needle of
    one byte, a folded one with bytes past ASCII): the Python pass runs instead."""


_MAX_OUT = 4096  # hits returned per call; more: called again from where it stopped


@functools.cache
def _compiled(prog: bytes) -> ctypes.Array[ctypes.c_char]:
    lib = _library()
    assert lib is not None
    compiled = ctypes.create_string_buffer(lib.compiled_size)
    if lib.compile(prog, compiled) != 0:
        raise Unsupported
    return compiled


_local = threading.local()


def _buffers() -> tuple[Any, Any, Any, ctypes.c_size_t]:
    """This thread's output arrays of the C pass (allocated once: a call per small file)."""
    buffers = getattr(_local, "buffers", None)
    if buffers is None:
        buffers = _local.buffers = (
            (ctypes.c_uint64 * _MAX_OUT)(),
            (ctypes.c_uint32 * _MAX_OUT)(),
            (ctypes.c_uint8 * _MAX_OUT)(),
            ctypes.c_size_t(0),
        )
    return buffers


def hits(
    data: bytes, lo: int, hi: int, prog: bytes, views: bool = False
) -> list[tuple[int, int, int]]:
    """(offset, needle index, view) of every match starting in [lo, hi) of ``data`` (view
    0) and, with ``views``, in [lo//2, hi//2) of its even bytes (view 1) and odd bytes
    (view 2), offsets in the view; in the order of their bytes."""
    lib = _library()
    assert lib is not None
    compiled = _compiled(prog)
    at, which, view, resume = _buffers()
    found: list[tuple[int, int, int]] = []
    start = 0
    while True:
        n = lib.hits(
            data, len(data), lo, hi, int(views), start, prog, compiled,
            at, which, view, _MAX_OUT, ctypes.byref(resume),
        )  # fmt: skip
        if n:
            found.extend(zip(at[:n], which[:n], view[:n], strict=True))
        if resume.value >= len(data):
            return found
        start = resume.value


def newlines(data: bytes, lo: int, hi: int) -> int:
    """``data.count(b"\\n", lo, hi)``, in the C pass when there is one."""
    lib = _library()
    if lib is None:
        return data.count(b"\n", lo, hi)
    return int(lib.newlines(data, lo, max(lo, min(hi, len(data)))))


__all__ = ["Unsupported", "available", "hits", "newlines", "program"]
