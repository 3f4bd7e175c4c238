"""Issue 30, items 4 and 7, against real server processes: every HTTP route
of the relay checks its token before it reads a byte of the body, and reads
no body past its cap; a document id in a path is taken exactly as sent;
``/readyz`` tells strangers ready or not, nothing about the host; and no
token, nor a piece of one, reaches the log at ``--log-level debug``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import websockets
from fastapi import FastAPI

from conftest import eventually, serving
from gcutil import append_at, text_updates
from test_yws import stored
from yrelay import Relay
from yrelay.app.http_body import MAX_BODY_BYTES
from yrelay.auth import Principal
from yrelay.client import YrelayClient
from yrelay.config import Settings
from yrelay.storage.embedded import free_port
from yrelay_tools.testing.processes import ServerProcess, wait_ready
from ywspeer import YwsPeer

TOKEN = "ops-token-for-body-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WRONG = {"Authorization": "Bearer not-the-ops-token"}
MIB = 2**20
#: What the issue's attack sent; what the server may grow by meanwhile.
ATTACK_BYTES, RSS_BOUND = 128 * MIB, 8 * MIB
#: Every HTTP route of a relay that takes a token (checked against the OpenAPI schema).
GUARDED = [
    ("POST", "/ops/gc"),
    ("GET", "/ops/docs"),
    ("GET", "/ops/docs/{doc}"),
    ("DELETE", "/ops/docs/{doc}"),
    ("DELETE", "/ops/docs/{doc}/sessions/{session}"),
    ("POST", "/ops/docs/{doc}/drop-blocked"),
    ("POST", "/ops/tokens/revoke"),
    ("GET", "/ops/groups"),
    ("GET", "/ops/groups/{group}"),
    ("DELETE", "/ops/groups/{group}"),
    ("GET", "/ops/groups/{group}/dead-letters"),
    ("POST", "/ops/groups/{group}/dead-letters/{doc}/retry"),
    ("POST", "/ops/groups/{group}/dead-letters/retry"),
    ("GET", "/metrics"),
]


@pytest.fixture
def server(redis_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    process = ServerProcess(redis_url, tmp_path, env={"YRELAY_OPS_TOKEN": TOKEN, "YRELAY_GC_INTERVAL": "0"}).start()
    try:
        yield process
    finally:
        process.stop()


def _rss(server: ServerProcess) -> int:
    assert server.process is not None
    return psutil.Process(server.process.pid).memory_info().rss


def _reset_peak(server: ServerProcess) -> None:
    """Start the kernel's peak-RSS mark (VmHWM) over at the current RSS."""
    assert server.process is not None
    Path(f"/proc/{server.process.pid}/clear_refs").write_text("5")


def _peak(server: ServerProcess) -> int:
    assert server.process is not None
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:"))) * 1024


def _huge_json(size: int) -> Iterator[bytes]:
    """A JSON body of ``size`` bytes, made a MiB at a time (this process stays small)."""
    yield b'{"doc": "'
    left = size - len(b'{"doc": "') - len(b'"}')
    while left > 0:
        yield b"a" * min(MIB, left)
        left -= MIB
    yield b'"}'


def _send_huge(server: ServerProcess, headers: dict[str, str]) -> tuple[int, int]:
    """POST /ops/gc with the 128 MiB body; (status, the server's peak RSS
    during it less its RSS before: what it read was freed by the end)."""
    before = _rss(server)
    _reset_peak(server)
    with httpx.Client(timeout=60) as client:
        response = client.post(
            f"http://127.0.0.1:{server.port}/ops/gc",
            content=_huge_json(ATTACK_BYTES),
            headers={"Content-Type": "application/json", **headers},
        )
    return response.status_code, _peak(server) - before


def test_a_128_mib_body_is_refused_without_being_read(server: ServerProcess):
    """The issue's attack: no token, 401, and the server's peak RSS grows by
    less than 8 MiB (it grew by 384 MiB); a wrong token, 403; the right
    token, 413 at the cap. Each of the three sends the whole 128 MiB, chunked."""
    for headers, expected in (({}, 401), (WRONG, 403), (AUTH, 413)):
        status, growth = _send_huge(server, headers)
        print(f"{status}: peak RSS +{growth / MIB:.1f} MiB")
        assert status == expected and growth < RSS_BOUND, (status, growth / MIB)
    assert httpx.post(f"http://127.0.0.1:{server.port}/ops/gc", json={}, headers=AUTH).status_code == 200


def test_a_malformed_body_gets_the_token_answer_first(server: ServerProcess):
    base, json_type = f"http://127.0.0.1:{server.port}", {"Content-Type": "application/json"}
    for path in ("/ops/gc", "/ops/tokens/revoke"):
        assert httpx.post(base + path, content=b"{not json", headers=json_type).status_code == 401
        assert httpx.post(base + path, content=b"{not json", headers={**json_type, **WRONG}).status_code == 403
        assert httpx.post(base + path, content=b"{not json", headers={**json_type, **AUTH}).status_code == 422
        assert httpx.post(base + path, json={"doc": 5, "jti": []}, headers=AUTH).status_code == 422


async def _answer(port: int, method: str, path: str, *headers: str, body: bytes = b"") -> tuple[int, float]:
    """Send a request head (and ``body``), never the rest of what it
    announces; the status of the answer and how long it took."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        started = time.monotonic()
        head = "".join(f"{line}\r\n" for line in (f"{method} {path} HTTP/1.1", "Host: x", *headers))
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 5)
        return int(status_line.split()[1]), time.monotonic() - started
    finally:
        writer.close()


async def _assert_every_route_answers_before_the_body(port: int, prefix: str = "") -> None:
    """A request that announces 1 GiB and sends none of it is answered at
    once on every guarded route: 401 without a token, 403 with a wrong one."""
    for method, template in GUARDED:
        path = prefix + template.format(doc="a", session="s", group="g")
        for headers, expected in (((), 401), ((f"Authorization: {WRONG['Authorization']}",), 403)):
            status, took = await _answer(port, method, path, "Content-Length: 1073741824", *headers)
            assert (method, path, status) == (method, path, expected) and took < 2, (method, path, status, took)


async def test_tokens_are_checked_before_the_body_arrives(server: ServerProcess):
    async with httpx.AsyncClient() as client:
        schema = (await client.get(f"http://127.0.0.1:{server.port}/openapi.json")).json()
    routes = {(method.upper(), path) for path, operations in schema["paths"].items() for method in operations}
    assert {route for route in routes if route[1].startswith("/ops") or route[1] == "/metrics"} == set(GUARDED)
    await _assert_every_route_answers_before_the_body(server.port)
    authorized = f"Authorization: {AUTH['Authorization']}"
    # The right token and a body over the cap: 413 from the announced length, nothing read ...
    assert (await _answer(server.port, "POST", "/ops/gc", "Content-Length: 1073741824", authorized))[0] == 413
    # ... and from the bytes themselves when none is announced: answered once past the cap, the rest never sent.
    chunk = b'{"doc": "'.ljust(4096, b"a")
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY_BYTES // 4096 + 2))
    chunked = "Transfer-Encoding: chunked"
    assert (await _answer(server.port, "POST", "/ops/gc", chunked, authorized, body=body))[0] == 413
    # Under the cap, the route works as before.
    assert (await _answer(server.port, "POST", "/ops/gc", "Content-Length: 2", authorized, body=b"{}"))[0] == 200


async def test_bodies_wait_for_the_token_under_a_prefix_too(redis_url: str):
    """A host that installs the relay under /collab, or includes its router
    under /deep/er: the same answers, before the body; and its routed
    ``/yws/<room>`` takes the room exactly too."""
    relay = Relay(Settings.from_env(ops_token=TOKEN, gc_interval=0), redis_url=redis_url)
    installed, included = FastAPI(), FastAPI()
    relay.install(installed, prefix="/collab")
    included.include_router(relay.router, prefix="/deep/er")
    for app, prefix in ((installed, "/collab"), (included, "/deep/er")):
        port = free_port()
        async with relay.lifespan(), serving(app, port, **relay.settings.uvicorn_options()):
            await _assert_every_route_answers_before_the_body(port, prefix)
            status, _ = await _answer(
                port,
                "POST",
                prefix + "/ops/gc",
                "Content-Length: 9",
                "Content-Type: application/json",
                body=b"{not json",
            )
            assert status == 401
            # The room "ctl/nl\n" is the document ctl/nl%0A (docs/web.md#room-names), never ctl/nl.
            writer, reader = [await YwsPeer.connect(f"ws://127.0.0.1:{port}{prefix}", "ctl/nl%0A") for _ in "wr"]
            await writer.edit(prefix)
            # stored: the reader has it from the stream
            await eventually(lambda: prefix in str(reader.text))  # noqa: B023 - called within this iteration, never after it
            await writer.close()
            await reader.close()
    assert await stored(redis_url, "ctl/nl%0A") == "/collab/deep/er" and await stored(redis_url, "ctl/nl") == ""


async def test_a_document_id_in_a_path_is_taken_exactly(server: ServerProcess, redis_client):
    """``ctl/nl%0A`` is not ``ctl/nl``: Starlette's ``path`` parameters
    dropped a trailing newline, so DELETE /ops/docs/ctl/nl%0A deleted ctl/nl."""
    await append_at(redis_client, "ctl/nl", [1000], text_updates(1)[0])  # the document the check means to spare
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", headers=AUTH) as ops:
        for encoded in ("%0A", "%0D", "%0A%0A", "%00"):
            for method, path in (
                ("DELETE", "/ops/docs/ctl/nl{}"),
                ("GET", "/ops/docs/ctl/nl{}"),
                ("POST", "/ops/docs/ctl/nl{}/drop-blocked"),
                ("DELETE", "/ops/docs/ctl/nl{}/sessions/s"),
                ("POST", "/ops/groups/g/dead-letters/ctl/nl{}/retry"),
            ):
                response = await ops.request(method, path.format(encoded))
                assert response.status_code == 422, (method, path, encoded, response.text)
        assert (await ops.get("/ops/docs/ctl/nl")).json()["stream_length"] == 1


async def test_readyz_tells_strangers_only_ready_or_not(server: ServerProcess):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
        stranger = await http.get("/readyz")
        assert stranger.status_code == 200 and stranger.json() == {"status": "ready"}
        wrong = await http.get("/readyz", headers=WRONG)
        assert wrong.json() == {"status": "ready"}
        operator = (await http.get("/readyz", headers=AUTH)).json()
        assert operator["status"] == "ready" and operator["process"].endswith(f":{server.process.pid}")


OPAQUE = "Qm7tXw2Rk9Lp"  # what an auth hook's own sessions might use: short, no recognisable shape
HOOK = f"""
from yrelay.auth import AuthError, Principal

class Opaque:
    async def authenticate(self, token, headers):
        if token != {OPAQUE!r}:
            raise AuthError("unknown token")
        return Principal.of("alice", ["*"], "write")

def factory(settings):
    return Opaque()
"""


def _fragments(token: str) -> list[str]:
    return [token, token[:4], token[-4:]]


async def _use_the_token(ws_url: str) -> None:
    """A hello with the token, one with it twice (refused), the token as a
    subprotocol and in the cookie and Authorization headers."""
    async with websockets.connect(ws_url) as ws:
        await ws.send(json.dumps({"op": "hello", "session": None, "token": OPAQUE}))
        assert json.loads(await ws.recv())["op"] == "welcome"
        await ws.send(json.dumps({"op": "hello", "session": None, "token": OPAQUE}))
        assert json.loads(await ws.recv())["op"] == "error"
    subprotocols = ["yrelay.v1", f"yrelay.auth.{OPAQUE}"]
    headers = {"Cookie": f"sid={OPAQUE}", "Authorization": f"Token {OPAQUE}"}
    async with websockets.connect(ws_url, subprotocols=subprotocols, additional_headers=headers) as ws:  # type: ignore
        await ws.send(json.dumps({"op": "hello", "session": None}))
        assert json.loads(await ws.recv())["op"] == "welcome"


def test_no_token_nor_a_piece_of_one_is_logged_at_debug(tmp_path: Path, redis_url: str):
    """``yrelay serve --log-level debug`` logged each frame and handshake
    header: a hello's token whole when short (its ends when long), the
    subprotocol's token whole."""
    (tmp_path / "opaque_hook.py").write_text(HOOK)
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("YRELAY_")},
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "YRELAY_DATA_DIR": str(tmp_path / "data"),
        "YRELAY_GC_INTERVAL": "0",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "yrelay",
            "serve",
            "--port",
            str(port),
            "--redis-url",
            redis_url,
            "--log-level",
            "debug",
            "--auth-hook",
            "opaque_hook:factory",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        wait_ready(port, process)
        asyncio.run(_use_the_token(f"ws://127.0.0.1:{port}/ws"))
    finally:
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=20)
    assert "< TEXT" in output and "sec-websocket-protocol" in output  # debug lines were written
    for piece in _fragments(OPAQUE):
        assert piece not in output, [line for line in output.splitlines() if piece in line]


class _ServerLines(logging.Handler):
    """Every record at DEBUG and up of the server's loggers, yrelay's and
    uvicorn's (the websockets library writes to ``uvicorn.error``), as its
    message; not the test's own client's."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.loggers = [logging.getLogger(name) for name in ("yrelay", "uvicorn", "uvicorn.error")]

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> list[str]:
        self.levels = [logger.level for logger in self.loggers]
        for logger in self.loggers:
            logger.setLevel(logging.DEBUG)
        for logger in self.loggers[:2]:  # uvicorn.error's lines propagate to uvicorn
            logger.addHandler(self)
        return self.lines

    def __exit__(self, *exc: object) -> None:
        for logger, level in zip(self.loggers, self.levels, strict=True):
            logger.removeHandler(self)
            logger.setLevel(level)


async def test_an_embedded_relay_logs_no_token_at_debug(redis_url: str):
    """The same with Relay(authenticate=...) in a host app whose logging is its own."""

    async def authenticate(connection: object, token: str | None) -> Principal:
        assert token == OPAQUE
        return Principal.of("alice", ["*"], "write")

    relay = Relay(Settings.from_env(insecure_no_auth=False), redis_url=redis_url, authenticate=authenticate)
    app = FastAPI()
    relay.install(app, prefix="/collab")
    port = free_port()
    async with relay.lifespan(), serving(app, port, **relay.settings.uvicorn_options()):
        with _ServerLines() as lines:
            await _use_the_token(f"ws://127.0.0.1:{port}/collab/ws")
    text = "\n".join(lines)
    assert "< TEXT" in text
    for piece in _fragments(OPAQUE):
        assert piece not in text, [line for line in text.splitlines() if piece in line]


async def test_the_python_client_logs_no_token_at_debug(server_url: str):
    """The client's own socket: the websockets library logs every frame it
    sends at debug, a hello's token included, unless filtered."""
    lines: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, root = Lines(logging.DEBUG), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        async with YrelayClient(server_url, token=OPAQUE) as client:
            await client.subscribe("logged")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text = "\n".join(lines)
    assert "> TEXT" in text  # the client's frames were logged
    for piece in _fragments(OPAQUE):
        assert piece not in text, [line for line in text.splitlines() if piece in line]
