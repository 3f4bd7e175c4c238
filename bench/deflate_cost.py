"""CPU and bytes of permessage-deflate per yrelay frame, as the server pays
them with ``ws_compression`` on (no context takeover: a compressor per
message, window 2**12, memLevel 5) and with uvicorn's default (one
compressor per connection, kept). Frames: ``deliver`` frames of 1, 10 and
100 entries of ~16-byte Yjs updates (the bench's typing edits), an ``ack``.

    PYTHONPATH=. .venv/bin/python bench/deflate_cost.py
"""

from __future__ import annotations

import base64
import json
import time
import zlib

from yrelay_tools.bench.edits import writer_edits

ROUNDS = 200


def delivers(entries: int) -> list[bytes]:
    """``ROUNDS`` consecutive deliver frames of one typing writer, ``entries`` each."""
    updates = writer_edits(client_id=12345, count=entries * ROUNDS)
    return [
        json.dumps(
            {
                "op": "deliver",
                "doc": "notes/today",
                "entries": [
                    {"id": f"{1795528884422 + r * entries + i}-0", "update": base64.b64encode(u).decode()}
                    for i, u in enumerate(updates[r * entries : (r + 1) * entries])
                ],
            },
            separators=(",", ":"),
        ).encode()
        for r in range(ROUNDS)
    ]


def per_message(frames: list[bytes], fresh: bool) -> tuple[float, float]:
    """Mean microseconds and bytes to compress one frame (RFC 7692: sync flush, tail cut)."""
    kept = zlib.compressobj(wbits=-12, memLevel=5)
    size = 0
    start = time.process_time()
    for frame in frames:
        encoder = zlib.compressobj(wbits=-12, memLevel=5) if fresh else kept
        size += len(encoder.compress(frame) + encoder.flush(zlib.Z_SYNC_FLUSH)) - 4
    return (time.process_time() - start) / len(frames) * 1e6, size / len(frames)


def main() -> None:
    frames = {
        "deliver, 1 entry": delivers(1),
        "deliver, 10 entries": delivers(10),
        "deliver, 100 entries": delivers(100),
        "ack": [b'{"op":"ack","doc":"notes/today","offset":"%d-0"}' % (1795528884422 + r) for r in range(ROUNDS)],
    }
    print("| frame | bytes | no context takeover: µs, bytes | context kept: µs, bytes |")
    print("| --- | ---: | --- | --- |")
    for name, frame in frames.items():
        fresh_us, fresh_size = per_message(frame, fresh=True)
        kept_us, kept_size = per_message(frame, fresh=False)
        print(
            f"| {name} | {sum(map(len, frame)) / len(frame):,.0f} | {fresh_us:.1f}, {fresh_size:,.0f} | "
            f"{kept_us:.1f}, {kept_size:,.0f} |"
        )


if __name__ == "__main__":
    main()
