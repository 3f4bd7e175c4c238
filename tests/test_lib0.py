"""yrelay.yjs.lib0 against lib0 itself: known vectors, round trips, a cross-check
with the lib0 the browser bundle is built from (node, web/node_modules), and
hostile input reaching every caller as that caller's own error."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from browser import WEB_DIR
from yrelay.reconciliation import messages
from yrelay.yjs import awareness, lib0, update_format

#: Written by lib0 0.2.120 (web/node_modules/lib0): encoding.writeVarUint /
#: writeVarInt / writeVarString / writeVarUint8Array into a fresh encoder,
#: printed as hex; test_matches_lib0_in_node recomputes such values live.
VARUINTS = {
    0: "00",
    1: "01",
    63: "3f",
    64: "40",
    127: "7f",
    128: "8001",
    300: "ac02",
    16383: "ff7f",
    16384: "808001",
    2**31 - 1: "ffffffff07",
    2**32: "8080808010",
    2**53 - 1: "ffffffffffffff0f",
}
VARINTS = {
    0: "00",
    1: "01",
    -1: "41",
    63: "3f",
    -63: "7f",
    64: "8001",
    -64: "c001",
    8191: "bf7f",
    -8192: "c08001",
    2**31 - 1: "bfffffff0f",
    -(2**31): "c080808010",
    2**53 - 1: "bfffffffffffff1f",
    -(2**53 - 1): "ffffffffffffff1f",
}
VARSTRINGS = {
    "": "00",
    "a": "0161",
    "é": "02c3a9",
    "日本語": "09e697a5e69cace8aa9e",
    "😀": "04f09f9880",
    "a\ud800b": "0561efbfbd62",
}  # a lone surrogate: TextEncoder writes U+FFFD

uints = st.integers(0, lib0.MAX_SAFE_INTEGER)
ints = st.integers(-lib0.MAX_SAFE_INTEGER, lib0.MAX_SAFE_INTEGER)


def encoded(write, value) -> bytes:
    out = bytearray()
    write(out, value)
    return bytes(out)


def test_known_vectors_match_lib0_byte_for_byte():
    for value, expected in VARUINTS.items():
        assert encoded(lib0.write_varuint, value).hex() == expected == lib0.varuint(value).hex()
        assert lib0.Reader(bytes.fromhex(expected)).varuint() == value
    for value, expected in VARINTS.items():
        assert encoded(lib0.write_varint, value).hex() == expected
        assert lib0.Reader(bytes.fromhex(expected)).varint() == value
    for text, expected in VARSTRINGS.items():
        assert encoded(lib0.write_varstring, text).hex() == expected
    assert encoded(lib0.write_varuint8array, b"\x00\xff").hex() == "0200ff"
    assert lib0.Reader(bytes.fromhex("40")).varint() == 0  # lib0 writes -0 so


@given(
    st.lists(
        st.one_of(
            uints.map(lambda v: ("u", v)),
            ints.map(lambda v: ("i", v)),
            st.text().map(lambda v: ("s", v)),
            st.binary().map(lambda v: ("b", v)),
        )
    )
)
def test_round_trip(values):
    out = bytearray()
    writers = {
        "u": lib0.write_varuint,
        "i": lib0.write_varint,
        "s": lib0.write_varstring,
        "b": lib0.write_varuint8array,
    }
    for kind, value in values:
        writers[kind](out, value)
    reader = lib0.Reader(bytes(out))
    readers = {"u": reader.varuint, "i": reader.varint, "s": reader.varstring, "b": reader.varuint8array}
    expected = [(kind, lib0.utf8(value).decode() if kind == "s" else value) for kind, value in values]
    assert [(kind, readers[kind]()) for kind, _ in values] == expected
    assert reader.done()


def test_out_of_range_values_are_not_written():
    for write, value in (
        (lib0.write_varuint, -1),
        (lib0.write_varuint, 2**53),
        (lib0.write_varint, 2**53),
        (lib0.write_varint, -(2**53)),
    ):
        with pytest.raises(ValueError):
            write(bytearray(), value)


def test_matches_lib0_in_node():
    """A sample of values (edges and random ones) encoded by lib0 in node
    and here; lib0 also reads back what Python wrote."""
    library = WEB_DIR / "node_modules" / "lib0"
    assert library.exists(), f"{library} missing: run `make web`"
    import random

    rng = random.Random(5)
    sample_uints = sorted(set(VARUINTS) | {rng.randrange(2 ** rng.randint(1, 53)) for _ in range(300)})
    sample_ints = sorted(
        set(VARINTS) | {rng.choice((-1, 1)) * rng.randrange(2 ** rng.randint(1, 53)) for _ in range(300)}
    )
    sample_strings = [*VARSTRINGS, "x" * 300, "".join(chr(rng.randrange(0x20, 0xD7FF)) for _ in range(50))]
    ours = {
        "uints": [encoded(lib0.write_varuint, v).hex() for v in sample_uints],
        "ints": [encoded(lib0.write_varint, v).hex() for v in sample_ints],
    }
    script = """
    const encoding = await import(process.argv[1] + '/encoding.js')
    const decoding = await import(process.argv[1] + '/decoding.js')
    const input = JSON.parse(require('fs').readFileSync(0, 'utf8'))
    const hex = (f) => {
      const e = encoding.createEncoder(); f(e); return Buffer.from(encoding.toUint8Array(e)).toString('hex')
    }
    const read = (h, f) => f(decoding.createDecoder(Buffer.from(h, 'hex')))
    console.log(JSON.stringify({
      uints: input.uints.map(v => hex(e => encoding.writeVarUint(e, v))),
      ints: input.ints.map(v => hex(e => encoding.writeVarInt(e, v))),
      strings: input.strings.map(v => hex(e => encoding.writeVarString(e, v))),
      readUints: input.ours.uints.map(h => read(h, decoding.readVarUint)),
      readInts: input.ours.ints.map(h => read(h, decoding.readVarInt)),
    }))
    """.replace("require('fs')", "(await import('node:fs'))")
    payload = json.dumps({"uints": sample_uints, "ints": sample_ints, "strings": sample_strings, "ours": ours})
    result = subprocess.run(
        ["node", "--input-type=module", "-e", script, library.as_uri()],
        input=payload,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    theirs = json.loads(result.stdout)
    assert theirs["uints"] == ours["uints"]
    assert theirs["ints"] == ours["ints"]
    assert theirs["strings"] == [encoded(lib0.write_varstring, s).hex() for s in sample_strings]
    assert theirs["readUints"] == sample_uints
    assert [abs(v) for v in theirs["readInts"]] == [abs(v) for v in sample_ints]  # JSON has no -0
    assert theirs["readInts"] == sample_ints


# ------------------------------------------------------------------ hostile input


def test_reader_raises_the_error_it_is_given():
    class Mine(ValueError):
        pass

    for data, read in (
        (b"", "varuint"),
        (b"\x80", "varuint"),
        (b"\xc0", "varint"),
        (b"\x05ab", "varstring"),
        (b"\x02\xc3\x28", "varstring"),
        (b"\x80" * 8 + b"\x00", "varuint"),
        (b"\xff" * 7 + b"\x10", "varuint"),
        (b"", "uint8"),
        (b"\x75\x05", "skip_any"),
    ):
        with pytest.raises(Mine):
            getattr(lib0.Reader(data, Mine), read)()
    with pytest.raises(lib0.DecodeError):
        lib0.Reader(b"\x80").varuint()
    # The largest number lib0 writes reads back; one more does not.
    assert lib0.Reader(bytes.fromhex("ffffffffffffff0f")).varuint() == 2**53 - 1
    with pytest.raises(lib0.DecodeError, match="2\\^53"):
        lib0.Reader(bytes.fromhex("8080808080808010")).varuint()


def good_inputs() -> list[tuple[bytes, object, type[Exception]]]:
    from yrelay.yjs import crdt

    doc = crdt.new_doc(7)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    crdt.insert_text(doc, 0, "héllo 😀")
    crdt.delete_text(doc, 1, 2)
    presence = awareness.encode_update([awareness.AwarenessEntry(3, 4, '{"name":"ann"}')])
    encoder = messages.Encoder()
    encoder.fingerprint("", "b", 7, 2**127 + 5)
    encoder.ids("c", "d", ["c", "c/x", "cc"])
    reply = encoder.finish_at(None)
    decode_reply = lambda data: messages.decode(data, messages.REPLY_MODES, 10)  # noqa: E731
    return [
        (updates[0], update_format.read_layout, update_format.MalformedUpdate),
        (updates[1], update_format.read_layout, update_format.MalformedUpdate),
        (updates[0], update_format.decode, update_format.MalformedUpdate),
        (crdt.state_vector(doc), update_format.decode_state_vector, update_format.MalformedUpdate),
        (presence, awareness.decode_update, awareness.AwarenessError),
        (reply, decode_reply, messages.MalformedMessage),
    ]


def test_every_truncation_raises_the_callers_error():
    for data, decode, error in good_inputs():
        decode(data)
        for size in range(len(data)):
            try:
                decode(data[:size])
            except error:
                pass  # a reconciliation message cut between entries is a valid shorter one


def test_overlong_numbers_raise_the_callers_error():
    nine_bytes, past_2_53 = b"\x81" + b"\x80" * 7 + b"\x00", bytes.fromhex("8080808080808010")
    for number in (nine_bytes, past_2_53):
        with pytest.raises(update_format.MalformedUpdate):
            update_format.read_layout(number + b"\x00")
        with pytest.raises(update_format.MalformedUpdate):
            update_format.decode_state_vector(b"\x01" + number + b"\x00")
        with pytest.raises(awareness.AwarenessError):
            awareness.decode_update(b"\x01" + number + b"\x00\x04null")
        with pytest.raises(messages.MalformedMessage):
            messages.decode(b"\x01\x01" + number, messages.REPLY_MODES, 10)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 5))
def test_garbage_raises_only_the_callers_error(garbage, which):
    data, decode, error = GOOD[which]
    for candidate in (garbage, data[: len(data) // 2] + garbage):
        try:
            decode(candidate)
        except error:
            pass


GOOD = good_inputs()
