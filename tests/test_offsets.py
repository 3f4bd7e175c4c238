"""Stream id <-> tracker score: exact and ordered, including >999 per ms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yrelay.storage.append import append_args, append_keys
from yrelay.storage.offsets import MAX_EXACT_SCORE, MAX_SEQ, InvalidOffset, StreamId, next_stream_id
from yrelay.storage.reads import DocumentStore
from yrelay.yjs.admission import Needs

NOW = st.integers(min_value=0, max_value=2**41)  # ms timestamps until year ~2039 and beyond


@given(st.lists(st.tuples(NOW, st.integers(1, 3000)), min_size=1, max_size=30))
def test_append_ids_increase_and_scores_stay_exact(bursts):
    """Any schedule of clock readings (also going backwards) and burst sizes:
    ids strictly increase, seq never passes 999, scores are exact and ordered."""
    last = None
    previous_score = -1
    for now_ms, count in bursts:
        for _ in range(count):
            current = next_stream_id(last, now_ms)
            assert last is None or current > last
            assert current.seq <= MAX_SEQ
            score = current.score()
            assert score > previous_score
            assert score < MAX_EXACT_SCORE and float(score) == score
            assert StreamId.from_score(float(score)) == current
            assert StreamId.parse(str(current)) == current
            last, previous_score = current, score


@given(st.integers(0, 2**44), st.integers(0, MAX_SEQ), st.integers(0, 2**44), st.integers(0, MAX_SEQ))
def test_score_order_matches_id_order(ms_a, seq_a, ms_b, seq_b):
    a, b = StreamId(ms_a, seq_a), StreamId(ms_b, seq_b)
    assert (a < b) == (a.score() < b.score())
    assert (a == b) == (a.score() == b.score())


def test_padding_on_the_right_side():
    """yrb-actioncable's bug: ts-1 and ts-10 must not collide or misorder."""
    ids = [StreamId(5, 1), StreamId(5, 10), StreamId(5, 100), StreamId(6, 0)]
    scores = [i.score() for i in ids]
    assert scores == sorted(scores) and len(set(scores)) == 4


@pytest.mark.parametrize("text", ["", "1", "1-", "-1", "1-1000", "a-1", "1-1-1", "9" * 16 + "-0", " 1-1"])
def test_parse_rejects_ids_the_append_path_cannot_produce(text):
    with pytest.raises(InvalidOffset):
        StreamId.parse(text)


async def test_burst_on_a_real_stream_keeps_seq_below_1000(redis_client):
    """5,000 appends in one script call land within one or two real
    milliseconds; every id must still map to a distinct, ordered score."""
    store = DocumentStore(redis_client)
    await store.load_scripts()
    nothing = Needs()
    args = append_args([("burst-session", clock, b"\x00\x00", nothing) for clock in range(5000)])
    result = await store.scripts.append(keys=append_keys("burst"), args=args)
    ids = [StreamId.parse(entry_id.decode()) for entry_id, _ in result]
    assert len(ids) == 5000
    assert all(i.seq <= MAX_SEQ for i in ids)
    scores = [i.score() for i in ids]
    assert scores == sorted(scores) and len(set(scores)) == 5000
    stream = await redis_client.xrange("yrelay:{burst}:stream")
    assert [StreamId.parse(e.decode()) for e, _ in stream] == ids
    # the next append still goes after the borrowed milliseconds
    [(later, _)] = await store.scripts.append(
        keys=append_keys("burst"), args=append_args([("s", 1, b"\x00\x00", nothing)])
    )
    assert StreamId.parse(later.decode()) > ids[-1]
