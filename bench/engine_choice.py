"""y-py 0.6.2 vs pycrdt 0.14.13 as the server's CRDT engine (issue 16).

Measures, per engine, on the same inputs:

- hostile inputs, each in a child process (an abort must not end the
  benchmark): the state vector ``/////w8=`` and the 21-byte update that
  aborts y-py; then a mutation fuzz for ``--fuzz-seconds`` (random bit flips,
  truncations, splices and random bytes over real updates and state vectors):
  how many inputs raised, applied, or killed the child;
- the fold of N one-character updates of one client, in order and reversed
  (y-py: one pass, yrelay's old re-apply loop, and one pass in sorted order;
  pycrdt: one pass), with how many characters the result keeps;
- the sync answer: load the N updates and encode the diff for a peer's state
  vector;
- whether each engine reloads its own encoding, and whether its encoding
  keeps pending structs and pending deletes.

    .venv/bin/python bench/engine_choice.py [--updates 1500] [--fuzz-seconds 20]

Figures: docs/architecture.md#crdt-engine.
"""

from __future__ import annotations

import argparse
import base64
import random
import subprocess
import sys
import time

HOSTILE_STATE_VECTOR = base64.b64decode("/////w8=")
ABORTS_YPY = bytes.fromhex("0101f430c4014501460af4313220c3bcf09f988000")

# ------------------------------------------------------------------ engines
# Each engine is a small dict of functions, so the child processes and the
# timings call the very same code.


def _ypy():
    import y_py

    def chain(count: int) -> list[bytes]:
        doc = y_py.YDoc(7)
        text = doc.get_text("text")
        updates: list[bytes] = []
        doc.observe_after_transaction(lambda event: updates.append(event.get_update()))
        for _ in range(count):
            with doc.begin_transaction() as txn:
                text.insert(txn, len(str(text)), "x")
        return updates

    def apply(doc, update: bytes) -> None:
        y_py.apply_update(doc, update)

    return {
        "name": "y-py 0.6.2",
        "new": y_py.YDoc,
        "apply": apply,
        "encode": lambda doc, sv=None: y_py.encode_state_as_update(doc, sv) if sv else y_py.encode_state_as_update(doc),
        "state": y_py.encode_state_vector,
        "text": lambda doc: str(doc.get_text("text")),
        "chain": chain,
    }


def _pycrdt():
    import pycrdt

    def chain(count: int) -> list[bytes]:
        doc = pycrdt.Doc(client_id=7)
        text = doc.get("text", type=pycrdt.Text)
        updates: list[bytes] = []
        doc.observe(lambda event: updates.append(event.update))
        for _ in range(count):
            text.insert(len(text), "x")
        return updates

    return {
        "name": "pycrdt 0.14.13",
        "new": pycrdt.Doc,
        "apply": lambda doc, update: doc.apply_update(update),
        "encode": lambda doc, sv=None: doc.get_update(sv) if sv else doc.get_update(),
        "state": lambda doc: doc.get_state(),
        "text": lambda doc: str(doc.get("text", type=pycrdt.Text)),
        "chain": chain,
    }


ENGINES = {"ypy": _ypy, "pycrdt": _pycrdt}

# ------------------------------------------------------ hostile, in a child


def _child_hostile(engine_name: str) -> None:
    """Runs in a child: one hostile input named on stdin, result on stdout."""
    engine = ENGINES[engine_name]()
    kind, data = sys.stdin.read().split()
    data = bytes.fromhex(data)
    doc = engine["new"]()
    try:
        if kind == "sv":
            engine["apply"](doc, engine["chain"](3)[0])
            engine["encode"](doc, data)
        else:
            engine["apply"](doc, data)
            engine["encode"](doc)
        print("accepted")
    except BaseException as exc:  # noqa: BLE001 - a Rust panic is a BaseException
        print(f"raised {type(exc).__name__}: {str(exc)[:80]}")


def hostile(engine_name: str, kind: str, data: bytes) -> str:
    result = subprocess.run(
        [sys.executable, __file__, "--child-hostile", engine_name],
        input=f"{kind} {data.hex()}",
        capture_output=True,
        text=True,
        timeout=120,
    )
    if result.returncode != 0:
        return f"process died (exit {result.returncode}): {result.stderr.strip().splitlines()[-1][:80]}"
    return result.stdout.strip()


def _child_fuzz(engine_name: str, seconds: float, seed: int) -> None:
    """Runs in a child: mutates real updates and state vectors until the
    time is up, printing a running tally (the parent keeps the last line
    and the input in flight if the process dies)."""
    engine = ENGINES[engine_name]()
    rng = random.Random(seed)
    seeds = engine["chain"](20)
    base = engine["new"]()
    for update in seeds:
        engine["apply"](base, update)
    seeds += [engine["encode"](base), engine["state"](base)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(seeds))
        kind = rng.choice(("update", "sv"))
        print(f"TRY {kind} {data.hex()}", flush=True)
        try:
            if kind == "sv":
                engine["encode"](base, data)
            else:
                doc = engine["new"]()
                engine["apply"](doc, data)
                engine["encode"](doc)
            print("applied", flush=True)
        except BaseException:  # noqa: BLE001 - a PanicException is caught, not fatal
            print("raised", flush=True)


def _mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    move = rng.randrange(5)
    if move == 0 and data:
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif move == 1 and data:
        data = data[: rng.randrange(len(data))]
    elif move == 2 and data:
        index = rng.randrange(len(data))
        data[index:index] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif move == 3:
        data = bytearray(rng.randbytes(rng.randint(1, 40)))
    elif data:
        data[rng.randrange(len(data))] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
    return bytes(data)


def fuzz(engine_name: str, seconds: float) -> dict[str, object]:
    """Fuzz in children, restarting after each death, until ``seconds`` pass."""
    totals = {"raised": 0, "applied": 0, "killed": 0}
    examples: list[str] = []
    deadline = time.monotonic() + seconds
    seed = 0
    while (left := deadline - time.monotonic()) > 0.5:
        seed += 1
        result = subprocess.run(
            [sys.executable, __file__, "--child-fuzz", engine_name, str(left), str(seed)],
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
        lines = result.stdout.splitlines()
        totals["raised"] += lines.count("raised")
        totals["applied"] += lines.count("applied")
        if result.returncode != 0:
            totals["killed"] += 1
            if len(examples) < 3 and lines and lines[-1].startswith("TRY "):
                examples.append(lines[-1][4:84])
    return {**totals, "examples": examples}


# ---------------------------------------------------------------- timings


def timed(function) -> tuple[float, object]:
    started = time.perf_counter()
    result = function()
    return (time.perf_counter() - started) * 1000, result


def fold_one_pass(engine, updates: list[bytes]):
    doc = engine["new"]()
    for update in updates:
        engine["apply"](doc, update)
    return doc


def fold_reapply(engine, updates: list[bytes]):
    """yrelay's fold before issue 16: re-apply until the document settles."""
    doc = fold_one_pass(engine, updates)
    state = engine["encode"](doc)
    for _ in range(len(updates)):
        for update in updates:
            engine["apply"](doc, update)
        settled = engine["encode"](doc)
        if settled == state:
            break
        state = settled
    return doc


def fold_sorted(engine, updates: list[bytes]):
    """One pass after sorting on the decoded (client, clock) ranges."""
    from yrelay.yjs import update_format

    return fold_one_pass(engine, update_format.causal_order(updates))


def measure_folds(engine, count: int) -> list[tuple[str, float, int]]:
    updates = engine["chain"](count)
    rows = []
    variants = [("one pass", fold_one_pass)]
    if engine["name"].startswith("y-py"):
        variants += [("re-apply loop (old)", fold_reapply), ("sorted, one pass", fold_sorted)]
    for order, sequence in (("in order", updates), ("reversed", updates[::-1])):
        for label, fold in variants:
            if label.startswith("re-apply") and order == "reversed" and count > 1500:
                continue  # minutes
            ms, doc = timed(lambda: fold(engine, sequence))  # noqa: B023 - called within this iteration, never after it
            rows.append((f"fold {order}, {label}", ms, len(engine["text"](doc))))
    return rows


def measure_sync(engine, count: int) -> list[tuple[str, float, int]]:
    """Load the updates (reversed: sorted first for y-py) and answer a peer
    holding the first half."""
    updates = engine["chain"](count)
    peer = fold_one_pass(engine, updates[: count // 2])
    vector = engine["state"](peer)
    fold = fold_sorted if engine["name"].startswith("y-py") else fold_one_pass
    rows = []
    for order, sequence in (("in order", updates), ("reversed", updates[::-1])):
        ms, diff = timed(lambda: engine["encode"](fold(engine, sequence), vector))  # noqa: B023 - called within this iteration, never after it
        rows.append((order, ms, len(diff)))
    return rows


def encoding_facts(engine) -> dict[str, object]:
    updates = engine["chain"](10)
    doc = fold_one_pass(engine, updates)
    full = engine["encode"](doc)
    reloaded = fold_one_pass(engine, [full])
    # Pending: the first update is missing, the other nine cannot integrate.
    pending = fold_one_pass(engine, updates[1:])
    pending_encoding = engine["encode"](pending)
    keeps_pending = len(engine["text"](fold_one_pass(engine, [pending_encoding, updates[0]]))) == 10
    # A pending delete: delete an item the receiver has not seen yet.
    source = fold_one_pass(engine, updates)
    if engine["name"].startswith("y-py"):
        text = source.get_text("text")
        with source.begin_transaction() as txn:
            text.delete_range(txn, 9, 1)
    else:
        import pycrdt

        del source.get("text", type=pycrdt.Text)[9:10]
    delete_only = engine["encode"](source, engine["state"](doc))
    receiver = fold_one_pass(engine, updates[:9] + [delete_only])  # the deleted item is in updates[9]: missing
    rebuilt = fold_one_pass(engine, [engine["encode"](receiver), updates[9]])
    return {
        "reloads own encoding": engine["text"](reloaded) == engine["text"](doc),
        "encoding keeps pending structs": keeps_pending,
        "encoding keeps pending deletes": engine["text"](rebuilt) == engine["text"](source),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--fuzz-seconds", type=float, default=20.0)
    parser.add_argument("--child-hostile")
    parser.add_argument("--child-fuzz", nargs=3)
    args = parser.parse_args()
    if args.child_hostile:
        return _child_hostile(args.child_hostile)
    if args.child_fuzz:
        name, seconds, seed = args.child_fuzz
        return _child_fuzz(name, float(seconds), int(seed))
    for key, factory in ENGINES.items():
        engine = factory()
        print(f"== {engine['name']}")
        print(f"  state vector /////w8=: {hostile(key, 'sv', HOSTILE_STATE_VECTOR)}")
        print(f"  21-byte update: {hostile(key, 'update', ABORTS_YPY)}")
        print(f"  fuzz {args.fuzz_seconds:g}s: {fuzz(key, args.fuzz_seconds)}")
        for label, ms, chars in measure_folds(engine, args.updates):
            print(f"  {label} of {args.updates}: {ms:9.1f} ms, keeps {chars} characters")
        for order, ms, size in measure_sync(engine, args.updates):
            print(f"  sync answer over {args.updates} {order} (peer holds half): {ms:.1f} ms, diff {size} bytes")
        for fact, value in encoding_facts(engine).items():
            print(f"  {fact}: {value}")


if __name__ == "__main__":
    main()
