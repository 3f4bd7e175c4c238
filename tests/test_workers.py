"""``yrelay serve --workers 2``: two server processes on one port, one
embedded Redis; one document served to clients on both; all stopped on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import redis

from conftest import eventually
from yrelay.config import Settings
from yrelay.storage.embedded import free_port
from yrelay.storage.keys import stream_key
from yrelay.storage.offsets import StreamId
from yrelay.supervisor import START_GRACE
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import wait_ready


def _children(pid: int) -> dict[int, str]:
    """pid -> command name of ``pid``'s children."""
    out = subprocess.run(["ps", "--ppid", str(pid), "-o", "pid=,comm="], capture_output=True, text=True).stdout
    return {int(line.split()[0]): line.split()[1] for line in out.splitlines() if line.strip()}


def _connect_processes(events: Path) -> dict[str, str]:
    """session -> the process that served its ``hello`` (from the event logs)."""
    served: dict[str, str] = {}
    for path in events.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["type"] == "connect":
                served[event["session"]] = event["process"]
    return served


async def test_two_workers_serve_one_document_and_stop_together(tmp_path, make_client):
    port = free_port()
    data = tmp_path / "data"
    server = subprocess.Popen(  # noqa: ASYNC220 - started, not waited on: the test talks to it over HTTP
        [sys.executable, "-m", "yrelay", "serve", "--workers", "2", "--port", str(port), "--data-dir", str(data)],
        cwd=Path(__file__).parent.parent,
        env={**os.environ, "YRELAY_INSECURE_NO_AUTH": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_ready(port, server)
        children = _children(server.pid)
        workers = [pid for pid, name in children.items() if name.startswith("python")]
        redises = [pid for pid, name in children.items() if name.startswith("redis-server")]
        assert len(workers) == 2 and len(redises) == 1, children
        url = f"ws://127.0.0.1:{port}/ws"
        clients = []
        # New connections are spread by the kernel (SO_REUSEPORT): connect until both workers serve some.
        for _ in range(20):
            clients.append(await make_client(url))
            await eventually(lambda: clients[-1].session in _connect_processes(data / "events"))
            if len(clients) >= 3 and len(set(_connect_processes(data / "events").values())) == 2:
                break
        served = _connect_processes(data / "events")
        assert len(set(served[c.session] for c in clients)) == 2, "every client landed on one worker"
        docs = [await client.subscribe("shared") for client in clients]
        for i in range(30):  # edits from clients on both workers, interleaved
            writer = i % len(clients)
            crdt.insert_text(docs[writer].ydoc, 0, f"<{i}>")
        for client in clients:
            await client.wait_idle()
        await eventually(lambda: len({doc.text for doc in docs}) == 1 and len(docs[0].text) > 0, timeout=20)
        with redis.Redis.from_url((data / "redis" / "redis.url").read_text()) as store:
            entries = [(id_.decode(), fields[b"s"].decode()) for id_, fields in store.xrange(stream_key("shared"))]
        assert len(entries) == 30

        def delivered_everything(client, doc) -> bool:  # offset: the last entry of others it was sent
            theirs = [id_ for id_, session in entries if session != client.session]
            return doc.offset is not None and StreamId.parse(doc.offset) >= StreamId.parse(theirs[-1])

        await eventually(
            lambda: all(delivered_everything(c, d) for c, d in zip(clients, docs, strict=True)), timeout=20
        )
        assert all(sum(client.error_codes.values()) == 0 for client in clients)
        for i in range(30):
            assert f"<{i}>" in docs[0].text
        for client in clients:
            await client.close()
        # Past its start-up grace, counted from the worker process's own start
        # (the supervisor starts it after the embedded Redis, which on a busy
        # machine came more than 2 s after the server: the kill then fell inside
        # the grace and the supervisor rightly stopped every worker).
        born = psutil.Process(workers[0]).create_time()
        await asyncio.sleep(max(0.0, born + START_GRACE + 1.0 - time.time()))
        os.kill(workers[0], signal.SIGKILL)  # a worker that dies is replaced
        await eventually(
            lambda: (
                len([p for p, n in _children(server.pid).items() if n.startswith("python") and p not in workers]) == 1
            ),
            timeout=20,
        )
        workers = [pid for pid, name in _children(server.pid).items() if name.startswith("python")]
        assert len(workers) == 2
        wait_ready(port, server)
    finally:
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    assert server.returncode == 0, output[-3000:]
    assert "restarting it" in output
    for pid in [*workers, *redises]:
        assert not os.path.exists(f"/proc/{pid}"), f"{children[pid]} {pid} outlived the supervisor"  # noqa: ASYNC240 - /proc is in memory


def test_workers_setting():
    assert Settings(workers="3").worker_count() == 3
    assert Settings(workers="auto").worker_count() == len(os.sched_getaffinity(0))
    with pytest.raises(ValueError, match="workers"):
        Settings(workers="0")


def test_a_worker_that_cannot_start_stops_the_supervisor(caplog):
    """A worker that exits at once (a port taken, a bad setting) is not
    restarted in a loop: every worker is stopped and the exit code is 1."""
    from yrelay.supervisor import Supervisor

    quits = [sys.executable, "-c", "import sys; sys.exit(3)"]
    sleeps = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor([quits, sleeps], dict(os.environ))
    with caplog.at_level(logging.ERROR, logger="yrelay.supervisor"):
        assert supervisor.run() == 1
    assert "worker 0 exited with 3 at start-up" in caplog.text
    assert all(worker.exit_code() is not None for worker in supervisor.workers)  # no orphan


def test_a_port_taken_is_refused_before_any_worker_starts(tmp_path):
    """The port is taken (without SO_REUSEPORT): one line, exit code 1, no worker started."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "yrelay",
                "serve",
                "--workers",
                "2",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "data"),
            ],
            cwd=Path(__file__).parent.parent,
            env={**os.environ, "YRELAY_INSECURE_NO_AUTH": "1"},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stderr[-2000:]
    [line] = result.stderr.splitlines()
    assert line.startswith(f"yrelay: cannot listen on 127.0.0.1:{port}")


def test_workers_from_the_environment_and_what_each_worker_is_told(monkeypatch):
    """YRELAY_WORKERS starts the supervisor; each worker gets the resolved port
    and data dir on its command line and the Redis URL in its environment."""
    from typer.testing import CliRunner

    from yrelay import cli as cli_module

    seen: dict[str, object] = {}

    class FakeSupervisor:
        def __init__(self, commands, env):
            seen.update(commands=commands, env=env)

        def run(self) -> int:
            return 0

    async def redis_answers(url: str, cluster: bool) -> None:  # the password below is for the command lines
        pass

    monkeypatch.setattr(cli_module, "Supervisor", FakeSupervisor)
    monkeypatch.setattr(cli_module, "_ensure_redis", redis_answers)
    monkeypatch.setenv("YRELAY_WORKERS", "2")
    monkeypatch.setenv("YRELAY_PORT", "9123")
    monkeypatch.setenv("YRELAY_REDIS_URL", "redis://:secret@127.0.0.1:1/0")
    result = CliRunner().invoke(cli_module.cli, ["serve", "--insecure-no-auth", "--verify-digests"])
    assert result.exit_code == 0, result.output
    first, second = seen["commands"]
    assert first[first.index("--port") + 1] == "9123" and first[first.index("--workers") + 1] == "1"
    assert "--reuse-port" in first and "--insecure-no-auth" in second
    assert "--verify-digests" in first and "--verify-digests" not in second  # once is enough
    assert seen["env"]["YRELAY_REDIS_URL"] == "redis://:secret@127.0.0.1:1/0"
    assert not any("secret" in part for part in first), "the Redis password would show in the process list"
