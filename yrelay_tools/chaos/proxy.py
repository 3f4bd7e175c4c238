"""A loopback TCP proxy between one client and the servers, with faults.

Each chaos client connects through its own proxy, so the nemesis can hurt one
client's network without touching the others. The proxy picks a server per
connection (in turn, skipping those that refuse), which also spreads clients
over the server processes. Faults:

- ``latency`` (seconds added to every chunk, order kept) and ``bandwidth``
  (bytes per second per direction): conditions, on until cleared;
- ``drop()``: close every connection cleanly (FIN both ways);
- ``reset()``: abort every connection with a TCP RST (``SO_LINGER`` 0);
- ``half_open(seconds)``: close the server side, but leave the client side
  open and silent, so the client believes it is connected and its frames go
  nowhere; after ``seconds`` it is reset. New connections are refused
  meanwhile (reset at once), as a dead path would.

Everything listens on and connects to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
CHUNK = 64 * 1024


@dataclass
class ProxyStats:
    connections: int = 0
    refused: int = 0
    drops: int = 0
    resets: int = 0
    half_opens: int = 0
    bytes_forwarded: int = 0


@dataclass(eq=False)  # identity: links live in a set
class _Link:
    """One client connection and the server connection it was paired with."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    silent: bool = False


class FaultProxy:
    def __init__(self, upstreams: Callable[[], list[int]], name: str = "proxy"):
        """``upstreams``: the server ports to try, asked anew for every connection."""
        self.upstreams = upstreams
        self.name = name
        self.latency = 0.0
        self.bandwidth: int | None = None
        self.stats = ProxyStats()
        self._links: set[_Link] = set()
        self._server: asyncio.base_events.Server | None = None
        self._turn = 0
        self._refuse_until = 0.0
        self._background: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def ws_url(self) -> str:
        return f"ws://{HOST}:{self.port}/ws"

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, HOST, 0)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.reset()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)

    # ----------------------------------------------------------------- faults

    def degrade(self, latency: float = 0.0, bandwidth: int | None = None) -> None:
        self.latency, self.bandwidth = latency, bandwidth

    def clear(self) -> None:
        self.degrade()

    def drop(self) -> None:
        self.stats.drops += 1
        for link in list(self._links):
            self._close(link, abort=False)

    def reset(self) -> None:
        self.stats.resets += 1
        for link in list(self._links):
            self._close(link, abort=True)

    def half_open(self, seconds: float) -> None:
        self.stats.half_opens += 1
        self._refuse_until = time.monotonic() + seconds
        for link in list(self._links):
            link.silent = True
            _abort(link.server)
            task = asyncio.get_running_loop().create_task(self._reset_later(link, seconds))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _reset_later(self, link: _Link, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._close(link, abort=True)

    # ----------------------------------------------------------- forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if time.monotonic() < self._refuse_until:
            self.stats.refused += 1
            _abort(writer)
            return
        upstream = await self._connect_upstream()
        if upstream is None:
            self.stats.refused += 1
            _abort(writer)
            return
        server_reader, server_writer = upstream
        self.stats.connections += 1
        link = _Link(writer, server_writer)
        self._links.add(link)
        link.tasks = [
            asyncio.create_task(self._pump(link, reader, server_writer)),
            asyncio.create_task(self._pump(link, server_reader, writer)),
        ]
        await asyncio.gather(*link.tasks, return_exceptions=True)
        if not link.silent:
            self._close(link, abort=False)

    async def _connect_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        ports = self.upstreams()
        for index in range(len(ports)):
            port = ports[(self._turn + index) % len(ports)]
            try:
                connection = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2.0)
            except (TimeoutError, OSError):
                continue
            self._turn += index + 1
            return connection
        return None

    async def _pump(self, link: _Link, source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
        """Copy one direction, delaying each chunk by the latency at the time it
        was read (a queue keeps the order) and pacing writes to the bandwidth."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        writer = asyncio.create_task(self._deliver(link, queue, target))
        try:
            while True:
                data = await source.read(CHUNK)
                if not data:
                    break
                if not link.silent:
                    queue.put_nowait((time.monotonic() + self.latency, data))
            await queue.join()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.cancel()
            if not link.silent:
                for other in link.tasks:
                    if other is not asyncio.current_task():
                        other.cancel()

    async def _deliver(
        self, link: _Link, queue: asyncio.Queue[tuple[float, bytes]], target: asyncio.StreamWriter
    ) -> None:
        while True:
            due, data = await queue.get()
            try:
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not link.silent:
                    target.write(data)
                    await target.drain()
                    self.stats.bytes_forwarded += len(data)
                    if self.bandwidth:
                        await asyncio.sleep(len(data) / self.bandwidth)
            except (OSError, ConnectionError):
                pass
            finally:
                queue.task_done()

    def _close(self, link: _Link, abort: bool) -> None:
        if link not in self._links:
            return
        self._links.discard(link)
        for task in link.tasks:
            task.cancel()
        for writer in (link.client, link.server):
            if abort:
                _abort(writer)
            else:
                writer.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST instead of a FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
