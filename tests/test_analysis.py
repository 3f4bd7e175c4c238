"""Known-answer tests of the analysis: a generated log whose lags, statuses and
latency percentiles are known by construction (yrelay_tools.analytics_data),
analysed by the real job on the shared local SparkSession."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import edit_then_evict_reader
from yrelay.spark_analytics.analysis import Options
from yrelay.spark_analytics.dashboard import read_table
from yrelay.spark_analytics.events import read_events
from yrelay.spark_analytics.job import JobConfig, run
from yrelay.spark_analytics.latency import HISTOGRAM_EDGES, delivery_latency
from yrelay.spark_analytics.tables import Status, Table
from yrelay_tools.analytics_data import Behaviour, Expected, Scenario, generate

BUCKET_S = 10
SCENARIO = Scenario(docs=2, readers=3, seconds=60)

#: The first test of the module also runs the whole analysis job (the
#: ``analysed`` fixture): ~20 s on a quiet 2-core machine, 55 s beside
#: another suite, more than the default 120 s with both cores busy, which
#: failed every test here at once (issue 31). No test here asserts on time:
#: the job's results are exact by construction.
pytestmark = pytest.mark.timeout(600)


class Analysed:
    def __init__(self, expected: Expected, out: Path, summary: dict):
        self.expected, self.out, self.summary = expected, out, summary

    def table(self, table: Table) -> pd.DataFrame:
        return read_table(self.out, table)


def fake_redis(spark, url):
    """What the Redis data source returns, two documents' worth (its own tests cover the source)."""
    entries = spark.createDataFrame(
        [
            ("d0", "5-0", 5, 0, 5000, "w", 1, 10),
            ("d0", "7-1", 7, 1, 7001, "w", 2, 30),
            ("d1", "9-0", 9, 0, 9000, "w", 1, 5),
        ],
        "doc string, id string, ms long, seq int, score long, session string, clock long, bytes int",
    )
    tracker = spark.createDataFrame(
        [("d0", "a", "5-0", 5000, 5, 1, 2), ("d0", "b", "7-1", 7001, 7, 0, 0)],
        "doc string, session string, offset string, score long, ms long, lag_entries long, lag_ms long",
    )
    return entries, tracker


@pytest.fixture(scope="module")
def analysed(spark, tmp_path_factory) -> Analysed:
    root = tmp_path_factory.mktemp("analysis")
    expected = generate(root / "events", SCENARIO)
    config = JobConfig(
        root / "events", root / "out", redis_url="redis://fake", options=Options(bucket_seconds=BUCKET_S)
    )
    summary = run(spark, config, redis_reader=fake_redis)
    return Analysed(expected, root / "out", summary)


def by_key(frame: pd.DataFrame, keys: list[str], values: list[str]) -> dict:
    return {tuple(row[k] for k in keys): tuple(row[v] for v in values) for row in frame.to_dict("records")}


def test_every_ack_has_its_exact_lag_in_entries_and_ms(analysed):
    lag = analysed.table(Table.LAG)
    assert len(lag) == len(analysed.expected.ack_lags)
    assert by_key(lag, ["doc", "session", "ts"], ["lag_entries", "lag_ms"]) == analysed.expected.ack_lags


def test_every_group_ack_has_its_exact_lag(analysed):
    """The generator's group acks every document one tick behind."""
    lag = analysed.table(Table.GROUP_LAG)
    assert len(lag) == len(analysed.expected.group_lags) > 0
    assert by_key(lag, ["doc", "group", "ts"], ["lag_entries", "lag_ms"]) == analysed.expected.group_lags


def test_lag_over_time_is_the_last_ack_of_each_bucket(analysed):
    last: dict[tuple, tuple[int, tuple]] = {}
    for (doc, session, ts), lag in analysed.expected.ack_lags.items():
        key = (doc, session, ts // (BUCKET_S * 1000) * BUCKET_S * 1000)
        if key not in last or last[key][0] < ts:
            last[key] = (ts, lag)
    table = analysed.table(Table.LAG_OVER_TIME)
    table["bucket_ms"] = pd.to_datetime(table["bucket"], utc=True).astype("datetime64[ms, UTC]").astype("int64")
    assert by_key(table, ["doc", "session", "bucket_ms"], ["lag_entries", "lag_ms"]) == {
        key: lag for key, (_, lag) in last.items()
    }


def test_every_session_gets_the_status_its_behaviour_earns(analysed):
    status = analysed.table(Table.STATUS)
    found = {key: Status(value) for key, (value,) in by_key(status, ["doc", "session"], ["status"]).items()}
    assert found == analysed.expected.statuses
    assert set(found.values()) == set(Status)  # the scenario shows every status once at least


def test_lag_at_the_end_of_the_log(analysed):
    status = analysed.table(Table.STATUS).dropna(subset=["current_lag_entries"])
    found = by_key(status, ["doc", "session"], ["current_lag_entries", "current_lag_ms"])
    assert found == analysed.expected.current_lag
    slow = analysed.expected.current_lag[("d0", "d0-slow")]
    assert slow == (2 * SCENARIO.burst, 2 * SCENARIO.tick_ms)


def test_errors_name_the_last_problem(analysed):
    status = analysed.table(Table.STATUS).set_index("session")
    assert status.loc["d0-evict", "last_problem"] == "resync:evicted"
    assert (status.loc["d0-evict", "evictions"], status.loc["d0-evict", "resyncs"]) == (1, 1)
    assert status.loc["d0-resynced", "last_problem"] == "resync:trimmed"


def test_ack_latency_percentiles_are_exact(analysed):
    latency = analysed.table(Table.ACK_LATENCY)
    overall = latency[latency["doc"].isna()].iloc[0]
    expected = analysed.expected
    assert overall["deliveries"] == expected.deliveries
    assert overall["acked"] == sum(expected.latencies.values())
    for p in (0.5, 0.95, 0.99):
        assert overall[f"p{round(p * 100)}_ms"] == pytest.approx(expected.percentile(p), abs=1e-9)
    assert overall["max_ms"] == max(expected.latencies)
    assert set(latency["doc"].dropna()) == {"d0", "d1"}
    d1 = latency[latency["doc"] == "d1"].iloc[0]
    assert (d1["p50_ms"], d1["max_ms"]) == (40.0, 100)  # d1 has the three plain readers only


def test_latency_histogram_counts_every_acked_delivery_in_its_bin(analysed):
    histogram = analysed.table(Table.LATENCY_HISTOGRAM)
    expected: dict[int, int] = {}
    for latency, count in analysed.expected.latencies.items():
        edge = max(e for e in HISTOGRAM_EDGES if latency >= e)
        expected[edge] = expected.get(edge, 0) + count
    assert by_key(histogram, ["bin_ms"], ["deliveries"]) == {(k,): (v,) for k, v in expected.items()}


def test_document_figures(analysed):
    documents = analysed.table(Table.DOCUMENTS).set_index("doc")
    span_s = (analysed.expected.end_ts - analysed.expected.start_ts) / 1000
    for name, want in analysed.expected.documents.items():
        row = documents.loc[name]
        for figure in (
            "appends",
            "bytes",
            "deliveries",
            "resends",
            "evictions",
            "resyncs",
            "trims",
            "trimmed",
            "stream_length",
        ):
            assert row[figure] == getattr(want, figure), (name, figure)
        assert row["appends_per_s"] == pytest.approx(want.appends / span_s)
        assert row["bytes_per_s"] == pytest.approx(want.bytes / span_s)
        assert row["resend_ratio"] == pytest.approx(want.resends / want.deliveries)
        assert row["trim_efficiency"] == pytest.approx(want.trimmed / want.appends)


def test_resyncs_by_reason(analysed):
    resyncs = analysed.table(Table.RESYNCS)
    expected = analysed.expected.resyncs_by_reason
    assert by_key(resyncs, ["reason"], ["resyncs"]) == {(reason,): (count,) for reason, count in expected.items()}


def test_evictions_and_resends_over_time(analysed):
    events = analysed.table(Table.EVENTS_OVER_TIME)
    evictions = events[events["type"] == "evict"]
    assert evictions["events"].sum() == 1
    half = SCENARIO.tick_ts(SCENARIO.ticks // 2)
    assert evictions["bucket"].iloc[0] == pd.Timestamp(half // 10_000 * 10_000, unit="ms", tz="UTC")
    assert events[events["type"] == "resend"]["events"].sum() == analysed.expected.resends


def test_summary_counts_dropped_and_broken_lines(analysed):
    summary, expected = analysed.summary, analysed.expected
    assert analysed.table(Table.SUMMARY).iloc[0].to_dict() == pytest.approx(summary)  # the table holds the same
    assert (summary["events"], summary["corrupt_lines"], summary["other_version_lines"]) == (
        expected.events,
        expected.corrupt_lines,
        expected.other_version_lines,
    )
    assert (summary["start_ts"], summary["end_ts"], summary["dropped_events"]) == (
        expected.start_ts,
        expected.end_ts,
        expected.dropped_events,
    )
    assert summary["resend_ratio"] == pytest.approx(expected.resends / expected.deliveries)
    assert summary["sessions"] == len(expected.statuses)
    assert summary["status_ok"] == sum(s is Status.OK for s in expected.statuses.values())


def test_top_lagging_and_hottest(analysed):
    top = analysed.table(Table.TOP_LAGGING).sort_values("rank")
    assert list(top["rank"]) == list(range(1, len(top) + 1))
    # Stalled, stopped and evicted at half time, all at the same offset: equally far behind, then by name.
    assert list(top["session"][:3]) == ["d0-evict", "d0-stall", "d0-stop"]
    assert list(top["current_lag_ms"]) == sorted(top["current_lag_ms"], reverse=True)
    hottest = analysed.table(Table.HOTTEST_DOCUMENTS).sort_values("rank")
    assert list(hottest["doc"]) == ["d1", "d0"]  # same appends, d1's updates are twice the size


def test_current_lag_and_stream_lengths_come_from_redis(analysed):
    current = analysed.table(Table.CURRENT_LAG)
    assert by_key(current, ["doc", "session"], ["offset", "lag_entries", "lag_ms"]) == {
        ("d0", "a"): ("5-0", 1, 2),
        ("d0", "b"): ("7-1", 0, 0),
    }
    streams = analysed.table(Table.STREAMS)
    assert by_key(streams, ["doc"], ["length", "bytes", "first_ms", "last_ms"]) == {
        ("d0",): (2, 40, 5, 7),
        ("d1",): (1, 5, 9, 9),
    }


def test_a_later_run_without_redis_removes_the_redis_tables(analysed, spark, tmp_path):
    from yrelay.spark_analytics.job import _remove_stale

    _remove_stale(analysed.out, set(Table) - {Table.CURRENT_LAG, Table.STREAMS})
    assert not (analysed.out / "current_lag").exists() and (analysed.out / "lag").exists()


def write_lines(path: Path, events: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "events-h-1-20260101T000000-0.jsonl").write_text(
        "".join(json.dumps({"v": 1, "process": "h:1", **event}) + "\n" for event in events)
    )
    return path


def test_latency_is_measured_to_the_first_later_covering_ack_within_a_run(spark, tmp_path):
    def deliver(ts, session, last):
        return {"ts": ts, "type": "deliver", "doc": "x", "session": session, "first": last, "last": last, "head": last}

    def ack(ts, session, offset):
        return {"ts": ts, "type": "ack", "doc": "x", "session": session, "offset": offset, "head": offset}

    events = [
        deliver(100, "a", "10-0"),
        deliver(101, "a", "11-0"),
        ack(150, "a", "10-0"),
        ack(170, "a", "11-0"),  # 50, 69
        deliver(200, "b", "20-5"),
        ack(200, "b", "20-5"),  # an ack in the same ms covers it: 0
        ack(250, "c", "30-0"),
        deliver(300, "c", "30-0"),
        ack(320, "c", "30-0"),  # an earlier ack does not count: 20
        deliver(400, "d", "40-0"),
        ack(410, "d", "39-0"),
        ack(420, "d", "40-0"),  # must cover, not just follow: 20
        deliver(500, "e", "50-0"),
        ack(510, "e", "49-0"),
        ack(520, "e", "48-0"),
        ack(530, "e", "50-0"),  # rewind first
        deliver(600, "f", "60-0"),  # never acked
    ]
    log = read_events(spark, write_lines(tmp_path / "events", events))
    try:
        found = {(r["session"], r["ts"]): r["latency_ms"] for r in delivery_latency(log.events).collect()}
    finally:
        log.release()
    assert found == {
        ("a", 100): 50,
        ("a", 101): 69,
        ("b", 200): 0,
        ("c", 300): 20,
        ("d", 400): 20,
        ("e", 500): None,
        ("f", 600): None,
    }


def test_scenarios_too_short_for_the_window_are_refused():
    with pytest.raises(ValueError):
        Scenario(seconds=5)
    with pytest.raises(ValueError):
        Scenario(latencies_ms=(600,))
    assert Behaviour.SLOW in Scenario().special


async def test_a_real_servers_log_and_redis(spark, redis_url, make_client, tmp_path):
    """The writer's real output and the real Redis source, end to end: nothing
    the server writes is dropped as corrupt, and an operator's eviction is an ERR."""
    writer, reader = await edit_then_evict_reader(redis_url, make_client, tmp_path, "live", 5)

    summary = run(spark, JobConfig(tmp_path / "events", tmp_path / "out", redis_url=redis_url))
    assert (summary["corrupt_lines"], summary["other_version_lines"]) == (0, 0)
    assert (summary["appends"], summary["evictions"], summary["documents"]) == (5, 1, 1)
    assert summary["acked_deliveries"] >= 1
    status = read_table(tmp_path / "out", Table.STATUS).set_index("session")
    assert status.loc[reader, "status"] == "ERR"
    assert status.loc[reader, "last_problem"] == "evict:operator"
    assert by_key(read_table(tmp_path / "out", Table.STREAMS), ["doc"], ["length"]) == {("live",): (5,)}
    current = read_table(tmp_path / "out", Table.CURRENT_LAG)
    assert reader not in set(current["session"]) and writer in set(current["session"])


async def test_group_lag_beside_session_lag(spark, redis_url, make_client, tmp_path):
    """A real server's log and a consumer group's own log in one directory:
    ``yrelay analyze`` measures the group's lag per ack like a session's (the
    server's appends give the entries), and sums it up per group."""
    from redis.asyncio import Redis

    from yrelay.consumers import ConsumerGroup
    from yrelay.observability.eventlog import EventLog

    writer, _ = await edit_then_evict_reader(redis_url, make_client, tmp_path, "grouped", 6)
    log = EventLog(tmp_path / "events", process="indexer:1").start()
    redis = Redis.from_url(redis_url)
    last = (await redis.xrevrange("yrelay:{grouped}:stream", count=1))[0][0].decode()
    try:
        async with ConsumerGroup(redis, "indexer", lease=1.2, events=log, batch_size=2) as group:
            async for batch in group.batches():
                await batch.ack()
                if batch.doc == "grouped" and str(batch.offset) == last:
                    break
    finally:
        log.stop()
        await redis.aclose()
    summary = run(spark, JobConfig(tmp_path / "events", tmp_path / "out"))
    assert summary["consumer_groups"] == 1 and summary["sessions"] >= 1  # beside the sessions
    lag = read_table(tmp_path / "out", Table.GROUP_LAG)
    rows = lag[lag["doc"] == "grouped"]
    # Acks of one batch after another can share a millisecond: ordered as the
    # product orders them (time, then the acked offset), not by time alone.
    order = sorted(rows.index, key=lambda i: (rows.at[i, "ts"], *map(int, rows.at[i, "offset"].split("-"))))
    rows = rows.loc[order]
    # Batches of 2 over 6 appends: 4, 2, then 0 entries behind the head when acked.
    assert list(rows["lag_entries"]) == [4, 2, 0]
    assert (rows["group"] == "indexer").all() and rows["lag_ms"].iloc[-1] == 0
    groups = read_table(tmp_path / "out", Table.GROUPS)
    row = groups[groups["group"] == "indexer"].iloc[0]
    assert (row["acks"], row["documents"], row["last_lag_entries"]) == (3, 1, 0)


# ------------------------------------------------------------------ issue 37

T0 = 1_767_225_600_000


def _at(ms: int) -> str:
    return f"{T0 + ms}-0"


def operator_log(path: Path) -> Path:
    """A hand-built log of one document ``k`` with known answers (times in ms after T0):

    - ``x`` appends 1000-0 (schema 1: no ``connect``, no subject);
    - writer ``w`` (subject alice) appends 2000-0, 3000-0, 4000-0; acks at
      4500 with offset 1000-0 and head 4000-0 (the three entries in between
      are its own: lag 0), then appends 7000-0 and 8000-0 after its last ack;
    - ``r1``..``r3`` ack everything, close at 5000, are evicted by GC at 10000;
    - ``q`` (schema 1) acks 2000-0, is delivered 3000-0, closes at 3500
      without acking it and never comes back;
    - ``s`` (subject erin) acks 2000-0 at 2100, then stays connected and
      silent while deliveries and a resend go on: STOP, 4 entries behind.
    """

    def v2(event: dict) -> dict:
        return {"v": 2, "process": "h:2", **event}

    def append(ms: int, session: str) -> dict:
        return {
            "ts": T0 + ms,
            "type": "append",
            "doc": "k",
            "session": session,
            "offset": _at(ms),
            "clock": ms,
            "bytes": 10,
            "duplicate": False,
        }

    def deliver(ms: int, session: str, entry: int) -> dict:
        return {
            "ts": T0 + ms,
            "type": "deliver",
            "doc": "k",
            "session": session,
            "first": _at(entry),
            "last": _at(entry),
            "entries": 1,
            "bytes": 10,
            "head": _at(entry),
        }

    def ack(ms: int, session: str, offset: int, head: int) -> dict:
        return {"ts": T0 + ms, "type": "ack", "doc": "k", "session": session, "offset": _at(offset), "head": _at(head)}

    readers = ["r1", "r2", "r3"]
    subjects = {"w": "alice", "r1": "bob", "r2": "carol", "r3": "dave", "s": "erin"}
    connects = [
        v2({"ts": T0, "type": "connect", "session": who, "resumed": False, "subject": subject})
        for who, subject in subjects.items()
    ]
    events = [
        append(1000, "x"),
        *[deliver(1001, who, 1000) for who in ["w", "s", "q", *readers]],
        *[ack(1100, who, 1000, 1000) for who in ["w", "s", "q", *readers]],
    ]
    for ms in (2000, 3000, 4000):
        events += [
            append(ms, "w"),
            *[deliver(ms + 1, who, ms) for who in ["s", *readers]],
            *[ack(ms + 100, who, ms, ms) for who in readers],
        ]
    events += [
        deliver(2001, "q", 2000),
        ack(2100, "q", 2000, 2000),
        ack(2100, "s", 2000, 2000),
        deliver(3001, "q", 3000),
        {"ts": T0 + 3500, "type": "disconnect", "session": "q", "docs": 1, "duration_ms": 3500},
        ack(4500, "w", 1000, 4000),
    ]
    events += [
        v2({"ts": T0 + 5000, "type": "disconnect", "session": who, "docs": 1, "duration_ms": 5000}) for who in readers
    ]
    for ms in (7000, 8000):
        events += [append(ms, "w"), deliver(ms + 1, "s", ms)]
    events += [
        {"ts": T0 + 9000, "type": "resend", "doc": "k", "session": "s", "offset": _at(2000), "entries": 4},
        deliver(9000, "s", 8000),
    ]
    events += [
        {"ts": T0 + 10_000, "type": "evict", "doc": "k", "session": who, "mode": "relative"} for who in [*readers, "q"]
    ]
    write_lines(path, events)  # schema 1, beside the schema-2 lines below
    (path / "events-h-2-20260101T000000-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in connects))
    return path


@pytest.fixture(scope="module")
def operator_run(spark, tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("operator")
    summary = run(spark, JobConfig(operator_log(root / "events"), root / "out", options=Options(bucket_seconds=1)))
    return root / "out", summary


def test_own_appends_never_count_and_closed_sessions_left(operator_run):
    out, summary = operator_run
    status = read_table(out, Table.STATUS).set_index("session")
    assert dict(status["status"]) == {
        "w": "OK",
        "r1": "LEFT",
        "r2": "LEFT",
        "r3": "LEFT",
        "q": "LEFT_UNACKED",
        "s": "STOP",
    }
    # The writer: its own five appends after its offset are no lag, at its last ack or at the end.
    assert tuple(status.loc["w", ["lag_entries", "lag_ms", "current_lag_entries", "current_lag_ms"]]) == (0, 0, 0, 0)
    # The stuck session: the writer's four appends after its offset, 8000 - 2000 ms.
    assert tuple(status.loc["s", ["current_lag_entries", "current_lag_ms"]]) == (4, 6000)
    assert status.loc["r1", ["current_lag_entries", "current_lag_ms"]].isna().all()  # gone: no lag now
    assert status.loc["r1", "left_ts"] == T0 + 5000 and status.loc["r1", "last_problem"] == "evict:relative"
    # Subjects from the schema-2 connects; none for the schema-1 session.
    assert (status.loc["w", "subject"], status.loc["s", "subject"], status.loc["q", "subject"]) == (
        "alice",
        "erin",
        None,
    )
    assert (summary["other_version_lines"], summary["corrupt_lines"], summary["events"]) == (0, 0, 61)
    assert (summary["status_left"], summary["status_stop"], summary["status_err"]) == (3, 1, 0)
    assert (summary["worst_lag_entries"], summary["worst_lag_ms"], summary["sessions_connected"]) == (4, 6000, 2)
    top = read_table(out, Table.TOP_LAGGING)
    assert list(top["session"]) == ["s"]  # neither the writer nor the sessions that left


def test_a_silent_session_grows_on_the_lag_timeline(operator_run):
    out, _ = operator_run
    timeline = read_table(out, Table.LAG_TIMELINE)
    timeline["second"] = (timeline["bucket"].astype("datetime64[ms, UTC]").astype("int64") - T0) // 1000
    stuck = timeline[timeline["session"] == "s"].sort_values("second")
    assert [tuple(row) for row in stuck[["second", "lag_entries", "lag_ms", "acks"]].itertuples(index=False)] == [
        (1, 0, 0, 1),
        (2, 0, 0, 1),
        (3, 1, 1000, 0),
        (4, 2, 2000, 0),
        (5, 2, 2000, 0),
        (6, 2, 2000, 0),
        (7, 3, 5000, 0),
        (8, 4, 6000, 0),
        (9, 4, 6000, 0),
        (10, 4, 6000, 0),
    ]
    writer = timeline[timeline["session"] == "w"]
    assert len(writer) == 10 and (writer["lag_entries"] == 0).all() and (writer["lag_ms"] == 0).all()
    left = timeline[timeline["session"] == "r1"]
    assert left["second"].max() == 5  # sampled until it left, not after


def test_the_stuck_session_heads_the_sessions_not_ok(operator_run):
    from yrelay.spark_analytics.dashboard import troubled_sessions

    out, _ = operator_run
    troubled = troubled_sessions(read_table(out, Table.STATUS))
    assert list(troubled["session"]) == ["s", "q"]  # STOP first; a clean LEFT and OK are not trouble
    assert (troubled.iloc[0]["subject"], troubled.iloc[0]["current_lag_s"]) == ("erin", 6.0)
