"""A minimal websocket client on a bare asyncio protocol: just what a load
generator needs, at a few microseconds per frame.

Client frames are masked with the all-zero key (valid per RFC 6455: the mask
bit is set and the payload unchanged), so sending costs no byte loop. Server
frames are never masked. Pings are answered; fragments are reassembled.

With ``deflate`` it offers permessage-deflate as Chromium does
(``permessage-deflate; client_max_window_bits``), so a server that accepts it
pays what a browser costs it; like Chromium it then compresses every message
it sends, and inflates what the server compressed (RFC 7692).
"""

from __future__ import annotations

import asyncio
import base64
import os
import struct
import zlib
from collections.abc import Callable

TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA

#: ``(opcode, payload)`` for every complete text or binary message.
OnMessage = Callable[[int, bytes], None]
#: What Chromium sends in ``Sec-WebSocket-Extensions``.
CHROMIUM_EXTENSIONS = "permessage-deflate; client_max_window_bits"
RSV1 = 0x40
_TAIL = b"\x00\x00\xff\xff"  # the empty stored block a sync flush ends with (RFC 7692 7.2.1)


class Deflate:
    """permessage-deflate as the server's response set it up."""

    def __init__(self, response: str):
        params = dict((p.split("=", 1) + [""])[:2] for p in (part.strip() for part in response.split(";")[1:]) if p)
        self.server_bits = int(params.get("server_max_window_bits") or 15)
        self.client_bits = int(params.get("client_max_window_bits") or 15)
        self.server_reset = "server_no_context_takeover" in params
        self.client_reset = "client_no_context_takeover" in params
        self._inflater = zlib.decompressobj(wbits=-self.server_bits)
        self._deflater = zlib.compressobj(wbits=-max(9, self.client_bits))

    def inflate(self, payload: bytes) -> bytes:
        if self.server_reset:
            self._inflater = zlib.decompressobj(wbits=-self.server_bits)
        return self._inflater.decompress(payload + _TAIL)

    def deflate(self, payload: bytes) -> bytes:
        if self.client_reset:
            self._deflater = zlib.compressobj(wbits=-max(9, self.client_bits))
        data = self._deflater.compress(payload) + self._deflater.flush(zlib.Z_SYNC_FLUSH)
        return data[:-4] if data.endswith(_TAIL) else data


class HandshakeError(ConnectionError):
    pass


class WsClient(asyncio.Protocol):
    def __init__(self, on_message: OnMessage):
        self.on_message = on_message
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._handshaken = False
        self._dispatching = False
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fragments: list[bytes] = []
        self._fragment_op = 0
        self._fragment_compressed = False
        self._offered = False
        #: Set when the server accepted permessage-deflate.
        self.deflate: Deflate | None = None

    # ---------------------------------------------------------------- opening

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        path: str,
        on_message: OnMessage,
        subprotocols: list[str] | None = None,
        timeout: float = 30.0,
        deflate: bool = False,
    ) -> WsClient:
        loop = asyncio.get_running_loop()
        _, client = await asyncio.wait_for(loop.create_connection(lambda: cls(on_message), host, port), timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        if subprotocols:
            lines.append(f"Sec-WebSocket-Protocol: {', '.join(subprotocols)}")
        if deflate:
            lines.append(f"Sec-WebSocket-Extensions: {CHROMIUM_EXTENSIONS}")
        client._offered = deflate
        assert client.transport is not None
        client.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await asyncio.wait_for(client._opened, timeout)
        client._dispatching = True
        loop.call_soon(client.data_received, b"")  # runs after the caller holds the client
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._opened.done():
            self._opened.set_exception(exc or ConnectionError("closed during the handshake"))
        if not self.closed.done():
            self.closed.set_result(None)

    # ---------------------------------------------------------------- frames

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        if not self._handshaken:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head_lines = bytes(buffer[:end]).split(b"\r\n")
            status = head_lines[0]
            del buffer[: end + 4]
            if b" 101 " not in status + b" ":
                self._opened.set_exception(HandshakeError(status.decode(errors="replace")))
                self.transport.close()  # type: ignore[union-attr]
                return
            try:
                self._accept_extensions(head_lines[1:])
            except HandshakeError as exc:
                self._opened.set_exception(exc)
                self.transport.close()  # type: ignore[union-attr]
                return
            self._handshaken = True
            self._opened.set_result(None)
        if not self._dispatching:
            return  # frames right behind the handshake wait until connect() returned
        pos, size = 0, len(buffer)
        while size - pos >= 2:
            first, second = buffer[pos], buffer[pos + 1]
            length = second & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = (buffer[pos + 2] << 8) | buffer[pos + 3]
                head = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = struct.unpack_from(">Q", buffer, pos + 2)[0]
                head = 10
            masked = second & 0x80
            if masked:
                head += 4
            if size - pos < head + length:
                break
            payload = bytes(buffer[pos + head : pos + head + length])
            if masked:  # servers never mask; tolerate it anyway
                mask = buffer[pos + head - 4 : pos + head]
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            pos += head + length
            self._frame(first & 0x80, first & 0x0F, payload, first & RSV1)
        if pos:
            del buffer[:pos]

    def _accept_extensions(self, header_lines: list[bytes]) -> None:
        for line in header_lines:
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "sec-websocket-extensions" and "permessage-deflate" in value:
                if not self._offered:
                    raise HandshakeError("the server chose permessage-deflate, which was not offered")
                self.deflate = Deflate(value.strip())

    def _frame(self, fin: int, opcode: int, payload: bytes, compressed: int = 0) -> None:
        if opcode == PING:
            self._write(PONG, payload)
        elif opcode == CLOSE:
            self._write(CLOSE, payload[:2])
            self.transport.close()  # type: ignore[union-attr]
        elif opcode == 0:  # continuation
            self._fragments.append(payload)
            if fin:
                whole, self._fragments = b"".join(self._fragments), []
                if self._fragment_compressed:
                    whole = self.deflate.inflate(whole)  # type: ignore[union-attr]
                self.on_message(self._fragment_op, whole)
        elif opcode in (TEXT, BINARY):
            if fin:
                self.on_message(opcode, self.deflate.inflate(payload) if compressed else payload)  # type: ignore[union-attr]
            else:
                self._fragment_op, self._fragments = opcode, [payload]
                self._fragment_compressed = bool(compressed)

    def _write(self, opcode: int, payload: bytes) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        first = 0x80 | opcode
        if self.deflate is not None and opcode in (TEXT, BINARY):
            payload, first = self.deflate.deflate(payload), first | RSV1
        length = len(payload)
        if length < 126:
            header = bytes((first, 0x80 | length))
        elif length < 65536:
            header = bytes((first, 0x80 | 126)) + length.to_bytes(2, "big")
        else:
            header = bytes((first, 0x80 | 127)) + length.to_bytes(8, "big")
        transport.write(header + b"\x00\x00\x00\x00" + payload)  # zero mask key: payload unchanged

    def send_text(self, text: str) -> None:
        self._write(TEXT, text.encode())

    def send_binary(self, data: bytes) -> None:
        self._write(BINARY, data)

    def close(self) -> None:
        self._write(CLOSE, (1000).to_bytes(2, "big"))
        if self.transport is not None:
            self.transport.close()
