"""Known-answer tests of the analysis: a generated log whose lags, statuses and
latency percentiles are known by construction (yrelay.spark_analytics.generator),
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
from yrelay.spark_analytics.generator import Behaviour, Expected, Scenario, generate
from yrelay.spark_analytics.job import JobConfig, run
from yrelay.spark_analytics.latency import HISTOGRAM_EDGES, delivery_latency
from yrelay.spark_analytics.tables import Status, Table

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
        [("d0", "5-0", 5, 0, 5000, "w", 1, 10), ("d0", "7-1", 7, 1, 7001, "w", 2, 30),
         ("d1", "9-0", 9, 0, 9000, "w", 1, 5)],
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
    config = JobConfig(root / "events", root / "out", redis_url="redis://fake",
                       options=Options(bucket_seconds=BUCKET_S))
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
        for figure in ("appends", "bytes", "deliveries", "resends", "evictions", "resyncs", "trims", "trimmed",
                       "stream_length"):
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
        expected.events, expected.corrupt_lines, expected.other_version_lines)
    assert (summary["start_ts"], summary["end_ts"], summary["dropped_events"]) == (
        expected.start_ts, expected.end_ts, expected.dropped_events)
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
        ("d0", "a"): ("5-0", 1, 2), ("d0", "b"): ("7-1", 0, 0)}
    streams = analysed.table(Table.STREAMS)
    assert by_key(streams, ["doc"], ["length", "bytes", "first_ms", "last_ms"]) == {
        ("d0",): (2, 40, 5, 7), ("d1",): (1, 5, 9, 9)}


def test_a_later_run_without_redis_removes_the_redis_tables(analysed, spark, tmp_path):
    from yrelay.spark_analytics.job import _remove_stale

    _remove_stale(analysed.out, set(Table) - {Table.CURRENT_LAG, Table.STREAMS})
    assert not (analysed.out / "current_lag").exists() and (analysed.out / "lag").exists()


def write_lines(path: Path, events: list[dict]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "events-h-1-20260101T000000-0.jsonl").write_text(
        "".join(json.dumps({"v": 1, "process": "h:1", **event}) + "\n" for event in events))
    return path


def test_latency_is_measured_to_the_first_later_covering_ack_within_a_run(spark, tmp_path):
    def deliver(ts, session, last):
        return {"ts": ts, "type": "deliver", "doc": "x", "session": session, "first": last, "last": last, "head": last}

    def ack(ts, session, offset):
        return {"ts": ts, "type": "ack", "doc": "x", "session": session, "offset": offset, "head": offset}

    events = [
        deliver(100, "a", "10-0"), deliver(101, "a", "11-0"), ack(150, "a", "10-0"), ack(170, "a", "11-0"),  # 50, 69
        deliver(200, "b", "20-5"), ack(200, "b", "20-5"),  # an ack in the same ms covers it: 0
        ack(250, "c", "30-0"), deliver(300, "c", "30-0"), ack(320, "c", "30-0"),  # an earlier ack does not count: 20
        deliver(400, "d", "40-0"), ack(410, "d", "39-0"), ack(420, "d", "40-0"),  # must cover, not just follow: 20
        deliver(500, "e", "50-0"), ack(510, "e", "49-0"), ack(520, "e", "48-0"), ack(530, "e", "50-0"),  # rewind first
        deliver(600, "f", "60-0"),  # never acked
    ]
    log = read_events(spark, write_lines(tmp_path / "events", events))
    try:
        found = {(r["session"], r["ts"]): r["latency_ms"] for r in delivery_latency(log.events).collect()}
    finally:
        log.release()
    assert found == {("a", 100): 50, ("a", 101): 69, ("b", 200): 0, ("c", 300): 20, ("d", 400): 20,
                     ("e", 500): None, ("f", 600): None}


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
    from yrelay.consumers import ConsumerGroup
    from yrelay.eventlog import EventLog
    from redis.asyncio import Redis

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
    rows = lag[lag["doc"] == "grouped"].sort_values("ts")
    # Batches of 2 over 6 appends: 4, 2, then 0 entries behind the head when acked.
    assert list(rows["lag_entries"]) == [4, 2, 0]
    assert (rows["group"] == "indexer").all() and rows["lag_ms"].iloc[-1] == 0
    groups = read_table(tmp_path / "out", Table.GROUPS)
    row = groups[groups["group"] == "indexer"].iloc[0]
    assert (row["acks"], row["documents"], row["last_lag_entries"]) == (3, 1, 0)
