"""The lib0 decoders on their hot paths, timed in-process: what the server
runs per update (``update_format.read_layout``, ``update_format.decode``),
per presence frame (``awareness.decode_update``) and per reconciliation
round (``reconciliation.messages.decode``). Public functions only, so the
same script measures any revision (run it before and after a codec change).

    .venv/bin/python bench/codec.py [--repeat 7]

Prints, per workload, the best and the median of ``--repeat`` runs. To
compare with another revision, run it over that revision's package:

    git archive REV yrelay | tar -x -C /tmp/base && PYTHONPATH=/tmp/base .venv/bin/python bench/codec.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from yrelay.reconciliation import messages
from yrelay.yjs import awareness, crdt, update_format

WORDS = ("the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ", "dog ")


def typing_trace(count: int = 1000, client_id: int = 7) -> list[bytes]:
    """``count`` updates of one writer typing words and correcting itself."""
    doc, updates, rng, cursor = crdt.new_doc(client_id), [], random.Random(1), 0
    crdt.observe_updates(doc, updates.append)
    while len(updates) < count:
        if cursor > 4 and rng.random() < 0.2:
            crdt.replace_text(doc, cursor - 2, 2, "e")
            cursor -= 1
        else:
            word = rng.choice(WORDS)
            crdt.insert_text(doc, cursor, word)
            cursor += len(word)
    return updates


def scattered_state(size: int = 1 << 20) -> bytes:
    """A document state of about ``size`` bytes made of many small structs:
    two clients type single characters near the start of the text (typing
    backwards: Yjs cannot merge such items, each stays a struct with its
    origins; near the start, so y-py finds the index fast)."""
    rng = random.Random(2)
    docs = [crdt.new_doc(11), crdt.new_doc(12)]
    while True:
        for doc in docs:
            for _ in range(5000):
                crdt.insert_text(doc, rng.randint(0, 8), rng.choice("abcdefgh"))
        crdt.apply_update(docs[1], crdt.encode_state(docs[0], crdt.state_vector(docs[1])))
        crdt.apply_update(docs[0], crdt.encode_state(docs[1], crdt.state_vector(docs[0])))
        state = crdt.encode_state(docs[0])
        if len(state) >= size:
            return state


def paste(size: int = 1 << 20) -> bytes:
    doc = crdt.new_doc(21)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    crdt.insert_text(doc, 0, ("0123456789abcdef" * (size // 16 + 1))[:size])
    return updates[0]


def presence_update() -> bytes:
    entries = [
        awareness.AwarenessEntry(1000 + i, i + 1, f'{{"user":{{"name":"user {i}","color":"#30bced"}}}}')
        for i in range(awareness.MAX_ENTRIES)
    ]
    return awareness.encode_update(entries)


def reconciliation_reply() -> bytes:
    ids = sorted(f"team-{i // 50:04d}/doc-{i:06d}" for i in range(2000))
    encoder = messages.Encoder()
    for start in range(0, len(ids), 100):
        chunk = ids[start : start + 100]
        lower = "" if start == 0 else ids[start - 1] + "\0"
        encoder.ids(lower, chunk[-1] + "\0", chunk)
    return encoder.finish()


def timed(label: str, run: Callable[[], object], repeat: int, unit: str, per: int = 1) -> None:
    run()  # warm up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) / per)
    scale = {"ms": 1e3, "us": 1e6}[unit]
    print(f"| {label} | {min(times) * scale:,.1f} {unit} | {statistics.median(times) * scale:,.1f} {unit} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    trace, state, big = typing_trace(), scattered_state(), paste()
    hello, reply, vector = presence_update(), reconciliation_reply(), _state_vector()
    layout = update_format.read_layout(state)
    structs = sum(len(section.structs) for section in layout.sections)
    print(
        f"typing trace: {len(trace)} updates, {sum(map(len, trace)):,} bytes; scattered state: "
        f"{len(state):,} bytes, {structs:,} structs; paste: {len(big):,} bytes; "
        f"presence: {len(hello)} bytes; reconciliation reply: {len(reply):,} bytes\n"
    )
    print("| workload | best | median |")
    print("| --- | ---: | ---: |")
    timed(
        "read_layout, 1,000-update typing trace (all)",
        lambda: [update_format.read_layout(u) for u in trace],
        args.repeat,
        "ms",
    )
    timed("read_layout, 1 MiB scattered state", lambda: update_format.read_layout(state), args.repeat, "ms")
    timed("read_layout, 1 MiB paste", lambda: update_format.read_layout(big), args.repeat, "ms")
    timed("decode (coverage), 1 MiB scattered state", lambda: update_format.decode(state), args.repeat, "ms")
    timed(
        "decode_state_vector, 20 clients, x1000",
        lambda: [update_format.decode_state_vector(vector) for _ in range(1000)],
        args.repeat,
        "ms",
    )
    timed(
        "awareness.decode_update, 16 entries, x1000",
        lambda: [awareness.decode_update(hello) for _ in range(1000)],
        args.repeat,
        "ms",
    )
    timed(
        "messages.decode, 2,000 ids, x10",
        lambda: [messages.decode(reply, messages.REPLY_MODES, 10_000) for _ in range(10)],
        args.repeat,
        "ms",
    )


def _state_vector() -> bytes:
    docs = [crdt.new_doc(client) for client in range(100, 120)]
    target = crdt.new_doc(99)
    for doc in docs:
        crdt.insert_text(doc, 0, "x" * 5000)
        crdt.apply_update(target, crdt.encode_state(doc))
    return crdt.state_vector(target)


if __name__ == "__main__":
    main()
