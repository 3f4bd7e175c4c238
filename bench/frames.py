"""Per-frame cost of the hot path's frames: decoding an ``update`` and an
``ack`` (``protocol.parse_client_frame``) and encoding an ``appended`` and a
one-entry ``deliver`` (``protocol.encode``), in us per frame.

Run it against two trees to compare (issue 20, BENCHMARKS.md):

    cd /tmp && PYTHONPATH=/work/main /work/main/.venv/bin/python /work/wt-perf-frames/bench/frames.py
    cd /tmp && PYTHONPATH=/work/wt-perf-frames /work/main/.venv/bin/python /work/wt-perf-frames/bench/frames.py
"""

from __future__ import annotations

import timeit

from yrelay import protocol

UPDATE = '{"op":"update","doc":"doc-123","clock":42,"update":"AQHcq5HbBgAEAQR0ZXh0AWE="}'
ACK = '{"op":"ack","doc":"doc-123","offset":"1700000000000-12"}'


def us(work, number: int = 100_000) -> float:
    return min(timeit.repeat(work, number=number, repeat=5)) / number * 1e6


def main() -> None:
    print(f"yrelay from {protocol.__file__}")
    print("| frame | us per frame |")
    print("| --- | ---: |")
    print(f"| decode update | {us(lambda: protocol.parse_client_frame(UPDATE)):.2f} |")
    print(f"| decode ack | {us(lambda: protocol.parse_client_frame(ACK)):.2f} |")
    appended = lambda: protocol.encode(protocol.appended("doc-123", 42, "1700000000000-12", False))  # noqa: E731
    print(f"| build + encode appended | {us(appended):.2f} |")
    deliver = lambda: protocol.encode(protocol.deliver("doc-123", [("1700000000000-12", "AQHcq5HbBgAEAQR0ZXh0AWE=")]))  # noqa: E731
    print(f"| build + encode deliver (1 entry) | {us(deliver):.2f} |")


if __name__ == "__main__":
    main()
