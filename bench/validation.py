"""Cost of validating one update before it is appended: y-py's decode into a
scratch document vs yrelay's own layout decoder (update_format), which
validation now runs too. Prints microseconds per update.

    .venv/bin/python bench/validation.py [--updates 20000]
"""

from __future__ import annotations

import argparse
import time

import y_py

from yrelay import crdt, update_format


def sample_updates(count: int) -> list[bytes]:
    """Typing: small inserts into one text, as a browser sends them."""
    doc = crdt.new_doc(1)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for index in range(count):
        crdt.insert_text(doc, len(crdt.text_of(doc)) // 2, f"w{index} ")
    return updates


def per_update_us(check, updates: list[bytes]) -> float:
    started = time.perf_counter()
    for update in updates:
        check(update)
    return (time.perf_counter() - started) / len(updates) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=20_000)
    updates = sample_updates(parser.parse_args().updates)
    ypy = per_update_us(lambda u: y_py.apply_update(y_py.YDoc(), u), updates)
    ours = per_update_us(update_format.decode, updates)
    full = per_update_us(crdt.validate_update, updates)
    print("| check | us per update |")
    print("| --- | ---: |")
    print(f"| y-py decode into a scratch doc | {ypy:.1f} |")
    print(f"| update_format.decode | {ours:.1f} |")
    print(f"| crdt.validate_update (both) | {full:.1f} |")


if __name__ == "__main__":
    main()
