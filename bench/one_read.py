"""The write path's read of an update, before and after issue 34 folded the
known-safe decision into it: before, ``read_layout`` then ``known_safe``
walked the structs again (``yrelay/safe_updates.py``); after, one
``read_layout`` returns the layout with ``known_safe`` decided. Both
revisions run in this one process, interleaved, over the same typical
updates (typing, deleting, formatting, embeds and map edits of y-py and
pycrdt documents with 32-bit client ids, as browsers write them).

    PYTHONPATH=. .venv/bin/python bench/one_read.py [--updates 10000] [--repeat 7] [--before ca9f426]

``--before`` names the revision whose ``update_format``, ``safe_updates``
and ``lib0`` are timed as "before" (read with ``git show``).
"""

from __future__ import annotations

import argparse
import importlib
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pycrdt

from yrelay.yjs import crdt, update_format


def typical_updates(count: int, seed: int = 1) -> list[bytes]:
    """Half y-py typing and deleting, half pycrdt rich-text and map edits."""
    rng = random.Random(seed)
    updates: list[bytes] = []
    ydoc = crdt.new_doc(rng.randrange(2**32))
    crdt.observe_updates(ydoc, updates.append)
    while len(updates) < count // 2:
        length = len(crdt.text_of(ydoc))
        if length > 3 and rng.random() < 0.25:
            crdt.delete_text(ydoc, rng.randrange(length - 1), 1)
        else:
            crdt.insert_text(ydoc, rng.randrange(length + 1), rng.choice(["a", "b ", "ü", "the "]))
    pdoc = pycrdt.Doc(client_id=rng.randrange(2**32))
    pdoc.observe(lambda event: updates.append(event.update))
    text, meta = pdoc.get("t", type=pycrdt.Text), pdoc.get("m", type=pycrdt.Map)
    while len(updates) < count:
        roll = rng.random()
        if roll < 0.6 or len(text) < 4:
            text.insert(
                rng.randrange(len(text) + 1), rng.choice(["x", "yz", "é"]), attrs=rng.choice([None, {"b": True}])
            )
        elif roll < 0.75:
            start = rng.randrange(len(text) - 2)
            text.format(start, start + 2, rng.choice([{"b": True}, {"link": "https://a.b/c"}]))
        elif roll < 0.85:
            del text[rng.randrange(len(text))]
        elif roll < 0.9:
            text.insert_embed(rng.randrange(len(text) + 1), {"image": "a.png"})
        else:
            meta[rng.choice(["title", "n"])] = rng.choice(["draft", 3, [1, "x"]])
    return updates[:count]


def before_modules(revision: str) -> tuple[ModuleType, ModuleType]:
    """``update_format`` and ``safe_updates`` of ``revision``, as a package of their own."""
    package = Path(tempfile.mkdtemp()) / "yrelay_before"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("lib0", "update_format", "safe_updates"):
        source = subprocess.run(["git", "show", f"{revision}:yrelay/{name}.py"], capture_output=True, check=True)
        (package / f"{name}.py").write_bytes(source.stdout)
    sys.path.insert(0, str(package.parent))
    return importlib.import_module("yrelay_before.update_format"), importlib.import_module("yrelay_before.safe_updates")


def us_per_update(work: Callable[[bytes], object], updates: list[bytes]) -> float:
    started = time.perf_counter()
    for update in updates:
        work(update)
    return (time.perf_counter() - started) / len(updates) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", default="ca9f426")
    args = parser.parse_args()
    old_format, old_safe = before_modules(args.before)
    updates = typical_updates(args.updates)
    old = [old_safe.known_safe(u, old_format.read_layout(u, strict=True)) for u in updates]
    new = [update_format.read_layout(u, strict=True, decide=True).known_safe for u in updates]
    assert old == new, "the decisions differ"
    workloads = {
        "strict read + known-safe decision (the write path)": (
            lambda u: old_safe.known_safe(u, old_format.read_layout(u, strict=True)),
            lambda u: update_format.read_layout(u, strict=True, decide=True).known_safe,
        ),
        "lenient read (admission of stored entries, sync diffs)": (old_format.read_layout, update_format.read_layout),
    }
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in workloads}
    for _ in range(args.repeat):  # interleaved: a busy machine slows both alike
        for name, (before, after) in workloads.items():
            times[name][0].append(us_per_update(before, updates))
            times[name][1].append(us_per_update(after, updates))
    size = sum(map(len, updates)) / len(updates)
    print(
        f"{len(updates)} typical updates ({size:.0f} bytes on average), {sum(new)} known-safe; "
        f"best / median of {args.repeat}"
    )
    print("| per update | before: two walks (us) | after: one walk (us) | after / before (best) |")
    print("| --- | ---: | ---: | ---: |")
    for name, (before, after) in times.items():
        print(
            f"| {name} | {min(before):.2f} / {statistics.median(before):.2f} "
            f"| {min(after):.2f} / {statistics.median(after):.2f} | {min(after) / min(before):.2f} |"
        )


if __name__ == "__main__":
    main()
