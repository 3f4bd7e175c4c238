"""One chaos client: a separate OS process (so a crash is a real SIGKILL)
editing its documents at random through :class:`yrelay.client.YrelayClient`.

It leaves three files in its directory for the harness:

- ``acked.jsonl``: one line per update the server acknowledged (``appended``):
  document, session, clock, stream id and the update bytes, written (and
  flushed to the OS) as soon as the ack arrives, across every incarnation;
- ``status.json``: replaced every ``STATUS_INTERVAL``: connected, pending,
  a hash of each document's text, counters (the counters of earlier
  incarnations carried over);
- ``final.json``: written on SIGTERM: every document's Yjs state.

With ``persist`` it keeps its client state in ``state.json``
(:mod:`yrelay.client.persistence`), so a restarted process resumes the session
and resends what was not acked. Without it, a restarted process is a new
client, as a browser tab closed without IndexedDB would be: new session, empty
documents, a new Yjs client id; what the killed one had not got acked is gone
(the harness's own files above are kept).
Run: ``python -m yrelay_tools.chaos.workload CONFIG.json``.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import random
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from yrelay.client import Backoff, YrelayClient
from yrelay.client.persistence import ClientStateFile
from yrelay.yjs import crdt

STATUS_INTERVAL = 0.25
#: Retries fast and gives up on a silent server quickly (half-open links,
#: stopped processes), so faults are noticed in seconds, not minutes.
CHAOS_BACKOFF = Backoff(base=0.05, max_delay=1.0, max_attempts=12)


@dataclass(frozen=True)
class WorkloadConfig:
    name: str
    url: str
    docs: list[str]
    directory: str
    seed: int
    #: The harness writes ``{"until": <epoch seconds>}`` here once every
    #: client is ready: edit from then until that time, then only sync.
    window_file: str
    #: Mean seconds between two edits.
    edit_interval: float = 0.15
    #: Keep the client state in ``state.json`` across crashes.
    persist: bool = True

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> WorkloadConfig:
        return cls(**json.loads(path.read_text()))


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


class Workload:
    def __init__(self, config: WorkloadConfig):
        self.config = config
        self.dir = Path(config.directory)
        self.incarnation = int(time.time() * 1000)
        self.rng = random.Random(f"{config.seed}-{config.name}-{self.incarnation}")
        self.base_counters = self._previous_counters()
        state_file = ClientStateFile(self.dir / "state.json") if config.persist else None
        self.client = YrelayClient(
            config.url,
            backoff=CHAOS_BACKOFF,
            subscription_check_interval=10.0,
            state_file=state_file,
            on_event=self._on_event,
        )
        self.acked_log = open(self.dir / "acked.jsonl", "a", buffering=1)
        self.edits = 0
        self.last_token: str | None = None
        self.reconnects = 0
        #: Answers (``appended``, ``missing_dependency``) to an update of a
        #: document while an earlier one of it was unacked: issue 15's state.
        self.answered_past_unacked = 0
        self.edit_until: float | None = None
        self.stop = asyncio.Event()

    def _previous_counters(self) -> dict[str, int]:
        try:
            return dict(json.loads((self.dir / "status.json").read_text())["counters"])
        except (FileNotFoundError, KeyError, ValueError):
            return {}

    def _on_event(self, name: str, data: dict[str, Any]) -> None:
        if (name == "appended" or data.get("code") == "missing_dependency") and self._earlier_unacked(data):
            self.answered_past_unacked += 1
            self._write_status(self._ready())  # the nemesis waits for this (redis-kill-client-crash)
        if name == "appended":
            acked = self.client.acked[-1]
            line = {
                "doc": acked.doc,
                "clock": acked.clock,
                "id": acked.id,
                "session": self.client.session,
                "duplicate": data.get("duplicate", False),
                "update": base64.b64encode(acked.update).decode(),
            }
            self.acked_log.write(json.dumps(line) + "\n")
        elif name == "connected":
            self.reconnects += 1

    def _earlier_unacked(self, frame: dict[str, Any]) -> bool:
        return any(
            item.doc == frame.get("doc") and item.clock < frame.get("clock", -1) for item in self.client.buffer.all()
        )

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stop.set)
        status = asyncio.create_task(self._status_loop())
        await self.client.connect(timeout=3600)
        for name in self.config.docs:
            await self._subscribe(name)
        self._write_status(ready=True)
        editing = asyncio.create_task(self._edit_loop())
        await self.stop.wait()
        editing.cancel()
        status.cancel()
        await asyncio.gather(editing, status, return_exceptions=True)
        self._write_final()
        await self.client.close()

    async def _subscribe(self, name: str) -> None:
        while True:
            try:
                await self.client.subscribe(name, timeout=5)
                return
            except TimeoutError:
                continue  # a fault got in the way; the subscription is retried on reconnect

    async def _edit_loop(self) -> None:
        window = Path(self.config.window_file)
        # The harness (another process) writes the file: nothing here to await; a stat and a read of a few bytes.
        while not window.exists():  # noqa: ASYNC110, ASYNC240
            await asyncio.sleep(0.05)
        self.edit_until = float(json.loads(window.read_text())["until"])  # noqa: ASYNC240
        while time.time() < self.edit_until:
            await asyncio.sleep(self.rng.expovariate(1 / self.config.edit_interval))
            if time.time() >= self.edit_until:
                break
            doc = self.client.docs[self.rng.choice(self.config.docs)]
            self._edit(doc.ydoc)
            self.edits += 1

    def _edit(self, ydoc: crdt.Doc) -> None:
        """Mostly insertions of a unique token, sometimes a short deletion,
        sometimes a backspace over the end of this client's last token (a
        deletion of its own content, maybe not acked yet)."""
        text = crdt.text_of(ydoc)
        last = text.find(self.last_token) if self.last_token else -1
        draw = self.rng.random()
        if last >= 0 and draw < 0.1:
            assert self.last_token is not None  # found in the text above
            end = last + len(self.last_token)
            crdt.delete_text(ydoc, end - 3, 3)
            self.last_token = None
        elif len(text) > 10 and draw < 0.25:
            start = self.rng.randrange(len(text))
            crdt.delete_text(ydoc, start, min(self.rng.randint(1, 4), len(text) - start))
        else:
            self.last_token = f"<{self.config.name}.{self.incarnation % 10000}.{self.edits}>"
            crdt.insert_text(ydoc, self.rng.randint(0, len(text)), self.last_token)

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(STATUS_INTERVAL)
            self._write_status(self._ready())

    def _ready(self) -> bool:
        docs = self.client.docs
        return len(docs) == len(self.config.docs) and all(d.synced.is_set() for d in docs.values())

    def counters(self) -> dict[str, int]:
        now = {
            "edits": self.edits,
            "update_sends": self.client.buffer.sends,
            "update_resends": self.client.buffer.resends,
            "acked": self.client.acked_total,  # the list keeps only the newest
            "resyncs": self.client.resyncs,
            "drift_repairs": self.client.drifts,
            "connections": self.reconnects,
            "answered_past_unacked": self.answered_past_unacked,
            "errors": sum(self.client.error_codes.values()),
            **{f"error:{code}": count for code, count in self.client.error_codes.items()},
        }
        return {key: self.base_counters.get(key, 0) + now.get(key, 0) for key in {*self.base_counters, *now}}

    def _write_status(self, ready: bool) -> None:
        docs = {
            name: {
                "sha": hashlib.sha256(doc.text.encode()).hexdigest(),
                "length": len(doc.text),
                "offset": doc.offset,
                "synced": doc.synced.is_set(),
            }
            for name, doc in self.client.docs.items()
        }
        write_atomically(
            self.dir / "status.json",
            {
                "incarnation": self.incarnation,
                "pid": os.getpid(),
                "ready": ready,
                "connected": self.client.connected.is_set(),
                "pending": self.client.pending,
                "session": self.client.session,
                "editing": self.edit_until is None or time.time() < self.edit_until,
                "docs": docs,
                "counters": self.counters(),
                "written": time.time(),
            },
        )

    def _write_final(self) -> None:
        states = {
            name: base64.b64encode(crdt.encode_state(doc.ydoc)).decode() for name, doc in self.client.docs.items()
        }
        self._write_status(ready=True)
        write_atomically(
            self.dir / "final.json", {"docs": states, "counters": self.counters(), "pending": self.client.pending}
        )


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = WorkloadConfig.load(Path(sys.argv[1]))
    asyncio.run(Workload(config).run())


if __name__ == "__main__":
    main()
