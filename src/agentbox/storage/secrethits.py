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
        self.newlines.argtypes = [
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_size_t,
            ctypes.c_size_t,
        ]


@functools.cache
def _library() -> _Library | None:
    library = _build(agentbox_home() / "lib")
    return None if library is None else _Library(library)


def available() -> bool:
    return _library() is not None


ELEMENT_TRAPS = {"s": 1, "k": 2, "i": 4}  # letters a fold trap can stand for (secrethits.c)


Needle = list[tuple[frozenset[int], int]]  # (byte set, repeat count) elements


def program(needles: list[tuple[bool, Needle]]) -> bytes:
    """Needles (each folded or not) in the C pass's layout, then the bitmap of the two
    bytes each can start with, then the AVX2 loop's nibble tables."""
    out = bytearray(len(needles).to_bytes(4, "little"))
    starts: dict[int, tuple[set[int], set[int]]] = {}  # first byte: (seconds, thirds)
    for folded, needle in needles:
        out += int(folded).to_bytes(4, "little") + len(needle).to_bytes(4, "little")
        for byte_set, count in needle:
            bits = bytearray(32)
            for b in byte_set:
                bits[b >> 3] |= 1 << (b & 7)
            out += bits + count.to_bytes(4, "little") + _traps(byte_set).to_bytes(4, "little")
        for first, second, third in _starts(folded, needle):
            seconds, thirds = starts.setdefault(first, (set(), set()))
            seconds.add(second)
            thirds |= third
    pairs = bytearray(8192)
    for first, (seconds, _) in starts.items():
        for second in seconds:
            pair = first << 8 | second
            pairs[pair >> 3] |= 1 << (pair & 7)
    return bytes(out + pairs + _nibble_tables(starts))


def _nibble_tables(starts: dict[int, tuple[set[int], set[int]]]) -> bytes:
    """The AVX2 loop's coarse filter of the needles' first three bytes: first bytes in 8
    buckets, chosen so few other triples pass (a bucket lets through every triple whose
    bytes' low and high nibbles each occur among its own), as 6 tables of 16 bucket
    masks: the low then the high nibble of the first, second and third byte."""

    def nibbles(values: set[int]) -> tuple[int, int]:
        lo = hi = 0
        for v in values:
            lo, hi = lo | 1 << (v & 15), hi | 1 << (v >> 4)
        return lo, hi

    Bucket = tuple[int, int, int, int, int, int]
    buckets: list[Bucket] = [
        (*nibbles({a}), *nibbles(seconds), *nibbles(thirds))
        for a, (seconds, thirds) in sorted(starts.items())
    ]

    def cost(m: Bucket) -> int:
        out = 1
        for mask in m:
            out *= mask.bit_count()
        return out

    def merge(x: Bucket, y: Bucket) -> Bucket:
        return (x[0] | y[0], x[1] | y[1], x[2] | y[2], x[3] | y[3], x[4] | y[4], x[5] | y[5])

    while len(buckets) > 8:  # merge the two that let the fewest new triples through
        best: tuple[int, int, int] | None = None
        for i in range(len(buckets)):
            for j in range(i + 1, len(buckets)):
                x, y = buckets[i], buckets[j]
                extra = cost(merge(x, y)) - cost(x) - cost(y)
                if best is None or extra < best[0]:
                    best = (extra, i, j)
        assert best is not None
        _, i, j = best
        buckets[i] = merge(buckets[i], buckets[j])
        del buckets[j]
    tables = [bytearray(16) for _ in range(6)]
    for k, bucket in enumerate(buckets):
        for t, mask in enumerate(bucket):
            for nibble in range(16):
                if mask >> nibble & 1:
                    tables[t][nibble] |= 1 << k
    return b"".join(bytes(t) for t in tables)


_TRAPS = {1: (b"\xc5\xbf",), 2: (b"\xe2\x84\xaa",), 4: (b"\xc4\xb0", b"\xc4\xb1")}
_ANY = frozenset(range(256))


def _traps(byte_set: frozenset[int]) -> int:
    return sum(bit for letter, bit in ELEMENT_TRAPS.items() if ord(letter) in byte_set)


def _starts(folded: bool, needle: Needle) -> list[tuple[int, int, frozenset[int]]]:
    """(first byte, second byte, the bytes that can follow those two) of every way a
    match of the needle can start."""
    if sum(count for _, count in needle) < 2 or (
        folded and any(b >= 0x80 for byte_set, _ in needle for b in byte_set)
    ):
        raise Unsupported  # no pair to filter on, or a fold trap would be ambiguous
    chars = [byte_set for byte_set, count in needle for _ in range(min(count, 3))][:3]

    def options(i: int) -> list[bytes]:
        """What the i-th character can be: one of its bytes, or a fold trap."""
        if i >= len(chars):
            return []
        out = [bytes([b]) for b in sorted(chars[i])]
        if folded:
            out += [t for bit, traps in _TRAPS.items() if _traps(chars[i]) & bit for t in traps]
        return out

    def firsts(i: int) -> frozenset[int]:
        return frozenset(o[0] for o in options(i)) if i < len(chars) else _ANY

    starts = []
    for one in options(0):
        if len(one) >= 3:
            starts.append((one[0], one[1], frozenset({one[2]})))
        elif len(one) == 2:
            starts.append((one[0], one[1], firsts(1)))
        else:
            for two in options(1):
                third = frozenset({two[1]}) if len(two) > 1 else firsts(2)
                starts.append((one[0], two[0], third))
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


def newlines(data: bytes, lo: int, hi: int, stride: int = 1) -> int:
    """Newline bytes among ``data[lo:hi:stride]`` (stride 1 or 2), in the C pass when
    there is one."""
    hi = max(lo, min(hi, len(data)))
    lib = _library()
    if lib is None:
        return data.count(b"\n", lo, hi) if stride == 1 else data[lo:hi:stride].count(b"\n")
    return int(lib.newlines(data, lo, hi, stride))


__all__ = ["Unsupported", "available", "hits", "newlines", "program"]
