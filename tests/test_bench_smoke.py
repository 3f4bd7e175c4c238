"""`yrelay bench` end to end on a tiny load: the generator's processes, a real
yrelay server on its own redis-server, the report. No timing is asserted."""

from __future__ import annotations

from pathlib import Path

from yrelay_tools.bench import BenchConfig, run_bench
from yrelay_tools.bench.drivers import sync_message
from yrelay_tools.bench.edits import read_uint, update_key, writer_edits


def test_edits_are_named_by_their_first_struct() -> None:
    updates = writer_edits(client_id=77, count=200)
    keys = [update_key(update) for update in updates]
    assert len(set(keys)) == 200 and all(key is not None and key >> 32 == 77 for key in keys)
    assert keys == sorted(keys)  # one writer's clocks only grow


def test_sync_message_frames_an_update() -> None:
    update = writer_edits(client_id=5, count=1)[0]
    message = sync_message(2, update)
    length, pos = read_uint(message, 2)
    assert message[:2] == b"\x00\x02" and message[pos:] == update and length == len(update)


def test_hot_scenario_delivers_every_acked_update_to_every_reader(tmp_path: Path) -> None:
    config = BenchConfig(scenarios=("hot",), targets=("yrelay", "broadcast"), hot_rates=[40.0], duration=1.0, readers=3)
    report = run_bench(config, "yrelay bench hot (smoke)", progress=lambda _: None, work_dir=tmp_path)
    [ladder] = report.ladders
    runs = {run.target: run for run in ladder.runs}
    ours = runs["yrelay"]
    assert ours.updates == 40
    assert ours.acked == ours.updates  # every update acked (appended) ...
    assert ours.expected_deliveries == ours.updates * 3
    assert ours.deliveries == ours.expected_deliveries  # ... and delivered to every reader
    assert ours.complete and ours.errors == 0
    # the server's validator and engine worker processes count as its CPU, listed apart
    assert ours.cpu.keys() == {"server", "server workers", "redis"} and ours.redis_memory_per_doc is not None
    assert ours.p50_ms <= ours.p99_ms <= ours.max_ms
    broadcast = runs["bare uvicorn broadcast"]
    assert broadcast.acked is None and broadcast.deliveries == broadcast.expected_deliveries == 40 * 3
    markdown = report.markdown()
    for column in ("deliveries/s", "p99 ms", "server CPU s per 1k updates", "RSS per connection kB", "kept up"):
        assert column in markdown


def test_hot_scenario_over_yws_delivers_every_update_to_every_reader(tmp_path: Path) -> None:
    """yrelay driven with the y-websocket protocol on /yws (issue 19): no acks, every delivery."""
    config = BenchConfig(scenarios=("hot",), targets=("yrelay-yws",), hot_rates=[40.0], duration=1.0, readers=3)
    report = run_bench(config, "yrelay bench hot (smoke, /yws)", progress=lambda _: None, work_dir=tmp_path)
    [ladder] = report.ladders
    [run] = ladder.runs
    assert run.target == "yrelay /yws" and run.updates == 40
    assert run.expected_deliveries == run.updates * 3
    assert run.deliveries == run.expected_deliveries
    assert run.complete and run.errors == 0


def test_readers_wait_for_the_writers_whole_schedule_before_their_drain(tmp_path: Path) -> None:
    """A worker of readers only has no schedule of its own: its drain starts
    when the writers' schedule ends, not at the start (the last updates of a
    run longer than the drain were counted as lost)."""
    from dataclasses import replace

    from yrelay_tools.bench import load
    from yrelay_tools.bench.targets import make_target

    shape = replace(load.hot_document(40.0, duration=1.5, writers=2, readers=2), deflate=False)
    assert shape.sending == 1.5
    target = make_target("broadcast", tmp_path)
    target.start()
    try:
        run = load.run(target, shape, drain=0.5)
    finally:
        target.stop()
    assert run.deliveries == run.expected_deliveries == 60 * 2
    assert run.complete
