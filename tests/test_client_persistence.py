"""The client's state file: a client killed mid-edit comes back as the same
session with its documents and sends what the server never acknowledged."""

from __future__ import annotations

import asyncio

from conftest import FAST_BACKOFF, eventually, running_server
from yrelay.client import YrelayClient
from yrelay.client.persistence import ClientStateFile, PersistedDocument, PersistedState, PersistedUpdate
from yrelay.storage.embedded import free_port
from yrelay.yjs import crdt

NOWHERE = f"ws://127.0.0.1:{free_port()}/ws"


def test_state_file_round_trip_leaves_no_temporary_file(tmp_path):
    file = ClientStateFile(tmp_path / "client" / "state.json")
    assert file.load() is None
    state = PersistedState(
        session="s" * 24,
        clock=7,
        documents=[PersistedDocument("doc", b"\x01\x02", "1-0", "0-0", ["1-0"], [b"\x03"], needs_sync=True)],
        pending=[PersistedUpdate(7, "doc", b"\x04\x05"), PersistedUpdate(0, "doc", b"\x06")],
    )
    file.save(state)
    file.save(state)
    assert file.load() == state
    assert [path.name for path in file.path.parent.iterdir()] == ["state.json"]


def test_the_journal_holds_what_the_last_snapshot_does_not(tmp_path):
    file = ClientStateFile(tmp_path / "state.json")
    first, second = PersistedUpdate(1, "doc", b"\x01"), PersistedUpdate(2, "doc", b"\x02")
    file.append(first)
    assert file.load() == PersistedState(None, 0, [], [], journal=[first])
    file.save(PersistedState("s" * 24, 1, [], [first]))
    file.append(second)
    with open(file.journal_path, "ab") as journal:
        journal.write(b'{"seq": 3, "clo')  # torn by a crash mid-write: never sent
    again = ClientStateFile(file.path)
    state = again.load()
    assert state is not None and state.pending == [first] and state.journal == [second]
    journal = again.journal_path.read_bytes()
    again.save(state)
    again.journal_path.write_bytes(journal)  # a crash before the journal was emptied ...
    assert ClientStateFile(file.path).load().journal == []  # ... replays nothing twice


async def crash(client: YrelayClient) -> None:
    """Stop a client's tasks without the final write ``close()`` makes."""
    client.state_file = None
    await client.close()


async def test_a_restarted_client_resumes_its_session_and_sends_unacked_edits(redis_url, make_client, tmp_path):
    file = ClientStateFile(tmp_path / "state.json")
    async with running_server(redis_url, gc_interval=0) as url:
        reader = await make_client(url)
        rdoc = await reader.subscribe("doc")
        writer = YrelayClient(url, backoff=FAST_BACKOFF, state_file=file)
        await writer.connect()
        wdoc = await writer.subscribe("doc")
        crdt.insert_text(wdoc.ydoc, 0, "<acked>")
        await writer.wait_idle()
        await eventually(lambda: rdoc.text == "<acked>")
        session, clock = writer.session, writer.buffer.clock

        writer.urls = [NOWHERE]  # the server never sees the next edits
        await writer.drop_connection()
        crdt.insert_text(wdoc.ydoc, 0, "<offline>")
        assert writer.pending == 1
        await crash(writer)

        again = YrelayClient(url, backoff=FAST_BACKOFF, state_file=file)
        events: list[tuple[str, dict]] = []
        again.on_event = lambda name, data: events.append((name, data))
        await again.connect()
        doc = await again.subscribe("doc")
        assert doc.text == "<offline><acked>"
        await again.wait_idle()
        assert again.session == session and ("connected", {"session": session, "resumed": True}) in events
        assert again.drifts == 0 and again.resyncs == 0  # resumed from offset and digest
        crdt.insert_text(doc.ydoc, 0, "<new>")
        await again.wait_idle()
        assert again.buffer.clock == clock + 2  # never reuses a clock of the session
        await eventually(lambda: rdoc.text == doc.text == "<new><offline><acked>")
        await again.close()


async def test_remote_edits_after_the_last_write_are_delivered_again(redis_url, make_client, tmp_path):
    file = ClientStateFile(tmp_path / "state.json")
    async with running_server(redis_url, gc_interval=0) as url:
        other = await make_client(url)
        odoc = await other.subscribe("doc")
        client = YrelayClient(url, backoff=FAST_BACKOFF, state_file=file, persist_interval=3600)
        await client.connect()
        cdoc = await client.subscribe("doc")
        crdt.insert_text(cdoc.ydoc, 0, "<mine>")  # written ahead
        await client.wait_idle()
        for i in range(5):
            crdt.insert_text(odoc.ydoc, 0, f"<o{i}>")
        await other.wait_idle()
        await eventually(lambda: cdoc.text == odoc.text)
        await crash(client)  # the deliveries never reached the file

        again = YrelayClient(url, backoff=FAST_BACKOFF, state_file=file)
        await again.connect()
        doc = await again.subscribe("doc")
        await eventually(lambda: doc.text == odoc.text)
        await asyncio.sleep(0.1)
        assert again.pending == 0
        await again.close()
