"""Updates of a shape y-py and pycrdt are known to read pass without a
validator process; everything else, hostile input first, still goes to one.

The long differential fuzz (millions of updates) is a script:
``python -m yrelay_tools.testing.update_fuzz``; a short run is here."""

from __future__ import annotations

import pycrdt
import pytest

from engines import needs_ypy
from test_validation import good_update
from yrelay.yjs import crdt, validation
from yrelay.yjs.update_format import read_layout
from yrelay.yjs.validator import Validator
from yrelay_tools.testing import update_fuzz

#: Each passes yrelay's layout read and at least one engine does not read it:
#: y-py aborts its process (the 21-byte update of docs/security.md#validation,
#: and one the fuzz found), y-py panics, or pycrdt refuses what y-py reads
#: (an XmlHook, a type ref written ``80 00``, client ids of 2**32:
#: each once passed an earlier draft of the known shapes, found by the fuzz).
HOSTILE = {
    "aborts y-py": "0101f430c4014501460af4313220c3bcf09f988000",
    "aborts y-py, found by the fuzz": "028300808100048780010303016b2101117b2278223a2d323134373438333634377d01c306868001"
    "05016b03f43132010204040105316534303003eda0800101010701",
    "y-py panics": "01038080808010000801016101770677c3b6726c64a8808080801000017de4074100ffffffff0f07018080808010010100",
    "an XmlHook pycrdt refuses": "0201e1edd8bcc9b6230107010568656c6c6f0504746578740102040301022d310677c3b6726c6401"
    "02010601",
    "a padded type ref pycrdt refuses": "010102018701f507800000",
    "an XmlHook pycrdt refuses (2)": "0101000147010205125b5b5b5b5b5b5b5b5b5d5d5d5d5d5d5d5d5d02000000010101",
    # found by the fuzz: a client id of 2**32 (the parent's, the item's) panics y-py
    "a parent id y-py panics on": "0101000027008080808010989c010677c3b6726c640000",
    "a client y-py panics on": "01018080808010000400000605316534303000",
    # found by the fuzz: parent info 2**32 + 1, "an id" to lib0, 1 ("a name") to the engines' u32
    "a parent info pycrdt refuses": "01010001038180808010030501e60100010500",
    # found by the fuzz: a delete of half of the update's own "😀" panics y-py
    "half an emoji deleted": "02010100040102d29e04f09f98800103058400f7b3e503016b0101010001",
    # found by the fuzz: y-py reads it, pycrdt panics ("index out of bounds")
    "pycrdt panics": "030201d3e3ea87f9bea4010401505b" + "5b" * 39 + "5d" * 40 + "016b8780808080100309010305a801d4e3ea87"
    "f9bea401017b7ff8000000000000010002440307ac02" + "61" * 300 + "02010206000100010100e6db7d",
}


def _known(update: bytes) -> bool:
    return read_layout(update, decide=True).known_safe


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_updates_pass_the_layout_read_but_are_not_known_shapes(name):
    assert not _known(bytes.fromhex(HOSTILE[name]))


@needs_ypy
def test_the_hostile_updates_really_break_an_engine():
    """The list above is evidence, not folklore: each, applied in a child
    process, is refused, panics, or aborts in at least one engine."""
    updates = [bytes.fromhex(text) for text in HOSTILE.values()]
    engines = [update_fuzz.Engine("ypy"), update_fuzz.Engine("pycrdt")]
    try:
        verdicts = []
        for engine in engines:
            engine.send(updates)
            verdicts.append(engine.receive(updates))
    finally:
        for engine in engines:
            engine.stop()
    ypy, pycrdt_ = verdicts
    assert ypy[0] == update_fuzz.ABORT and ypy[1] == update_fuzz.ABORT
    assert ypy[2] == update_fuzz.PANIC
    assert all(ypy[i] == update_fuzz.OK and pycrdt_[i] == update_fuzz.ERROR for i in (3, 4, 5))
    assert ypy[6] == ypy[7] == update_fuzz.PANIC and pycrdt_[6] == pycrdt_[7] == update_fuzz.OK
    assert ypy[8] == update_fuzz.OK and pycrdt_[8] == update_fuzz.ERROR
    assert ypy[9] == update_fuzz.PANIC and pycrdt_[9] == update_fuzz.OK
    assert ypy[10] == update_fuzz.OK and pycrdt_[10] == update_fuzz.PANIC


def test_a_pycrdt_panic_is_a_refusal_not_a_dead_validator_process():
    """Before, the PanicException left validation.check and killed its worker
    (restarted, the update refused as "could not be decoded in time")."""
    reason = validation.check(bytes.fromhex(HOSTILE["pycrdt panics"]))
    assert reason.startswith("not a Yjs update") and "index out of bounds" in reason


def test_what_editors_send_is_a_known_shape():
    ypy_updates: list[bytes] = []
    doc = crdt.new_doc(7)
    crdt.observe_updates(doc, ypy_updates.append)
    for index, word in enumerate(["hello", " wörld", " 😀", " ok", "\u2028x"]):
        crdt.insert_text(doc, index, word)
    crdt.delete_text(doc, 1, 3)
    # A 32-bit client id, as Yjs's: pycrdt's own take 53 bits, which are
    # not a known shape (they go to the workers).
    pdoc = pycrdt.Doc(client_id=3_000_000_000)
    pycrdt_updates: list[bytes] = []
    pdoc.observe(lambda event: pycrdt_updates.append(event.update))
    text = pdoc.get("t", type=pycrdt.Text)
    text.insert(0, "abc")
    text.insert(1, "X", attrs={"bold": True})
    text.format(0, 2, {"link": "https://a.b/c"})
    pdoc.get("x", type=pycrdt.XmlFragment).children.append(
        pycrdt.XmlElement("p", {"class": "a"}, [pycrdt.XmlText("hi")])
    )
    pdoc.get("m", type=pycrdt.Map)["k"] = {"n": [1, "s", None, True]}
    yjs_updates = [bytes.fromhex(text) for text in update_fuzz.YJS_UPDATES]  # what browsers send
    for update in [*ypy_updates, *pycrdt_updates, *yjs_updates, good_update()]:
        assert _known(update), update.hex()


def test_rare_or_large_shapes_are_left_to_the_engines():
    doc = crdt.new_doc(7)
    crdt.insert_text(doc, 0, "x" * 5000)
    assert not _known(crdt.encode_state(doc))  # past MAX_BYTES
    pdoc = pycrdt.Doc()
    nested: list = [1]
    for _ in range(12):
        nested = [nested]
    pdoc.get("a", type=pycrdt.Array).append(nested)  # nested deeper than MAX_DEPTH
    assert not _known(pdoc.get_update())
    typed: list[bytes] = []
    crdt.observe_updates(doc, typed.append)
    for char in "abc":
        crdt.insert_text(doc, 0, char)
    gap = pycrdt.merge_updates(typed[0], typed[2])  # a Skip stands for the missing "b"
    assert any(s.skip for section in read_layout(gap).sections for s in section.structs)
    assert not _known(gap)


@needs_ypy
def test_a_short_differential_fuzz_finds_no_known_shape_an_engine_refuses():
    report = update_fuzz.run(4000, seed=7)
    assert report.counterexamples == []
    assert report.known_safe > 200  # the fuzz reaches the known shapes
    assert report.others  # and what lies outside them


async def test_a_known_shape_passes_without_a_worker():
    """The worker here hangs on any update containing HANG: a known shape
    given with its layout is answered at once, the same bytes without it
    still go to the worker (and are cut off)."""
    validator = Validator(workers=1, timeout=0.5, module="yrelay_tools.testing.hanging_validator")
    await validator.start()
    try:
        hang = good_update("HANG")
        future = validator.submit(hang, layout_checked=True, layout=read_layout(hang, decide=True))
        assert future.done() and future.result() is None and validator.known_safe == 1
        result = await validator.submit(hang)
        assert isinstance(result, crdt.InvalidUpdate) and "0.5s" in str(result)
        aborts = bytes.fromhex(HOSTILE["aborts y-py"])
        assert not validator.submit(aborts, layout_checked=True, layout=read_layout(aborts, decide=True)).done()
    finally:
        await validator.stop()
