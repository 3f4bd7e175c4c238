"""Differential fuzz of the known-safe shapes (:attr:`yrelay.yjs.update_format.Layout.known_safe`)
against the engines.

The claim the server relies on: every update of a known-safe shape
is applied by y-py 0.6.2 and by pycrdt to a fresh document without an error,
a panic, an abort or a hang. This generates updates (synthesised from the Yjs
v1 grammar with hostile values, real edits of y-py and pycrdt documents, and
byte-level mutations of both), and hands every one that passes yrelay's
layout read to y-py and to pycrdt, each in a child process of its own (an
abort or a hang costs the child, never this process). Any known-safe update
an engine did not read is a counterexample.

    python -m yrelay_tools.testing.update_fuzz [--count 1000000] [--seed 1] [--survivors FILE]

It also counts, for the updates outside the known shapes, how each engine
fared (the evidence for the options weighed in BENCHMARKS.md#validation),
and what the server's validation stores of them: with pycrdt alone (the
default) and with ``YRELAY_VALIDATE_WITH_YPY`` (issue 32). Each update is
read as the server's write path reads it (``admission.read_for_storing``):
strictly (what Yjs cannot decode is refused: ``read_layout(strict=True)``;
so are structs that refer to each other in a way no document can apply),
and in its stored form, without structs of length 0 and empty delete
ranges. ``--survivors FILE`` writes every update validation on pycrdt alone
would store, one hex per line, for a reference engine (``node
yrelay_tools/testing/yjs_apply.mjs FILE`` applies each with Yjs);
``FILE.with-ypy`` what it stores with y-py's check; and ``FILE.admitted``,
``FILE.with-ypy.admitted`` those of them the server's causal admission takes
into an empty document (the rest wait for content they build on, and Yjs
keeps them pending).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from yrelay.yjs import lib0
from yrelay.yjs.admission import missing, needs_of, read_for_storing
from yrelay.yjs.update_format import MalformedUpdate, read_layout

_U32 = struct.Struct(">I")
OK, ERROR, PANIC = 0, 1, 2  # a child's verdicts; ABORT and HANG are the parent's
ABORT, HANG = 3, 4
VERDICTS = {OK: "ok", ERROR: "error", PANIC: "panic", ABORT: "abort", HANG: "hang"}
BATCH = 256
TIMEOUT = 20.0  # seconds a child may take for one batch (a loaded machine)


# ------------------------------------------------------------------ the children


def _apply_ypy(update: bytes) -> None:
    import y_py

    y_py.apply_update(y_py.YDoc(), update)


def _apply_pycrdt(update: bytes) -> None:
    import pycrdt

    pycrdt.Doc().apply_update(update)


def _child(engine: str) -> None:
    """Apply each update of each request; reply one verdict byte per update."""
    apply = _apply_ypy if engine == "ypy" else _apply_pycrdt
    apply(b"\x00\x00")  # imports done before the first deadline
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(b"R")
    stdout.flush()
    while len(head := stdin.read(4)) == 4:
        verdicts = bytearray()
        for _ in range(_U32.unpack(head)[0]):
            update = stdin.read(_U32.unpack(stdin.read(4))[0])
            try:
                apply(update)
                verdicts.append(OK)
            except Exception:  # noqa: BLE001 - the verdict is whether the engine refused the update, whatever it raises
                verdicts.append(ERROR)
            except BaseException as exc:  # pyo3's PanicException derives from BaseException
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                verdicts.append(PANIC)
        stdout.write(bytes(verdicts))
        stdout.flush()


class Engine:
    """One engine in a child process; a batch that kills or hangs it is
    replayed one update at a time (a fresh child after each failure)."""

    def __init__(self, name: str):
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-m", "yrelay_tools.testing.update_fuzz", "--child", self.name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        if process.stdout.read(1) != b"R":
            raise RuntimeError(f"the {self.name} child did not start")
        return process

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def send(self, updates: list[bytes]) -> None:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self.process = self._start()
        assert self.process.stdin is not None
        request = _U32.pack(len(updates)) + b"".join(_U32.pack(len(u)) + u for u in updates)
        try:
            self.process.stdin.write(request)
            self.process.stdin.flush()
        except BrokenPipeError:
            pass  # it died on an earlier batch: receive notices

    def receive(self, updates: list[bytes]) -> list[int]:
        verdicts = self._read(len(updates))
        if isinstance(verdicts, bytes):
            return list(verdicts)
        self.stop()
        if len(updates) == 1:
            return [verdicts]
        result = []  # one at a time, in one child until one kills it
        for update in updates:
            self.send([update])
            verdict = self._read(1)
            result.append(verdict[0] if isinstance(verdict, bytes) else verdict)
            if not isinstance(verdict, bytes):
                self.stop()
        return result

    def _read(self, count: int) -> bytes | int:
        """``count`` verdicts, or HANG (the deadline passed) or ABORT (the child died)."""
        assert self.process is not None and self.process.stdout is not None
        out = b""
        deadline = time.monotonic() + TIMEOUT
        fd = self.process.stdout.fileno()
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return HANG
            chunk = os.read(fd, count - len(out))
            if not chunk:
                return ABORT
            out += chunk
        return out


# ------------------------------------------------------------------ generators

_TEXTS: list[bytes] = [
    s.encode() for s in ["", "a", "hello", "wörld", "😀", "\u2028x", "a" * 300, "p", "bold", "text", "m", "k", "ü😀ok"]
]
_TEXTS += [
    b"\xff",
    b"\xed\xa0\x80",
    b"\xed\xb0\x80x",
    b"\xf4\x31\x32",
    b"\xc3",
    b"\x00",
    b"\xf4\x90\x80\x80",
    b"\xc0\x80",
    b"a\xe2\x82",
]
_JSON = [
    "null",
    "true",
    "false",
    "1",
    "-1",
    "0",
    "1.5",
    "-0",
    "1e400",
    "NaN",
    "12345678901234567890",
    "2147483648",
    '"x"',
    '""',
    "[]",
    "{}",
    "[1,2]",
    '{"a":1}',
    '{"a":1,"a":2}',
    '{"href":"https://x.y/z"}',
    '"\\ud800"',
    '"\\u0000"',
    '{"a":{"b":[1,"x"]}}',
    "[" * 40 + "]" * 40,
    "[" * 9 + "]" * 9,
    "{",
    '"a',
    "undefined",
    " 1",
    "1 ",
    '{"a":1}x',
    '"\u2028"',
    '"😀"',
    '{"😀":null}',
    "9007199254740993",
    '{"x":-2147483647}',
]
#: Updates Yjs itself wrote (yjs 13.6, in Node: typing, deletes, bold and
#: italic, links, embeds, a ProseMirror paragraph, maps, arrays, binary),
#: one per mix of content kinds: seeds for mutation and known shapes in tests.
YJS_UPDATES = [
    "0103e1cd8efe080006010a636f64656d6972726f7204626f6c64047472756584e1cd8efe080002616286e1cd8efe0802"
    "04626f6c64046e756c6c00",
    "0101e1cd8efe0804c4e1cd8efe0802e1cd8efe080302c3bc00",
    "0001e1cd8efe08010401",
    "0101e1cd8efe081485e1cd8efe0803117b22696d616765223a22612e706e67227d00",
    "0103e1cd8efe084cc6e1cd8efe0818e1cd8efe081d04626f6c64046e756c6cc5e1cd8efe084ce1cd8efe081d117b2269"
    "6d616765223a22612e706e67227dc6e1cd8efe084de1cd8efe081d04626f6c64047472756500",
    "0104e1cd8efe085c46e1cd8efe0800066974616c69630474727565c6e1cd8efe085ce1cd8efe0800046c696e6b132268"
    "747470733a2f2f782e792f7a3f613d3122c6e1cd8efe0838e1cd8efe081a066974616c6963046e756c6cc6e1cd8efe08"
    "5ee1cd8efe081a046c696e6b046e756c6c00",
    "0102e1cd8efe08fa0146e1cd8efe08e501066974616c69630474727565c6e1cd8efe08fa01e1cd8efe08e501046c696e"
    "6b132268747470733a2f2f782e792f7a3f613d312201e1cd8efe08015c02",
    "0102e1cd8efe08cf0207010b70726f73656d6972726f7203097061726167726170682800e1cd8efe08cf0205616c6967"
    "6e0177046c65667400",
    "0101e1cd8efe08d1020700e1cd8efe08cf020600",
    "0101e1cd8efe08d6022801016d016b017601016175047d017c402000007e77017300",
    "0102e1cd8efe08d90208010161037d017701787883e1cd8efe08db0202010200",
    "0104e1cd8efe08dd0244e1cd8efe08fa01026d75c1e1cd8efe08de02e1cd8efe08fa0101c4e1cd8efe08df02e1cd8efe"
    "08fa01027469a8e1cd8efe08d602017d0101e1cd8efe0802d60201df0201",
]
_ANY_TAGS = [127, 126, 125, 124, 123, 122, 121, 120, 119, 118, 117, 116, 115, 0, 255]
_BOUNDARY = [
    0,
    1,
    2,
    3,
    7,
    127,
    128,
    2**31 - 2,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**32 + 1,
    2**33,
    3 * 2**32,
    2**40,
    2**53 - 1,
]


def _number(rng: random.Random, small: int = 16) -> int:
    roll = rng.random()
    if roll < 0.7:
        return rng.randrange(small)
    if roll < 0.9:
        return rng.choice(_BOUNDARY)
    return rng.randrange(2 ** rng.randrange(1, 54))


def _text(rng: random.Random) -> bytes:
    if rng.random() < 0.15:
        return rng.choice(_JSON).encode()
    if rng.random() < 0.1:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(6)))
    return rng.choice(_TEXTS)


def _write_any(rng: random.Random, out: bytearray, depth: int) -> None:
    tag = rng.choice(_ANY_TAGS) if depth < 12 and rng.random() < 0.97 else rng.choice([126, 125, 119])
    out.append(tag)
    if tag == 125:
        lib0.write_varint(
            out, rng.choice([0, 1, -1, 63, 64, -64, 2**31 - 1, -(2**31), 2**31, 2**53 - 1, rng.randrange(-1000, 1000)])
        )
    elif tag == 124:
        out += bytes(rng.randrange(256) for _ in range(4))
    elif tag in (123, 122):
        out += rng.choice([bytes(8), b"\x7f\xf8" + bytes(6), bytes(rng.randrange(256) for _ in range(8))])
    elif tag in (119, 116):
        _put_bytes(out, _text(rng))
    elif tag == 118:
        count = rng.choice([0, 1, 2, 3])
        _put(out, count)
        for _ in range(count):
            _put_bytes(out, _text(rng))
            _write_any(rng, out, depth + 1)
    elif tag == 117:
        count = rng.choice([0, 1, 2, 3])
        _put(out, count)
        for _ in range(count):
            _write_any(rng, out, depth + 1)


def _content(rng: random.Random, out: bytearray, kind: int) -> None:
    if kind == 1:
        _put(out, _number(rng, 8))
    elif kind == 2:
        count = rng.choice([0, 1, 2])
        _put(out, count)
        for _ in range(count):
            _put_bytes(out, rng.choice(_JSON).encode())
    elif kind == 3:
        _put_bytes(out, _text(rng))
    elif kind == 4:
        _put_bytes(out, _text(rng))
    elif kind == 5:
        _put_bytes(out, rng.choice(_JSON).encode() if rng.random() < 0.8 else _text(rng))
    elif kind == 6:
        _put_bytes(out, _text(rng))
        _put_bytes(out, rng.choice(_JSON).encode() if rng.random() < 0.8 else _text(rng))
    elif kind == 7:
        ref = rng.choice([0, 1, 2, 3, 4, 5, 6, 6, 7, 8, 9, 15, 16, 200])
        _put(out, ref)
        if ref in (3, 5):
            _put_bytes(out, _text(rng))
    elif kind == 8:
        count = rng.choice([0, 1, 1, 2, 3])
        _put(out, count)
        for _ in range(count):
            _write_any(rng, out, 0)
    elif kind == 9:
        _put_bytes(out, _text(rng))
        _write_any(rng, out, 0)


@dataclass
class _Plan:
    sections: list[tuple[int, int]] = field(default_factory=list)  # (client, first clock)


#: Set by :func:`synthesised`: how often a number is written non-minimally.
_PADDED = [0.0]
_RNG = random.Random()


def _put(out: bytearray, value: int) -> None:
    """A varuint, now and then padded (``80 00`` for 0): lib0 reads that, some engines not."""
    value = min(value, lib0.MAX_SAFE_INTEGER)
    if _PADDED[0] and _RNG.random() < _PADDED[0] and value < 2**40:
        encoded = bytearray(lib0.varuint(value))
        encoded[-1] |= 0x80
        out += encoded + b"\x00"
        return
    lib0.write_varuint(out, value)


def _put_bytes(out: bytearray, data: bytes) -> None:
    _put(out, len(data))
    out += data


def _ref(rng: random.Random, plan: _Plan, client: int, clock: int) -> tuple[int, int]:
    roll = rng.random()
    if roll < 0.3 and plan.sections:
        other, start = rng.choice(plan.sections)
        return other, max(0, start + rng.choice([-1, 0, 0, 1, 2, 3]))
    if roll < 0.55:
        return client, max(0, clock + rng.choice([-3, -2, -1, -1, 0, 1, 5]))
    return _number(rng, 4), _number(rng, 8)


def synthesised(rng: random.Random) -> bytes:
    """A random update from the Yjs v1 grammar, biased to shapes that pass
    the layout read (so the engines, not the decoder, are exercised)."""
    out = bytearray()
    _PADDED[0] = rng.choice([0.0, 0.0, 0.0, 0.05])
    _RNG.seed(rng.random())
    plan = _Plan([(_number(rng, 4), _number(rng, 6)) for _ in range(rng.choice([0, 1, 1, 1, 2, 2, 3]))])
    if rng.random() < 0.1 and plan.sections:
        plan.sections.append(plan.sections[0])  # one client twice
    _put(out, len(plan.sections))
    for client, clock in plan.sections:
        count = rng.choice([0, 1, 1, 1, 2, 3, 5])
        _put(out, count)
        _put(out, client)
        _put(out, clock)
        for _ in range(count):
            start = len(out)
            kind = (
                rng.choice([1, 2, 3, 4, 4, 4, 5, 6, 7, 7, 8, 8, 9])
                if rng.random() < 0.9
                else rng.choice([0, 10, 11, 31])
            )
            info = kind | (rng.random() < 0.5) * 128 | (rng.random() < 0.3) * 64 | (rng.random() < 0.25) * 32
            out.append(info)
            if kind in (0, 10):
                _put(out, _number(rng, 4))
            else:
                if info & 128:
                    for value in _ref(rng, plan, client, clock):
                        _put(out, value)
                if info & 64:
                    for value in _ref(rng, plan, client, clock):
                        _put(out, value)
                if not info & 192:
                    parent = rng.choice([1, 1, 0, 0, 2, 2**32, 2**32 + 1])
                    _put(out, parent)
                    if parent == 1:
                        _put_bytes(out, _text(rng))
                    else:
                        for value in _ref(rng, plan, client, clock):
                            _put(out, value)
                    if info & 32:
                        _put_bytes(out, _text(rng))
                _content(rng, out, kind)
            try:  # advance the clock as a decoder will
                clock += (
                    read_layout(bytes([1, 1]) + lib0.varuint(client) + lib0.varuint(clock) + out[start:] + b"\x00")
                    .sections[0]
                    .structs[0]
                    .length
                )
            except (MalformedUpdate, ValueError):
                clock += 1
    deletes = rng.choice([0, 0, 1, 1, 2])
    _put(out, deletes)
    for _ in range(deletes):
        _put(out, rng.choice([c for c, _ in plan.sections] or [0]) if rng.random() < 0.6 else _number(rng, 4))
        ranges = rng.choice([0, 1, 1, 2])
        _put(out, ranges)
        for _ in range(ranges):
            _put(out, _number(rng, 8))
            _put(out, _number(rng, 4))
    return bytes(out)


def real_updates(seed: int, edits: int = 400) -> list[bytes]:
    """Updates of real edits: Yjs's own (recorded), y-py typing and deleting,
    pycrdt text with formats, embeds, maps, arrays and XML, and merges of those."""
    import pycrdt

    from yrelay.yjs import crdt

    rng = random.Random(seed)
    found: list[bytes] = [bytes.fromhex(text) for text in YJS_UPDATES]
    doc = crdt.new_doc(7, engine=crdt.YPY if crdt.ypy_available() else crdt.PYCRDT)  # y-py's own encodings too
    crdt.observe_updates(doc, found.append)
    for _ in range(edits // 4):
        length = len(crdt.text_of(doc))
        try:
            if length and rng.random() < 0.3:
                crdt.delete_text(doc, rng.randrange(length), 1)
            else:
                crdt.insert_text(doc, rng.randrange(length + 1), rng.choice(["a", "ü", "😀", "ab ", "\u2028"]))
        except BaseException as exc:  # y-py 0.6.2 panics on some offsets inside an emoji (a PanicException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
    found.append(crdt.encode_state(doc))
    pdoc = pycrdt.Doc(client_id=rng.randrange(2**53))
    pdoc.observe(lambda event: found.append(event.update))
    text = pdoc.get("t", type=pycrdt.Text)
    array = pdoc.get("a", type=pycrdt.Array)
    mapping = pdoc.get("m", type=pycrdt.Map)
    xml = pdoc.get("x", type=pycrdt.XmlFragment)
    for index in range(edits):
        try:
            _pycrdt_edit(rng, index, text, array, mapping, xml)
        except BaseException as exc:  # yrs 0.28 panicked once deleting next to an embed (a PanicException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
    found.append(pdoc.get_update())
    for _ in range(20):
        found.append(pycrdt.merge_updates(*rng.sample(found[:-1], 3)))
    return found


def _pycrdt_edit(rng: random.Random, index: int, text, array, mapping, xml) -> None:
    """One random edit of a pycrdt document (text with formats and embeds,
    arrays, maps, XML)."""
    import pycrdt

    roll = rng.random()
    if roll < 0.4:
        text.insert(
            rng.randrange(len(text) + 1),
            rng.choice(["x", "ü", "😀", "yy"]),
            attrs=rng.choice([None, {"bold": True}, {"link": "https://a.b/c"}, {"c": None}]),
        )
    elif roll < 0.5 and len(text):
        start = rng.randrange(len(text))
        text.format(start, min(len(text), start + 2), rng.choice([{"bold": True}, {"bold": None}, {"i": {}}]))
    elif roll < 0.55:
        text.insert_embed(rng.randrange(len(text) + 1), {"image": "a.png"})
    elif roll < 0.6 and len(text):
        del text[rng.randrange(len(text))]
    elif roll < 0.7:
        array.append(
            rng.choice([1, 1.5, "s", None, True, [1, "x"], {"k": 2}, pycrdt.Map({"q": 1}), pycrdt.Text("t"), b"bin"])
        )
    elif roll < 0.8:
        mapping[f"k{index % 5}"] = rng.choice([1, "v", None, {"n": [1, 2]}, pycrdt.Array([1])])
    else:
        xml.children.append(pycrdt.XmlElement("p", {"class": "a"}, [pycrdt.XmlText("hi")]))


def mutated(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        kind = rng.randrange(6)
        position = rng.randrange(len(out)) if out else 0
        if kind == 0 and out:
            out[position] = rng.randrange(256)
        elif kind == 1 and out:
            out[position] ^= 1 << rng.randrange(8)
        elif kind == 2 and out:
            del out[position]
        elif kind == 3:
            out.insert(position, rng.choice([0, 1, 127, 128, 255, rng.randrange(256)]))
        elif kind == 4 and out:
            out[position : position + 1] = lib0.varuint(rng.choice(_BOUNDARY))
        else:
            out = out[:position]
    return bytes(out)


def candidates(seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    real = real_updates(seed)
    sources: list[Callable[[], bytes]] = [
        lambda: synthesised(rng),
        lambda: synthesised(rng),
        lambda: synthesised(rng),
        lambda: mutated(rng, synthesised(rng)),
        lambda: mutated(rng, rng.choice(real)),
        lambda: mutated(rng, rng.choice(real)),
        lambda: rng.choice(real),
    ]
    while True:
        yield rng.choice(sources)()


# ------------------------------------------------------------------ the run


@dataclass
class Report:
    generated: int = 0
    layout_refused: int = 0
    #: Read by the lenient layout read, refused by the write path's strict
    #: one (Yjs cannot apply them, or their structs cannot apply in any document).
    strict_refused: int = 0
    #: Stored in another form: without structs of length 0 or empty delete
    #: ranges (``update_format.stored_form``).
    normalized: int = 0
    known_safe: int = 0
    #: Outside the known shapes: (y-py verdict, pycrdt verdict) -> count.
    others: Counter = field(default_factory=Counter)
    #: One update per class of ``others`` (hex), for the record.
    examples: dict[str, str] = field(default_factory=dict)
    #: Known-safe updates an engine did not read (must stay empty).
    counterexamples: list[tuple[str, str, str]] = field(default_factory=list)
    #: What validation stores (known-safe, or read by its engines): on
    #: pycrdt alone, of those y-py did not read, and with y-py's check on.
    stored_pycrdt_alone: int = 0
    stored_pycrdt_alone_ypy_failed: int = 0
    stored_with_ypy: int = 0
    #: Read by both engines, refused with y-py's check for a client id past 32 bits.
    ypy_id_refused: int = 0
    #: Every update validation stores on pycrdt alone / with y-py's check
    #: (with ``--survivors``).
    survivors: list[bytes] | None = None
    survivors_with_ypy: list[bytes] | None = None
    seconds: float = 0.0

    def summary(self) -> dict[str, object]:
        return {
            "generated": self.generated,
            "layout_refused": self.layout_refused,
            "refused by the write path's strict read": self.strict_refused,
            "stored without length-0 structs or empty delete ranges": self.normalized,
            "known_safe": self.known_safe,
            "outside_known_shapes": {
                f"ypy={VERDICTS[a]} pycrdt={VERDICTS[b]}": n for (a, b), n in sorted(self.others.items())
            },
            "counterexamples": len(self.counterexamples),
            "stored": {
                "pycrdt alone": self.stored_pycrdt_alone,
                "pycrdt alone, y-py did not read": self.stored_pycrdt_alone_ypy_failed,
                "with y-py's check": self.stored_with_ypy,
                "both read, client id past 32 bits (refused with y-py's check)": self.ypy_id_refused,
            },
            "seconds": round(self.seconds, 1),
        }


def run(
    count: int, seed: int = 1, progress: Callable[[Report], None] | None = None, keep_survivors: bool = False
) -> Report:
    report = Report(survivors=[] if keep_survivors else None, survivors_with_ypy=[] if keep_survivors else None)
    engines = [Engine("ypy"), Engine("pycrdt")]
    started = time.monotonic()
    pending: list[tuple[bytes, bool]] = []
    try:
        for update in candidates(seed):
            if report.generated >= count:
                break
            report.generated += 1
            try:
                read_layout(update)
            except MalformedUpdate:
                report.layout_refused += 1
                continue
            try:
                reading = read_for_storing(update)
            except MalformedUpdate:
                report.strict_refused += 1
                continue
            report.normalized += reading.update is not update
            update, layout = reading.update, reading.layout
            safe = layout.known_safe
            report.known_safe += safe
            pending.append((update, safe))
            if len(pending) >= BATCH:
                _judge(engines, pending, report)
                pending = []
                if progress is not None:
                    report.seconds = time.monotonic() - started
                    progress(report)
        if pending:
            _judge(engines, pending, report)
    finally:
        for engine in engines:
            engine.stop()
    report.seconds = time.monotonic() - started
    return report


def _judge(engines: list[Engine], batch: list[tuple[bytes, bool]], report: Report) -> None:
    updates = [update for update, _ in batch]
    for engine in engines:
        engine.send(updates)
    ypy, pycrdt = (engine.receive(updates) for engine in engines)
    for (update, safe), a, b in zip(batch, ypy, pycrdt, strict=True):
        stored_alone = safe or b == OK
        report.stored_pycrdt_alone += stored_alone
        report.stored_pycrdt_alone_ypy_failed += stored_alone and a != OK
        both_read = a == OK and b == OK
        fits = safe or not both_read or _ids_fit_ypy(update)
        stored_with_ypy = safe or (both_read and fits)
        report.stored_with_ypy += stored_with_ypy
        report.ypy_id_refused += not fits
        if report.survivors is not None and report.survivors_with_ypy is not None:
            if stored_alone:
                report.survivors.append(update)
            if stored_with_ypy:
                report.survivors_with_ypy.append(update)
        if not safe:
            report.others[(a, b)] += 1
            report.examples.setdefault(f"ypy={VERDICTS[a]} pycrdt={VERDICTS[b]}", update.hex())
        elif a != OK or b != OK:
            report.counterexamples.append((update.hex(), VERDICTS[a], VERDICTS[b]))
            print("COUNTEREXAMPLE", update.hex(), VERDICTS[a], VERDICTS[b], file=sys.stderr, flush=True)


def _ids_fit_ypy(update: bytes) -> bool:
    from yrelay.yjs import crdt

    try:
        crdt.check_ypy_client_ids(update)
        return True
    except crdt.InvalidUpdate:
        return False


def admitted_into_empty(update: bytes) -> bool:
    """True when the server's causal admission takes ``update`` into an
    empty document (it carries everything it builds on)."""
    try:
        return not missing(needs_of(read_layout(update)), {})
    except MalformedUpdate:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--survivors",
        help="write what validation on pycrdt alone stores here, one hex per line "
        "(what it stores with y-py's check to FILE.with-ypy, and those "
        "admitted into an empty document to FILE.admitted and "
        "FILE.with-ypy.admitted)",
    )
    parser.add_argument("--child", choices=["ypy", "pycrdt"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    last = [0.0]

    def progress(report: Report) -> None:
        if report.seconds - last[0] >= 30:
            last[0] = report.seconds
            print(json.dumps(report.summary()), file=sys.stderr, flush=True)

    report = run(args.count, args.seed, progress, keep_survivors=bool(args.survivors))
    if args.survivors:
        for path, kept in (
            (args.survivors, report.survivors),
            (args.survivors + ".with-ypy", report.survivors_with_ypy),
        ):
            with open(path, "w") as out, open(path + ".admitted", "w") as admitted:
                for update in kept or []:
                    out.write(update.hex() + "\n")
                    if admitted_into_empty(update):
                        admitted.write(update.hex() + "\n")
    print(json.dumps(report.summary(), indent=1))
    for name, example in sorted(report.examples.items()):
        print("EXAMPLE", name, example)
    for example in report.counterexamples[:20]:
        print("COUNTEREXAMPLE", *example)
    sys.exit(1 if report.counterexamples else 0)


if __name__ == "__main__":
    main()
