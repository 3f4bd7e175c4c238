"""`yrelay consume -- COMMAND` with a real Python script as the command and a
real redis-server: every entry reaches the script in order per document, a
batch the script did not ack (it crashed) is sent again to the restarted
script, and SIGTERM stops the script and leaves the group."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import eventually
from test_consumers import write
from yrelay.consumers import ConsumerGroup
from yrelay.consumers.pipe import Pipe
from yrelay.storage.keys import group_members_key
from yrelay.storage.offsets import StreamId

SCRIPT = str(Path(__file__).resolve().parent / "consume_script.py")


def received(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def per_doc(out: Path) -> dict[str, list[str]]:
    """Entry ids per document, repeats dropped (as a receiver dedupes)."""
    docs: dict[str, list[str]] = {}
    for item in received(out):
        ids = docs.setdefault(item["doc"], [])
        ids.extend(i for i in item["ids"] if not ids or StreamId.parse(i) > StreamId.parse(ids[-1]))
    return docs


async def test_the_cli_pipes_every_entry_restarts_a_crashed_command_and_leaves_on_sigterm(
    redis_url, redis_client, store, tmp_path
):
    docs = ["a", "b", "c"]
    written = await write(store, docs, 3)
    out, marker = tmp_path / "out.jsonl", tmp_path / "marker"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "yrelay.cli",
        "consume",
        "--group",
        "pipe",
        "--redis-url",
        redis_url,
        "--lease",
        "1.2",
        "--window",
        "2",
        "--",
        sys.executable,
        SCRIPT,
        str(out),
        str(marker),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(lambda: per_doc(out) == written, timeout=20)
        more = await write(store, docs, 2, word="more")
        await eventually(lambda: per_doc(out) == {d: written[d] + more[d] for d in docs}, timeout=10)
        assert await redis_client.zcard(group_members_key("pipe")) == 1
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            # Its stop (the command's 5 s grace, leaving the group) took more
            # than 15 s under make test-busy; a stop that hangs still fails,
            # now with the command's log.
            _, stderr = await asyncio.wait_for(process.communicate(), 60)
        except TimeoutError:
            process.kill()
            _, stderr = await process.communicate()
            pytest.fail(f"consume did not stop within 60 s of SIGTERM; its log:\n{stderr.decode()[-4000:]}")
    log = stderr.decode()
    assert process.returncode == 0, log
    # The crash: the batch written second was received, not acked, and sent again to the new script.
    batches = [(item["doc"], tuple(item["ids"])) for item in received(out)]
    assert batches.count(batches[1]) == 2, batches
    assert "exited with 3" in log and log.count("script started") == 2
    # Everything acked; the group left; the script was stopped with it.
    offsets = await ConsumerGroup(redis_client, "pipe").progress.offsets(docs)
    assert offsets == {d: StreamId.parse(more[d][-1]) for d in docs}
    assert await redis_client.zcard(group_members_key("pipe")) == 0
    pid = int(marker.read_text())
    await eventually(lambda: not _alive(pid), timeout=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_ack_on_write_acks_without_waiting_for_the_command(redis_client, store, tmp_path):
    written = await write(store, ["w"], 2)
    out = tmp_path / "out.txt"
    # A command that never acks: it only stores what it reads.
    command = [sys.executable, "-c", f"import sys\nfor line in sys.stdin: open({str(out)!r}, 'a').write(line)"]
    async with ConsumerGroup(redis_client, "pipe-w", member="p1", lease=1.2) as group:
        pipe = Pipe(group, command, ack_on_write=True)
        task = asyncio.create_task(pipe.run())
        await eventually(lambda: pipe.stats.acked == 1, timeout=10)
        await eventually(lambda: out.exists() and json.loads(out.read_text())["ids"] == written["w"], timeout=10)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert pipe.process is not None and pipe.process.returncode is not None  # stopped with the member
    assert (await group.progress.offsets(["w"]))["w"] == StreamId.parse(written["w"][-1])
