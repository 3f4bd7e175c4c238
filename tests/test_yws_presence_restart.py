"""Presence across server restarts with stock y-websocket 2.1.0 clients
(issue 36, item 2): after the server is stopped with SIGTERM, and again
with kill -9, and started again, two clients of different subjects (auth
on) and two clients of different addresses (auth off) see each other again
within 20 s, and no later than 2 s after two clients of y-websocket's own
server (2.1.0's bin/server.cjs, restarted beside it the same way) do; a
client of another subject (auth on) or address (auth off) is never given
their clientIDs, before the restarts or right after them (while their
owners are still reconnecting). And when only alice's process restarts
(bob on another process stays connected and is told she left), she is
seen again as soon. The clients are web/test-stock/presence-restart.mjs.

Each restart is one awareness renewal long (~15 s): a stock client ignores
a re-sent state whose clock has not moved, so the pairs are seen at the
renewal that follows the restart, on either server. The figures are
printed (docs/reliability.md records them)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from browser import WEB_DIR, require_web_build
from yrelay.auth import issue_token
from yrelay.storage.embedded import free_port
from yrelay_tools.testing.processes import ServerProcess

SECRET = "presence-restart-secret-0123456789abcdef"
#: The issue's bounds: seen within 20 s of the restart, at most 2 s after y-websocket's server.
WITHIN = 20.0
BESIDE_YWS = 2.0
HARNESS = "test-stock/presence-restart.mjs"
YWS_SERVER = WEB_DIR / "node_modules" / "y-websocket" / "bin" / "server.cjs"
#: Seconds a server may take to answer (three start at once on a busy 2-core machine).
START_TIMEOUT = 90.0


class YwsServer:
    """y-websocket's own server (in memory) on a fixed port, restartable."""

    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.log_path = log_dir / f"y-websocket-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> YwsServer:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                ["node", str(YWS_SERVER)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HOST": "127.0.0.1", "PORT": str(self.port)},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log_path.read_text()[-2000:]
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise TimeoutError("y-websocket's server did not listen")

    def stop(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(10)


def stop(server: ServerProcess | YwsServer, signum: int) -> None:
    if isinstance(server, YwsServer):
        server.stop(signum)
    elif signum == signal.SIGKILL:
        server.kill()
    else:
        server.stop()  # SIGTERM: uvicorn's graceful shutdown


def pairs(servers: dict[str, Any], beside: ServerProcess) -> list[dict[str, Any]]:
    """The clients: who connects where, as whom. Each yrelay pair has a pair
    on a y-websocket server of its own, stopped with it and started again
    the moment it answers: the same outage, the same clients' timers. One
    more pair has bob on a second yrelay process (``beside``, same Redis)
    that is not restarted: he stays connected, and is told alice left."""

    def token(subject: str) -> dict[str, str]:
        return {"token": issue_token(SECRET, subject, ["presence-*"], "write")}

    def address(last: int) -> dict[str, str]:
        return {"X-Forwarded-For": f"203.0.113.{last}"}  # behind the trusted proxy (127.0.0.1)

    def pair(server: str, **clients: Any) -> dict[str, Any]:
        return {
            "name": server,
            "server": server,
            "base": f"ws://127.0.0.1:{servers[server].port}",
            "room": f"presence-{server}",
            "a": {},
            "b": {},
            **clients,
        }

    return [
        pair(
            "yrelay-on", a={"params": token("alice")}, b={"params": token("bob")}, mallory={"params": token("mallory")}
        ),
        pair("yrelay-off", a={"headers": address(1)}, b={"headers": address(2)}, mallory={"headers": address(66)}),
        {
            **pair(
                "yrelay-off",
                a={"headers": address(3)},
                b={"headers": address(4), "base": f"ws://127.0.0.1:{beside.port}"},
            ),
            "name": "yrelay-off, bob on another process",
            "room": "presence-two",
        },
        pair("yws-on"),
        pair("yws-off"),
        # The control: y-websocket's server has no owners, so the same spoof takes the clientID there.
        {**pair("yws-on", mallory={}, control=True), "name": "control", "room": "presence-control"},
    ]


class Harness:
    """The Node side: commands in, JSON events out."""

    def __init__(self, process: asyncio.subprocess.Process):
        self.process = process
        self.events: list[dict[str, Any]] = []

    async def command(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    async def until(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            try:
                line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
            except TimeoutError:
                raise AssertionError(f"no {event} within {timeout} s; events: {self.events}") from None
            assert line, f"the harness exited: {self.events}"
            if not line.startswith(b"{"):
                continue  # y-websocket's own console output
            self.events.append(json.loads(line))
            if self.events[-1]["event"] == event:
                return self.events[-1]


async def restart(harness: Harness, servers: dict[str, Any], label: str, signum: int) -> dict[str, float]:
    """Stop every server at once with ``signum`` and start them again, each
    y-websocket server once its yrelay counterpart answers; tell the clients
    when each answers; once every pair saw each other again, return how long
    after the signal each server answered."""
    await harness.command(f"kill {label}")
    signalled = time.monotonic()
    await asyncio.gather(*(asyncio.to_thread(stop, server, signum) for server in servers.values()))
    answered: dict[str, float] = {}

    async def start(name: str) -> None:
        await asyncio.to_thread(servers[name].start, START_TIMEOUT)
        answered[name] = round(time.monotonic() - signalled, 2)
        await harness.command(f"up {name}")

    async def start_beside(mode: str) -> None:
        await start(f"yrelay-{mode}")
        await start(f"yws-{mode}")

    await asyncio.gather(start_beside("on"), start_beside("off"))
    await harness.until("round", timeout=60)
    return answered


@pytest.mark.timeout(400)
async def test_stock_clients_see_each_other_after_restarts_and_nobody_takes_their_ids(redis_url, tmp_path):
    require_web_build()
    assert shutil.which("node") and YWS_SERVER.is_file(), "needs node and `cd web && npm ci` (y-websocket 2.1.0)"
    servers: dict[str, Any] = {
        "yrelay-on": ServerProcess(
            redis_url, tmp_path, env={"YRELAY_INSECURE_NO_AUTH": "0", "YRELAY_AUTH_SECRET": SECRET}
        ),
        "yrelay-off": ServerProcess(redis_url, tmp_path, env={"YRELAY_TRUSTED_PROXIES": "127.0.0.1"}),
        "yws-on": YwsServer(tmp_path),
        "yws-off": YwsServer(tmp_path),
    }
    beside = ServerProcess(redis_url, tmp_path, env={"YRELAY_TRUSTED_PROXIES": "127.0.0.1"})  # never restarted
    await asyncio.gather(*(asyncio.to_thread(server.start, START_TIMEOUT) for server in [*servers.values(), beside]))
    process = await asyncio.create_subprocess_exec(
        "node",
        HARNESS,
        cwd=WEB_DIR,
        env={**os.environ, "PRESENCE_CONFIG": json.dumps({"pairs": pairs(servers, beside)})},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    harness = Harness(process)
    try:
        await harness.until("ready", timeout=60)
        answered = {
            "SIGTERM": await restart(harness, servers, "SIGTERM", signal.SIGTERM),
            "SIGKILL": await restart(harness, servers, "SIGKILL", signal.SIGKILL),
        }
        await harness.command("quit")
        summary = await harness.until("summary", timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()
        for server in [*servers.values(), beside]:
            stop(server, signal.SIGKILL)
    seen = {(event["round"], event["pair"]): event for event in harness.events if event["event"] == "seen"}
    print(
        f"\nservers answered again after the signal (s): {answered}\npresence seen again (s): "
        + "; ".join(
            f"{label} {pair}: {event['after_kill']} after the signal, {event['after_up']} after it answered, "
            f"{event['after_reconnect']} after both reconnected"
            for (label, pair), event in sorted(seen.items())
        )
    )
    for label in ("SIGTERM", "SIGKILL"):
        for pair, baseline in (
            ("yrelay-on", "yws-on"),
            ("yrelay-off", "yws-off"),
            ("yrelay-off, bob on another process", "yws-off"),
        ):
            event = seen[label, pair]
            assert event["after_up"] <= WITHIN, event
            assert event["after_kill"] <= seen[label, baseline]["after_kill"] + BESIDE_YWS, (
                event,
                seen[label, baseline],
            )
    spoofs = [(event["pair"], event["when"], event["taken"]) for event in harness.events if event["event"] == "spoof"]
    assert sorted(spoofs) == [("control", "start", True)] + [
        (pair, when, False) for pair in ("yrelay-off", "yrelay-on") for when in ("restart", "restart", "start")
    ], spoofs
    assert summary["violations"] == [], summary
