"""The event log: what happens to documents and sessions, as JSON lines.

Schema and file layout: docs/events.md. The Spark jobs in
:mod:`yrelay.spark_analytics` read it.

The hot path only builds a small dict and appends it to a bounded deque
(thread-safe, no lock, no I/O, no JSON); a daemon thread encodes and writes
batches every ``flush_interval`` seconds and rotates files by size and age.
Delivery never waits for the log, and the log can never break delivery: a
full buffer drops events (counted), a failed write drops its batch (counted,
warned about once a minute), and the next successful write records a
``dropped`` event with the count so readers know the log has a hole.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

log = logging.getLogger(__name__)

#: Version 2 adds ``subject`` to ``connect`` (docs/events.md); ``yrelay
#: analyze`` reads versions 1 and 2.
SCHEMA_VERSION = 2
#: How a session's subject is written (``event_log_subject``): a hash of it
#: (the default), as is, or not at all. A subject may be personal data (an
#: e-mail address), and the event log is kept and copied for analysis.
SUBJECT_MODES = ("hash", "plain", "off")
#: Tells apart the logs of several servers in one process (tests, embedding).
_instances = itertools.count(1)
#: Seconds between two "events dropped" warnings.
WARN_EVERY = 60.0

#: One JSON line per event (msgspec: json.dumps was ~3% of the server's CPU).
_encode_lines = msgspec.json.Encoder().encode_lines
#: Events taken and encoded at a time by the writer thread, which then
#: sleeps ``GIL_PAUSE`` s. Python hands the GIL to a waiting thread only
#: when the holder releases it or after the 5 ms switch interval: a whole
#: flush under load (~10,000 events, ~5 ms of Python) made the event loop
#: wait behind it, the largest part of the p99 of scenario hot
#: (BENCHMARKS.md, issue 20). A slice holds it for ~0.3 ms.
SLICE = 500
GIL_PAUSE = 0.0002


def process_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def subject_for_log(subject: str, mode: str) -> str | None:
    """What the log records of ``subject`` under ``mode`` (:data:`SUBJECT_MODES`).

    ``hash``: ``sha256:`` and the first 16 hex digits of SHA-256 of the
    subject: the same subject always gives the same value, so an operator
    who knows a user id can find its sessions (``yrelay subject-hash ID``
    prints it), while the log itself names nobody. A guessable id can still
    be found by trying candidates: use ``off`` where that matters.
    """
    if mode == "off":
        return None
    if mode == "plain":
        return subject
    return "sha256:" + hashlib.sha256(subject.encode()).hexdigest()[:16]


class EventLog:
    """Buffered, rotated JSON-lines writer for one process."""

    def __init__(
        self,
        directory: Path,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_age: float = 3600.0,
        capacity: int = 100_000,
        flush_interval: float = 0.2,
        process: str | None = None,
        subjects: str = "hash",
    ):
        if subjects not in SUBJECT_MODES:
            raise ValueError(f"event log subject mode must be one of {', '.join(SUBJECT_MODES)}, got {subjects!r}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.max_age = max_age
        self.capacity = capacity
        self.flush_interval = flush_interval
        self.process = process or process_name()
        self.subjects = subjects
        #: Events lost so far (full buffer or failed writes), for metrics and tests.
        self.dropped = 0
        self._unreported = 0
        self._counters = threading.Lock()
        self._queue: deque[dict[str, Any]] = deque()
        self._file: BinaryIO | None = None
        self._file_opened = 0.0
        self._file_size = 0
        self._files = 0
        self._started = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{next(_instances)}"
        self._last_warning = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------- hot path

    def emit(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> None:
        """Queue one event; never blocks, never raises."""
        if len(self._queue) >= self.capacity:
            self._count_dropped(1)
            return
        self._queue.append(self._event(type, doc, session, **fields))

    def subject(self, subject: str) -> dict[str, str]:
        """The ``subject`` field of a ``connect`` event (none when the mode is ``off``)."""
        recorded = subject_for_log(subject, self.subjects)
        return {} if recorded is None else {"subject": recorded}

    def _event(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> dict[str, Any]:
        return {
            "v": SCHEMA_VERSION,
            "ts": int(time.time() * 1000),
            "type": type,
            "process": self.process,
            "doc": doc,
            "session": session,
            **fields,
        }

    # ------------------------------------------------------------ lifecycle

    def start(self) -> EventLog:
        self._thread = threading.Thread(target=self._run, name="yrelay-event-log", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Write what is queued and close the file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():  # a hung disk: leave the file to that thread
                return
        self.flush()
        self._close()

    # --------------------------------------------------------- writer thread

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            try:
                self.flush()
            except Exception as exc:  # noqa: BLE001 - the writer thread's boundary: never let it die silently
                self._warn(f"event log writer error: {exc!r}")

    def flush(self) -> None:
        """Write every event queued when it starts (the writer thread; at
        stop, the caller's), in slices of ``SLICE`` with a pause between them."""
        parts, taken = [], 0
        for _ in range(0, len(self._queue), SLICE):
            batch = [self._queue.popleft() for _ in range(min(SLICE, len(self._queue)))]
            parts.append(_encode_lines(batch))
            taken += len(batch)
            time.sleep(GIL_PAUSE)
        reported = self._unreported
        if reported:
            parts.append(_encode_lines([self._event("dropped", entries=reported)]))
        if not parts:
            return
        try:
            self._write(b"".join(parts))
        except OSError as exc:
            self._count_dropped(taken)
            self._close()
            self._warn(f"event log write failed ({exc}); {self.dropped} events dropped so far")
        else:
            with self._counters:
                self._unreported -= reported

    def _count_dropped(self, events: int) -> None:
        with self._counters:  # the event loop and the writer thread both count
            self.dropped += events
            self._unreported += events

    def _write(self, data: bytes) -> None:
        if self._file is None or self._due_for_rotation():
            self._rotate()
        assert self._file is not None
        self._file.write(data)
        self._file.flush()
        self._file_size += len(data)

    def _due_for_rotation(self) -> bool:
        return self._file_size >= self.max_bytes or time.monotonic() - self._file_opened >= self.max_age

    def _rotate(self) -> None:
        self._close()
        self.directory.mkdir(parents=True, exist_ok=True)
        self._files += 1
        host, _, pid = self.process.rpartition(":")
        name = f"events-{host}-{pid}-{self._started}-{self._files}.jsonl"
        self._file = (self.directory / name).open("ab")
        self._file_opened = time.monotonic()
        self._file_size = 0

    def _close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY:
            self._last_warning = now
            log.warning(message)


class NullEventLog(EventLog):
    """The log switched off (``YRELAY_EVENT_LOG=0``): emits nothing."""

    def __init__(self) -> None:
        super().__init__(Path("."), process="off")

    def emit(self, type: str, doc: str | None = None, session: str | None = None, **fields: Any) -> None:
        pass

    def start(self) -> EventLog:
        return self

    def stop(self) -> None:
        pass
