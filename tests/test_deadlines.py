"""Deadlines and caps before a connection is useful (issue 16): a websocket
must send ``hello`` within ``hello_timeout``; an HTTP connection must deliver
its request head within ``header_timeout``; at most
``max_pending_connections`` wait for theirs; oversize heads get 431. The
last test holds a thousand of each against a real ``yrelay serve``."""

from __future__ import annotations

import asyncio
import base64
import os
import resource
import socket
import struct
import threading
import time
from pathlib import Path

import httpx
import psutil
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from conftest import FAST_BACKOFF, running_server
from yrelay.client import YrelayClient
from yrelay.transport.http_guard import EVICT_AFTER
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import ServerProcess


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("ws://").removesuffix("/ws").split(":")
    return host, int(port)


def upgrade_request(port: int, protocols: str = "yrelay.v1", path: str = "/ws") -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocols}\r\n\r\n"
    ).encode()


class SilentSocket:
    """A websocket that completes the upgrade and then never says anything,
    not even an answer to the server's close (the cheapest attacker)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(
        cls, port: int, source: str = "127.0.0.1", path: str = "/ws", protocols: str = "yrelay.v1"
    ) -> SilentSocket:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        writer.write(upgrade_request(port, protocols, path))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101"), head[:100]
        return cls(reader, writer)

    async def read_frame(self) -> tuple[int, bytes]:
        """The server's next frame: (opcode, payload)."""
        first, second = await self.reader.readexactly(2)
        length = second & 0x7F
        if length == 126:
            length = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif length == 127:
            length = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return first & 0x0F, await self.reader.readexactly(length)

    async def read_frames(self, timeout: float) -> tuple[list[tuple[int, bytes]], int | None]:
        """Frames until the server's close frame, and its code (None: EOF first)."""
        frames: list[tuple[int, bytes]] = []

        async def read() -> int:
            while True:
                opcode, payload = await self.read_frame()
                if opcode == 0x8:
                    return struct.unpack("!H", payload[:2])[0]
                frames.append((opcode, payload))

        try:
            return frames, await asyncio.wait_for(read(), timeout)
        except asyncio.IncompleteReadError:
            return frames, None

    async def close_code(self, timeout: float) -> int | None:
        """Read frames until the server's close frame; its code (None: EOF first)."""
        return (await self.read_frames(timeout))[1]

    async def eof(self, timeout: float) -> bool:
        """True once the server has closed the TCP connection."""
        try:
            while await asyncio.wait_for(self.reader.read(65536), timeout):
                pass
        except (TimeoutError, ConnectionError):
            return False
        return True

    def close(self) -> None:
        self.writer.transport.abort()


async def idle_connection(port: int, source: str = "127.0.0.1", partial: bool = False) -> SilentSocket:
    """A TCP connection that sends nothing, or half a request head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    if partial:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    return SilentSocket(reader, writer)


async def test_sockets_that_never_send_hello_are_closed_and_free_their_address(redis_url):
    """256 websockets from one address (the default cap) that never send
    hello (and answer pings, as any websocket library does) used to lock
    that address out for ever: a real client got 1008. Now each is closed
    with 4408 after ``hello_timeout`` and the real client gets in.

    The address is filled with a cap of 64: all of them must still be open
    when the lone client comes, so opening them must take well under
    ``hello_timeout``. 256 took 0.3 s on a quiet machine and more than the
    1 s deadline this test had on a busy one (issue 31); 64 take a quarter
    of that, against a deadline of 2 s."""
    async with running_server(redis_url, hello_timeout=2.0, max_connections_per_address=64) as url:
        silent = [await websockets.connect(url) for _ in range(64)]
        with pytest.raises(ConnectionClosed) as refused:  # the address is full
            lone = await websockets.connect(url)
            await lone.send('{"op": "hello"}')
            while True:
                await asyncio.wait_for(lone.recv(), 30)
        assert refused.value.rcvd.code == 1008
        codes = []
        for ws in silent:
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await asyncio.wait_for(ws.recv(), 30)
            codes.append(closed.value.rcvd.code)
        assert set(codes) == {4408}
        async with YrelayClient(url, backoff=FAST_BACKOFF) as client:
            doc = await client.subscribe("after-the-deadline")
            crdt.insert_text(doc.ydoc, 0, "in")
            await client.wait_idle()


async def test_a_silent_websocket_is_told_why_it_is_closed(redis_url):
    async with running_server(redis_url, hello_timeout=0.5) as url:
        ws = await websockets.connect(url)
        error = await asyncio.wait_for(ws.recv(), 5)
        assert '"code": "handshake_required"' in error.replace('":"', '": "') and "hello" in error
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 5)
        assert closed.value.rcvd.code == 4408


async def test_idle_and_half_sent_http_connections_are_closed_after_header_timeout(redis_url):
    async with running_server(redis_url, header_timeout=1.0) as url:
        _, port = _host_port(url)
        idle, half = await idle_connection(port), await idle_connection(port, partial=True)
        kept_alive = await idle_connection(port)  # one whole request, then half of the next
        kept_alive.writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        assert (await kept_alive.reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        for connection in (idle, half, kept_alive):
            assert await connection.eof(timeout=10), "still open long after header_timeout"
        assert time.monotonic() - started < 8
        async with httpx.AsyncClient() as http:  # a whole request is answered as before
            assert (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200


async def test_past_the_pending_cap_the_oldest_waiting_connection_is_closed(redis_url):
    async with running_server(redis_url, header_timeout=60.0, max_pending_connections=5) as url:
        _, port = _host_port(url)
        waiting = [await idle_connection(port) for _ in range(5)]
        burst = await idle_connection(port)  # within EVICT_AFTER of the others: a burst, nobody closed
        assert not await waiting[0].eof(timeout=0.3)
        await asyncio.sleep(EVICT_AFTER)
        newcomer = await idle_connection(port)
        assert await waiting[0].eof(timeout=5), "the oldest waiting connection is closed"
        assert await waiting[1].eof(timeout=5), "and the next, down to the cap"
        async with httpx.AsyncClient() as http:  # and newcomers with a request are served
            assert (await http.get(f"http://127.0.0.1:{port}/healthz", timeout=5)).status_code == 200
        for connection in [*waiting[2:], burst, newcomer]:
            connection.close()


async def test_an_oversize_handshake_is_refused_with_431_instead_of_hanging(redis_url):
    """A token over ~8 KB in the subprotocol header used to hang the
    handshake (the websockets library's 431 was never sent)."""
    async with running_server(redis_url, max_header_bytes=16 * 1024) as url:
        _, port = _host_port(url)
        for protocols, why in ((f"yrelay.v1, yrelay.auth.{'a' * 9000}", b"hello"), ("x" * 20_000, b"")):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(upgrade_request(port, protocols))
            answer = await asyncio.wait_for(reader.read(), 5)
            assert answer.startswith(b"HTTP/1.1 431"), answer[:80]
            assert why in answer
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # a head that never ends
        writer.write(b"GET /healthz HTTP/1.1\r\n" + b"X-Filler: " + b"f" * 40_000)
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 431")
        writer.close()


# -- a thousand of each against a real server process ------------------------

ATTACKERS = 1_000
#: Source addresses of the silent websockets: 250 each stays under the
#: per-address cap (256), so all of them are really held by the server.
SOURCES = [f"127.0.0.{i}" for i in range(2, 6)]
#: Attacking sockets opened per second: all 2,000 are open (5 s) before the
#: first deadline (6 s), so the server holds every one of them at once.
OPEN_RATE = 400
HELLO_TIMEOUT = HEADER_TIMEOUT = 6.0


def _open_file_room(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed and hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    elif soft < needed:
        # The attack this test measures needs the sockets; a machine that cannot
        # open them cannot show the guarantee, and must not count as a pass.
        pytest.fail(f"needs {needed} open files, the hard limit is {hard}: raise it (ulimit -Hn)")


def _rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


class HealthProbe(threading.Thread):
    """GET /healthz on a fresh connection every 100 ms from a thread of its
    own (blocking sockets), so the test's busy event loop does not delay it;
    records (latency or inf, when) and the server's RSS each time."""

    def __init__(self, server: ServerProcess):
        super().__init__(daemon=True)
        self.server, self.stopping = server, threading.Event()
        self.latencies: list[tuple[float, float]] = []
        self.rss: list[float] = []

    def run(self) -> None:
        while not self.stopping.wait(0.1):
            started = time.monotonic()
            try:
                with socket.create_connection(("127.0.0.1", self.server.port), timeout=5) as probe:
                    probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    ok = probe.recv(100).startswith(b"HTTP/1.1 200")
                took = time.monotonic() - started if ok else float("inf")
            except OSError:
                took = float("inf")
            self.latencies.append((took, started))
            self.rss.append(_rss_mib(self.server.process.pid))

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


async def _attack_wave(server: ServerProcess) -> tuple[float, float, float]:
    """Open the thousand silent websockets and the thousand idle connections,
    connect a real client among them, and wait until the server has closed
    every attacking socket. Returns (when the wave began, seconds until the
    real client wrote, seconds until the last attacking socket was closed)."""

    async def one(index: int) -> SilentSocket:
        if index % 2 == 0:
            return await SilentSocket.open(server.port, SOURCES[index // 2 % len(SOURCES)])
        return await idle_connection(server.port, "127.0.0.9", partial=index % 4 == 1)

    began = time.monotonic()
    opening = []
    for index in range(2 * ATTACKERS):  # OPEN_RATE a second, both kinds mixed
        opening.append(asyncio.create_task(one(index)))
        if index % 20 == 19:
            await asyncio.sleep(20 / OPEN_RATE)
    opened = list(await asyncio.gather(*opening))
    sockets = opened[0::2] + opened[1::2]  # the websockets first
    try:
        async with YrelayClient(server.ws_url, backoff=FAST_BACKOFF) as client:  # a real client, mid-attack
            doc = await client.subscribe("during-the-attack")
            crdt.insert_text(doc.ydoc, 0, "still served")
            await client.wait_idle()
        connected = time.monotonic() - began
        codes = await asyncio.gather(*(s.close_code(HELLO_TIMEOUT + 10) for s in sockets[:ATTACKERS]))
        assert set(codes) == {4408}, {code: codes.count(code) for code in set(codes)}
        # No close frame is answered: uvicorn drops each after its 10 s close timeout.
        closed = await asyncio.gather(*(s.eof(HEADER_TIMEOUT + 20) for s in sockets))
        assert all(closed), f"{closed.count(False)} attacking sockets still open"
        return began, connected, time.monotonic() - began
    finally:
        for s in sockets:
            s.close()


async def test_a_thousand_silent_websockets_and_a_thousand_idle_connections(redis_url, tmp_path: Path):
    """The issue's bound: /healthz answers within 1 s throughout, a real
    client connects and writes during the attack, every attacking socket is
    closed after its deadline, and the server's memory comes back.

    What "comes back" can mean for RSS: CPython frees the connections'
    objects, but keeps a 1 MiB arena while any object in it lives, so RSS
    stays near the first wave's high-water mark (measured: +23 to +30 MiB for
    the thousand websockets; malloc_trim returns ~5). So the test sends a
    second wave: if the first one's memory were not free for reuse, RSS
    would grow by as much again; it must stay at the first wave's mark."""
    _open_file_room(4 * ATTACKERS + 1024)
    server = ServerProcess(
        redis_url,
        tmp_path,
        env={
            "YRELAY_HELLO_TIMEOUT": str(HELLO_TIMEOUT),
            "YRELAY_HEADER_TIMEOUT": str(HEADER_TIMEOUT),
            "YRELAY_ADMISSION_RATE": "0",  # hold all thousand (the admission rate is another test's subject)
        },
    ).start()
    probe = HealthProbe(server)
    try:
        async with YrelayClient(server.ws_url, backoff=FAST_BACKOFF) as warmup:  # the paths a client touches
            await warmup.subscribe("warmup")
        await asyncio.sleep(1)
        baseline = _rss_mib(server.process.pid)
        probe.start()
        waves = []
        for _ in range(2):
            began, connected, all_closed = await _attack_wave(server)
            await asyncio.sleep(2)
            waves.append((max(probe.rss), _rss_mib(server.process.pid), connected, all_closed))
    finally:
        probe.stop()
        server.stop()
    (peak1, after1, *_), (peak2, after2, *_) = waves
    latencies = probe.latencies
    worst, when = max(latencies)
    slow = [(round(took, 2), round(at - latencies[0][1], 1)) for took, at in latencies if took > 0.3]
    print(
        f"\nDEADLINES: {ATTACKERS} silent websockets + {ATTACKERS} idle HTTP connections, two waves: RSS "
        f"baseline {baseline:.1f} MiB; "
        + "; ".join(
            f"wave {n}: peak {peak:.1f} MiB, after {after:.1f} MiB, real client wrote {connected:.2f} s in, "
            f"all attacking sockets closed {closed:.1f} s in"
            for n, (peak, after, connected, closed) in enumerate(waves, 1)
        )
        + f"; /healthz {len(latencies)} probes, worst {worst * 1000:.0f} ms; over 300 ms (s, at): {slow}"
    )
    assert worst < 1.0, f"/healthz took {worst:.2f} s"
    assert len(latencies) >= 40
    assert peak1 - baseline > 10, "the attack should have cost memory (is it really held?)"
    assert after1 <= peak1 + 1 and after2 <= peak2 + 1
    assert peak2 <= peak1 + 5, "the second wave did not reuse the first one's memory"
