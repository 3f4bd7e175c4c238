"""What every server under test offers the generator."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from yrelay.storage.embedded import _die_with_parent, free_port
from yrelay_tools.testing.processes import terminate


class Target:
    """A server under test, started fresh (``start``) and stopped (``stop``)."""

    #: Name in the tables.
    name: str = ""
    #: Which driver speaks to it (``drivers.PROTOCOLS``).
    protocol: str = ""
    #: What an ack is worth, and how the server was driven (goes in the table).
    note: str = ""
    #: Connections opened at once (pycrdt-websocket: one at a time).
    parallel_connects: int = 16

    def __init__(self, work_dir: Path):
        self.work_dir = Path(work_dir)
        self.host = "127.0.0.1"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Target:
        raise NotImplementedError

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, 10)
            self.process = None

    def pids(self) -> dict[str, int]:
        """The processes whose CPU and memory count: ``server`` (and ``redis``)."""
        assert self.process is not None
        return {"server": self.process.pid}

    @property
    def redis_url(self) -> str | None:
        return None

    def _spawn(self, command: list[str], env: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = (self.work_dir / f"{self.name.split()[0]}-{self.port}.log").open("ab")
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            preexec_fn=_die_with_parent,
        )
        wait_for_port(self.host, self.port, timeout, self.process)


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode} before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port} after {timeout}s")
