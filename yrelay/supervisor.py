"""``yrelay serve --workers N``: N server processes on one port.

Each worker is a whole ``yrelay serve`` of its own (a child process run with
``--workers 1 --reuse-port``): its own uvicorn server, built exactly as a
single-process one (every option of ``Settings.uvicorn_options()``, the
guarded HTTP protocol of :mod:`yrelay.transport.http_guard` included), its own
fan-out, GC loop, validator and engine workers. Workers never talk to each
other; several processes on one Redis is how the server always scaled.

Why ``SO_REUSEPORT`` sockets and not uvicorn's ``--workers`` supervisor:
uvicorn's supervisor spawns its workers through ``multiprocessing`` and
pickles its ``Config`` to them, and our HTTP protocol is a class made per
setting values (``guarded_protocol``), which pickle cannot carry; uvicorn's
workers also share one listening socket, where asyncio processes race for
each accept and one of them often takes most connections. With one
``SO_REUSEPORT`` socket per worker the kernel spreads new connections over
the workers by a hash of their addresses, and a worker is a plain
``yrelay serve`` that the supervisor restarts when it dies.

The supervisor (the parent) owns the embedded Redis (started once, by the
CLI, before the workers) and stops it after them. SIGTERM or SIGINT: every
worker gets SIGTERM (uvicorn's graceful shutdown) and is killed if it has
not exited within ``STOP_TIMEOUT``. A worker that dies on its own is
restarted, unless it died within ``START_GRACE`` of its start (a port taken,
a bad setting: restarting would only repeat it), which stops them all.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from types import FrameType

from yrelay.storage.embedded import _die_with_parent

log = logging.getLogger(__name__)

#: Seconds the workers have to exit after SIGTERM before they are killed.
STOP_TIMEOUT = 30.0
#: A worker that exits this soon after its start is not restarted: it cannot start.
START_GRACE = 5.0
#: Seconds between two looks at the workers.
POLL_INTERVAL = 0.2


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` that other processes of the same
    user may bind too (``SO_REUSEPORT``): the kernel spreads connections over them."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
        0
    ]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # uvicorn's backlog
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


class Worker:
    """One ``yrelay serve`` child process."""

    def __init__(self, index: int, command: Sequence[str], env: Mapping[str, str]):
        self.index = index
        self.command = list(command)
        self.env = dict(env)
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        preexec = _die_with_parent if sys.platform.startswith("linux") else None  # no orphan if we are killed
        self.process = subprocess.Popen(self.command, env=self.env, preexec_fn=preexec)
        self.started = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def wait(self, deadline: float) -> None:
        """Wait until ``deadline`` (monotonic); kill it past that."""
        if self.process is None:
            return
        try:
            self.process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            log.warning("worker %d (pid %d) did not stop in time: killed", self.index, self.process.pid)
            self.process.kill()
            self.process.wait()


class Supervisor:
    """Runs one worker per command line until SIGTERM/SIGINT."""

    def __init__(self, commands: Sequence[Sequence[str]], env: Mapping[str, str]):
        self.workers = [Worker(index, command, env) for index, command in enumerate(commands)]
        self._stopping = False
        self._failed = False

    def run(self) -> int:
        """Start the workers, keep them running, stop them all; the exit code."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for worker in self.workers:
                worker.start()
            log.info(
                "%d workers started (pids %s)",
                len(self.workers),
                ", ".join(str(w.process.pid) for w in self.workers if w.process),
            )
            while not self._stopping:
                self._watch()
                time.sleep(POLL_INTERVAL)
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if self._failed else 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _watch(self) -> None:
        for worker in self.workers:
            code = worker.exit_code()
            if code is None:
                continue
            if time.monotonic() - worker.started < START_GRACE:
                log.error("worker %d exited with %d at start-up: stopping every worker", worker.index, code)
                self._failed, self._stopping = True, True
                return
            log.warning("worker %d exited with %d: restarting it", worker.index, code)
            worker.start()

    def _stop_all(self) -> None:
        for worker in self.workers:
            worker.terminate()
        deadline = time.monotonic() + STOP_TIMEOUT
        for worker in self.workers:
            worker.wait(deadline)
