"""Server-side TLS on a connection the proxy has already read from.

The proxy reads the start of a connection before it decides (a CONNECT head, a TLS
ClientHello on the transparent side), so asyncio's ``start_tls`` (which knows nothing of
bytes already read) cannot take it over. This runs TLS with ``ssl.MemoryBIO``: the
bytes already read are fed first, then whatever the raw stream delivers. The result is an
ordinary ``(StreamReader, StreamWriter)`` pair, so the proxy's HTTP code serves it as it
serves a plain connection. Its transport has no ``socket`` extra: nothing may splice the
raw (encrypted) socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from agentbox.network import relay

Streams = relay.Streams


class TLSHandshakeFailed(Exception):
    """The client did not complete a TLS handshake with the proxy."""


class _Transport(asyncio.Transport):
    def __init__(
        self,
        raw: Streams,
        tls: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        protocol: asyncio.StreamReaderProtocol,
    ) -> None:
        super().__init__()
        self._loop = asyncio.get_running_loop()
        self._raw_reader, self._raw_writer = raw
        self._tls = tls
        self._in = incoming
        self._out = outgoing
        self._protocol = protocol
        self._closing = False
        self._lost = False
        self._reading = asyncio.Event()
        self._reading.set()
        self._paused_writing = False
        self._pump: asyncio.Task[None] | None = None
        self._drainer: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._pump = asyncio.ensure_future(self._read_loop())

    # -- reading -------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        error: BaseException | None = None
        try:
            while True:
                if self._decrypt():
                    self._protocol.eof_received()
                    return
                await self._reading.wait()
                data = await self._raw_reader.read(relay.CHUNK)
                if data:
                    self._in.write(data)
                else:
                    self._in.write_eof()
        except asyncio.CancelledError:
            raise
        except (OSError, ssl.SSLError) as e:
            error = e
        finally:
            if error is not None:
                self._connection_lost(error)

    def _decrypt(self) -> bool:
        """Hand every decrypted byte to the protocol; True at the end of the stream."""
        while True:
            try:
                data = self._tls.read(relay.CHUNK)
            except ssl.SSLWantReadError:
                self._flush()  # post-handshake messages (tickets, key updates)
                return False
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return True
            if not data:
                return True
            self._protocol.data_received(data)

    def pause_reading(self) -> None:
        self._reading.clear()

    def resume_reading(self) -> None:
        self._reading.set()

    def is_reading(self) -> bool:
        return self._reading.is_set()

    # -- writing -------------------------------------------------------------------------

    def _flush(self) -> None:
        out = self._out.read()
        if out and not self._raw_writer.transport.is_closing():
            self._raw_writer.write(out)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing:
            raise ConnectionResetError("write to a closed TLS connection")
        if not data:
            return
        self._tls.write(bytes(data))
        self._flush()
        if (
            not self._paused_writing
            and self._raw_writer.transport.get_write_buffer_size() >= relay.WRITE_HIGH
        ):
            self._paused_writing = True
            self._protocol.pause_writing()
            self._drainer = asyncio.ensure_future(self._wait_drained())

    async def _wait_drained(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            await self._raw_writer.drain()
        self._paused_writing = False
        if not self._lost:
            self._protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close; close_notify ends both directions

    def write_eof(self) -> None:
        raise NotImplementedError("TLS connections cannot half-close")

    def get_write_buffer_size(self) -> int:
        return self._raw_writer.transport.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._raw_writer.transport.set_write_buffer_limits(high=high, low=low)

    # -- the rest ------------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "socket":
            return default  # never the raw socket: splicing it would bypass TLS
        if name == "ssl_object":
            return self._tls
        if name == "sslcontext":
            return self._tls.context
        return self._raw_writer.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._closing or self._raw_writer.transport.is_closing()

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(ssl.SSLError, OSError):
            self._tls.unwrap()  # our close_notify; the peer's need not be awaited
        self._flush()
        self._raw_writer.close()
        self._stop()
        self._loop.call_soon(self._connection_lost, None)

    def abort(self) -> None:
        self._closing = True
        self._raw_writer.transport.abort()
        self._stop()
        self._loop.call_soon(self._connection_lost, None)

    def _stop(self) -> None:
        for task in (self._pump, self._drainer):
            if task is not None and task is not asyncio.current_task():
                task.cancel()

    def _connection_lost(self, error: BaseException | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._closing = True
        self._protocol.connection_lost(error if isinstance(error, Exception) else None)


async def accept(raw: Streams, context: ssl.SSLContext, initial: bytes, timeout: float) -> Streams:
    """Run the server side of a TLS handshake on ``raw`` (``initial``: the client's bytes
    already read from it) and return the decrypted streams."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_side=True)
    incoming.write(initial)
    reader, writer = raw
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    pass
                out = outgoing.read()
                if out:
                    writer.write(out)
                    await writer.drain()
                data = await reader.read(relay.CHUNK)
                if not data:
                    raise TLSHandshakeFailed("the client closed the connection in the handshake")
                incoming.write(data)
    except TimeoutError:
        raise TLSHandshakeFailed(f"no TLS handshake within {timeout:g} s") from None
    except ssl.SSLError as e:
        # Send our alert, if any, before the caller closes.
        with contextlib.suppress(OSError, RuntimeError):
            out = outgoing.read()
            if out:
                writer.write(out)
        raise TLSHandshakeFailed(f"TLS handshake failed: {e.reason or e}") from None
    except OSError as e:
        raise TLSHandshakeFailed(f"connection failed in the TLS handshake: {e}") from None
    out = outgoing.read()
    if out:
        writer.write(out)
    stream_reader = asyncio.StreamReader(limit=relay.STREAM_LIMIT)
    protocol = asyncio.StreamReaderProtocol(stream_reader)
    transport = _Transport(raw, tls, incoming, outgoing, protocol)
    protocol.connection_made(transport)
    transport.start()
    return stream_reader, asyncio.StreamWriter(
        transport, protocol, stream_reader, asyncio.get_running_loop()
    )
