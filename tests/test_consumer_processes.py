"""Consumer groups with real member processes on a real redis-server:
kill -9 one under steady edits (nothing missed, duplicates only what it had
not acked), SIGSTOP one past its lease (refused when it acks, nothing twice
after it woke), a new member gets a share (handed over: no duplicates)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from conftest import eventually
from yrelay.storage.append import append_one
from yrelay.storage.keys import group_leader_key, group_leases_key, group_meta_key, group_progress_key
from yrelay.storage.offsets import StreamId
from yrelay.storage.reads import DocumentStore

LEASE = 1.5
#: Each member sleeps this long between processing a batch and acking it, so
#: the kill and the pause land while it holds unacked entries.
ACK_DELAY = 0.1
ROOT = Path(__file__).resolve().parent.parent


class Member:
    def __init__(self, redis_url: str, name: str, tmp: Path):
        self.name = name
        self.out = tmp / f"{name}.lines"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "consumer_process.py"),
                redis_url,
                "procs",
                name,
                str(self.out),
                str(LEASE),
                str(ACK_DELAY),
            ],
            env=env,
        )

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.out.read_text().splitlines()] if self.out.exists() else []

    def processed(self) -> list[tuple[str, str]]:
        return [
            (doc, entry_id) for kind, doc, entry_id, *_ in (row for row in self.lines() if len(row) >= 3) if kind == "P"
        ]

    def batches(self) -> list[tuple[list[tuple[str, str]], str]]:
        """Each batch's entries and its ack's result ('none': never acked)."""
        result, keys = [], []
        for line in self.lines():
            if line[0] == "P":
                keys.append((line[1], line[2]))
            elif line[0] == "A":
                result.append((keys, line[3]))
                keys = []
        if keys:
            result.append((keys, "none"))
        return result

    def acked(self) -> dict[str, StreamId]:
        """Per document, the highest offset this member's acks stored."""
        offsets: dict[str, StreamId] = {}
        for line in self.lines():
            if line[0] == "A" and line[3] == "ok":
                offsets[line[1]] = max(offsets.get(line[1], StreamId(0, 0)), StreamId.parse(line[2]))
        return offsets

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait()


class Writer:
    """Steady edits: one small entry at a time, round robin over the documents.

    Stopped by a flag, not by cancelling: redis-py can swallow a cancel that
    lands inside a command, and the loop then ran on for ever while the test
    waited for it (the one time this test hung until the timeout)."""

    def __init__(self, store: DocumentStore, docs: list[str]):
        self.store, self.docs = store, docs
        self.appended: list[tuple[str, str, float]] = []
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def _run(self) -> None:
        clock = 0
        while not self._stop.is_set():
            doc = self.docs[clock % len(self.docs)]
            entry_id, _ = await append_one(self.store, doc, "writer", clock, b"not a yjs update: consumers do not care")
            self.appended.append((doc, entry_id, asyncio.get_running_loop().time()))
            clock += 1
            await asyncio.sleep(0.002)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        assert self._task is not None
        self._stop.set()
        await self._task


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP has landed)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


async def stop_holding_a_batch(member: Member, redis) -> tuple[str, bytes | None]:
    """SIGSTOP ``member`` at a moment it holds a batch it processed and whose
    ack Redis has not stored: its last line is a P line, and the group's
    progress on that document is below the entry. Tried again (SIGCONT,
    wait for the next P line) when the ack got in between the look at its
    lines and the stop, as it may on a busy machine. Returns the document
    and the lease version the member holds it with."""
    for _ in range(50):
        await eventually(lambda: (lines := member.lines()) and lines[-1][0] == "P", timeout=30, interval=0.005)
        member.process.send_signal(signal.SIGSTOP)
        await eventually(lambda: stopped(member.process.pid), timeout=10)
        lines = member.lines()
        if lines[-1][0] == "P":
            doc, entry_id = lines[-1][1], StreamId.parse(lines[-1][2])
            acked = await redis.zscore(group_progress_key(doc), "procs")
            if acked is None or acked < entry_id.score():
                return doc, await redis.hget(group_leases_key(doc), "procs")
        member.process.send_signal(signal.SIGCONT)
    raise AssertionError(f"{member.name} was never stopped holding an unacked batch")


async def taken_over(redis, doc: str, held: bytes | None) -> None:
    """Wait until another member claimed ``doc`` (its lease version moved on
    from ``held``): from then on an ack under ``held`` is refused. A lease
    lapses after LEASE and the leader reassigns at its next round; the
    deadline is generous because the members are processes competing for a
    busy machine's cores, and nothing here measures how soon it happens."""
    deadline = asyncio.get_running_loop().time() + 60
    while await redis.hget(group_leases_key(doc), "procs") == held:
        assert asyncio.get_running_loop().time() < deadline, f"nobody took {doc} over in 60 s"
        await asyncio.sleep(0.05)


def after_first_ack(lines: list[list[str]]) -> list[list[str]]:
    """The lines after the first A line (none: no ack yet)."""
    acks = [index for index, line in enumerate(lines) if line[0] == "A"]
    return lines[acks[0] + 1 :] if acks else []


def unacked_of(member: Member) -> set[tuple[str, str]]:
    """What ``member`` processed beyond its last accepted ack of each document."""
    acked = member.acked()
    return {
        (doc, entry_id)
        for doc, entry_id in member.processed()
        if StreamId.parse(entry_id) > acked.get(doc, StreamId(0, 0))
    }


def union(members: list[Member]) -> Counter:
    return Counter(key for member in members for key in member.processed())


async def test_kill_9_and_sigstop_under_steady_edits(redis_url, store, tmp_path):
    docs = [f"doc-{i:03d}" for i in range(200)]
    writer = Writer(store, docs)
    for doc in docs:  # every document exists before the members start
        await append_one(store, doc, "seed", 0, b"seed")
    members = [Member(redis_url, f"m{i}", tmp_path) for i in range(3)]
    try:
        writer.start()
        await eventually(lambda: all(member.processed() for member in members), timeout=30)
        # kill -9 the leader: another takes the lease, and the others resume
        # its documents from its last acks.
        leader = (await store.redis.get(group_leader_key("procs"))).decode()
        victim = next(member for member in members if member.name == leader)
        # Killed while it holds a batch it processed and has not acked: killed
        # between batches (a busy machine's timing), it would leave nothing to
        # redeliver and the test nothing to check.
        doc, held = await stop_holding_a_batch(victim, store.redis)
        victim.process.kill()
        victim.process.wait()
        await taken_over(store.redis, doc, held)
        # SIGSTOP another past its lease, then let it go on.
        paused = next(member for member in members if member is not victim)
        # Stopped while it holds a batch it processed and has not acked (it
        # sleeps ACK_DELAY before the ack), and woken only once another member
        # claimed that batch's document, so its ack must be refused; stopped
        # between batches, it would have nothing to ack.
        doc, held = await stop_holding_a_batch(paused, store.redis)
        await taken_over(store.redis, doc, held)
        stopped_at = len(paused.lines())
        paused.process.send_signal(signal.SIGCONT)
        # It acks (refused), rejoins the group and gets a share again.
        await eventually(lambda: any(line[0] == "A" for line in paused.lines()[stopped_at:]), timeout=30)
        await eventually(
            lambda: any(line[0] == "P" for line in after_first_ack(paused.lines()[stopped_at:])), timeout=60
        )
        # A new member gets a share within a rebalance.
        members.append(Member(redis_url, "m3", tmp_path))
        await eventually(lambda: members[3].processed(), timeout=4 * LEASE + 5)
        await writer.stop()

        seeded = {
            (doc, entry_id.decode())
            for doc in docs
            for entry_id, _ in await store.redis.xrange(f"yrelay:{{{doc}}}:stream", count=1)
        }
        every = {(doc, entry_id) for doc, entry_id, _ in writer.appended} | seeded
        await eventually(lambda: set(union(members)) >= every, timeout=30)  # else: the missed ones, below

        processed = union(members)
        missed = sorted(every - set(processed))
        assert not missed, (len(missed), missed[:5])
        duplicates = {key for key, count in processed.items() if count > 1}
        # At least once, never more than that: an entry is processed again only
        # when the batch it was processed in was not acked (the killed member,
        # the paused one, one whose document moved): at most one accepted ack each.
        outcomes: dict[tuple[str, str], list[str]] = {}
        for member in members:
            for keys, result in member.batches():
                for key in keys:
                    outcomes.setdefault(key, []).append(result)
        acked_twice = sorted(key for key, results in outcomes.items() if results.count("ok") > 1)
        assert not acked_twice, (len(acked_twice), acked_twice[:5])
        unacked_by_victim = {key for keys, result in victim.batches() if result != "ok" for key in keys}
        unacked_by_paused = {key for keys, result in paused.batches() if result != "ok" for key in keys}
        # Only the killed and the paused member cause duplicates: the fourth
        # member's share and the woken member's new share were handed over.
        assert duplicates <= unacked_by_victim | unacked_by_paused, sorted(
            duplicates - unacked_by_victim - unacked_by_paused
        )[:5]
        refused = [line for line in paused.lines() if line[0] == "A" and line[3] != "ok"]
        assert refused, "the paused member acked after its lease was taken over, and was not refused"
        assert unacked_by_victim
        # Killing the leader made another take the lease.
        assert int(await store.redis.hget(group_meta_key("procs"), "elections")) >= 2
        redelivered = int(await store.redis.hget(group_meta_key("procs"), "redelivered") or 0)
        print(
            f"\nentries {len(every)}, duplicates {len(duplicates)}, counted as redelivered {redelivered} "
            f"(victim's unacked {len(unacked_by_victim)}), refused acks of the paused member: "
            f"{sum(1 for line in paused.lines() if line[0] == 'A' and line[3] != 'ok')}"
        )
    finally:
        for member in members:
            member.stop()
