"""The nftables ruleset's generation: a number the kernel changes with every committed
ruleset change (any table's), read over nfnetlink without running ``nft``.

``plane.ensure_host_setup`` checks agentbox's table by listing it with ``nft`` (a process
and a ruleset parse: the first create in each process paid it). Once it has checked, it
notes the generation; a later process that reads the same generation knows nothing in
the ruleset changed since, so the table is still the one that was checked. (The note
lives in /run, so a reboot forgets it.)
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct

NETLINK_NETFILTER = 12
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_GETGEN, _NFT_MSG_NEWGEN = 16, 15
_NFTA_GEN_ID = 1
_NLMSG_ERROR = 2
_NLM_F_REQUEST = 0x1
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_NFGENMSG = struct.Struct("=BBH")  # family, version, res_id
_ATTR = struct.Struct("=HH")  # nlattr: len, type


def generation() -> int | None:
    """The current ruleset generation of this network namespace, or None when the kernel
    does not say (no nf_tables, an error): then the caller checks the slow way."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    except OSError:
        return None
    try:
        sock.settimeout(2.0)
        kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETGEN
        body = _NFGENMSG.pack(socket.AF_UNSPEC, 0, 0)
        sock.send(_HEADER.pack(_HEADER.size + len(body), kind, _NLM_F_REQUEST, 1, 0) + body)
        data = sock.recv(65536)
    except OSError:
        return None
    finally:
        sock.close()
    return _parse(data)


def _parse(data: bytes) -> int | None:
    if len(data) < _HEADER.size + _NFGENMSG.size:
        return None
    length, kind, _, _, _ = _HEADER.unpack_from(data)
    if kind == _NLMSG_ERROR or kind != (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_NEWGEN:
        return None
    offset = _HEADER.size + _NFGENMSG.size
    end = min(length, len(data))
    while offset + _ATTR.size <= end:
        size, attr = _ATTR.unpack_from(data, offset)
        if size < _ATTR.size:
            return None
        if attr & 0x3FFF == _NFTA_GEN_ID and size >= _ATTR.size + 4:
            return int(struct.unpack_from(">I", data, offset + _ATTR.size)[0])
        offset += (size + 3) & ~3
    return None


def checked_path(directory: str) -> str:
    """Per network namespace (its inode): each has its own ruleset and generations."""
    netns = os.stat("/proc/self/ns/net").st_ino
    return os.path.join(directory, f"nft-checked-{netns}")


def read_checked(directory: str) -> int | None:
    """The generation at which the table was last checked (or loaded), if noted."""
    try:
        with open(checked_path(directory)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def note_checked(directory: str, gen: int) -> None:
    """Note ``gen`` as checked (best effort: without it, the next process checks again)."""
    path = checked_path(directory)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(str(gen))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
