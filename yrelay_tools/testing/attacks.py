"""Attack clients of issue 30, and what a victim of them measures.

Everything here talks to a real server over loopback; nothing imports the
server's internals, so the same functions measure any checkout (the code
before a fix and after it). ``bench/attack_probe.py`` runs them side by
side; tests can call them on their own.

Attacks (each returns a dict of what it measured; ``on_event(name, data)``
is called at the moments a caller may want to sample the server):

* :func:`ping_flood`: ``{"op":"ping"}`` text frames as fast as a socket
  takes them, pre-masked and written in large batches on a raw socket, with
  or without a ``hello`` first; reconnects whenever the server closes it.
* :func:`query_awareness_flood`: y-protocols query-awareness messages (one
  byte each) on ``/yws/<doc>``, in rounds of ``queries``; counts the bytes
  the server sent back (the amplification).
* :func:`half_frames`: waves of websockets that declare a large frame,
  send part of it and stall; how each socket ended.
* :func:`ops_body`: an unauthenticated ``POST /ops/gc`` with a large body,
  streamed in chunks (``Transfer-Encoding: chunked``).
* :func:`burst`: clients of one subject each sending a burst of updates
  through :class:`yrelay.client.YrelayClient`; the error codes they got.

Measurement: :class:`Victim` (a writer and a reader on ``/ws``, the
update-to-delivery latency of each update), :class:`PresenceCrowd` (large
presence states on a document), :class:`HealthProbe` (``/healthz`` every
100 ms from a thread), :class:`ProcessSampler` (RSS and CPU of a process
every 50 ms) and :func:`count_log_lines`.

The raw-socket attacks are plain blocking functions with threads of their
own: run them in another process (or thread) than the one measuring, so
the attacker's own CPU does not show up as the victim's latency.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import random
import re
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

OnEvent = Callable[[str, dict[str, Any]], None]

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10
MiB = 1024 * 1024


def _no_event(name: str, data: dict[str, Any]) -> None:
    pass


def mint_token(secret: str, subject: str, docs: Iterable[str], permission: str = "write", ttl: float = 6 * 3600) -> str:
    """A client token the server's built-in JWT authentication accepts,
    minted with the project's own code (``yrelay token issue``)."""
    from yrelay.auth import issue_token

    return issue_token(secret, subject, list(docs), permission, ttl)


# ---------------------------------------------------------------- raw websockets


class HandshakeRefused(OSError):
    """The upgrade did not answer 101 (``status`` is the HTTP status, or 0)."""

    def __init__(self, status: int, detail: str = ""):
        super().__init__(f"websocket upgrade refused: {status} {detail}".strip())
        self.status = status


def open_websocket(
    host: str,
    port: int,
    path: str,
    protocols: Iterable[str] = (),
    timeout: float = 10.0,
) -> tuple[socket.socket, bytes]:
    """A websocket upgrade on a plain blocking socket: the socket (no
    timeout) and whatever bytes came after the 101 response's head."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {path} HTTP/1.1",
            f"Host: {host}:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
        offered = list(protocols)
        if offered:
            lines.append("Sec-WebSocket-Protocol: " + ", ".join(offered))
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        received = b""
        while b"\r\n\r\n" not in received:
            chunk = sock.recv(65536)
            if not chunk:
                raise HandshakeRefused(0, "closed during the upgrade")
            received += chunk
            if len(received) > 65536:
                raise HandshakeRefused(0, "response head too long")
        head, _, rest = received.partition(b"\r\n\r\n")
        try:
            status = int(head.split(b" ", 2)[1])
        except (IndexError, ValueError):
            raise HandshakeRefused(0, "not HTTP") from None
        if status != 101:
            raise HandshakeRefused(status)
        sock.settimeout(None)
        return sock, rest
    except BaseException:
        sock.close()
        raise


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload or key == b"\0\0\0\0":
        return payload
    n = len(payload)
    keys = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(keys, "big")).to_bytes(n, "big")


def frame_header(opcode: int, length: int, key: bytes, fin: bool = True) -> bytes:
    """A client frame's header (masked, as a client must) declaring ``length`` payload bytes."""
    head = bytearray([(0x80 if fin else 0) | opcode])
    if length < 126:
        head.append(0x80 | length)
    elif length < 65536:
        head.append(0x80 | 126)
        head += length.to_bytes(2, "big")
    else:
        head.append(0x80 | 127)
        head += length.to_bytes(8, "big")
    return bytes(head) + key


def client_frame(opcode: int, payload: bytes, key: bytes | None = None) -> bytes:
    """One whole masked client frame."""
    key = os.urandom(4) if key is None else key
    return frame_header(opcode, len(payload), key) + _mask(payload, key)


_CODE = re.compile(rb'"code"\s*:\s*"([a-z_]+)"')
_OP = re.compile(rb'"op"\s*:\s*"([a-z_]+)"')


class FrameStream:
    """Counts the frames a server sends (unmasked), without keeping large
    payloads: text frames up to ``keep`` bytes are classified by their
    ``op`` (an ``error`` by its ``code``), a close frame gives its code."""

    def __init__(self, keep: int = 4096):
        self.keep = keep
        self.bytes = 0
        self.frames: Counter[int] = Counter()
        self.payload_bytes: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.close_code: int | None = None
        self.close_reason = ""
        self.first_text: bytes | None = None
        self.first_binary: bytes | None = None
        self._head = bytearray()
        self._skip = 0
        self._collect: tuple[int, int] | None = None
        self._payload = bytearray()

    def feed(self, data: bytes) -> None:
        self.bytes += len(data)
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                take = min(self._skip, n - i)
                self._skip -= take
                i += take
                continue
            if self._collect is not None:
                opcode, length = self._collect
                take = min(length - len(self._payload), n - i)
                self._payload += data[i : i + take]
                i += take
                if len(self._payload) == length:
                    self._collect = None
                    payload, self._payload = bytes(self._payload), bytearray()
                    self._frame(opcode, length, payload)
                continue
            take = min(14 - len(self._head), n - i)
            self._head += data[i : i + take]
            i += take
            parsed = self._parse_head()
            if parsed is None:
                continue
            opcode, length, head_length = parsed
            i -= len(self._head) - head_length  # what was taken past the header belongs to the payload
            self._head.clear()
            if length == 0:
                self._frame(opcode, 0, b"")
            elif length <= self.keep or opcode == OP_CLOSE:
                self._collect = (opcode, length)
            else:
                self._skip = length
                self._frame(opcode, length, None)

    def _parse_head(self) -> tuple[int, int, int] | None:
        head = self._head
        if len(head) < 2:
            return None
        opcode, length, size = head[0] & 0x0F, head[1] & 0x7F, 2
        if length == 126:
            size = 4
        elif length == 127:
            size = 10
        masked = head[1] & 0x80
        if masked:
            size += 4
        if len(head) < size:
            return None
        if length == 126:
            length = int.from_bytes(head[2:4], "big")
        elif length == 127:
            length = int.from_bytes(head[2:10], "big")
        if masked:  # a server never masks; counted, not unmasked
            self.kinds["masked_from_server"] += 1
        return opcode, length, size

    def _frame(self, opcode: int, length: int, payload: bytes | None) -> None:
        self.frames[opcode] += 1
        self.payload_bytes[opcode] += length
        if opcode == OP_CLOSE and payload is not None:
            self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.close_reason = payload[2:].decode(errors="replace")
        elif opcode == OP_TEXT:
            if payload is None:
                self.kinds["text_large"] += 1
                return
            if self.first_text is None:
                self.first_text = payload
            code = _CODE.search(payload)
            op = _OP.search(payload)
            self.kinds[("error:" + code.group(1).decode()) if code else (op.group(1).decode() if op else "text")] += 1
        elif opcode == OP_BINARY:
            if self.first_binary is None and payload is not None:
                self.first_binary = payload
            self.kinds["binary"] += 1


class _Reader(threading.Thread):
    """Reads one socket into a :class:`FrameStream` until EOF, an error or a
    close frame (then shuts the socket down, so a writer blocked on it returns)."""

    def __init__(self, sock: socket.socket, stream: FrameStream):
        super().__init__(daemon=True)
        self.sock, self.stream = sock, stream
        self.ended = ""
        self.closed = threading.Event()

    def run(self) -> None:
        try:
            while True:
                if self.stream.close_code is not None:
                    self.ended = f"close {self.stream.close_code}"
                    break
                try:
                    data = self.sock.recv(1 << 20)
                except OSError as exc:
                    self.ended = f"error {type(exc).__name__}"
                    break
                if not data:
                    self.ended = "eof"
                    break
                self.stream.feed(data)
        finally:
            self.closed.set()
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """Shuts the current socket down at the deadline (unblocks a blocked ``sendall``)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.sock: socket.socket | None = None
        self._timer = threading.Timer(max(0.0, deadline - time.monotonic()), self._fire)
        self._timer.daemon = True
        self._timer.start()
        self.fired = False

    def _fire(self) -> None:
        self.fired = True
        sock = self.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()

    @property
    def over(self) -> bool:
        return self.fired or time.monotonic() >= self.deadline


def _read_until(sock: socket.socket, stream: FrameStream, done: Callable[[], bool], timeout: float) -> bool:
    """Blocking reads into ``stream`` until ``done()``; False on timeout, EOF or close."""
    deadline = time.monotonic() + timeout
    while not done():
        remaining = deadline - time.monotonic()
        if remaining <= 0 or stream.close_code is not None:
            return False
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except (TimeoutError, OSError):
            return False
        finally:
            with contextlib.suppress(OSError):
                sock.settimeout(None)
        if not data:
            return False
        stream.feed(data)
    return True


@dataclass
class FloodTotals:
    """What a flooding client did over all its connections."""

    connections: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    frames_sent: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    frames_received: Counter[str] = field(default_factory=Counter)
    replies: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, stream: FrameStream, ended: str) -> None:
        self.bytes_received += stream.bytes
        for opcode, count in stream.frames.items():
            self.frames_received[
                {1: "text", 2: "binary", 8: "close", 9: "ping", 10: "pong"}.get(opcode, str(opcode))
            ] += count
        self.replies.update(stream.kinds)
        self.ended[ended] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "refused": dict(self.refused),
            "ended": dict(self.ended),
            "frames_sent": self.frames_sent,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "frames_received": dict(self.frames_received),
            "replies": dict(self.replies),
            "seconds": round(self.seconds, 3),
            **self.extra,
        }


def _flood(
    host: str,
    port: int,
    path: str,
    protocols: list[str],
    duration: float,
    batch: bytes,
    frames_per_batch: int,
    first: Callable[[socket.socket, FrameStream], bool] | None,
    totals: FloodTotals,
    answers_quiet: float | None = None,
) -> None:
    """Open, (``first``), write ``batch`` again and again until the deadline
    or the server closes (with ``answers_quiet``: each time once nothing
    arrived for that many seconds); reconnect; until the deadline."""
    started = time.monotonic()
    watchdog = _Watchdog(started + duration)
    try:
        while not watchdog.over:
            try:
                sock, rest = open_websocket(
                    host, port, path, protocols, timeout=max(0.5, watchdog.deadline - time.monotonic())
                )
            except HandshakeRefused as exc:
                totals.refused[str(exc.status)] += 1
                time.sleep(0.01)
                continue
            except OSError as exc:
                totals.refused[type(exc).__name__] += 1
                time.sleep(0.01)
                continue
            totals.connections += 1
            stream = FrameStream()
            stream.feed(rest)
            watchdog.sock = sock
            ended = ""
            try:
                try:
                    opened = first is None or first(sock, stream)
                except OSError:
                    opened = False
                if not opened:
                    ended = "refused before flooding" + (f" (close {stream.close_code})" if stream.close_code else "")
                    continue
                reader = _Reader(sock, stream)
                reader.start()
                try:
                    while not watchdog.over and not reader.closed.is_set():
                        sock.sendall(batch)
                        totals.frames_sent += frames_per_batch
                        totals.bytes_sent += len(batch)
                        if answers_quiet is not None:
                            _wait_quiet(stream, reader, answers_quiet, watchdog)
                except OSError:
                    pass
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                reader.join(5)
                ended = (
                    reader.ended if not watchdog.over or reader.ended.startswith("close") else "open at the deadline"
                )
            finally:
                watchdog.sock = None
                sock.close()
                totals.add(stream, ended or "closed")
    finally:
        watchdog.cancel()
        totals.seconds = time.monotonic() - started


def _wait_quiet(stream: FrameStream, reader: _Reader, quiet: float, watchdog: _Watchdog) -> None:
    """Until nothing arrived on ``stream`` for ``quiet`` seconds, the socket closed or the deadline."""
    seen, since = stream.bytes, time.monotonic()
    while not watchdog.over and not reader.closed.is_set():
        time.sleep(0.02)
        if stream.bytes != seen:
            seen, since = stream.bytes, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return


def _hello_first(token: str) -> Callable[[socket.socket, FrameStream], bool]:
    hello = client_frame(OP_TEXT, json.dumps({"op": "hello", "protocol": 1, "token": token}).encode())

    def first(sock: socket.socket, stream: FrameStream) -> bool:
        sock.sendall(hello)
        answered = _read_until(sock, stream, lambda: stream.frames[OP_TEXT] > 0, 10.0)
        return answered and stream.kinds["welcome"] > 0

    return first


def ping_flood(
    host: str, port: int, duration: float, *, token: str | None = None, batch: int = 2000, on_event: OnEvent = _no_event
) -> dict[str, Any]:
    """``{"op":"ping"}`` on ``/ws`` as fast as the socket takes them, ``batch``
    pre-masked frames per write, reconnecting whenever the server closes the
    socket, for ``duration`` seconds. With ``token``: after a ``hello`` with
    it (and its ``welcome``). ``frames_sent`` counts whole batches written
    (a batch cut off by a close is not counted)."""
    frame = client_frame(OP_TEXT, b'{"op":"ping"}', os.urandom(4))
    totals = FloodTotals()
    on_event("attack_start", {})
    _flood(
        host, port, "/ws", ["yrelay.v1"], duration, frame * batch, batch, _hello_first(token) if token else None, totals
    )
    on_event("attack_end", {})
    result = totals.as_dict()
    result["frames_per_second"] = round(totals.frames_sent / totals.seconds) if totals.seconds else None
    return result


def query_awareness_flood(
    host: str,
    port: int,
    doc: str,
    token: str,
    duration: float,
    *,
    queries: int = 2000,
    token_in: str = "param",
    answers_quiet: float | None = 1.0,
    on_event: OnEvent = _no_event,
) -> dict[str, Any]:
    """Rounds of ``queries`` one-byte query-awareness messages (y-protocols
    type 3) on ``/yws/<doc>``, each round in one write, reconnecting when
    closed, for ``duration`` seconds. A round follows the previous one once
    no answer arrived for ``answers_quiet`` seconds (None: at once, a
    flood the server reads as fast as it can). ``amplification`` = bytes
    received / bytes sent (the frames on the wire, both ways).
    ``token_in``: ``param`` (``?token=``) or ``subprotocol`` (``yrelay.auth.<token>``)."""
    path = f"/yws/{doc}"
    protocols = ["yrelay.yws"]
    if token_in == "param":
        path += "?token=" + quote(token, safe="")
    else:
        protocols.append("yrelay.auth." + token)
    frame = client_frame(OP_BINARY, b"\x03", os.urandom(4))
    totals = FloodTotals()
    on_event("attack_start", {})
    _flood(host, port, path, protocols, duration, frame * queries, queries, None, totals, answers_quiet=answers_quiet)
    on_event("attack_end", {})
    result = totals.as_dict()
    result["queries_per_round"] = queries
    result["answers_quiet_s"] = answers_quiet
    result["rounds"] = totals.frames_sent // queries
    result["amplification"] = round(totals.bytes_received / totals.bytes_sent, 1) if totals.bytes_sent else None
    return result


def awareness_greeting(host: str, port: int, doc: str, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """Connect to ``/yws/<doc>`` with ``token`` and read the server's first
    awareness message (the others' states): its size and entry count."""
    from yrelay.yjs.awareness import decode_update
    from yrelay.yjs.yprotocol import AwarenessMessage, decode

    sock, rest = open_websocket(host, port, f"/yws/{doc}?token={quote(token, safe='')}", ["yrelay.yws"])
    stream = FrameStream(keep=64 * MiB)
    try:
        stream.feed(rest)
        _read_until(sock, stream, lambda: stream.first_binary is not None, timeout)
    finally:
        sock.close()
    if stream.first_binary is None:
        return {"bytes": 0, "entries": 0, "close_code": stream.close_code}
    message = decode(stream.first_binary)
    if not isinstance(message, AwarenessMessage):
        return {"bytes": len(stream.first_binary), "entries": None, "first_message": type(message).__name__}
    return {"bytes": len(stream.first_binary), "entries": len(decode_update(message.update, max_entries=10**6))}


def half_frames(
    host: str,
    port: int,
    *,
    waves: int = 3,
    per_wave: int = 64,
    declared: int = 16 * MiB,
    payload: int = 8 * MiB,
    hold: float = 0.0,
    wave_timeout: float = 20.0,
    yws_doc: str = "x",
    on_event: OnEvent = _no_event,
) -> dict[str, Any]:
    """``waves`` waves of ``per_wave`` websockets (half on ``/ws`` without a
    ``hello``, half on ``/yws/<yws_doc>`` without a token), each declaring a
    ``declared``-byte frame (text on /ws, binary on /yws), sending
    ``payload`` bytes of it (or what the server takes before closing) and
    stalling. ``on_event("wave", ...)`` after each wave has sent (or given
    up after ``wave_timeout``); then held open until ``hold`` seconds
    have passed since the first wave began, closed, ``on_event("closed", ...)``. Returns how
    each socket ended: ``close <code>`` (the server's close frame),
    ``eof``/``error`` (closed without one), or ``open`` (open until we closed it)."""
    stop = threading.Event()
    sockets: list[_HalfFrame] = []
    started = time.monotonic()
    on_event("attack_start", {})
    for wave in range(waves):
        batch = [
            _HalfFrame(host, port, "/ws" if i % 2 == 0 else f"/yws/{yws_doc}", declared, payload, stop)
            for i in range(per_wave)
        ]
        for one in batch:
            one.start()
        deadline = time.monotonic() + wave_timeout
        for one in batch:
            one.sent_all.wait(max(0.0, deadline - time.monotonic()))
        sockets += batch
        on_event(
            "wave",
            {
                "wave": wave + 1,
                "seconds": round(time.monotonic() - started, 3),
                "sent_mib": round(sum(one.sent for one in batch) / MiB, 1),
                "ended": dict(Counter(one.state for one in batch)),
            },
        )
    while time.monotonic() < started + hold:
        time.sleep(0.05)
    states_before_close = Counter(one.state for one in sockets)
    on_event("closing", {"states": dict(states_before_close)})
    stop.set()
    for one in sockets:
        one.join(10)
    on_event("closed", {})
    by_path: dict[str, Counter[str]] = {}
    for one in sockets:
        by_path.setdefault("/ws" if one.path == "/ws" else "/yws", Counter())[one.state] += 1
    return {
        "sockets": len(sockets),
        "declared_bytes": declared,
        "payload_bytes": payload,
        "sent_mib": round(sum(one.sent for one in sockets) / MiB, 1),
        "sent_all": sum(one.sent >= payload for one in sockets),
        "ended": dict(states_before_close),
        "ended_by_path": {p: dict(c) for p, c in by_path.items()},
        "end_seconds_max": max((one.ended_at - started for one in sockets if one.ended_at), default=None),
        "seconds": round(time.monotonic() - started, 3),
    }


class _HalfFrame(threading.Thread):
    """One socket of :func:`half_frames`."""

    CHUNK = 256 * 1024

    def __init__(self, host: str, port: int, path: str, declared: int, payload: int, stop: threading.Event):
        super().__init__(daemon=True)
        self.host, self.port, self.path, self.declared, self.payload, self.stop = (
            host,
            port,
            path,
            declared,
            payload,
            stop,
        )
        self.sent = 0
        self.state = "connecting"
        self.ended_at: float | None = None
        self.sent_all = threading.Event()

    def _end(self, state: str) -> None:
        if self.ended_at is None:
            self.state, self.ended_at = state, time.monotonic()
        self.sent_all.set()

    def run(self) -> None:
        protocols = ["yrelay.v1"] if self.path == "/ws" else ["yrelay.yws"]
        try:
            sock, rest = open_websocket(self.host, self.port, self.path, protocols)
        except HandshakeRefused as exc:
            self._end(f"refused {exc.status}")
            return
        except OSError as exc:
            self._end(f"connect {type(exc).__name__}")
            return
        self.state = "open"
        stream = FrameStream()
        stream.feed(rest)
        opcode = OP_TEXT if self.path == "/ws" else OP_BINARY
        pending = memoryview(frame_header(opcode, self.declared, b"\0\0\0\0"))  # zero mask: the payload as is
        chunk = memoryview(b"a" * self.CHUNK)
        sock.setblocking(False)
        try:
            while not self.stop.is_set():
                if stream.close_code is not None:
                    self._end(f"close {stream.close_code}")
                    break
                writing = self.sent < self.payload or len(pending) > 0
                if not writing:
                    self.sent_all.set()
                readable, writable, _ = select.select([sock], [sock] if writing else [], [], 0.1)
                if readable:
                    try:
                        data = sock.recv(65536)
                    except BlockingIOError:
                        data = None
                    except OSError as exc:
                        self._end(f"error {type(exc).__name__}")
                        break
                    if data == b"":
                        self._end("eof")
                        break
                    if data:
                        stream.feed(data)
                if writable:
                    if not pending:
                        pending = chunk[: min(self.CHUNK, self.payload - self.sent)]
                    try:
                        written = sock.send(pending)
                    except BlockingIOError:
                        written = 0
                    except OSError as exc:
                        self._end(f"error {type(exc).__name__}")
                        break
                    if pending.obj is chunk.obj:
                        self.sent += written
                    pending = pending[written:]
        finally:
            self.sent_all.set()
            sock.close()


def _body_chunks(size: int, malformed: bool, chunk: int) -> Iterator[bytes]:
    """A JSON-looking body of ``size`` bytes: ``{"doc": "aaa...a"}``, or
    without its closing (malformed)."""
    head, tail = b'{"doc": "', (b"" if malformed else b'"}')
    filler = size - len(head) - len(tail)
    yield head
    block = b"a" * chunk
    while filler > 0:
        part = block[: min(chunk, filler)]
        filler -= len(part)
        yield part
    if tail:
        yield tail


def ops_body(
    host: str,
    port: int,
    *,
    size: int = 128 * MiB,
    malformed: bool = False,
    path: str = "/ops/gc",
    chunk: int = MiB,
    timeout: float = 60.0,
    on_event: OnEvent = _no_event,
) -> dict[str, Any]:
    """``POST path`` without an Authorization header, its body (``size``
    bytes, JSON-looking or malformed) streamed in ``chunk``-byte chunks with
    ``Transfer-Encoding: chunked``, stopping once the response arrives.
    Returns the status, when it came, and how much of the body went out first."""
    started = time.monotonic()
    on_event("request_start", {"size": size, "malformed": malformed})
    result: dict[str, Any] = {"size": size, "malformed": malformed, "status": None, "body_bytes_sent": 0}
    response = bytearray()
    got_response = threading.Event()
    sock = socket.create_connection((host, port), timeout=10)
    sock.settimeout(None)

    def read() -> None:
        try:
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                response.extend(data)
                head, sep, body = bytes(response).partition(b"\r\n\r\n")
                if sep:
                    match = re.search(rb"(?i)content-length:\s*(\d+)", head)
                    if match is None or len(body) >= int(match.group(1)):
                        break
        except OSError:
            pass
        finally:
            got_response.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    watchdog = _Watchdog(started + timeout)
    watchdog.sock = sock
    try:
        sock.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            ).encode()
        )
        for part in _body_chunks(size, malformed, chunk):
            if got_response.is_set():
                break
            sock.sendall(b"%x\r\n" % len(part) + part + b"\r\n")
            result["body_bytes_sent"] += len(part)
        else:
            if not got_response.is_set():
                sock.sendall(b"0\r\n\r\n")
                result["body_complete"] = True
        result["body_seconds"] = round(time.monotonic() - started, 3)
    except OSError as exc:
        result["send_error"] = type(exc).__name__
    got_response.wait(max(0.0, started + timeout - time.monotonic()))
    watchdog.cancel()
    with contextlib.suppress(OSError):
        sock.close()
    reader.join(5)
    result["seconds"] = round(time.monotonic() - started, 3)
    head, _, body = bytes(response).partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/"):
        result["status"] = int(head.split(b" ", 2)[1])
        result["response"] = body[:200].decode(errors="replace")
    on_event("request_end", {"status": result["status"]})
    return result


def ops_flood(
    host: str, port: int, duration: float, *, size: int = 128 * MiB, every: float = 1.0, on_event: OnEvent = _no_event
) -> dict[str, Any]:
    """:func:`ops_body` with a valid-JSON body, a malformed one and a small
    malformed one, one after the other; the three again every ``every``
    seconds (or as soon as the last ended, if later) until ``duration``
    seconds have passed (each at least once)."""
    started = time.monotonic()
    on_event("attack_start", {})
    kinds = [("json", size, False), ("malformed", size, True), ("malformed_small", 64, True)]
    requests: list[dict[str, Any]] = []
    while not requests or time.monotonic() - started < duration:
        round_started = time.monotonic()
        for name, bytes_, malformed in kinds:
            requests.append({"kind": name, **ops_body(host, port, size=bytes_, malformed=malformed, on_event=on_event)})
        pause = min(every - (time.monotonic() - round_started), started + duration - time.monotonic())
        if pause > 0:
            time.sleep(pause)
    on_event("attack_end", {})
    return {
        "requests": requests,
        "seconds": round(time.monotonic() - started, 3),
        "statuses": {
            name: dict(Counter(str(r["status"]) for r in requests if r["kind"] == name)) for name, _, _ in kinds
        },
    }


async def burst(
    url: str,
    token: str,
    doc: str,
    *,
    clients: int = 3,
    updates: int = 1000,
    timeout: float = 60.0,
    check_token: str | None = None,
    on_event: OnEvent = _no_event,
) -> dict[str, Any]:
    """``clients`` :class:`~yrelay.client.YrelayClient` with the same token
    (one subject), each making ``updates`` one-character edits to ``doc`` at
    once; how long until every edit was stored (nothing pending in any
    client), the error codes they were sent, and the update frames they
    sent (resends included). With ``check_token``, a fresh client then reads
    the document and counts its characters."""
    from yrelay.client import YrelayClient
    from yrelay.yjs import crdt

    members = [YrelayClient(url, token=token, subscription_check_interval=None) for _ in range(clients)]
    frames = Counter[int]()

    def count_frames(index: int, client: YrelayClient) -> bool:
        send = getattr(client, "_send_quietly", None)  # the client's one path for a single-frame update
        if send is None:
            return False

        async def counted(frame: dict[str, Any]) -> None:
            if frame.get("op") == "update":
                frames[index] += 1
            await send(frame)

        client._send_quietly = counted  # type: ignore[method-assign]
        return True

    counting = all(count_frames(i, client) for i, client in enumerate(members))
    result: dict[str, Any] = {"clients": clients, "updates_per_client": updates}
    try:
        docs = []
        for client in members:
            await client.connect()
            docs.append(await client.subscribe(doc))
        on_event("attack_start", {})
        started = time.monotonic()
        for client_doc in docs:
            for _ in range(updates):
                crdt.insert_text(client_doc.ydoc, 0, "x")
        finished = True
        while any(client.pending for client in members):
            if time.monotonic() - started > timeout:
                finished = False
                break
            await asyncio.sleep(0.01)
        result["seconds"] = round(time.monotonic() - started, 3)
        result["all_stored"] = finished
        result["pending_at_end"] = sum(client.pending for client in members)
        on_event("attack_end", {})
        codes: Counter[str] = Counter()
        for client in members:
            codes.update(client.error_codes)
        result["errors"] = dict(codes)
        result["acked_total"] = sum(client.acked_total for client in members)
        result["resyncs"] = sum(client.resyncs for client in members)
        result["update_frames_sent"] = sum(frames.values()) if counting else None
    finally:
        for client in members:
            with contextlib.suppress(Exception):
                await client.close()
    if check_token is not None:
        reader = YrelayClient(url, token=check_token, subscription_check_interval=None)
        try:
            await reader.connect()
            held = await reader.subscribe(doc)
            await asyncio.wait_for(held.synced.wait(), 20)
            result["document_characters"] = len(held.text)
        except Exception as exc:  # noqa: BLE001 - reported, not raised: a figure of the run
            result["document_characters"] = None
            result["check_error"] = repr(exc)
        finally:
            await reader.close()
    return result


# ---------------------------------------------------------------- measurement


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``, or None."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


class Victim:
    """A writer and a reader on ``/ws`` of one document: the writer sends one
    small valid Yjs update (a text insert of its own y-py client) every
    ``interval`` seconds; the reader, subscribed, records when each arrives.
    The latency of an update is from the writer's first send of it to its
    delivery to the reader (same process, one clock). An update refused
    with an ``error`` is sent again (``retry_after_ms``, else 100 ms) with
    its first send time kept; a socket the server closes is reopened
    (``hello`` with the session, resubscribe from the last offset).

    ``phase`` names the phase updates are sent in; :meth:`summary` gives a
    phase's figures (``undelivered``: sent in the phase and not delivered
    by ``until``, the phase's end)."""

    def __init__(self, url: str, doc: str, writer_token: str, reader_token: str, interval: float = 0.05):
        self.url, self.doc, self.interval = url, doc, interval
        self.writer_token, self.reader_token = writer_token, reader_token
        self.phase: str | None = None
        self.sent: dict[int, tuple[float, str | None]] = {}  # clock -> (first send, phase)
        self.delivered: dict[int, float] = {}
        self.appended: set[int] = set()
        self.errors: Counter[str] = Counter()
        self.errors_by_phase: dict[str, Counter[str]] = {}
        self.reconnects: Counter[str] = Counter()
        self._updates: dict[str, int] = {}  # base64 update -> clock
        self._frames: dict[int, str] = {}
        self._ydoc: Any = None
        self._writer: Any = None
        self._reader: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._reader_ready = asyncio.Event()
        self._writer_ready = asyncio.Event()
        self._sending = asyncio.Event()
        self._closing = False
        self._writer_session: str | None = None
        self._reader_session: str | None = None
        self._reader_offset: str | None = None
        self._clock = 0
        self._retry: dict[int, asyncio.TimerHandle] = {}
        self._open_sockets: list[Any] = []
        #: The ``auth`` of the writer's first ``welcome`` (``mode``, ``subject``, ``permission``).
        self.welcome_auth: dict[str, Any] | None = None

    async def start(self, timeout: float = 20.0) -> Victim:
        from yrelay.yjs import crdt

        self._ydoc = crdt.new_doc(random.randrange(1, 2**31))
        self._tasks = [asyncio.create_task(self._read_loop()), asyncio.create_task(self._write_loop())]
        await asyncio.wait_for(asyncio.gather(self._reader_ready.wait(), self._writer_ready.wait()), timeout)
        return self

    def send_updates(self, on: bool) -> None:
        (self._sending.set if on else self._sending.clear)()

    async def stop(self) -> None:
        self._closing = True
        for handle in self._retry.values():
            handle.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(_close_soon(ws) for ws in self._open_sockets))

    async def wait_delivered(self, timeout: float) -> bool:
        """Until every update sent so far was delivered (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while any(clock not in self.delivered for clock in self.sent):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def summary(self, phase: str, until: float) -> dict[str, Any]:
        """Latencies (ms) of the updates first sent in ``phase``; ``until``:
        the phase's end (``time.perf_counter()``)."""
        clocks = [clock for clock, (_, name) in self.sent.items() if name == phase]
        latencies = [(self.delivered[c] - self.sent[c][0]) * 1000 for c in clocks if c in self.delivered]
        in_time = [c for c in clocks if c in self.delivered and self.delivered[c] <= until]
        return {
            "sent": len(clocks),
            "delivered": len(latencies),
            "undelivered": len(clocks) - len(in_time),
            "never_delivered": len(clocks) - len(latencies),
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "max_ms": max(latencies) if latencies else None,
            "errors": dict(self.errors_by_phase.get(phase, {})),
            "latencies_ms": [round(x, 3) for x in latencies],
        }

    # -- the sockets

    async def _open(self, token: str, session: str | None) -> tuple[Any, dict[str, Any]]:
        from websockets.asyncio.client import connect

        ws = await connect(self.url, subprotocols=["yrelay.v1"], max_size=None, open_timeout=10)  # type: ignore[list-item]
        self._open_sockets = [w for w in self._open_sockets if w.state.name != "CLOSED"] + [ws]
        await ws.send(json.dumps({"op": "hello", "protocol": 1, "session": session, "token": token}))
        welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
        if welcome.get("op") != "welcome":
            await ws.close()
            raise ConnectionError(f"no welcome: {welcome}")
        return ws, welcome

    async def _read_loop(self) -> None:
        while not self._closing:
            try:
                ws, welcome = await self._open(self.reader_token, self._reader_session)
                self._reader_session = welcome["session"]
                subscribe: dict[str, Any] = {"op": "subscribe", "doc": self.doc}
                if self._reader_offset is not None:
                    subscribe["offset"] = self._reader_offset
                await ws.send(json.dumps(subscribe))
                async for message in ws:
                    now = time.perf_counter()
                    frame = json.loads(message)
                    op = frame.get("op")
                    if op == "subscribed":
                        self._reader_ready.set()
                    elif op == "deliver":
                        for entry in frame["entries"]:
                            clock = self._updates.get(entry["update"])
                            if clock is not None and clock not in self.delivered:
                                self.delivered[clock] = now
                            self._reader_offset = entry["id"]
                        await ws.send(json.dumps({"op": "ack", "doc": self.doc, "offset": self._reader_offset}))
                    elif op == "snapshot":
                        self._reader_offset = frame.get("offset", self._reader_offset)
                    elif op == "error":
                        self._error(frame)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - counted, then reconnected
                self.reconnects["reader: " + type(exc).__name__] += 1
                await asyncio.sleep(0.1)

    async def _write_loop(self) -> None:
        sender = asyncio.create_task(self._send_loop())
        try:
            while not self._closing:
                try:
                    ws, welcome = await self._open(self.writer_token, self._writer_session)
                    self._writer_session = welcome["session"]
                    if self.welcome_auth is None:
                        self.welcome_auth = welcome.get("auth")
                    await ws.send(json.dumps({"op": "subscribe", "doc": self.doc}))
                    self._writer = None
                    async for message in ws:
                        frame = json.loads(message)
                        op = frame.get("op")
                        if op == "subscribed":
                            self._writer = ws
                            self._writer_ready.set()
                            for clock in sorted(set(self.sent) - self.appended):  # after a reconnect
                                await ws.send(self._frames[clock])
                        elif op == "appended":
                            self.appended.add(frame["clock"])
                        elif op == "error":
                            self._error(frame)
                            clock = frame.get("clock")
                            if clock in self._frames and clock not in self.appended:
                                delay = float(frame.get("retry_after_ms") or 100) / 1000
                                self._schedule_resend(clock, delay)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    self.reconnects["writer: " + type(exc).__name__] += 1
                    self._writer = None
                    await asyncio.sleep(0.1)
        finally:
            sender.cancel()

    def _error(self, frame: dict[str, Any]) -> None:
        code = str(frame.get("code"))
        self.errors[code] += 1
        self.errors_by_phase.setdefault(str(self.phase), Counter())[code] += 1

    def _schedule_resend(self, clock: int, delay: float) -> None:
        if clock in self._retry:
            return

        def resend() -> None:
            self._retry.pop(clock, None)
            ws = self._writer
            if ws is not None and clock not in self.appended and not self._closing:
                asyncio.ensure_future(self._send_quietly(ws, self._frames[clock]))

        self._retry[clock] = asyncio.get_running_loop().call_later(delay, resend)

    @staticmethod
    async def _send_quietly(ws: Any, text: str) -> None:
        with contextlib.suppress(Exception):
            await ws.send(text)

    async def _send_loop(self) -> None:
        from yrelay.yjs import crdt

        captured: list[bytes] = []
        crdt.observe_updates(self._ydoc, captured.append)
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self._sending.wait()
            next_at = max(next_at + self.interval, loop.time() - self.interval)
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            if not self._sending.is_set():
                continue
            clock = self._clock
            self._clock += 1
            crdt.insert_text(self._ydoc, len(crdt.text_of(self._ydoc)), f"<{clock}>")
            update = base64.b64encode(captured.pop()).decode()
            captured.clear()
            self._updates[update] = clock
            self._frames[clock] = json.dumps({"op": "update", "doc": self.doc, "clock": clock, "update": update})
            self.sent[clock] = (time.perf_counter(), self.phase)
            ws = self._writer
            if ws is not None:
                await self._send_quietly(ws, self._frames[clock])  # else sent when the writer is back


class PresenceCrowd:
    """Presence states of ``total_bytes`` on ``doc``, from as many ``/ws``
    connections as it takes (4 clientIDs each, under 32 KiB an update:
    docs/security.md's limits), each of its own subject (``tokens`` maps a
    connection's index to its token). Renewed every ``renew`` seconds
    (states not renewed within 30 s are dropped); every frame the server
    sends them is read and dropped."""

    PER_CONNECTION = 4
    ENTRY_BYTES = 7500

    def __init__(
        self, url: str, doc: str, token_for: Callable[[int], str], total_bytes: int = 237 * 1024, renew: float = 10.0
    ):
        self.url, self.doc, self.token_for, self.total_bytes, self.renew = url, doc, token_for, total_bytes, renew
        self.entries = max(1, math.ceil(total_bytes / self.ENTRY_BYTES))
        self.state_bytes = total_bytes // self.entries - 8  # a clientID, clock and length around each state
        self.connections = math.ceil(self.entries / self.PER_CONNECTION)
        self.errors: Counter[str] = Counter()
        self.dropped = 0
        self._sockets: list[Any] = []
        self._tasks: list[asyncio.Task[None]] = []

    def _update(self, index: int, clock: int) -> bytes:
        from yrelay.yjs.awareness import AwarenessEntry, encode_update

        first = index * self.PER_CONNECTION
        entries = []
        for k in range(first, min(first + self.PER_CONNECTION, self.entries)):
            name = f"presence-{k}"
            pad = "p" * (self.state_bytes - len(json.dumps({"user": {"name": name, "pad": ""}})))
            entries.append(AwarenessEntry(100_000 + k, clock, json.dumps({"user": {"name": name, "pad": pad}})))
        return encode_update(entries)

    async def start(self) -> PresenceCrowd:
        from websockets.asyncio.client import connect

        for index in range(self.connections):
            ws = await connect(self.url, subprotocols=["yrelay.v1"], max_size=None, open_timeout=10)  # type: ignore[list-item]
            await ws.send(json.dumps({"op": "hello", "protocol": 1, "token": self.token_for(index)}))
            welcome = json.loads(await asyncio.wait_for(ws.recv(), 10))
            if welcome.get("op") != "welcome":
                raise ConnectionError(f"presence connection {index}: {welcome}")
            await ws.send(json.dumps({"op": "subscribe", "doc": self.doc}))
            while json.loads(await asyncio.wait_for(ws.recv(), 10)).get("op") != "subscribed":
                pass
            self._sockets.append(ws)
            self._tasks.append(asyncio.create_task(self._drain(ws)))
            await self._announce(index, 1)
        self._tasks.append(asyncio.create_task(self._renew()))
        return self

    async def _announce(self, index: int, clock: int) -> None:
        update = base64.b64encode(self._update(index, clock)).decode()
        await self._sockets[index].send(json.dumps({"op": "awareness", "doc": self.doc, "update": update}))

    async def _drain(self, ws: Any) -> None:
        try:
            async for message in ws:
                if '"op":"error"' in message.replace(" ", ""):
                    self.errors[str(json.loads(message).get("code"))] += 1
        except Exception:  # noqa: BLE001
            self.dropped += 1

    async def _renew(self) -> None:
        clock = 1
        while True:
            await asyncio.sleep(self.renew)
            clock += 1
            for index in range(len(self._sockets)):
                with contextlib.suppress(Exception):
                    await self._announce(index, clock)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(_close_soon(ws) for ws in self._sockets))


async def _close_soon(ws: Any, timeout: float = 1.0) -> None:
    """Close a websocket; a server that does not answer the close within
    ``timeout`` (a busy one) gets its connection aborted."""
    try:
        await asyncio.wait_for(ws.close(), timeout)
    except Exception:  # noqa: BLE001
        with contextlib.suppress(Exception):
            ws.transport.abort()


class HealthProbe(threading.Thread):
    """``GET /healthz`` on a fresh connection every ``interval`` seconds,
    from a thread of its own (blocking sockets); records (when, seconds
    taken or None for a failure or ``timeout``), ``time.perf_counter()``."""

    def __init__(self, port: int, interval: float = 0.1, timeout: float = 5.0, host: str = "127.0.0.1"):
        super().__init__(daemon=True)
        self.host, self.port, self.interval, self.timeout = host, port, interval, timeout
        self.samples: list[tuple[float, float | None]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            started = time.perf_counter()
            took: float | None
            try:
                with socket.create_connection((self.host, self.port), timeout=self.timeout) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    ok = probe.recv(100).startswith(b"HTTP/1.1 200")
                took = time.perf_counter() - started if ok else None
            except OSError:
                took = None
            self.samples.append((started, took))

    def stop(self) -> None:
        self._stopping.set()
        self.join(self.timeout + 1)

    def summary(self, start: float, end: float) -> dict[str, Any]:
        window = [took for at, took in self.samples if start <= at < end]
        ok = [took * 1000 for took in window if took is not None]
        return {
            "probes": len(window),
            "failures": len(window) - len(ok),
            "p50_ms": percentile(ok, 50),
            "p99_ms": percentile(ok, 99),
            "max_ms": max(ok) if ok else None,
            "samples_ms": [None if t is None else round(t * 1000, 2) for t in window],
        }


class ProcessSampler(threading.Thread):
    """RSS (MiB) and CPU seconds (user + system) of one process, and its
    children's CPU, every ``interval`` seconds: (perf_counter, rss, cpu,
    children cpu); :meth:`now` samples at once (for moments an attack names)."""

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.samples: list[tuple[float, float, float, float]] = []
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._children: list[Any] = []
        self._children_at = 0.0

    def now(self) -> tuple[float, float, float, float] | None:
        import psutil

        try:
            with self.process.oneshot():
                rss = self.process.memory_info().rss / MiB
                times = self.process.cpu_times()
            if time.perf_counter() >= self._children_at:  # the list of children (a scan of /proc) once a second
                self._children = self.process.children(recursive=True)
                self._children_at = time.perf_counter() + 1.0
        except psutil.Error:
            return None
        children = 0.0
        for child in self._children:
            try:
                child_times = child.cpu_times()
            except psutil.Error:
                continue
            children += child_times.user + child_times.system
        sample = (time.perf_counter(), rss, times.user + times.system, children)
        with self._lock:
            self.samples.append(sample)
        return sample

    def run(self) -> None:
        while not self._stopping.wait(self.interval):
            if self.now() is None:
                return

    def stop(self) -> None:
        self._stopping.set()
        self.join(2)

    def connections(self, port: int) -> int:
        """TCP connections of the process on ``port`` (listening socket excluded)."""
        import psutil

        try:
            return sum(
                1
                for c in self.process.net_connections(kind="tcp")
                if c.laddr and c.laddr.port == port and c.status != psutil.CONN_LISTEN
            )
        except psutil.Error:
            return -1

    def summary(self, start: float, end: float) -> dict[str, Any]:
        with self._lock:
            window = [s for s in self.samples if start <= s[0] <= end]
            before = [s for s in self.samples if s[0] <= start]
        if not window:
            return {}
        first = before[-1] if before else window[0]
        return {
            "rss_start_mib": round(first[1], 1),
            "rss_max_mib": round(max(s[1] for s in [first, *window]), 1),
            "rss_end_mib": round(window[-1][1], 1),
            "cpu_s": round(window[-1][2] - first[2], 3),
            "children_cpu_s": round(window[-1][3] - first[3], 3),
            "rss_series_mib": [(round(s[0] - start, 3), round(s[1], 1)) for s in window],
        }


def count_log_lines(path: str | os.PathLike[str], patterns: Iterable[str]) -> dict[str, int]:
    """How many lines of the file contain each pattern (a plain substring)."""
    counts = {pattern: 0 for pattern in patterns}
    try:
        with open(path, "rb") as log:
            for line in log:
                for pattern in counts:
                    if pattern.encode() in line:
                        counts[pattern] += 1
    except FileNotFoundError:
        pass
    return counts


__all__ = [
    "FloodTotals",
    "FrameStream",
    "HandshakeRefused",
    "HealthProbe",
    "PresenceCrowd",
    "ProcessSampler",
    "Victim",
    "awareness_greeting",
    "burst",
    "client_frame",
    "count_log_lines",
    "frame_header",
    "half_frames",
    "mint_token",
    "open_websocket",
    "ops_body",
    "ops_flood",
    "percentile",
    "ping_flood",
    "query_awareness_flood",
]
