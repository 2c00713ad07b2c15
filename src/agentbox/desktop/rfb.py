"""The viewer's half of RFB (the VNC protocol, RFC 6143), framed and filtered by the gateway.

A person's VNC client talks to the Xvnc inside a sandbox through the gateway, which has
already checked the person's token. Only the viewer's bytes are parsed here (the
server's are the sandbox's own business and pass through): every message is framed, and
a *view-only* viewer's input (keys, pointer, clipboard, screen resizes) is dropped
before it reaches the sandbox. Whatever cannot be framed ends the connection: a message
this module does not know could hide input.

The handshake is pinned to what the gateway allows: security type None (1) — the
gateway's token is the authentication — and a shared session (ClientInit's flag is
forced to 1, so one viewer never disconnects another).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from agentbox.errors import RfbViolation

SECURITY_NONE = 1
MAX_CUT_TEXT = 1 << 20  # a clipboard larger than this is refused, not buffered
_VERSIONS = {b"RFB 003.003\n": 3, b"RFB 003.007\n": 7, b"RFB 003.008\n": 8}
# Messages of a fixed length: type -> (length, is input).
_FIXED = {
    0: (20, False),  # SetPixelFormat
    3: (10, False),  # FramebufferUpdateRequest
    4: (8, True),  # KeyEvent
    5: (6, True),  # PointerEvent
    150: (10, False),  # EnableContinuousUpdates
}
_SET_ENCODINGS, _CUT_TEXT, _FENCE, _SET_DESKTOP_SIZE = 2, 6, 248, 251


@dataclass
class ViewerStream:
    """Feed the viewer's bytes in; get back what may go on to the sandbox's VNC server."""

    control: bool
    state: str = "version"
    minor: int = 0
    dropped: int = 0  # input messages a view-only viewer sent (not forwarded)
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        out = bytearray()
        while True:
            message = self._next()
            if message is None:
                return bytes(out)
            out += message

    def _next(self) -> bytes | None:
        buf = self._buf
        if self.state == "version":
            if len(buf) < 12:
                return None
            version = bytes(buf[:12])
            if version not in _VERSIONS:
                raise RfbViolation(f"unknown RFB version {version!r}")
            self.minor = _VERSIONS[version]
            self.state = "init" if self.minor == 3 else "security"
            return self._take(12)
        if self.state == "security":
            if not buf:
                return None
            if buf[0] != SECURITY_NONE:
                raise RfbViolation("the gateway relays security type None only")
            self.state = "init"
            return self._take(1)
        if self.state == "init":
            if not buf:
                return None
            self._take(1)
            self.state = "messages"
            return b"\x01"  # shared: never disconnect the other viewers
        return self._message()

    def _message(self) -> bytes | None:
        buf = self._buf
        if not buf:
            return None
        kind = buf[0]
        if kind in _FIXED:
            length, is_input = _FIXED[kind]
        elif kind == _SET_ENCODINGS:
            if len(buf) < 4:
                return None
            length, is_input = 4 + 4 * struct.unpack_from(">H", buf, 2)[0], False
        elif kind == _CUT_TEXT:
            if len(buf) < 8:
                return None
            size = abs(struct.unpack_from(">i", buf, 4)[0])  # negative: extended clipboard
            if size > MAX_CUT_TEXT:
                raise RfbViolation(f"a clipboard of {size} bytes (the cap is {MAX_CUT_TEXT})")
            length, is_input = 8 + size, True
        elif kind == _FENCE:
            if len(buf) < 9:
                return None
            length, is_input = 9 + buf[8], False
        elif kind == _SET_DESKTOP_SIZE:
            if len(buf) < 8:
                return None
            length, is_input = 8 + 16 * buf[6], True
        else:
            raise RfbViolation(f"RFB message type {kind} is not relayed")
        if len(buf) < length:
            return None
        message = self._take(length)
        if is_input and not self.control:
            self.dropped += 1
            return b""
        return message

    def _take(self, n: int) -> bytes:
        data = bytes(self._buf[:n])
        del self._buf[:n]
        return data
