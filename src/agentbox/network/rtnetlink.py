"""The few rtnetlink requests that give a sandbox its veth, sent from this process.

``ip -batch`` and ``nsenter … ip -batch`` did the same in two processes per create
(~6 ms of a ~20 ms create on an idle host); these are the same messages iproute2 sends,
on a NETLINK_ROUTE socket of the namespace they concern (a socket belongs to the
namespace it was created in: see ``ports.socket_in_netns``). A library (pyroute2) costs
hundreds of milliseconds to import, more than the processes it would save.

Every request asks for an acknowledgement; a refusal is raised as ``OSError`` with the
kernel's errno.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import os
import socket
import struct
from pathlib import Path

# linux/rtnetlink.h, linux/if_link.h, linux/veth.h, linux/if_addr.h
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 17, 18, 20, 24
NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_PID, IFLA_NET_NS_FD = 3, 18, 19, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_GATEWAY, RTA_OIF = 5, 4
RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST = 254, 3, 0, 1
IFF_UP = 0x1
RTMGRP_LINK = 0x1  # multicast group of link changes (RTM_NEWLINK / RTM_DELLINK)

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg
_ATTR = struct.Struct("=HH")  # rtattr: len, type
_seq = itertools.count(1)


def attr(kind: int, payload: bytes) -> bytes:
    length = _ATTR.size + len(payload)
    return _ATTR.pack(length, kind) + payload + b"\0" * (-length % 4)


def _name(name: str) -> bytes:
    return name.encode() + b"\0"


def _ipv4(address: str) -> bytes:
    return ipaddress.IPv4Address(address).packed


class Route:
    """A NETLINK_ROUTE socket (of whichever namespace made it) and its requests."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    @classmethod
    def here(cls) -> Route:
        return cls(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE))

    def __enter__(self) -> Route:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes) -> bytes:
        """Send one request and return the reply (an ACK's is empty)."""
        seq = next(_seq)
        header = _HEADER.pack(_HEADER.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0)
        self.sock.send(header + body)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, rtype, _, rseq, _ = _HEADER.unpack_from(data, offset)
                payload = data[offset + _HEADER.size : offset + length]
                offset += (length + 3) & ~3
                if rseq != seq:
                    continue  # a stale answer to an earlier request
                if rtype == NLMSG_ERROR:
                    (error,) = struct.unpack_from("=i", payload)
                    if error:
                        raise OSError(-error, f"rtnetlink: {os.strerror(-error)}")
                    return b""
                return payload

    def add_veth(self, name: str, peer: str, peer_netns: int | Path) -> None:
        """A veth pair: ``name`` here, ``peer`` in the network namespace of a pid, or of
        a namespace file (a pinned netns: the gVisor tier's)."""
        fd = os.open(peer_netns, os.O_RDONLY | os.O_CLOEXEC) if isinstance(peer_netns, Path) else -1
        try:
            where = (
                attr(IFLA_NET_NS_FD, struct.pack("=I", fd))
                if fd >= 0
                else attr(IFLA_NET_NS_PID, struct.pack("=I", peer_netns))
            )
            peer_info = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, _name(peer)) + where
            linkinfo = attr(IFLA_INFO_KIND, b"veth") + attr(
                IFLA_INFO_DATA, attr(VETH_INFO_PEER, peer_info)
            )
            body = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, _name(name))
            body += attr(IFLA_LINKINFO, linkinfo)
            self.request(RTM_NEWLINK, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)
        finally:
            if fd >= 0:
                os.close(fd)

    def delete_link(self, name: str) -> None:
        """Delete link ``name`` (a veth: its peer goes with it)."""
        body = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, _name(name))
        self.request(RTM_DELLINK, NLM_F_ACK, body)

    def index(self, name: str) -> int:
        body = _IFINFO.pack(0, 0, 0, 0, 0) + attr(IFLA_IFNAME, _name(name))
        reply = self.request(RTM_GETLINK, 0, body)
        return int(_IFINFO.unpack_from(reply)[2])

    def add_address(self, index: int, address: str, prefixlen: int) -> None:
        body = _IFADDR.pack(socket.AF_INET, prefixlen, 0, RT_SCOPE_UNIVERSE, index)
        body += attr(IFA_LOCAL, _ipv4(address)) + attr(IFA_ADDRESS, _ipv4(address))
        self.request(RTM_NEWADDR, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)

    def set_up(self, index: int) -> None:
        self.request(RTM_NEWLINK, NLM_F_ACK, _IFINFO.pack(0, 0, index, IFF_UP, IFF_UP))

    def add_default_route(self, gateway: str, index: int) -> None:
        body = _RTMSG.pack(
            socket.AF_INET, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, RT_SCOPE_UNIVERSE, RTN_UNICAST, 0
        )
        body += attr(RTA_GATEWAY, _ipv4(gateway)) + attr(RTA_OIF, struct.pack("=I", index))
        self.request(RTM_NEWROUTE, NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, body)


class LinkWatch:
    """A NETLINK_ROUTE socket subscribed to this namespace's link changes: a link's
    removal is seen the moment the kernel announces it (name, addresses and routes gone),
    which is before a ``delete_link`` returns (the deleting call then waits an RCU barrier
    for the device's memory, 10-20 ms on a busy host)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK,
                                  socket.NETLINK_ROUTE)  # fmt: skip
        try:
            self.sock.bind((0, RTMGRP_LINK))
        except OSError:
            self.sock.close()
            raise

    def close(self) -> None:
        self.sock.close()

    def deleted(self, index: int) -> bool | None:
        """Read what is queued: True once the removal of link ``index`` is announced,
        False if not yet, None if announcements were lost (the queue overflowed: the
        caller looks for itself)."""
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return False
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    return None
                raise
            offset = 0
            while offset + _HEADER.size + _IFINFO.size <= len(data):
                length, rtype, _, _, _ = _HEADER.unpack_from(data, offset)
                if length < _HEADER.size:
                    break
                announced = _IFINFO.unpack_from(data, offset + _HEADER.size)[2]
                if rtype == RTM_DELLINK and announced == index:
                    return True
                offset += (length + 3) & ~3
