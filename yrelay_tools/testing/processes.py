"""Real server processes for tests, the fault suite and benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from yrelay.storage.embedded import _die_with_parent, free_port

#: Defaults of harness servers, under whatever the environment says.
HARNESS_ENV = {"YRELAY_INSECURE_NO_AUTH": "1"}


def wait_ready(port: int, process: subprocess.Popen[Any], timeout: float = 20.0, log_path: Path | None = None) -> None:
    """Poll a server's ``/readyz`` until it answers 200; fail if ``process`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            if log_path:
                output = log_path.read_text()
            else:  # its own pipe, if it was given one: what it said before it exited
                output = process.stdout.read() if process.stdout else ""
                output = output.decode(errors="replace") if isinstance(output, bytes) else output
            raise RuntimeError(f"server exited with {process.returncode}: {output[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"server on port {port} not ready")


class ServerProcess:
    """``yrelay serve`` in a child process, against a given Redis.

    These are harness servers (tests, the fault suite, benchmarks): they run
    without authentication unless the environment or ``env`` sets
    ``YRELAY_INSECURE_NO_AUTH=0`` and an auth secret."""

    def __init__(
        self,
        redis_url: str,
        log_dir: Path,
        port: int | None = None,
        env: dict[str, str] | None = None,
        module: str = "yrelay",
        cwd: Path | None = None,
    ):
        """``module``: what ``python -m`` runs; tests name a deliberately
        broken build (:mod:`yrelay_tools.testing.broken_server`) here. ``cwd``:
        where it runs; ``python -m`` imports from there first, ahead of
        ``PYTHONPATH`` (how a benchmark runs another checkout)."""
        self.cwd = cwd
        self.redis_url = redis_url
        self.module = module
        self.port = port or free_port()
        self.log_path = Path(log_dir) / f"server-{self.port}.log"
        self.env = env or {}
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    def start(self, timeout: float = 20.0) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        command = [
            sys.executable,
            "-m",
            self.module,
            "serve",
            "--port",
            str(self.port),
            "--redis-url",
            self.redis_url,
            "--log-level",
            "warning",
        ]
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**HARNESS_ENV, **os.environ, **self.env},
            preexec_fn=preexec,
            cwd=self.cwd,
        )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        wait_ready(self.port, self.process, timeout, self.log_path)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; what was acked must already be in Redis."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing."""
        if self.running:
            self.process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]

    def resume(self) -> None:
        if self.running:
            self.process.send_signal(signal.SIGCONT)  # type: ignore[union-attr]

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, 10)


def terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
