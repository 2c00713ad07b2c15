"""The egress proxy: every outbound TCP connection of a sandbox goes through here.

Two front doors, one decision procedure (:func:`decision.decide`):

* explicit (``HTTP(S)_PROXY``): ``CONNECT host:port`` tunnels, whose TLS ClientHello
  must name the same host, and absolute-form ``GET http://host/...`` requests, whose
  Host header must agree with the URL (forwarded one request per upstream connection);
* transparent: connections nftables redirected here; the name comes from the TLS
  ClientHello's SNI or the HTTP Host header, the port from the original destination, and
  the original destination address is only recorded (we connect where *we* resolved).
  Plain HTTP is forwarded one request per connection, each one's Host decided.

Hosts with a credential (:mod:`credentials`) are the one exception to "never look inside":
their HTTP requests are parsed one by one, the header is set (replacing the client's),
and responses are scrubbed of the secret. HTTPS to such a host (CONNECT, or transparent
with that SNI) is terminated here with a certificate of the home's CA (:mod:`egressca`),
and forwarded over a new TLS connection verified against the system trust store. Every
other TLS connection is relayed untouched.

The proxy connects only to an address it resolved and checked itself (pinned: no second
lookup). Exactly one :class:`EgressDecision` goes to ``on_decision`` per connection: at
the denial, or when the relay ends (with byte counts and duration).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import socket
import ssl
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agentbox.errors import InvalidRequest
from agentbox.network import clienthello, credentials, forward, httphead, peek, relay, tlsserver
from agentbox.network.addresses import IPAddress, IPNetwork
from agentbox.network.decision import (
    Asker,
    Conn,
    Denied,
    EgressDecision,
    EgressPolicy,
    Kind,
    Target,
    decide,
    printable,
)
from agentbox.network.names import normalize_host, parse_ip_literal

if TYPE_CHECKING:
    from agentbox.network.egressca import EgressCA

__all__ = ["EgressDecision", "EgressPolicy", "EgressProxy", "so_original_dst"]

log = logging.getLogger("agentbox.egress")

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same value
MAX_CONNECTIONS = 256
HEAD_TIMEOUT = 10.0
IDLE_TIMEOUT = 300.0
LINGER = 2.0  # after an error answer, how long to wait for the client to hang up
_TRY_ADDRESSES = 4  # resolved (and checked) addresses tried in turn
# A request line's start: a method, one space, a visible character. (SSH, SMTP replies
# and the like do not look like this.)
_HTTP_START = re.compile(rb"^[A-Z]{1,20} [\x21-\x7e]")
_PHRASES = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    429: "Too Many Requests",
    502: "Bad Gateway",
}
Streams = relay.Streams
Serve = Callable[[Streams, EgressPolicy, Conn], Coroutine[Any, Any, None]]


def so_original_dst(sock: socket.socket) -> tuple[str, int]:
    """Where a connection redirected by nftables (dnat/redirect) was going."""
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)  # sockaddr_in6
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), int.from_bytes(raw[2:4], "big")
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # sockaddr_in
    return socket.inet_ntoa(raw[4:8]), int.from_bytes(raw[2:4], "big")


def _error_response(status: int, reason: str) -> bytes:
    body = f"agentbox egress: {printable(reason)}\n".encode()
    head = (
        f"HTTP/1.1 {status} {_PHRASES.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


def _tls_error(e: BaseException) -> str:
    return str(
        getattr(e, "verify_message", None)
        or getattr(e, "reason", None)
        or getattr(e, "strerror", None)
        or e
        or type(e).__name__
    )


def _canonical_host(raw: str) -> str:
    """A comparable form of a host (name or literal); the raw text if it is neither."""
    literal = parse_ip_literal(raw)
    if literal is not None:
        return str(literal)
    try:
        return normalize_host(raw)
    except InvalidRequest:
        return raw


class EgressProxy:
    """The filtering proxy. One instance serves every sandbox; ``policy_for`` tells them
    apart by the client's source address (None: an unknown client, refused)."""

    def __init__(
        self,
        policy_for: Callable[[str], EgressPolicy | None],
        on_decision: Callable[[EgressDecision], None],
        extra_denied: Iterable[IPNetwork | IPAddress | str] = (),
        connect_timeout: float = 10.0,
        *,
        original_dst: Callable[[socket.socket], tuple[str, int]] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        head_timeout: float = HEAD_TIMEOUT,
        idle_timeout: float = IDLE_TIMEOUT,
        zero_copy: bool = True,
        ca: EgressCA | None = None,
        upstream_tls: ssl.SSLContext | None = None,
        secrets: Mapping[str, str] | None = None,
        ask: Asker | None = None,
    ) -> None:
        self._policy_for = policy_for
        self._on_decision = on_decision
        self.extra_denied: tuple[IPNetwork, ...] = tuple(
            ipaddress.ip_network(n, strict=False) for n in extra_denied
        )
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self.head_timeout = head_timeout
        self.idle_timeout = idle_timeout
        self.zero_copy = zero_copy  # splice(2) relays; False: copy through the streams
        self._original_dst = original_dst or so_original_dst
        # Credential injection: the CA that signs our certificates for credential hosts,
        # the trust for the upstream side, and where secrets are read (at request time).
        self.ca = ca
        self._upstream_tls = upstream_tls
        self._secrets: Mapping[str, str] = os.environ if secrets is None else secrets
        self._ask = ask  # mode ask: holds a connection for a person's decision
        self._active: dict[str, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- servers and handlers ------------------------------------------------------------

    async def serve_explicit(self, host: str, port: int) -> asyncio.Server:
        """An HTTP proxy (CONNECT and absolute-form requests) on ``host:port``."""
        return await asyncio.start_server(
            self.handle_explicit, host, port, limit=relay.STREAM_LIMIT, backlog=1024
        )

    async def serve_transparent(self, host: str, port: int) -> asyncio.Server:
        """The target of nftables' redirect, for connections that ignore the proxy."""
        return await asyncio.start_server(
            self.handle_transparent, host, port, limit=relay.STREAM_LIMIT, backlog=1024
        )

    async def handle_explicit(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._handle(reader, writer, "http", self._explicit)

    async def handle_transparent(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await self._handle(reader, writer, "transparent", self._transparent)

    async def aclose(self) -> None:
        """Cancel every connection still being handled (close the servers first)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def active_connections(self, sandbox_id: str) -> int:
        return self._active.get(sandbox_id, 0)

    # -- one connection ------------------------------------------------------------------

    async def _handle(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        kind: Kind,
        serve: Serve,
    ) -> None:
        conn = Conn(
            kind=kind, started=asyncio.get_running_loop().time(), can_respond=kind == "http"
        )
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        relay.tune(writer)
        try:
            policy = self._lookup(writer, conn)
            with self._slot(policy.sandbox_id):
                await serve((reader, writer), policy, conn)
        except Denied as deny:
            self._finish(conn, False, deny.reason)
            if deny.status and conn.can_respond:
                await self._answer(reader, writer, deny.status, deny.reason)
        except Exception as e:
            log.exception("egress proxy: unexpected error on a %s connection", kind)
            conn.broken = True
            self._finish(conn, False, f"internal error: {type(e).__name__}")
        finally:
            # Cancellation (shutdown) lands here too: the one decision is still emitted.
            self._finish(conn, False, "connection closed by the proxy")
            await relay.close(writer, abort=conn.broken)
            if task is not None:
                self._tasks.discard(task)

    def _lookup(self, writer: asyncio.StreamWriter, conn: Conn) -> EgressPolicy:
        peer = writer.get_extra_info("peername")
        ip = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(ip)
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                ip = str(address.ipv4_mapped)  # how a dual-stack listener sees v4 clients
        try:
            policy = self._policy_for(ip)
        except Exception:
            log.exception("egress proxy: policy lookup failed for %s", ip)
            raise Denied(f"policy lookup failed for client {ip}", 0) from None
        if policy is None:
            raise Denied("unknown client", 0)
        conn.sandbox_id = policy.sandbox_id
        return policy

    @contextlib.contextmanager
    def _slot(self, sandbox_id: str) -> Iterator[None]:
        count = self._active.get(sandbox_id, 0)
        if count >= self.max_connections:
            raise Denied(f"too many connections (max {self.max_connections} per sandbox)", 429)
        self._active[sandbox_id] = count + 1
        try:
            yield
        finally:
            left = self._active[sandbox_id] - 1
            if left:
                self._active[sandbox_id] = left
            else:
                del self._active[sandbox_id]

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, reason: str
    ) -> None:
        """Write an error answer, then linger briefly: closing with unread input would send
        a reset, which can destroy the answer before the client reads it."""
        if writer.transport.is_closing():
            return
        writer.write(_error_response(status, reason))
        relay.half_close(writer)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(LINGER):
                for _ in range(64):
                    if not await reader.read(relay.CHUNK):
                        break

    def _finish(
        self, conn: Conn, allowed: bool, reason: str, traffic: relay.Traffic | None = None
    ) -> None:
        """Emit the connection's one decision (later calls are no-ops)."""
        if conn.done:
            return
        conn.done = True
        if conn.note:
            reason = f"{reason}; {conn.note}"
        elapsed = asyncio.get_running_loop().time() - conn.started
        decision = EgressDecision(
            sandbox_id=conn.sandbox_id,
            allowed=allowed,
            host=conn.host,
            port=conn.port,
            address=conn.address,
            reason=printable(reason, 1000),
            kind=conn.kind,
            bytes_up=traffic.up if traffic else 0,
            bytes_down=traffic.down if traffic else 0,
            duration_ms=elapsed * 1000.0,
        )
        try:
            self._on_decision(decision)
        except Exception:
            log.exception("egress proxy: on_decision failed for %r", decision)

    # -- resolving and connecting ----------------------------------------------------------

    async def _decide(self, policy: EgressPolicy, raw: str, port: int, conn: Conn) -> Target:
        return await decide(policy, raw, port, conn, self._resolve, self.extra_denied, self._ask)

    async def _resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
        """Every address the system resolver gives for ``name`` (not in the host map)."""
        try:
            infos = await asyncio.wait_for(self._getaddrinfo(name, port), self.connect_timeout)
        except TimeoutError:
            raise Denied(f"resolving {name} timed out", 502) from None
        except OSError as e:
            raise Denied(f"cannot resolve {name}: {e.strerror or e}", 502) from None
        found: list[IPAddress] = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                address = ipaddress.ip_address(str(sockaddr[0]))
                if address not in found:
                    found.append(address)
        if not found:
            raise Denied(f"{name} has no IPv4 or IPv6 address", 502)
        return tuple(found)

    async def _getaddrinfo(
        self, name: str, port: int
    ) -> list[tuple[Any, Any, int, str, tuple[Any, ...]]]:
        # The trailing dot makes the name absolute: no resolv.conf search domains.
        return await asyncio.get_running_loop().getaddrinfo(
            name + ".", port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )

    async def _open(self, target: Target, conn: Conn, tls: ssl.SSLContext | None = None) -> Streams:
        """Connect to the first reachable address of those checked (never re-resolved);
        with ``tls``, over TLS to ``target.name``, its certificate verified."""
        failures = []
        for address in target.addresses[:_TRY_ADDRESSES]:
            try:
                streams = await self._connect(address, target.port)
            except (OSError, TimeoutError) as e:
                failures.append(f"{address}: {e.strerror if isinstance(e, OSError) else e}")
                continue
            conn.address = str(address)
            if tls is not None:
                try:
                    await streams[1].start_tls(
                        tls,
                        server_hostname=target.name,
                        ssl_handshake_timeout=self.connect_timeout,
                    )
                except (OSError, TimeoutError) as e:
                    await relay.close(streams[1], abort=True)
                    failures.append(f"{address}: TLS: {_tls_error(e)}")
                    continue
            return streams
        conn.address = str(target.addresses[0])
        raise Denied(f"cannot connect to {target.name} ({'; '.join(failures)})", 502)

    async def _connect(self, address: IPAddress, port: int) -> Streams:
        # AI_NUMERICHOST: the host is the literal we checked; nothing may resolve it again.
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                str(address),
                port,
                family=socket.AF_INET6 if address.version == 6 else socket.AF_INET,
                flags=socket.AI_NUMERICHOST,
                limit=relay.STREAM_LIMIT,
            ),
            self.connect_timeout,
        )
        relay.tune(writer)
        return reader, writer

    # -- explicit proxy ------------------------------------------------------------------

    async def _explicit(self, client: Streams, policy: EgressPolicy, conn: Conn) -> None:
        reader, writer = client
        raw, rest = await peek.client_head(reader, b"", self.head_timeout)
        with peek.bad_request():
            request = httphead.parse_request(raw)
        method, target, _ = request.first
        if method == "CONNECT":
            conn.kind = "connect"
            with peek.bad_request():
                host, port = httphead.split_authority(target, None)
            await self._tunnel(reader, writer, policy, conn, host, port, rest)
        else:
            await self._forward(reader, writer, policy, conn, request, rest)

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy,
        conn: Conn,
        request: httphead.Head,
        rest: bytes,
    ) -> None:
        """One absolute-form request, rewritten to origin-form, on its own connection."""
        with peek.bad_request():
            host, port, origin = httphead.split_absolute(request.first[1])
            body = httphead.request_body(request)
        self._check_host_header(request, host, port)
        await self._plain((reader, writer), policy, conn, (host, port), request, rest, body, origin)

    async def _plain(
        self,
        client: Streams,
        policy: EgressPolicy,
        conn: Conn,
        to: tuple[str, int],
        request: httphead.Head,
        rest: bytes,
        body: int | None,
        origin: str | None,
    ) -> None:
        """A plain-HTTP request to ``to``, decided, then forwarded alone; ``origin``
        None: the request's own target (checked after the decision)."""
        aim = await self._decide(policy, *to, conn)
        if origin is None:
            origin = self._origin(request)
        injected = self._injections(aim)
        await self._one_request(client, conn, aim, request, rest, body, origin, injected, tls=False)

    async def _one_request(
        self,
        client: Streams,
        conn: Conn,
        aim: Target,
        request: httphead.Head,
        rest: bytes,
        body: int | None,
        origin: str,
        injected: list[credentials.Injection],
        *,
        tls: bool,
    ) -> None:
        """Forward exactly one request (its body framed) on a new upstream connection (TLS
        with ``tls``) and relay the response until the upstream closes. ``injected``
        headers replace the client's, and the response is scrubbed of their secrets."""
        upstream = await self._open(aim, conn, self._upstream_context() if tls else None)
        traffic = relay.Traffic()
        default_port = 443 if tls else 80
        authority = aim.name if aim.port == default_port else f"{aim.name}:{aim.port}"
        headers = [(i.header, i.value) for i in injected]
        if injected:
            # Compressed responses could carry an echoed secret past the scrubber.
            headers.append(("Accept-Encoding", "identity"))
            names = ", ".join(dict.fromkeys(i.header for i in injected))
            aim = replace(aim, why=f"{aim.why}; injected {names}")
        relay.send(
            upstream[1],
            httphead.rewrite_request(request, origin, authority, headers),
            traffic,
            upward=True,
        )
        scrub = credentials.Scrubber(i.secret for i in injected) if injected else None
        work = relay.supervise(
            traffic,
            self.idle_timeout,
            main=[
                forward.response(
                    upstream,
                    client,
                    traffic,
                    conn,
                    zero_copy=self.zero_copy and not tls and scrub is None,
                    scrub=scrub,
                )
            ],
            others=[forward.request_body(client, upstream[1], rest, body, traffic)],
        )
        await self._run(conn, aim, traffic, work, client[1], upstream)

    def _injections(self, aim: Target) -> list[credentials.Injection]:
        """The headers to set for ``aim``, read now; Denied when a secret is missing."""
        if not aim.credentials:
            return []
        try:
            return credentials.injections(aim.credentials, self._secrets)
        except credentials.MissingCredential as e:
            raise Denied(str(e)) from None

    def _upstream_context(self) -> ssl.SSLContext:
        if self._upstream_tls is None:
            self._upstream_tls = upstream_context()
        return self._upstream_tls

    async def _intercept(self, client: Streams, conn: Conn, aim: Target, initial: bytes) -> None:
        """A TLS connection to a credential host: terminated here (our certificate for
        ``aim.name``), one request read, checked, injected and forwarded over new TLS."""
        injected = self._injections(aim)  # a missing secret is refused before any TLS
        if self.ca is None:
            raise Denied("credential injection over TLS needs the egress CA; none configured")
        context = self.ca.server_context(aim.name)
        if conn.kind == "connect":
            client[1].write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        conn.can_respond = False
        try:
            tls = await tlsserver.accept(client, context, initial, self.head_timeout)
        except tlsserver.TLSHandshakeFailed as e:
            raise Denied(f"{e} (the proxy terminates TLS for credential hosts)", 0) from None
        try:
            conn.can_respond = True
            raw, rest = await peek.client_head(tls[0], b"", self.head_timeout)
            with peek.bad_request():
                request = httphead.parse_request(raw)
                body = httphead.request_body(request)
            origin = self._origin(request)
            self._check_host_header(request, aim.name, aim.port, default_port=443)
            await self._one_request(tls, conn, aim, request, rest, body, origin, injected, tls=True)
        except Denied as deny:
            # Answered here, inside TLS: the caller's answer would go out in plain text.
            if deny.status and conn.can_respond:
                await self._answer(tls[0], tls[1], deny.status, deny.reason)
            raise Denied(deny.reason, 0) from None
        finally:
            await relay.close(tls[1], abort=conn.broken)

    @staticmethod
    def _origin(request: httphead.Head) -> str:
        """The origin-form target of a request sent to the origin (not to a proxy)."""
        method, target, _ = request.first
        if target.startswith("/") or (target == "*" and method == "OPTIONS"):
            return target
        raise Denied(f"request target {target[:100]!a} is not origin-form (/path)", 400)

    @staticmethod
    def _check_host_header(
        request: httphead.Head, host: str, port: int, default_port: int = 80
    ) -> None:
        values = request.get_all("host")
        if len(values) > 1:
            raise Denied("more than one Host header", 400)
        if not values:
            return  # HTTP/1.0: the URL's authority is sent as Host
        with peek.bad_request("bad Host header: "):
            header_host, header_port = httphead.split_authority(values[0], default_port)
        if _canonical_host(header_host) != _canonical_host(host) or header_port != port:
            raise Denied(
                f"Host header {values[0][:100]!a} does not match the URL authority "
                f"{host[:100]!a}:{port}"
            )

    async def _tunnel(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy,
        conn: Conn,
        host: str,
        port: int,
        rest: bytes,
    ) -> None:
        aim = await self._decide(policy, host, port, conn)
        if aim.credentials:
            await self._intercept((reader, writer), conn, aim, rest)
            return
        upstream = await self._open(aim, conn)
        try:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            conn.can_respond = False
            if rest:
                client_first, upstream_first = rest, b""
            else:
                client_first, upstream_first = await peek.first_bytes(
                    reader, upstream[0], self.head_timeout
                )
            if clienthello.looks_like_tls(client_first):
                client_first = await peek.whole_record(reader, client_first, self.head_timeout)
                sni = peek.sni(client_first)
                if sni is not None and sni != aim.name:
                    raise Denied(f"SNI {sni} does not match CONNECT {aim.name}")
        except BaseException:
            await relay.close(upstream[1], abort=True)
            raise
        await self._relay_both(conn, aim, (reader, writer), upstream, client_first, upstream_first)

    # -- transparent proxy ---------------------------------------------------------------

    async def _transparent(self, client: Streams, policy: EgressPolicy, conn: Conn) -> None:
        reader, writer = client
        try:
            dst_ip, dst_port = self._original_dst(writer.get_extra_info("socket"))
        except OSError as e:
            raise Denied(f"no original destination: {e}", 0) from None
        conn.port = dst_port
        conn.note = f"original destination {dst_ip}:{dst_port} (not used)"
        try:
            async with asyncio.timeout(self.head_timeout):
                first = await reader.read(relay.CHUNK)
        except TimeoutError:
            raise Denied(f"client sent nothing within {self.head_timeout:g} s", 0) from None
        if not first:
            raise Denied("client sent nothing", 0)
        if _HTTP_START.match(first):
            await self._transparent_http(reader, writer, policy, conn, first, dst_port)
            return
        if not clienthello.looks_like_tls(first):
            raise Denied("not HTTP or TLS", 0)
        first = await peek.whole_record(reader, first, self.head_timeout)
        host = peek.sni(first)
        if host is None:
            raise Denied("no SNI in the TLS ClientHello; name a host", 0)
        aim = await self._decide(policy, host, dst_port, conn)
        if aim.credentials:
            await self._intercept((reader, writer), conn, aim, first)
            return
        upstream = await self._open(aim, conn)
        conn.can_respond = False
        await self._relay_both(conn, aim, (reader, writer), upstream, first, b"")

    async def _transparent_http(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        policy: EgressPolicy,
        conn: Conn,
        first: bytes,
        port: int,
    ) -> None:
        """One request, decided by its Host header, on its own upstream connection (a
        second request on the connection could name another host: it is never sent)."""
        conn.can_respond = True
        raw, rest = await peek.client_head(reader, first, self.head_timeout)
        with peek.bad_request("malformed HTTP request: "):
            request = httphead.parse_request(raw)
            values = request.get_all("host")
            if len(values) != 1:
                raise Denied("plain HTTP without exactly one Host header", 400)
            host = httphead.split_authority(values[0], port)[0]
            body = httphead.request_body(request)
        await self._plain((reader, writer), policy, conn, (host, port), request, rest, body, None)

    # -- relaying ------------------------------------------------------------------------

    async def _relay_both(
        self,
        conn: Conn,
        aim: Target,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        client_first: bytes,
        upstream_first: bytes,
    ) -> None:
        """Relay both ways, after the bytes each side already sent (peeked for the decision)."""
        traffic = relay.Traffic()
        relay.send(upstream[1], client_first, traffic, upward=True)
        relay.send(client[1], upstream_first, traffic, upward=False)
        work = relay.relay(client, upstream, traffic, self.idle_timeout, zero_copy=self.zero_copy)
        await self._run(conn, aim, traffic, work, client[1], upstream)

    async def _run(
        self,
        conn: Conn,
        aim: Target,
        traffic: relay.Traffic,
        work: Coroutine[Any, Any, None],
        writer: asyncio.StreamWriter,
        upstream: Streams,
    ) -> None:
        """Relay until done, then emit the allow decision with the byte counts."""
        ended = ""
        try:
            await work
        except Denied as e:  # the upstream's answer was unusable
            ended = f"; {e.reason}"
            conn.broken = not conn.can_respond
            if conn.can_respond and not writer.transport.is_closing():
                writer.write(_error_response(e.status or 502, e.reason))
                conn.can_respond = False
        except relay.IdleTimeout as e:
            ended = f"; closed: {e}"  # a clean close: both sides get EOF
        except (OSError, EOFError, InvalidRequest) as e:
            ended = f"; relay ended: {e}"
            conn.broken = True
        finally:
            self._finish(conn, True, f"allowed: {aim.why}{ended}", traffic)
            await relay.close(upstream[1], abort=conn.broken)


def upstream_context(extra_ca: str | None = None) -> ssl.SSLContext:
    """How the proxy verifies the hosts it re-encrypts to: the system trust store, plus
    the PEM file ``extra_ca`` when given (private deployments, tests)."""
    context = ssl.create_default_context()
    if extra_ca:
        context.load_verify_locations(cafile=extra_ca)
    context.set_alpn_protocols(["http/1.1"])
    return context
