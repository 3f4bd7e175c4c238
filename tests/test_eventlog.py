"""The event log: lines as docs/events.md says, rotation, and no failure of
the log ever reaching delivery."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from conftest import edit_then_evict_reader, running_server
from yrelay.config import Settings
from yrelay.gc import Collector, GcPolicy
from yrelay.observability.eventlog import SUBJECT_MODES, EventLog, subject_for_log
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt

COMMON = {"v", "ts", "type", "process", "doc", "session"}


def read_events(directory: Path) -> list[dict]:
    lines = []
    for path in sorted(directory.glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


def test_lines_carry_the_common_fields(tmp_path):
    events = EventLog(tmp_path, process="host:1").start()
    events.emit("append", "doc", "s1", offset="1-0", clock=0, bytes=10, duplicate=False)
    events.stop()
    [line] = read_events(tmp_path)
    assert COMMON <= set(line)
    assert line["v"] == 2 and line["type"] == "append" and line["process"] == "host:1"
    assert (line["doc"], line["session"], line["offset"], line["bytes"]) == ("doc", "s1", "1-0", 10)


def test_a_connect_records_the_subject_hashed_plain_or_not_at_all(tmp_path):
    """Schema 2: ``connect`` carries the session's subject as the setting says
    (a subject may be personal data: hashed by default)."""
    recorded = {}
    for mode in SUBJECT_MODES:
        events = EventLog(tmp_path / mode, process="host:1", subjects=mode)
        events.emit("connect", session="s1", resumed=False, **events.subject("alice@example.com"))
        events.stop()
        [line] = read_events(tmp_path / mode)
        recorded[mode] = line.get("subject", "absent")
    digest = hashlib.sha256(b"alice@example.com").hexdigest()[:16]
    assert recorded == {"hash": f"sha256:{digest}", "plain": "alice@example.com", "off": "absent"}
    assert subject_for_log("alice@example.com", "hash") == recorded["hash"]  # what `yrelay subject-hash` prints
    with pytest.raises(ValueError, match="event_log_subject"):
        Settings(event_log_subject="base64")


def test_rotates_by_size_and_by_age(tmp_path):
    by_size = EventLog(tmp_path / "size", max_bytes=500)
    for i in range(40):
        by_size.emit("ack", "doc", "s", offset=f"{i}-0", head=f"{i}-0")
        if i % 5 == 4:
            by_size.flush()
    by_size.stop()
    files = list((tmp_path / "size").glob("*.jsonl"))
    assert len(files) > 3 and len(read_events(tmp_path / "size")) == 40
    assert all(path.stat().st_size < 500 + 5 * 200 for path in files)

    by_age = EventLog(tmp_path / "age", max_age=0)
    for i in range(3):
        by_age.emit("connect", session=f"s{i}", resumed=False)
        by_age.flush()
    by_age.stop()
    assert len(list((tmp_path / "age").glob("*.jsonl"))) == 3


def test_a_full_buffer_drops_and_reports_the_count(tmp_path):
    events = EventLog(tmp_path, capacity=5)
    for i in range(12):
        events.emit("ack", "doc", "s", offset=f"{i}-0", head=f"{i}-0")
    assert events.dropped == 7
    events.flush()
    lines = read_events(tmp_path)
    assert [line["type"] for line in lines] == ["ack"] * 5 + ["dropped"]
    assert lines[-1]["entries"] == 7


def test_a_failing_disk_never_raises_and_the_hole_is_recorded(tmp_path):
    blocker = tmp_path / "events"
    blocker.write_text("not a directory")  # every write fails, like a full disk
    events = EventLog(blocker)
    events.emit("connect", session="s", resumed=False)
    events.flush()
    events.emit("connect", session="t", resumed=False)
    events.flush()
    assert events.dropped == 2
    blocker.unlink()  # space again
    events.emit("connect", session="u", resumed=True)
    events.flush()
    events.stop()
    lines = read_events(blocker)
    assert [line["type"] for line in lines] == ["connect", "dropped"]
    assert lines[1]["entries"] == 2


async def test_a_server_logs_what_happens(redis_url, redis_client, make_client, tmp_path):
    writer, reader = await edit_then_evict_reader(redis_url, make_client, tmp_path, "logged", 6)
    await Collector(
        redis_client, GcPolicy(relative_ms=5, absolute_ms=50), events=(gc_events := EventLog(tmp_path / "events"))
    ).collect(["logged"])
    gc_events.stop()

    lines = read_events(tmp_path / "events")
    by_type: dict[str, list[dict]] = {}
    for line in lines:
        assert COMMON <= set(line)
        by_type.setdefault(line["type"], []).append(line)
    # A busy machine may delay an answer past the client's resend: the resend
    # is answered from the dedup (`duplicate`), stored once. Stored updates:
    appends = [line for line in by_type["append"] if not line["duplicate"]]
    resent = [line for line in by_type["append"] if line["duplicate"]]
    assert len(appends) == 6 and {line["session"] for line in by_type["append"]} == {writer}
    assert {line["offset"] for line in resent} <= {line["offset"] for line in appends}
    assert [line["offset"] for line in appends] == sorted(line["offset"] for line in appends)
    delivered = sum(line["entries"] for line in by_type["deliver"] if line["session"] == reader)
    assert delivered >= 6
    assert any(line["session"] == reader and line["offset"] == appends[-1]["offset"] for line in by_type["ack"])
    assert {line["session"] for line in by_type["connect"]} == {writer, reader}
    assert {line["subject"] for line in by_type["connect"]} == {subject_for_log("anonymous", "hash")}  # auth off
    assert {line["session"] for line in by_type["disconnect"]} == {writer, reader}
    assert by_type["evict"][0]["mode"] == "operator" and by_type["evict"][0]["session"] == reader
    [snapshot] = by_type["snapshot"]
    [trim] = by_type["trim"]
    assert snapshot["offset"] == trim["offset"] == appends[-1]["offset"] and trim["entries"] == 6
    assert snapshot["bytes"] == len((await DocumentStore(redis_client).load_snapshot("logged")).update)


async def test_resync_and_resend_are_logged(redis_url, make_client, tmp_path):
    from wsraw import RawPeer

    async with running_server(redis_url, gc_interval=0, data_dir=tmp_path, resend_after=0.2) as url:
        writer = await make_client(url)
        wdoc = await writer.subscribe("r")
        peer = await RawPeer.connect(url)
        await peer.send({"op": "subscribe", "doc": "r", "offset": "99999999999999-0"})
        assert (await peer.expect("resync_required"))["reason"] == "ahead"
        lazy = await RawPeer.connect(url)
        await lazy.send({"op": "subscribe", "doc": "r"})
        await lazy.expect("subscribed")
        crdt.insert_text(wdoc.ydoc, 0, "x")
        await writer.wait_idle()
        await lazy.expect("deliver")
        await lazy.expect("deliver", timeout=5)  # never acked: sent again
    lines = read_events(tmp_path / "events")
    resyncs = [line for line in lines if line["type"] == "resync"]
    assert resyncs and resyncs[0]["reason"] == "ahead" and resyncs[0]["offset"] == "99999999999999-0"
    assert any(line["type"] == "resend" and line["session"] == lazy.session for line in lines)
