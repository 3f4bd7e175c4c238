"""Synthetic event logs whose analysis is known in advance.

:func:`generate` writes ``events-*.jsonl`` files in the format of
docs/events.md and returns :class:`Expected`: the answers the analysis must
find, known by construction rather than recomputed from the events (the
generator decides which tick each ack acknowledges and when, so every lag,
latency and status follows from the schedule).

The schedule, per document ``d`` of ``docs``: every ``tick_ms`` its writer
appends ``burst`` updates in one millisecond (ids ``<ms>-0`` ..
``<ms>-<burst-1>``); each reader is delivered the tick 1 ms later and acks
it after a fixed latency. Readers of every document behave normally
(latency ``latencies_ms[i % n]``, always caught up: status OK). Document 0
also has one reader per ``special`` behaviour, each built to produce one
status (see :class:`Behaviour`). GC trims every ``trim_every`` ticks,
keeping the last ``trim_keep``. A consumer group (``group``, one member)
acks every document one tick behind, ``group_latency_ms`` after the tick's
appends: its lag is always ``burst`` entries and ``tick_ms`` ms. Nothing
happens at or after ``seconds``:
events scheduled later are not written (the log ends mid-flight, like a
real one read while the server runs).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

from yrelay.spark_analytics.tables import Status


class Behaviour(StrEnum):
    """A special reader of document 0, and the status it is built to earn."""

    RESENDS = "resends"  # loses every resend_every-th delivery; it is resent and acked: OK
    SLOW = "slow"  # acks 2.5 ticks after delivery, so always 2 ticks behind: WARN
    STALL = "stall"  # from half time on acks every tick without moving its offset: STALL
    STOP = "stop"  # from half time on silent, still connected: STOP
    REWIND = "rewind"  # acks only, 2 ticks behind; 6 ticks before the end goes back 3 ticks: REWIND
    EVICT = "evict"  # at half time evicted, then told to resync (reason evicted), silent after: ERR
    RESYNCED = "resynced"  # told to resync (reason trimmed) at a third of the time, acks on: OK
    LEAVE = "leave"  # at half time disconnects with everything acked: LEFT
    DROP = "drop"  # at half time is delivered a tick and disconnects before acking it: LEFT_UNACKED


STATUS_OF = {
    Behaviour.RESENDS: Status.OK,
    Behaviour.SLOW: Status.WARN,
    Behaviour.STALL: Status.STALL,
    Behaviour.STOP: Status.STOP,
    Behaviour.REWIND: Status.REWIND,
    Behaviour.EVICT: Status.ERR,
    Behaviour.RESYNCED: Status.OK,
    Behaviour.LEAVE: Status.LEFT,
    Behaviour.DROP: Status.LEFT_UNACKED,
}
#: Readers that disconnect and never come back: they have no lag at the end of the log.
GONE = {Behaviour.LEAVE, Behaviour.DROP}
#: How far back the REWIND reader goes, and how many ticks before the end.
REWIND_BY, REWIND_BEFORE_END = 3, 6


@dataclass(frozen=True)
class Scenario:
    docs: int = 2
    readers: int = 3  # well-behaved readers per document
    seconds: int = 60
    tick_ms: int = 500
    burst: int = 2  # appends per tick, all in the same ms
    update_bytes: int = 100  # document d's updates are update_bytes * (d + 1) bytes
    latencies_ms: tuple[int, ...] = (20, 40, 100)
    special: tuple[Behaviour, ...] = tuple(Behaviour)
    resend_every: int = 5
    resend_after_ms: int = 200
    trim_every: int = 20  # ticks
    trim_keep: int = 5  # ticks a trim leaves in the stream
    processes: int = 2  # writer processes (one file each)
    start_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    window: int = 10  # the analysis' status window the statuses are built for
    broken_lines: bool = True  # one corrupt line, one version-99 line, one torn last line
    record_acks: bool = True  # keep every ack's expected lag (small logs only)
    group: str | None = "indexer"  # a consumer group acking every document one tick behind (None: no group)
    group_latency_ms: int = 50

    def __post_init__(self) -> None:
        slowest = max(max(self.latencies_ms), self.resend_after_ms + self.latencies_ms[0])
        if slowest + 1 >= self.tick_ms:
            raise ValueError("latencies (and resend_after + the first latency) must be shorter than a tick")
        if self.ticks // 2 < self.window + 2:
            raise ValueError(f"{self.ticks} ticks are too few for a status window of {self.window} acks")

    @property
    def ticks(self) -> int:
        return self.seconds * 1000 // self.tick_ms

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.seconds * 1000

    @property
    def slow_ms(self) -> int:
        """Latency of the SLOW and REWIND readers: two and a half ticks."""
        return 2 * self.tick_ms + self.tick_ms // 2

    def tick_ts(self, tick: int) -> int:
        return self.start_ms + tick * self.tick_ms

    def entry_id(self, tick: int, seq: int | None = None) -> str:
        """Stream id of a tick's append ``seq`` (default: its last)."""
        return f"{self.tick_ts(tick)}-{self.burst - 1 if seq is None else seq}"

    def size(self, doc: int) -> int:
        return self.update_bytes * (doc + 1)


@dataclass
class DocExpected:
    appends: int = 0
    bytes: int = 0
    deliveries: int = 0
    resends: int = 0
    evictions: int = 0
    resyncs: int = 0
    trims: int = 0
    trimmed: int = 0
    stream_length: int | None = None


@dataclass
class Expected:
    """The answers, keyed by document name and ``(doc, session)``."""

    scenario: Scenario
    files: list[Path] = field(default_factory=list)
    events: int = 0
    corrupt_lines: int = 0
    other_version_lines: int = 0
    dropped_events: int = 0
    start_ts: int = 0
    end_ts: int = 0
    statuses: dict[tuple[str, str], Status] = field(default_factory=dict)
    #: (entries, ms) behind the end of the log at each session's last ack.
    current_lag: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    #: (doc, session, ts) -> (lag entries, lag ms) of every ack (record_acks).
    ack_lags: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    #: (doc, group, ts) -> (lag entries, lag ms) of every consumer_ack (record_acks).
    group_lags: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    latencies: Counter[int] = field(default_factory=Counter)  # latency ms -> acked deliveries
    documents: dict[str, DocExpected] = field(default_factory=dict)
    resyncs_by_reason: Counter[str] = field(default_factory=Counter)

    @property
    def deliveries(self) -> int:
        return sum(doc.deliveries for doc in self.documents.values())

    @property
    def resends(self) -> int:
        return sum(doc.resends for doc in self.documents.values())

    def percentile(self, p: float) -> float:
        """Exact percentile with linear interpolation between closest ranks (Spark's ``percentile``)."""
        values = sorted(self.latencies)
        position = p * (sum(self.latencies.values()) - 1)
        lower, higher = math.floor(position), math.ceil(position)
        low, high = _value_at(values, self.latencies, lower), _value_at(values, self.latencies, higher)
        return float(low) if lower == higher else (higher - position) * low + (position - lower) * high


def _value_at(values: list[int], counts: Counter[int], rank: int) -> int:
    seen = 0
    for value in values:
        seen += counts[value]
        if rank < seen:
            return value
    raise IndexError(rank)


#: The scenario of :func:`generate` when none is given (frozen: shared safely).
DEFAULT_SCENARIO = Scenario()


def generate(out_dir: Path, scenario: Scenario = DEFAULT_SCENARIO) -> Expected:
    """Write the scenario's event log under ``out_dir``; return what analysing it must find."""
    out_dir.mkdir(parents=True, exist_ok=True)
    expected = Expected(scenario, start_ts=scenario.start_ms)
    with _Log(out_dir, scenario, expected) as log:
        _Schedule(scenario, log, expected).run()
    return expected


class _Log:
    """Per-process files; events are buffered per tick and written in time order."""

    def __init__(self, out_dir: Path, scenario: Scenario, expected: Expected):
        self.scenario = scenario
        self.expected = expected
        stamp = "20260101T000000"
        self.paths = [out_dir / f"events-gen-{1000 + p}-{stamp}-0.jsonl" for p in range(scenario.processes)]
        self.files: list[IO[str]] = []
        self.buckets: dict[int, list[tuple[int, int, int, str]]] = {}
        self.order = 0

    def __enter__(self) -> _Log:
        self.files = [path.open("w") for path in self.paths]
        self.expected.files = list(self.paths)
        if self.scenario.broken_lines:
            self._write_broken_head()
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush_before(None)
        if self.scenario.broken_lines:
            self.files[-1].write(f'{{"v":1,"ts":{self.scenario.end_ms:d},"type":"ack","doc":"d0","sess')  # torn
            self.expected.corrupt_lines += 1
        for file in self.files:
            file.close()

    def _write_broken_head(self) -> None:
        self.files[0].write(f'{{"v":1,"ts":{self.scenario.start_ms:d},"type":"append","doc":"d0" garbage\n')
        self.files[0].write(json.dumps({"v": 99, "ts": self.scenario.start_ms, "type": "append", "doc": "d0"}) + "\n")
        self.expected.corrupt_lines += 1
        self.expected.other_version_lines += 1

    def emit(self, ts: int, type: str, process: int, doc: str | None, session: str | None, **fields: Any) -> bool:
        """Queue one event; False (and nothing written) at or after the end of the scenario."""
        if ts >= self.scenario.end_ms:
            return False
        event = {
            "v": 1,
            "ts": ts,
            "type": type,
            "process": f"gen:{1000 + process}",
            "doc": doc,
            "session": session,
            **fields,
        }
        bucket = (ts - self.scenario.start_ms) // self.scenario.tick_ms
        self.order += 1
        self.buckets.setdefault(bucket, []).append((ts, self.order, process, json.dumps(event, separators=(",", ":"))))
        self.expected.events += 1
        self.expected.end_ts = max(self.expected.end_ts, ts)
        return True

    def flush_before(self, tick: int | None) -> None:
        """Write every bucket before ``tick`` (all of them for None): nothing earlier can come."""
        for bucket in sorted(b for b in self.buckets if tick is None or b < tick):
            for _, _, process, line in sorted(self.buckets.pop(bucket)):
                self.files[process].write(line + "\n")


@dataclass
class _Reader:
    doc: int
    session: str
    process: int
    latency_ms: int
    behaviour: Behaviour | None = None  # None: a normal reader
    last_acked: int | None = None  # tick

    @property
    def doc_name(self) -> str:
        return f"d{self.doc}"


class _Schedule:
    """Walks the ticks and has every document, reader and GC pass emit its events."""

    def __init__(self, scenario: Scenario, log: _Log, expected: Expected):
        self.s = scenario
        self.log = log
        self.expected = expected
        self.readers = self._readers()
        self.last_trim: dict[int, int] = {}  # doc -> tick trimmed through
        self.removed: Counter[int] = Counter()  # doc -> entries removed so far

    def _readers(self) -> list[_Reader]:
        s = self.s
        readers = [
            _Reader(d, f"d{d}-r{i}", 0, s.latencies_ms[i % len(s.latencies_ms)])
            for d in range(s.docs)
            for i in range(s.readers)
        ]
        slow = {Behaviour.SLOW, Behaviour.REWIND}
        readers += [_Reader(0, f"d0-{b.value}", 0, s.slow_ms if b in slow else s.latencies_ms[0], b) for b in s.special]
        for index, reader in enumerate(readers):
            reader.process = index % s.processes
        return readers

    def run(self) -> None:
        for d in range(self.s.docs):
            self.expected.documents[f"d{d}"] = DocExpected()
            self.log.emit(self.s.start_ms, "connect", d % self.s.processes, None, f"d{d}-w", resumed=False)
        for reader in self.readers:
            self.log.emit(self.s.start_ms, "connect", reader.process, None, reader.session, resumed=False)
        self.log.emit(self.s.start_ms + 1, "dropped", 0, None, None, entries=7)
        self.expected.dropped_events = 7
        for tick in range(self.s.ticks):
            for d in range(self.s.docs):
                self._appends(d, tick)
                self._gc(d, tick)
            for reader in self.readers:
                self._read(reader, tick)
            for d in range(self.s.docs):
                self._group_ack(d, tick)
            self.log.flush_before(tick)
        self._settle()

    # ------------------------------------------------------------------ writer

    def _appends(self, d: int, tick: int) -> None:
        s, doc = self.s, self.expected.documents[f"d{d}"]
        for seq in range(s.burst):
            self.log.emit(
                s.tick_ts(tick),
                "append",
                d % s.processes,
                f"d{d}",
                f"d{d}-w",
                offset=s.entry_id(tick, seq),
                clock=tick * s.burst + seq,
                bytes=s.size(d),
                duplicate=False,
            )
            doc.appends += 1
            doc.bytes += s.size(d)
        if tick == 1:  # the writer sent an update again: logged, not a new entry
            self.log.emit(
                s.tick_ts(tick) + 2,
                "append",
                d % s.processes,
                f"d{d}",
                f"d{d}-w",
                offset=s.entry_id(tick, 0),
                clock=tick * s.burst,
                bytes=s.size(d),
                duplicate=True,
            )

    def _gc(self, d: int, tick: int) -> None:
        s = self.s
        if (tick + 1) % s.trim_every or tick < s.trim_keep:
            return
        through = tick - s.trim_keep
        removed = (through - self.last_trim.get(d, -1)) * s.burst
        self.last_trim[d] = through
        self.removed[d] += removed
        length = (tick + 1) * s.burst - self.removed[d]
        ts = s.tick_ts(tick) + s.tick_ms // 2
        self.log.emit(ts, "snapshot", 0, f"d{d}", None, offset=s.entry_id(through), entries=removed, bytes=4096)
        if self.log.emit(
            ts, "trim", 0, f"d{d}", None, offset=s.entry_id(through), entries=removed, stream_length=length
        ):
            doc = self.expected.documents[f"d{d}"]
            doc.trims += 1
            doc.trimmed += removed
            doc.stream_length = length + (s.ticks - 1 - tick) * s.burst  # plus what is appended after

    # ----------------------------------------------------------------- readers

    def _read(self, reader: _Reader, tick: int) -> None:
        s, half = self.s, self.s.ticks // 2
        behaviour = reader.behaviour
        if behaviour is Behaviour.REWIND:
            back = REWIND_BY if tick >= s.ticks - REWIND_BEFORE_END else 0
            self._ack(reader, tick - back, s.tick_ts(tick) + 1 + reader.latency_ms)
        elif behaviour is Behaviour.STALL and tick >= half:
            self._ack(reader, half - 1, s.tick_ts(tick) + 1 + reader.latency_ms)
        elif behaviour in (Behaviour.STOP, Behaviour.EVICT, *GONE) and tick >= half:
            if tick == half:
                self._leave(reader, tick)
        elif behaviour is Behaviour.RESENDS and tick % s.resend_every == s.resend_every - 1:
            self._deliver_twice(reader, tick)
        else:
            if behaviour is Behaviour.RESYNCED and tick == s.ticks // 3:
                self._resync(reader, s.tick_ts(tick) + 3, "trimmed", f"{s.start_ms - 60_000}-0")
            self._deliver_and_ack(reader, tick, s.tick_ts(tick) + 1)

    def _deliver(self, reader: _Reader, tick: int, ts: int) -> bool:
        s = self.s
        written = self.log.emit(
            ts,
            "deliver",
            reader.process,
            reader.doc_name,
            reader.session,
            first=s.entry_id(tick, 0),
            last=s.entry_id(tick),
            entries=s.burst,
            bytes=s.burst * s.size(reader.doc),
            head=s.entry_id(tick),
        )
        self.expected.documents[reader.doc_name].deliveries += written
        return written

    def _deliver_and_ack(self, reader: _Reader, tick: int, ts: int) -> None:
        if self._deliver(reader, tick, ts) and self._ack(reader, tick, ts + reader.latency_ms):
            self.expected.latencies[reader.latency_ms] += 1

    def _deliver_twice(self, reader: _Reader, tick: int) -> None:
        """The first delivery is lost; the resend after resend_after_ms is acked."""
        s = self.s
        first = s.tick_ts(tick) + 1
        lost = self._deliver(reader, tick, first)
        again = first + s.resend_after_ms
        offset = s.entry_id(tick - 1) if tick else "0-0"
        if self.log.emit(
            again, "resend", reader.process, reader.doc_name, reader.session, offset=offset, entries=s.burst
        ):
            self.expected.documents[reader.doc_name].resends += 1
        if self._deliver(reader, tick, again) and self._ack(reader, tick, again + reader.latency_ms):
            self.expected.latencies[reader.latency_ms] += 1
            if lost:
                self.expected.latencies[s.resend_after_ms + reader.latency_ms] += 1

    def _ack(self, reader: _Reader, acked: int, ts: int) -> bool:
        s = self.s
        head = min(s.ticks - 1, (ts - s.start_ms) // s.tick_ms)
        if not self.log.emit(
            ts, "ack", reader.process, reader.doc_name, reader.session, offset=s.entry_id(acked), head=s.entry_id(head)
        ):
            return False
        reader.last_acked = acked
        if s.record_acks:
            self.expected.ack_lags[(reader.doc_name, reader.session, ts)] = (
                (head - acked) * s.burst,
                (head - acked) * s.tick_ms,
            )
        return True

    def _group_ack(self, d: int, tick: int) -> None:
        """The group's member acks the tick before this one (the head it read is this tick's)."""
        s = self.s
        if s.group is None or tick == 0:
            return
        ts = s.tick_ts(tick) + s.group_latency_ms
        if (
            self.log.emit(
                ts,
                "consumer_ack",
                d % s.processes,
                f"d{d}",
                None,
                group=s.group,
                member=f"{s.group}-1",
                offset=s.entry_id(tick - 1),
                head=s.entry_id(tick),
                entries=s.burst,
            )
            and s.record_acks
        ):
            self.expected.group_lags[(f"d{d}", s.group, ts)] = (s.burst, s.tick_ms)

    def _leave(self, reader: _Reader, tick: int) -> None:
        s, ts = self.s, self.s.tick_ts(tick)
        if reader.behaviour is Behaviour.STOP:
            return  # silent, still connected
        if reader.behaviour in GONE:
            if reader.behaviour is Behaviour.DROP:
                self._deliver(reader, tick, ts + 1)
            self.log.emit(
                ts + 2, "disconnect", reader.process, None, reader.session, docs=1, duration_ms=ts + 2 - s.start_ms
            )
            return
        if self.log.emit(ts + 5, "evict", 0, reader.doc_name, reader.session, mode="relative"):
            self.expected.documents[reader.doc_name].evictions += 1
        self._resync(reader, ts + 10, "evicted", s.entry_id(tick - 1))

    def _resync(self, reader: _Reader, ts: int, reason: str, offset: str) -> None:
        if self.log.emit(ts, "resync", reader.process, reader.doc_name, reader.session, reason=reason, offset=offset):
            self.expected.documents[reader.doc_name].resyncs += 1
            self.expected.resyncs_by_reason[reason] += 1

    def _settle(self) -> None:
        """Statuses and end-of-log lag follow from each reader's behaviour and last ack."""
        s = self.s
        for reader in self.readers:
            key = (reader.doc_name, reader.session)
            self.expected.statuses[key] = STATUS_OF[reader.behaviour] if reader.behaviour else Status.OK
            if reader.last_acked is not None and reader.behaviour not in GONE:
                behind = s.ticks - 1 - reader.last_acked
                self.expected.current_lag[key] = (behind * s.burst, behind * s.tick_ms)
