"""Whether a command waits for input, seen from the host with no help from the sandbox.

A command waits for input when one of its processes (those of its cgroup leaf) is blocked
in a syscall that reads, or waits to read, the command's stdin: ``read``/``readv``/
``pread`` on it (bash ``read``, Python ``input()`` and ``getpass``, ``[Y/n]`` prompts), or
``poll``/``select``/``epoll_wait`` with it in the watched set (editors, REPLs). The syscall
and its arguments come from ``/proc/PID/syscall``; the fd is matched to stdin by device
and inode through ``/proc/PID/fd``; poll and select sets are read from ``/proc/PID/mem``
and epoll sets from ``/proc/PID/fdinfo``. The daemon reads these as root; a process of
the sandbox cannot make another command look blocked, only its own.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
from pathlib import Path

StreamId = tuple[int, int]  # (st_dev, st_ino) of the command's stdin

# Syscall numbers by machine: reads whose first argument is the fd, and the waits.
_SYSCALLS: dict[str, dict[str, tuple[int, ...]]] = {
    "x86_64": {
        "read": (0, 17, 19, 295, 327),  # read pread64 readv preadv preadv2
        "poll": (7, 271),  # poll ppoll
        "select": (23, 270),  # select pselect6
        "epoll": (232, 281, 441),  # epoll_wait epoll_pwait epoll_pwait2
    },
    "aarch64": {
        "read": (63, 67, 65, 69, 286),
        "poll": (73,),
        "select": (72,),
        "epoll": (22, 441),
    },
}
_CALLS = _SYSCALLS.get(os.uname().machine, _SYSCALLS["x86_64"])  # os.uname: platform costs ms
_MAX_WATCHED = 1024  # fds of a poll/select set we look at
_POLLIN = 0x1
_ANSI = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][A-Z0-9]|[=>])")
PROMPT_CHARS = 200


def stream_id(fd: int) -> StreamId:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def waiting_for_input(leaf: Path, stdin: StreamId) -> bool:
    """Whether a process of the cgroup ``leaf`` is blocked reading ``stdin``."""
    try:
        pids = [int(p) for p in (leaf / "cgroup.procs").read_text().split()]
    except OSError:
        return False
    return any(_blocked_on(pid, stdin) for pid in pids)


def _blocked_on(pid: int, stdin: StreamId) -> bool:
    try:
        fields = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError:  # gone, or not ours to inspect
        return False
    if len(fields) < 4 or not fields[0].isdigit():  # "running", or "-1 sp pc"
        return False
    nr, args = int(fields[0]), [int(a, 16) for a in fields[1:7]]
    if nr in _CALLS["read"]:
        return _is(pid, args[0], stdin)
    with contextlib.suppress(OSError, ValueError, struct.error):
        if nr in _CALLS["poll"]:
            return any(_is(pid, fd, stdin) for fd in _poll_fds(pid, args[0], args[1]))
        if nr in _CALLS["select"]:
            return any(_is(pid, fd, stdin) for fd in _select_fds(pid, args[0], args[1]))
        if nr in _CALLS["epoll"]:
            return any(_is(pid, fd, stdin) for fd in _epoll_fds(pid, args[0]))
    return False


def _is(pid: int, fd: int, stdin: StreamId) -> bool:
    try:
        st = os.stat(f"/proc/{pid}/fd/{fd}")
    except (OSError, ValueError):
        return False
    return (st.st_dev, st.st_ino) == stdin


def _read_mem(pid: int, address: int, size: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        mem.seek(address)
        return mem.read(size)


def _poll_fds(pid: int, address: int, count: int) -> list[int]:
    count = min(count, _MAX_WATCHED)
    raw = _read_mem(pid, address, 8 * count)
    entries = struct.iter_unpack("ihh", raw[: 8 * (len(raw) // 8)])
    return [fd for fd, events, _ in entries if fd >= 0 and events & _POLLIN]


def _select_fds(pid: int, nfds: int, address: int) -> list[int]:
    if not address:
        return []
    nfds = min(nfds, _MAX_WATCHED)
    bits = int.from_bytes(_read_mem(pid, address, (nfds + 7) // 8), "little")
    return [fd for fd in range(nfds) if bits >> fd & 1]


def _epoll_fds(pid: int, epfd: int) -> list[int]:
    info = Path(f"/proc/{pid}/fdinfo/{epfd}").read_text()
    return [int(m) for m in re.findall(r"^tfd:\s+(\d+)", info, re.MULTILINE)]


def prompt_text(recent: bytes) -> str:
    """The last non-empty line of what the command wrote, without terminal escapes."""
    text = _ANSI.sub(b"", recent).replace(b"\r", b"\n").decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.split("\n") if line.strip()]
    return lines[-1][-PROMPT_CHARS:] if lines else ""
