"""The Python client says what went wrong, from the user's side, against a
real server and Redis (issue 38): a refused token raises
:class:`Unauthorized` at ``connect()``, a document the token does not grant
raises :class:`Forbidden` at ``subscribe()``, updates the server will not
store raise :class:`UpdatesRefused` from ``wait_idle()``, and no server
raises :class:`ServerUnreachable`.

Every wait below is long (60 s): the exception's type proves the client
answered from the server's refusal, not from a timeout (which would be a
``TimeoutError`` after the full minute)."""

from __future__ import annotations

import time

import httpx
import pytest
import websockets

from conftest import FAST_BACKOFF, eventually, running_server
from engines import needs_ypy
from test_auth import AUTH, SECRET, token
from yrelay.auth import issue_token
from yrelay.client import (
    ClientError,
    Forbidden,
    ServerUnreachable,
    SubscribeRefused,
    Unauthorized,
    UpdatesRefused,
    YrelayClient,
)
from yrelay.storage.embedded import free_port
from yrelay.storage.keys import InvalidDocumentId, stream_key
from yrelay.yjs import crdt

#: Long enough that reaching it would fail the test by its exception type.
LONG = 60.0


@pytest.fixture
async def auth_url(redis_url):
    async with running_server(redis_url, **AUTH, max_update_bytes=4_096, max_subscriptions_per_subject=2) as url:
        yield url


def ops(url: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url.replace("ws://", "http://").removesuffix("/ws"), timeout=LONG)


async def revoke(url: str, token_id: str) -> None:
    async with ops(url) as http:
        answer = await http.post(
            "/ops/tokens/revoke",
            json={"jti": token_id, "expires_at": time.time() + 600},
            headers={"Authorization": "Bearer ops"},
        )
        assert answer.status_code == 204


def client(url: str, credential: object, **kwargs: object) -> YrelayClient:
    return YrelayClient(url, backoff=FAST_BACKOFF, token=credential, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "credential, reason",
    [
        ("wrong", "invalid token"),
        (issue_token("another-secret-0123456789abcdef012345", "eve", ["a"]), "invalid token"),
        (issue_token(SECRET, "late", ["a"], ttl=-60), "expired"),
        (None, "token"),
    ],
)
async def test_a_refused_token_raises_unauthorized_at_connect_with_the_servers_reason(auth_url, credential, reason):
    refused = client(auth_url, credential)
    with pytest.raises(Unauthorized) as raised:
        async with refused:
            pytest.fail("the context was entered with a refused token")
    error = raised.value
    assert not isinstance(error, TimeoutError)
    assert error.code == "unauthorized" and reason in error.reason and reason in str(error)
    assert "get a new token" in str(error)
    assert credential is None or credential not in str(error)
    assert refused.failure is error and refused._runner is not None and refused._runner.done()  # nothing left running


async def test_the_same_client_connects_again_with_a_new_token(auth_url):
    user = client(auth_url, "wrong")
    with pytest.raises(Unauthorized):
        await user.connect(timeout=LONG)
    user.token = token(["notes"])
    async with user:
        assert user.failure is None
        notes = await user.subscribe("notes", timeout=LONG)
        crdt.insert_text(notes.ydoc, 0, "in")
        await user.wait_idle(LONG)


async def test_subscribing_a_document_the_token_does_not_grant_raises_forbidden(auth_url, redis_client):
    async with client(auth_url, token(["notes"], subject="bob")) as user:
        with pytest.raises(Forbidden) as raised:
            await user.subscribe("secret", timeout=LONG)
        error = raised.value
        assert isinstance(error, SubscribeRefused) and not isinstance(error, TimeoutError)
        assert (error.code, error.doc, error.reason) == (
            "forbidden",
            "secret",
            "this token does not allow this document",
        )
        assert "'secret'" in str(error) and error.reason in str(error)
        assert "secret" not in user.docs
        notes = await user.subscribe("notes", timeout=LONG)  # the client and its connection carry on
        crdt.insert_text(notes.ydoc, 0, "allowed")
        await user.wait_idle(LONG)
        assert await redis_client.xlen(stream_key("notes")) == 1
        assert await redis_client.exists(stream_key("secret")) == 0


async def test_a_subscribe_over_the_users_subscriptions_raises_subscribe_refused(auth_url):
    async with client(auth_url, token(["*"], subject="carol")) as user:
        await user.subscribe("one", timeout=LONG)
        await user.subscribe("two", timeout=LONG)
        with pytest.raises(SubscribeRefused) as raised:
            await user.subscribe("three", timeout=LONG)
        assert not isinstance(raised.value, Forbidden)
        assert raised.value.code == "too_many_subscriptions" and "three" not in user.docs
        with pytest.raises(InvalidDocumentId):  # refused before anything is sent
            await user.subscribe("no spaces allowed", timeout=LONG)


@pytest.mark.parametrize("engine", [crdt.PYCRDT, pytest.param("y-py", marks=needs_ypy)])
async def test_wait_idle_raises_when_a_read_only_token_s_edits_are_refused(auth_url, redis_client, engine):
    writer = client(auth_url, token(["notes"], subject="writer"), engine=engine)
    reader = client(auth_url, token(["notes"], perm="read", subject="reader"), engine=engine)
    async with writer, reader:
        written = await writer.subscribe("notes", timeout=LONG)
        crdt.insert_text(written.ydoc, 0, "stored")
        await writer.wait_idle(LONG)
        notes = await reader.subscribe("notes", timeout=LONG)
        assert notes.text == "stored"  # a read-only token reads
        crdt.insert_text(notes.ydoc, 0, "one ")
        crdt.insert_text(notes.ydoc, 0, "two ")
        with pytest.raises(UpdatesRefused) as raised:
            await reader.wait_idle(LONG)
        error = raised.value
        assert not isinstance(error, TimeoutError) and error.total == 2
        assert [(frame["code"], frame["doc"]) for frame in error.refusals] == [("forbidden", "notes")] * 2
        assert error.code == "forbidden" and error.reason == "read-only: this token may not change this document"
        assert str(error).startswith("2 local updates were refused and will not be stored: 2 to 'notes': forbidden")
        assert notes.text == "two one stored"  # the local document keeps them
        assert await redis_client.xlen(stream_key("notes")) == 1  # the server stored none
        await reader.wait_idle(LONG)  # each refusal is raised once


async def test_wait_idle_raises_for_an_oversized_update_and_the_others_are_stored(auth_url, redis_client):
    async with client(auth_url, token(["*"], subject="dave")) as user:
        notes, big = await user.subscribe("notes", timeout=LONG), await user.subscribe("big", timeout=LONG)
        crdt.insert_text(notes.ydoc, 0, "before")
        crdt.insert_text(big.ydoc, 0, "x" * 10_000)  # over the server's max_update_bytes (4096)
        crdt.insert_text(notes.ydoc, 0, "after ")
        with pytest.raises(UpdatesRefused) as raised:
            await user.wait_idle(LONG)
        [refusal] = raised.value.refusals
        assert (refusal["code"], refusal["doc"], raised.value.pending) == ("update_too_large", "big", 0)
        assert "1 local update was refused and will not be stored: 1 to 'big': update_too_large" in str(raised.value)
        assert "over the server's limit of 4096 bytes" in str(raised.value)
        assert await redis_client.xlen(stream_key("notes")) == 2 and await redis_client.exists(stream_key("big")) == 0


async def test_wait_idle_raises_while_edits_that_build_on_a_refused_one_wait(auth_url, redis_client):
    """An edit next to refused content cannot be stored either (the server
    lacks what it refers to): it stays queued, and wait_idle says so instead
    of waiting for it."""
    async with client(auth_url, token(["notes"], subject="gina")) as user:
        notes = await user.subscribe("notes", timeout=LONG)
        crdt.insert_text(notes.ydoc, 0, "x" * 10_000)
        crdt.insert_text(notes.ydoc, 0, "after ")
        with pytest.raises(UpdatesRefused) as raised:
            await user.wait_idle(LONG)
        assert raised.value.code == "update_too_large" and raised.value.pending == 1 == user.pending
        assert str(raised.value).endswith("; 1 other not stored yet (still queued)")
        assert await redis_client.exists(stream_key("notes")) == 0


async def test_a_token_revoked_mid_session_stops_the_client_and_a_new_one_resumes_it(auth_url, make_client):
    events: list[str] = []
    user = client(
        auth_url, token(["notes"], subject="erin", token_id="erin-1"), on_event=lambda name, data: events.append(name)
    )
    async with user:
        notes = await user.subscribe("notes", timeout=LONG)
        await revoke(auth_url, "erin-1")
        await eventually(lambda: user.failure is not None, timeout=LONG)  # cut off; the reconnect refused
        assert isinstance(user.failure, Unauthorized) and user.failure.reason == "the token was revoked"
        crdt.insert_text(notes.ydoc, 0, "written while stopped")
        with pytest.raises(Unauthorized, match="revoked"):
            await user.wait_idle(LONG)
        with pytest.raises(Unauthorized, match="revoked"):
            await user.subscribe("other", timeout=LONG)
        assert user.pending == 1 and "disconnected" in events  # kept, not lost

        user.token = token(["notes"], subject="erin")
        await user.connect(LONG)
        await user.wait_idle(LONG)
        reader = await make_client(auth_url, token=token(["notes"], perm="read", subject="frank"))
        read = await reader.subscribe("notes", timeout=LONG)
        await eventually(lambda: read.text == "written while stopped")


async def test_a_new_token_that_no_longer_grants_a_document_refuses_its_unsent_edits(auth_url, redis_client):
    user = client(auth_url, token(["a", "b"], subject="ivy", token_id="ivy-1"))
    async with user:
        a, b = await user.subscribe("a", timeout=LONG), await user.subscribe("b", timeout=LONG)
        await revoke(auth_url, "ivy-1")
        await eventually(lambda: user.failure is not None, timeout=LONG)
        crdt.insert_text(a.ydoc, 0, "stored")
        crdt.insert_text(b.ydoc, 0, "refused")
        user.token = token(["a"], subject="ivy")
        await user.connect(LONG)  # resubscribes both: b is forbidden now
        with pytest.raises(UpdatesRefused) as raised:
            await user.wait_idle(LONG)
        [refusal] = raised.value.refusals
        assert (refusal["code"], refusal["doc"]) == ("forbidden", "b")
        assert isinstance(b.refused, Forbidden) and list(user.docs) == ["a"]
        assert await redis_client.xlen(stream_key("a")) == 1 and await redis_client.exists(stream_key("b")) == 0
        crdt.insert_text(b.ydoc, 0, "unbound ")  # not sent: nothing pending, nothing refused
        await user.wait_idle(LONG)


async def test_a_token_function_refreshes_an_expired_token_without_stopping(auth_url):
    events: list[str] = []
    user = client(
        auth_url,
        lambda: token(["notes"], ttl=4, subject="hal"),  # asked before every connection
        on_event=lambda name, data: events.append(name),
    )
    async with user:
        notes = await user.subscribe("notes", timeout=LONG)
        await eventually(lambda: events.count("connected") >= 2, timeout=LONG)  # cut off at expiry, back with a new one
        crdt.insert_text(notes.ydoc, 0, "still writing")
        await user.wait_idle(LONG)
        assert user.failure is None and any(error["message"] == "the token has expired" for error in user.errors)


async def test_no_server_raises_server_unreachable_naming_the_url(make_client):
    url = f"ws://127.0.0.1:{free_port()}/ws"  # nothing listens there
    unreachable = YrelayClient(url, backoff=FAST_BACKOFF)
    with pytest.raises(ServerUnreachable) as raised:
        await unreachable.connect(timeout=1.0)
    error = raised.value
    assert isinstance(error, ConnectionError) and isinstance(error, ClientError)
    assert (
        str(error)
        == f"no connection to {url} within 1 s; last attempt: {url}: connection refused (is the server running?)"
    )
    assert unreachable._runner is not None and unreachable._runner.done()


async def test_a_wrong_path_says_what_the_server_answered(redis_url):
    async with running_server(redis_url) as url:
        wrong = url.removesuffix("/ws") + "/nope"
        with pytest.raises(ServerUnreachable, match=r"HTTP 403 \(is it the server's /ws URL\?\)"):
            await YrelayClient(wrong, backoff=FAST_BACKOFF).connect(timeout=1.0)


async def test_a_socket_that_never_answers_hello_is_not_reported_as_the_clients_own_close():
    """A websocket that opens but never answers ``hello`` (another service
    on that URL): the client's own close at the deadline is not the reason
    ServerUnreachable gives (it said "sent 1000 (OK); then received 1000 (OK)")."""

    async def mute(ws: websockets.ServerConnection) -> None:
        await ws.wait_closed()

    async with websockets.serve(mute, "127.0.0.1", 0) as server:
        url = f"ws://127.0.0.1:{next(iter(server.sockets)).getsockname()[1]}/ws"
        unanswered = YrelayClient(url, backoff=FAST_BACKOFF)
        with pytest.raises(ServerUnreachable) as raised:
            await unanswered.connect(timeout=1.0)
        assert raised.value.reason == "no answer yet" and "1000" not in str(raised.value)
        assert unanswered._runner is not None and unanswered._runner.done()
