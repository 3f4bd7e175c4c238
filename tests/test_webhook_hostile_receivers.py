"""Webhooks against receivers that misbehave on purpose (issue 30, attack 5),
served by a raw asyncio HTTP server so an answer can lie in its
Content-Length, stream without end or trickle: the webhook reads at most
``max_response_bytes`` of an answer, gives each request one total deadline
(answer included), frees its concurrency slot when either is hit, and only
the misbehaving documents wait (and are parked by the usual rules)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import psutil

from conftest import eventually
from consumerutil import LEASE
from test_consumers import write
from yrelay.backoff import Backoff
from yrelay.consumers import ConsumerGroup
from yrelay.consumers.dead_letters import DeadLetters
from yrelay.consumers.webhook import TIMEOUT, Webhook

SECRET = "whsec-test"
FAST = Backoff(base=0.05, max_delay=0.2)
MiB = 1024 * 1024
#: What a flooding receiver sends at most on one connection: past the webhook's
#: memory budget (64 MiB), so a webhook that keeps what it reads fails the test,
#: bounded so that it does not take the machine down when it does.
FLOOD_LIMIT = 512 * MiB
#: Seconds between two bytes of a trickled body.
TRICKLE_EVERY = 2.0


@dataclass
class Answer:
    """One hostile answer: from its head sent to the webhook closing the connection."""

    opened: float
    closed: float | None = None
    sent: int = 0


class HostileReceiver:
    """A raw HTTP/1.1 receiver (keep-alive) answering by the body's ``doc``:

    - ``huge*``: 200 with ``Content-Length: 8 GiB``, then zeros as fast as they go;
    - ``endless*``: 200, chunked, 64 KiB chunks as fast as they go, no end;
    - ``trickle*``: 200 with ``Content-Length: 64``, one byte every 2 s;
    - ``small*``: 200 with a body of ``small_body`` bytes;
    - anything else: 204 at once, its entry ids recorded.
    """

    def __init__(self, small_body: int = 0) -> None:
        self.small_body = small_body
        self.accepted: dict[str, list[str]] = defaultdict(list)
        self.answers: dict[str, list[Answer]] = defaultdict(list)
        self.loop = asyncio.get_running_loop()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                data = json.loads(await reader.readexactly(length))
                doc = data["doc"]
                if doc.startswith(("huge", "endless", "trickle")):
                    await self._hostile(doc, reader, writer)
                    return
                if doc.startswith("small"):
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % self.small_body + b"x" * self.small_body
                    )
                else:
                    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
                self.accepted[doc].extend(data["ids"])
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _hostile(self, doc: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer until the webhook closes the connection (its EOF, or a
        write refused), recording when that was."""
        answer = Answer(self.loop.time())
        self.answers[doc].append(answer)
        sending = asyncio.create_task(self._send(doc, writer, answer))
        closed = asyncio.create_task(reader.read())  # the webhook sends nothing more: this ends at its EOF
        try:
            await asyncio.wait({sending, closed}, return_when=asyncio.FIRST_COMPLETED)
            if sending.done() and sending.exception() is None:  # sent all it would: wait for the close
                await closed
        except ConnectionError:
            pass
        finally:
            answer.closed = self.loop.time()
            sending.cancel()
            closed.cancel()
            await asyncio.gather(sending, closed, return_exceptions=True)

    async def _send(self, doc: str, writer: asyncio.StreamWriter, answer: Answer) -> None:
        if doc.startswith("trickle"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 64\r\n\r\n")
            for _ in range(64):
                await writer.drain()
                await asyncio.sleep(TRICKLE_EVERY)
                writer.write(b"x")
                answer.sent += 1
            return
        chunked = doc.startswith("endless")
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            if chunked
            else b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (8 * 1024 * MiB)
        )
        zeros = bytes(64 * 1024)
        chunk = b"10000\r\n" + zeros + b"\r\n" if chunked else zeros
        while answer.sent < FLOOD_LIMIT:
            writer.write(chunk)
            answer.sent += len(zeros)
            await writer.drain()

    def ended(self, doc: str, count: int = 1) -> bool:
        """Whether ``count`` hostile answers to ``doc`` were closed by the webhook."""
        return sum(answer.closed is not None for answer in self.answers[doc]) >= count


@contextlib.asynccontextmanager
async def receiving(receiver: HostileReceiver) -> AsyncIterator[int]:
    """``receiver`` served on a free local port (yielded) until the block ends."""
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def delivering(redis_client, group: str, port: int, **options) -> AsyncIterator[Webhook]:
    """A member of ``group`` running a webhook to ``port`` until the block ends."""
    async with ConsumerGroup(redis_client, group, prefix=options.pop("prefix", ""), member="w1", lease=LEASE) as member:
        webhook = Webhook(member, f"http://127.0.0.1:{port}/hook", SECRET, backoff=FAST, **options)
        task = asyncio.create_task(webhook.run())
        try:
            yield webhook
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def parked(redis_client, group: str, docs: set[str]) -> dict[str, str]:
    """doc -> the error of its dead letter, once every one of ``docs`` is parked."""
    letters: dict[str, str] = {}

    async def look() -> None:
        letters.update({letter.doc: letter.error for letter in await DeadLetters(redis_client, group).all()})

    await look()
    deadline = asyncio.get_running_loop().time() + 60
    while not docs <= letters.keys():
        assert asyncio.get_running_loop().time() < deadline, letters
        await asyncio.sleep(0.1)
        await look()
    return letters


async def test_the_cli_costs_no_memory_and_holds_no_slot_for_a_lying_flooding_or_trickling_receiver(
    redis_url, redis_client, store
):
    """Attack 5 against the real process, its defaults (10 s deadline, 64 KiB
    cap, 16 slots): RSS grows by under 64 MiB while receivers flood it, the
    trickled answer is given up at the deadline (twice: the retry too, then
    the document is parked), and the well-behaved documents are delivered
    all along, also while the trickled request is open."""
    receiver = HostileReceiver()
    hostile = {"huge", "endless", "trickle"}
    written = await write(store, ["ok-0", "ok-1"], 2)
    loop = asyncio.get_running_loop()
    peak = 0

    async def sample(rss: Callable[[], int]) -> None:
        nonlocal peak
        while True:
            peak = max(peak, rss())
            await asyncio.sleep(0.02)

    async with receiving(receiver) as port:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "yrelay.cli",
            "webhook",
            "--group",
            "hostile",
            "--url",
            f"http://127.0.0.1:{port}/hook",
            "--secret-env",
            "HOOK_SECRET",
            "--redis-url",
            redis_url,
            "--lease",
            str(LEASE),
            "--max-attempts",
            "2",
            env={**os.environ, "HOOK_SECRET": SECRET},
            stderr=asyncio.subprocess.PIPE,
        )
        sampler: asyncio.Task | None = None
        try:
            await eventually(lambda: all(receiver.accepted[d] == written[d] for d in written), timeout=30)
            member = psutil.Process(process.pid)
            baseline = member.memory_info().rss  # started, connected, delivering: its cost before the attack
            sampler = asyncio.create_task(sample(lambda: member.memory_info().rss))
            await write(store, sorted(hostile), 1)
            await eventually(lambda: receiver.answers["trickle"], timeout=30)
            # While the trickled request holds its slot, the others go on.
            more = await write(store, ["ok-0", "ok-1"], 2, word="more")
            await eventually(lambda: all(receiver.accepted[d] == written[d] + more[d] for d in more), timeout=30)
            others_delivered = loop.time()
            letters = await parked(redis_client, "hostile", hostile)
        finally:
            if sampler is not None:
                sampler.cancel()
            process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, stderr.decode()
    assert "Traceback" not in stderr.decode(), stderr.decode()
    grown = peak - baseline
    trickled = [answer.closed - answer.opened for answer in receiver.answers["trickle"] if answer.closed]
    flooded = {doc: [answer.sent for answer in receiver.answers[doc]] for doc in ("huge", "endless")}
    print(
        f"\nRSS {baseline / MiB:.0f} MiB -> peak {peak / MiB:.0f} MiB (+{grown / MiB:.1f}); trickled requests "
        f"lasted {', '.join(f'{t:.1f}' for t in trickled)} s; bytes sent by the flooders {flooded}; "
        f"dead letters {letters}"
    )
    assert grown < 64 * MiB
    assert letters == {"huge": "ResponseTooLarge", "endless": "ResponseTooLarge", "trickle": "TotalTimeout"}
    # Both attempts of the trickled batch ended at the deadline, not when its 64 bytes were in (128 s).
    assert len(trickled) == 2 and all(TIMEOUT / 2 < t < TIMEOUT + 10 for t in trickled), trickled
    assert others_delivered < receiver.answers["trickle"][0].closed  # not after it, not behind it
    assert all(receiver.accepted[doc] == written[doc] + more[doc] for doc in more)  # nothing lost meanwhile


async def test_a_trickling_receiver_frees_the_only_slot_at_the_deadline(redis_client, store):
    """One slot, one document trickled for ever (never parked): every
    attempt ends at the 1 s deadline, and the other document takes the slot
    between two of them."""
    receiver = HostileReceiver()
    written = await write(store, ["trickle", "ok"], 2)
    async with (
        receiving(receiver) as port,
        delivering(redis_client, "hooks-trickle", port, concurrency=1, timeout=1.0, max_attempts=None) as webhook,
    ):
        await eventually(lambda: receiver.ended("trickle", 2), timeout=30)
        await eventually(lambda: receiver.accepted["ok"] == written["ok"], timeout=30)
        more = await write(store, ["ok"], 1, word="more")
        await eventually(lambda: receiver.accepted["ok"] == written["ok"] + more["ok"], timeout=30)
    durations = [answer.closed - answer.opened for answer in receiver.answers["trickle"] if answer.closed]
    assert all(d < 1.0 + 10 for d in durations), durations
    assert webhook.stats.failed >= 2 and webhook.stats.dead_letters == 0


async def test_an_answer_over_the_cap_fails_the_attempt_one_at_it_is_delivered(redis_client, store):
    """A 2xx whose body is over ``max_response_bytes`` is a failed attempt
    (parked here after one); one exactly at the cap is a delivery."""
    for size, delivered in ((1024, True), (1025, False)):
        receiver = HostileReceiver(small_body=size)
        doc = group = f"small-{size}"
        written = await write(store, [doc], 2)
        async with (
            receiving(receiver) as port,
            delivering(redis_client, group, port, prefix=doc, max_response_bytes=1024, max_attempts=1) as webhook,
        ):
            await eventually(lambda: webhook.stats.delivered + webhook.stats.dead_letters >= 1, timeout=30)
        if delivered:
            assert (webhook.stats.delivered, webhook.stats.failed) == (1, 0)
        else:
            assert await parked(redis_client, group, {doc}) == {doc: "ResponseTooLarge"}
        assert receiver.accepted[doc] == written[doc]  # the receiver had it either way: at least once


async def test_a_receiver_that_never_accepts_the_connection_is_unreachable_not_a_failing_document(redis_client, store):
    """The deadline also bounds connecting; a request that never got a
    connection counts as the receiver being down (``ConnectTimeout``), so
    it never parks the document, even with ``max_attempts=1``."""
    with contextlib.ExitStack() as sockets:
        listener = sockets.enter_context(socket.socket())
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once its queue is full, the kernel drops further SYNs
        port = listener.getsockname()[1]
        for _ in range(3):
            filler = sockets.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
        await write(store, ["unreached"], 1)
        async with delivering(redis_client, "hooks-blackhole", port, timeout=0.5, max_attempts=1) as webhook:
            await eventually(lambda: webhook.stats.failed >= 3, timeout=30)
    assert webhook.stats.dead_letters == 0
    assert await DeadLetters(redis_client, "hooks-blackhole").all() == []
