"""Fuzzing a live server process with Hypothesis: whole frames, valid-shaped
and mutated, wrong types, huge numbers, unicode, random ops, random and
mutated Yjs updates, hostile and mutated sync state vectors, broken base64.

After the run: the process still serves (``/readyz``, a fresh client
syncs), every stream entry in Redis is a valid Yjs update, nothing was
written to or read from a document the fuzzer never subscribed to, and the
server logged no unhandled exception.

``YRELAY_FUZZ_FRAMES`` sets the number of frames (default 10,000; the long
run recorded in docs/security.md used 100,000).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil
import pycrdt
import pytest
import redis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from test_reconciliation import varint
from yrelay.client import YrelayClient
from yrelay.config import Settings
from yrelay.protocol import MAX_JSON_DEPTH
from yrelay.yjs import crdt, yprotocol
from yrelay.yjs.awareness import AwarenessEntry, encode_update
from yrelay_tools.testing.processes import ServerProcess

FRAMES = int(os.environ.get("YRELAY_FUZZ_FRAMES", "10000"))
BATCH = 50  # frames per Hypothesis example, sent without waiting for answers
CONNECTIONS = 4
FUZZ_DOCS = [f"fz-{i}" for i in range(4)]
VICTIM = "victim/doc"  # written by a legitimate client; the fuzzer never subscribes to it
#: Ops whose frames carry a document's content or state: the fuzzer may only
#: ever see them for documents it subscribed to.
READS = {"deliver", "snapshot", "sync_reply", "subscribed", "awareness", "resync_required"}


def _valid_updates() -> list[bytes]:
    doc = crdt.new_doc(7)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index, word in enumerate(["hello", " wörld", " 😀", " ok", "\u2028x"]):
        crdt.insert_text(doc, index, word)
    crdt.delete_text(doc, 1, 3)
    doc.get("m", type=pycrdt.Map)["k"] = {"a": [1, 2.5, None, "s"]}
    return updates + [crdt.encode_state(doc)]


VALID = _valid_updates()
ABORTS_YPY = bytes.fromhex("0101f430c4014501460af4313220c3bcf09f988000")
#: y-py 0.6.2 tries to allocate ~146 GB for this state vector and aborts.
HOSTILE_STATE_VECTOR = base64.b64decode("/////w8=")


def _valid_state_vectors() -> list[bytes]:
    doc = crdt.new_doc(7)
    for update in VALID:
        crdt.apply_update(doc, update)
    other = crdt.new_doc(2**53 - 1)
    crdt.insert_text(other, 0, "x")
    crdt.apply_update(other, crdt.encode_state(doc))
    return [b"\x00", crdt.state_vector(doc), crdt.state_vector(other)]


# ------------------------------------------------------------------ strategies


@st.composite
def mutated(draw, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.integers(0, 3))
        position = draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == 0 and out:
            out[position] = draw(st.integers(0, 255))
        elif kind == 1 and out:
            del out[position]
        elif kind == 2:
            out.insert(position, draw(st.integers(0, 255)))
        else:
            out = out[:position]
    return bytes(out)


update_bytes = st.one_of(
    st.sampled_from(VALID),
    st.sampled_from(VALID).flatmap(mutated),
    st.binary(max_size=64),
    st.binary(min_size=4097, max_size=6000),  # past the in-loop pre-check: straight to the validator
    st.just(ABORTS_YPY),
    st.just(b""),
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


#: State vectors: real ones, mutated, with huge counts, client ids and clocks.
state_vector_bytes = st.one_of(
    st.sampled_from(_valid_state_vectors()),
    st.sampled_from(_valid_state_vectors()).flatmap(mutated),
    st.just(HOSTILE_STATE_VECTOR),
    st.builds(
        lambda count, pairs: varint(count) + b"".join(varint(c) + varint(k) for c, k in pairs),
        st.integers(0, 2**64),
        st.lists(st.tuples(st.integers(0, 2**64), st.integers(0, 2**64)), max_size=4),
    ),
    st.binary(max_size=24),
)


payloads = st.one_of(
    update_bytes.map(b64),
    update_bytes.map(lambda data: b64(data)[:-1] if data else "="),  # truncated base64
    st.text(max_size=40),  # not base64 at all
)
json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
doc_ids = st.one_of(
    st.sampled_from(FUZZ_DOCS),
    st.sampled_from(FUZZ_DOCS),
    st.text(max_size=12),
    st.from_regex(r"[A-Za-z0-9._:/@-]{1,20}", fullmatch=True),
).filter(lambda d: d != VICTIM)
offsets = st.one_of(
    st.none(),
    st.just("0-0"),
    st.builds(lambda ms, seq: f"{ms}-{seq}", st.integers(0, 2**64), st.integers(0, 1500)),
    st.text(max_size=12),
)
clocks = st.one_of(st.integers(0, 2**53 + 5), st.integers(-5, 5), json_scalars)
hexes = st.text("0123456789abcdef", min_size=32, max_size=32)
digests = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"since": offsets, "count": st.integers(-1, 2**60), "hash": st.one_of(hexes, st.text(max_size=5))},
        optional={"through": offsets},
    ),
)

shaped = st.one_of(
    st.fixed_dictionaries({"op": st.just("update"), "doc": doc_ids, "clock": clocks, "update": payloads}),
    st.fixed_dictionaries(
        {
            "op": st.just("update"),
            "doc": st.sampled_from(FUZZ_DOCS),
            "clock": st.integers(0, 2**53 - 1),
            "update": update_bytes.map(b64),
        }
    ),
    st.fixed_dictionaries(
        {"op": st.just("subscribe"), "doc": doc_ids}, optional={"offset": offsets, "digest": digests}
    ),
    st.fixed_dictionaries({"op": st.just("unsubscribe"), "doc": doc_ids}),
    st.fixed_dictionaries({"op": st.just("ack"), "doc": doc_ids, "offset": offsets}),
    st.fixed_dictionaries(
        {"op": st.just("sync"), "doc": doc_ids, "state_vector": st.one_of(state_vector_bytes.map(b64), payloads)}
    ),
    st.fixed_dictionaries(
        {"op": st.just("sync"), "doc": st.sampled_from(FUZZ_DOCS), "state_vector": state_vector_bytes.map(b64)}
    ),
    st.fixed_dictionaries(
        {"op": st.just("check_subscriptions"), "count": clocks, "hash": hexes}, optional={"ref": clocks}
    ),
    st.fixed_dictionaries(
        {"op": st.just("reconcile"), "payload": st.binary(max_size=80).map(b64)}, optional={"ref": clocks}
    ),
    st.fixed_dictionaries(
        {"op": st.just("awareness"), "doc": doc_ids, "update": st.one_of(st.binary(max_size=80).map(b64), payloads)}
    ),
    st.fixed_dictionaries(
        {"op": st.sampled_from(["hello", "ping", "welcome", "deliver", "PING", ""])},
        optional={"session": st.text(max_size=30), "protocol": clocks},
    ),
)


@st.composite
def wrong_types(draw) -> dict:
    frame = dict(draw(shaped))
    key = draw(st.sampled_from(sorted(frame) + ["extra", "op"]))
    frame[key] = draw(json_values)
    return frame


@st.composite
def mangled_text(draw) -> str:
    text = json.dumps(draw(shaped))
    cut = draw(st.integers(0, len(text)))
    kind = draw(st.integers(0, 2))
    if kind == 0:
        return text[:cut]
    if kind == 1:
        return text[:cut] + draw(st.text(max_size=6)) + text[cut:]
    return json.dumps(draw(json_values))


#: Awareness floods (issue 16): valid updates of up to 16 entries, clientIDs
#: from a small range (so connections collide on them), states or removals.
awareness_states = st.one_of(
    st.just("null"), st.dictionaries(st.text(max_size=5), json_scalars, max_size=3).map(json.dumps)
)
awareness_floods = st.fixed_dictionaries(
    {
        "op": st.just("awareness"),
        "doc": st.sampled_from(FUZZ_DOCS),
        "update": st.lists(
            st.builds(AwarenessEntry, st.integers(0, 40), st.integers(0, 2**53 - 1), awareness_states),
            min_size=1,
            max_size=16,
        ).map(lambda entries: b64(encode_update(entries))),
    }
)

frames = st.one_of(
    shaped.map(json.dumps),
    shaped.map(json.dumps),
    wrong_types().map(json.dumps),
    mangled_text(),
    st.text(max_size=30),
    awareness_floods.map(json.dumps),
)


@st.composite
def deep_json(draw) -> str:
    """A shaped frame with one field (or a new one) nested around the depth
    limit or far past it: arrays or objects, whole or cut short."""
    depth = draw(st.one_of(st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH + 3), st.integers(0, 5_000)))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('[{"b":', "}]")]))
    frame = draw(shaped)
    key = draw(st.sampled_from(sorted(frame) + ["extra"]))
    text = json.dumps({**frame, key: "PLACE"}).replace('"PLACE"', opener * depth + "0" + closer * depth, 1)
    return text if draw(st.booleans()) else text[: draw(st.integers(0, len(text)))]


frames = st.one_of(frames, deep_json())  # deep JSON (issue 16): malformed_frame, never a traceback


# ------------------------------------------------------------------ the peers


class FuzzPeer:
    """A raw connection that sends a batch, then reads every answer up to the pong."""

    def __init__(self, url: str, seen: Seen):
        self.url = url
        self.seen = seen
        self.ws = None
        self.stack = contextlib.ExitStack()

    def open(self) -> None:
        self.ws = self.stack.enter_context(connect(self.url, max_size=None, max_queue=None, open_timeout=30))
        self.ws.send(json.dumps({"op": "hello"}))
        self.read_until("welcome")
        for doc in FUZZ_DOCS:
            self.seen.subscribed.add(doc)
            self.ws.send(json.dumps({"op": "subscribe", "doc": doc}))

    def send_batch(self, batch: list[str]) -> None:
        if self.ws is None:
            self.open()
        try:
            for text in batch:
                self._note_subscribe(text)
                self.ws.send(text)
            self.ws.send(json.dumps({"op": "ping"}))
            self.read_until("pong")
        except ConnectionClosed:
            self.seen.closed += 1
            self.ws = None

    def _note_subscribe(self, text: str) -> None:
        try:
            frame = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: deep JSON, refused by the server too
            return
        if isinstance(frame, dict) and frame.get("op") == "subscribe" and isinstance(frame.get("doc"), str):
            self.seen.subscribed.add(frame["doc"])

    def read_until(self, op: str) -> None:
        while True:
            frame = json.loads(self.ws.recv(timeout=60))
            self.seen.note(frame)
            if frame.get("op") == op:
                return


class Seen:
    def __init__(self) -> None:
        self.frames = 0
        self.subscribed: set[str] = set()
        self.answers: Counter[str] = Counter()
        self.leaks: list[dict] = []
        self.closed = 0

    def note(self, frame: dict) -> None:
        op = frame.get("op")
        self.answers[frame["code"] if op == "error" else op] += 1
        if op in READS and frame.get("doc") not in self.subscribed:
            self.leaks.append(frame)


# ------------------------------------------------------------------ the run


def assert_no_foreign_documents(client: redis.Redis, allowed: set[str]) -> list[str]:
    """Every document with a stream is one the writers were allowed to write
    (here: the fuzzer's subscriptions plus the victim; with auth, a token's scope)."""
    docs = [key.decode()[len("yrelay:{") : -len("}:stream")] for key in client.scan_iter(match="yrelay:{*}:stream")]
    foreign = sorted(set(docs) - allowed)
    assert not foreign, f"entries in documents never subscribed to: {foreign[:10]}"
    return docs


def assert_every_entry_is_valid(client: redis.Redis, docs: list[str]) -> int:
    count = 0
    for doc in docs:
        for _entry_id, fields in client.xrange(f"yrelay:{{{doc}}}:stream"):
            crdt.validate_update(fields[b"u"])  # raises on an invalid stored update
            count += 1
    return count


def assert_presence_is_bounded(client: redis.Redis) -> int:
    """The floods left at most what the limits allow in each presence hash:
    the clientIDs of the fuzzer's live connections, and claims under the
    per-document cap. Returns the largest presence hash."""
    defaults = Settings()
    largest = 0
    for doc in FUZZ_DOCS:
        states = client.hlen(f"yrelay:{{{doc}}}:presence")
        assert states <= CONNECTIONS * defaults.max_presence_clients_per_connection, (doc, states)
        assert client.hlen(f"yrelay:{{{doc}}}:presence:owners") <= defaults.max_presence_clients_per_document
        largest = max(largest, states)
    return largest


def victim_sessions(client: redis.Redis) -> set[str]:
    return {fields[b"s"].decode() for _, fields in client.xrange(f"yrelay:{{{VICTIM}}}:stream")}


@pytest.fixture
def fuzz_server(redis_url: str, tmp_path: Path):
    # Rate limits high: the fuzz is about what a frame does, not how many. GC off:
    # every update the server accepted stays in its stream, to be checked.
    # The presence limits stay on: the awareness floods must meet them.
    # The websocket pacing (frames, control frames, answers) is off for the same
    # reason; test_floods_of_fuzzed_frames_on_every_endpoint meets it.
    server = ServerProcess(
        redis_url,
        tmp_path,
        env={
            "YRELAY_UPDATES_PER_SECOND": "1000000",
            "YRELAY_UPDATE_BURST": "1000000",
            "YRELAY_SUBJECT_UPDATES_PER_SECOND": "0",
            "YRELAY_FRAMES_PER_SECOND": "0",
            "YRELAY_CONTROL_PER_SECOND": "0",
            "YRELAY_ANSWER_BYTES_PER_SECOND": "0",
            "YRELAY_SUBJECT_ANSWER_BYTES_PER_SECOND": "0",
            "YRELAY_ADMISSION_RATE": "0",
            "YRELAY_GC_INTERVAL": "0",
        },
    ).start()
    yield server
    server.stop()


def _write_victim(url: str, text: str) -> str:
    """A legitimate edit of the victim document; returns the writer's session."""
    import asyncio

    async def write() -> str:
        async with YrelayClient(url) as client:
            doc = await client.subscribe(VICTIM)
            crdt.insert_text(doc.ydoc, 0, text)
            await client.wait_idle()
            return client.session

    return asyncio.run(write())


@pytest.mark.timeout(3600)
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")  # the websocket client's masks use random
def test_fuzz_frames_against_a_live_server(fuzz_server: ServerProcess, redis_url: str):
    client = redis.Redis.from_url(redis_url)
    writers = {_write_victim(fuzz_server.ws_url, "secret")}
    process = psutil.Process(fuzz_server.process.pid)
    rss_before = process.memory_info().rss
    seen = Seen()
    peers = [FuzzPeer(fuzz_server.ws_url, seen) for _ in range(CONNECTIONS)]
    turn = iter(range(10**9))
    started = time.monotonic()

    @settings(
        max_examples=FRAMES // BATCH,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(frames, min_size=BATCH, max_size=BATCH))
    def fuzz(batch: list[str]) -> None:
        peers[next(turn) % CONNECTIONS].send_batch(batch)
        seen.frames += len(batch)

    fuzz()
    elapsed = time.monotonic() - started
    writers.add(_write_victim(fuzz_server.ws_url, "more"))  # the victim is written again ...
    for peer in peers:
        if peer.ws is not None:
            peer.ws.send(json.dumps({"op": "ping"}))
            peer.read_until("pong")  # ... and a leak of it would show here
        peer.stack.close()
    rss_after = process.memory_info().rss

    assert seen.frames >= FRAMES
    assert fuzz_server.running, "the server process died"
    assert httpx.get(f"http://127.0.0.1:{fuzz_server.port}/readyz", timeout=5).status_code == 200
    assert not seen.leaks, seen.leaks[:3]
    docs = assert_no_foreign_documents(client, seen.subscribed | {VICTIM})
    entries = assert_every_entry_is_valid(client, docs)
    presence = assert_presence_is_bounded(client)
    assert victim_sessions(client) <= writers  # GC may have folded entries; none came from the fuzzer
    log = fuzz_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:3000]

    import asyncio

    async def fresh_client_syncs() -> str:
        async with YrelayClient(fuzz_server.ws_url) as fresh:
            doc = await fresh.subscribe(VICTIM)
            for _ in range(500):  # snapshot and deliveries follow `subscribed`
                if len(doc.text) == len("moresecret"):
                    break
                await asyncio.sleep(0.02)
            return doc.text

    assert asyncio.run(fresh_client_syncs()) in ("moresecret", "secretmore")  # two concurrent inserts at 0
    summary = {
        "frames": seen.frames,
        "seconds": round(elapsed, 1),
        "frames_per_s": round(seen.frames / elapsed),
        "answers": dict(seen.answers.most_common()),
        "closed_connections": seen.closed,
        "documents": len(docs),
        "stored_entries": entries,
        "largest_presence_hash": presence,
        "rss_mib_before": round(rss_before / 2**20, 1),
        "rss_mib_after": round(rss_after / 2**20, 1),
    }
    print("FUZZ SUMMARY", json.dumps(summary))


@pytest.mark.timeout(3600)
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_awareness_floods_against_a_live_server(fuzz_server: ServerProcess, redis_url: str):
    """Issue 16's presence flood, fuzzed: connections that stay subscribed
    send valid awareness updates of up to 16 entries as fast as the socket
    takes them. The limits answer (rate, clientIDs per connection and per
    document, ownership), the hashes stay bounded, and a newcomer's greeting
    holds at most the fuzzers' own clientIDs."""
    client = redis.Redis.from_url(redis_url)
    seen = Seen()
    peers = [FuzzPeer(fuzz_server.ws_url, seen) for _ in range(CONNECTIONS)]
    turn = iter(range(10**9))

    @settings(
        max_examples=max(FRAMES // 2 // BATCH, 20),
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(awareness_floods.map(json.dumps), min_size=BATCH, max_size=BATCH))
    def flood(batch: list[str]) -> None:
        peers[next(turn) % CONNECTIONS].send_batch(batch)
        seen.frames += len(batch)

    flood()
    # The rate limit, whatever the machine's speed: each batch of the flood
    # waits for its pong, so on a busy machine (make test-busy) a connection's
    # batches came slower than its bucket refills (30/s) and met no limit.
    # One and a half bursts of one client's renewals, sent in one go, meet it
    # on any machine.
    burst = Settings.from_env().presence_burst
    FuzzPeer(fuzz_server.ws_url, seen).send_batch(
        [
            json.dumps(
                {
                    "op": "awareness",
                    "doc": FUZZ_DOCS[0],
                    "update": b64(encode_update([AwarenessEntry(7, clock, json.dumps({"n": clock}))])),
                }
            )
            for clock in range(1, burst * 3 // 2 + 1)
        ]
    )
    greeting = _greeting_of_a_newcomer(fuzz_server.ws_url, FUZZ_DOCS[0])
    presence = assert_presence_is_bounded(client)  # while the fuzzers are still there
    for peer in peers:
        peer.stack.close()

    assert fuzz_server.running and not seen.leaks and seen.closed == 0
    assert httpx.get(f"http://127.0.0.1:{fuzz_server.port}/readyz", timeout=5).status_code == 200
    assert {"rate_limited", "awareness_too_many_clients"} <= set(seen.answers), seen.answers
    assert len(greeting) <= CONNECTIONS * Settings().max_presence_clients_per_connection, greeting
    log = fuzz_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:3000]
    print(
        "FLOOD SUMMARY",
        json.dumps(
            {
                "frames": seen.frames,
                "answers": dict(seen.answers.most_common()),
                "greeting_entries": len(greeting),
                "largest_presence_hash": presence,
            }
        ),
    )


def _greeting_of_a_newcomer(url: str, doc: str) -> list[AwarenessEntry]:
    """The awareness entries a fresh connection is greeted with on ``doc``."""
    from yrelay.yjs.awareness import decode_update

    with connect(url, max_size=None) as ws:
        ws.send(json.dumps({"op": "hello"}))
        ws.send(json.dumps({"op": "subscribe", "doc": doc}))
        entries: list[AwarenessEntry] = []
        with contextlib.suppress(TimeoutError):
            while True:
                frame = json.loads(ws.recv(timeout=1))
                if frame["op"] == "awareness":
                    entries += decode_update(base64.b64decode(frame["update"]))
        return entries


# ------------------------------------------------------------------ /yws (issue 19)

YWS_MESSAGES = int(os.environ.get("YRELAY_FUZZ_YWS_MESSAGES", "3000"))
YWS_BATCH = 20
YWS_DOCS = [f"fz-yws-{i}" for i in range(2)]


def _lib0(*parts: bytes | int) -> bytes:
    return b"".join(varint(part) if isinstance(part, int) else part for part in parts)


#: y-protocols messages: real shapes with hostile payloads, lengths that lie,
#: unknown types and steps, truncated varints, hostile state vectors.
yws_messages = st.one_of(
    st.builds(lambda step, data: _lib0(0, step, len(data), data), st.sampled_from([1, 2]), update_bytes),
    st.builds(lambda sv: _lib0(0, 0, len(sv), sv), state_vector_bytes),
    st.builds(
        lambda kind, step, length, data: _lib0(kind, step, length, data),
        st.integers(0, 2**64),
        st.integers(0, 2**64),
        st.integers(0, 2**64),
        st.binary(max_size=16),
    ),
    st.builds(lambda data: _lib0(1, len(data), data), st.binary(max_size=64)),  # awareness, garbage
    st.builds(lambda reason: _lib0(2, 0, len(reason), reason), st.binary(max_size=16)),  # auth from a client
    st.just(b"\x03"),  # query awareness
    st.sampled_from([b"", b"\x80", b"\x00\x80", b"\x00\x00\xff", b"\xff" * 10]),  # truncated / overlong varints
    st.binary(max_size=32),
    st.builds(lambda message: message, st.sampled_from(VALID).map(lambda u: _lib0(0, 2, len(u), u)).flatmap(mutated)),
)


def _send_yws_batch(base: str, doc: str, batch: list[bytes], seen: Counter) -> None:
    with connect(f"{base}/yws/{doc}", max_size=None, open_timeout=10) as ws:
        try:
            for message in batch:
                ws.send(message)
            while True:
                ws.recv(timeout=0.2)
                seen["answers"] += 1
        except TimeoutError:
            seen["open_after_batch"] += 1
        except ConnectionClosed as closed:
            seen[f"closed {closed.rcvd.code if closed.rcvd else None}"] += 1


@pytest.mark.timeout(1800)
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_fuzz_yws_messages_against_a_live_server(fuzz_server: ServerProcess, redis_url: str):
    client = redis.Redis.from_url(redis_url)
    writers = {_write_victim(fuzz_server.ws_url, "secret")}
    base = fuzz_server.ws_url.removesuffix("/ws")
    seen: Counter = Counter()
    turn = iter(range(10**9))

    @settings(
        max_examples=YWS_MESSAGES // YWS_BATCH,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.lists(yws_messages, min_size=YWS_BATCH, max_size=YWS_BATCH))
    def fuzz(batch: list[bytes]) -> None:
        _send_yws_batch(base, YWS_DOCS[next(turn) % len(YWS_DOCS)], batch, seen)
        seen["messages"] += len(batch)

    started = time.monotonic()
    fuzz()
    elapsed = time.monotonic() - started
    assert fuzz_server.running, "the server process died"
    assert httpx.get(f"http://127.0.0.1:{fuzz_server.port}/readyz", timeout=5).status_code == 200
    docs = assert_no_foreign_documents(client, set(YWS_DOCS) | {VICTIM})
    entries = assert_every_entry_is_valid(client, docs)
    assert victim_sessions(client) <= writers
    log = fuzz_server.log_path.read_text(errors="replace")
    assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:3000]
    # A well-behaved y-websocket peer still gets the victim, exactly.
    with connect(f"{base}/yws/{VICTIM}", open_timeout=10) as ws:
        ws.send(_lib0(0, 0, 1, b"\x00"))
        answer = ws.recv(timeout=10)
    doc = crdt.new_doc()
    crdt.apply_update(doc, yprotocol.decode(answer).payload)
    assert crdt.text_of(doc) == "secret"
    print(
        "YWS FUZZ SUMMARY",
        json.dumps({"seconds": round(elapsed, 1), "documents": len(docs), "stored_entries": entries, **seen}),
    )


#: Seconds each fuzzed batch is flooded at one endpoint.
FLOOD_SECONDS = 1.0
#: The endpoints a flood goes to in turn: /ws before hello, /ws after it, /yws.
FLOOD_ENDPOINTS = ("ws-before-hello", "ws-after-hello", "yws")


async def _flood_endpoint(port: int, endpoint: str, messages: list[bytes], binary: bool) -> Counter:
    """Flood ``messages`` over and over at ``endpoint`` for FLOOD_SECONDS,
    reconnecting whenever the server closes the socket; how each socket ended."""

    from test_deadlines import SilentSocket
    from test_floods import flood, masked

    ended: Counter = Counter()
    deadline = time.monotonic() + FLOOD_SECONDS
    while time.monotonic() < deadline:
        if endpoint == "yws":
            sock = await SilentSocket.open(port, path=f"/yws/{YWS_DOCS[0]}", protocols="yrelay.yws")
        else:
            sock = await SilentSocket.open(port)
        if endpoint == "ws-after-hello":
            sock.writer.write(masked(0x1, json.dumps({"op": "hello", "protocol": 1}).encode()))
        batch = b"".join(masked(0x2 if binary else 0x1, message) for message in messages)
        await flood(sock, batch, max(0.05, deadline - time.monotonic()))
        sock.close()
        ended[endpoint] += 1
    return ended


@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
def test_floods_of_fuzzed_frames_on_every_endpoint(redis_url: str, tmp_path: Path):
    """Issue 30: one socket's flood of tiny frames held the event loop for
    every other user. Fuzzed batches (the frames and y-websocket messages of
    the tests above) are flooded at /ws before and after hello and at /yws,
    reconnecting when closed, against a server with its default pacing: it
    keeps serving a victim, logs no traceback, and the floods cost it well
    under a core."""
    import asyncio

    server = ServerProcess(
        redis_url, tmp_path, env={"YRELAY_GC_INTERVAL": "0", "YRELAY_THROTTLE_CLOSE_SECONDS": "2"}
    ).start()
    try:
        process = psutil.Process(server.process.pid)
        writers = {_write_victim(server.ws_url, "secret")}
        turn = iter(range(10**9))
        ended: Counter = Counter()
        before = process.cpu_times()
        started = time.monotonic()

        @settings(
            max_examples=9,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(
            st.lists(frames, min_size=BATCH, max_size=BATCH),
            st.lists(yws_messages, min_size=YWS_BATCH, max_size=YWS_BATCH),
        )
        def fuzz(texts: list[str], binaries: list[bytes]) -> None:
            endpoint = FLOOD_ENDPOINTS[next(turn) % len(FLOOD_ENDPOINTS)]
            if endpoint == "yws":
                ended.update(asyncio.run(_flood_endpoint(server.port, endpoint, binaries, binary=True)))
            else:
                messages = [text.encode("utf-8", "surrogatepass") for text in texts]
                ended.update(asyncio.run(_flood_endpoint(server.port, endpoint, messages, binary=False)))

        fuzz()
        elapsed = time.monotonic() - started
        after = process.cpu_times()
        used = (after.user - before.user) + (after.system - before.system)
        writers.add(_write_victim(server.ws_url, "more"))  # a user is served right after the floods
        assert server.running, "the server process died"
        assert httpx.get(f"http://127.0.0.1:{server.port}/readyz", timeout=5).status_code == 200
        log = server.log_path.read_text(errors="replace")
        assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:3000]
        assert set(ended) == set(FLOOD_ENDPOINTS), ended
        assert used < 0.6 * elapsed, f"{used:.1f} s of server CPU in {elapsed:.1f} s of floods"
        print(
            "FUZZED FLOODS",
            json.dumps({"seconds": round(elapsed, 1), "server_cpu_s": round(used, 2), "sockets": dict(ended)}),
        )
    finally:
        server.stop()
