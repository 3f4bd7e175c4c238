"""The CRDT wrapper: validation and order-independent folding."""

import itertools

import pytest

from yrelay.yjs import crdt


def chain(n: int = 5) -> tuple[crdt.Doc, list[bytes]]:
    doc = crdt.new_doc(1)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    for i in range(n):
        crdt.insert_text(doc, 0, str(i))
    crdt.delete_text(doc, 0, 1)
    return doc, updates


@pytest.mark.parametrize("order", list(itertools.permutations(range(4)))[::5])
def test_fold_is_order_independent(order):
    """y-py alone leaves out-of-order updates pending forever; the fold must not."""
    source, updates = chain(3)
    folded = crdt.new_doc()
    crdt.apply_updates(folded, [updates[i] for i in order])
    assert crdt.text_of(folded) == crdt.text_of(source) == "10"


def test_replica_integrates_updates_arriving_out_of_order():
    source, updates = chain(6)
    replica = crdt.Replica(crdt.new_doc())
    for index in [3, 1, 0, 5, 2, 6, 4]:
        replica.apply(updates[index])
    assert crdt.text_of(replica.doc) == crdt.text_of(source)


def test_validate_rejects_garbage_and_accepts_real_updates():
    _, updates = chain(1)
    crdt.validate_update(updates[0])
    for bad in [b"", b"\x05", b"\xff\xfe\xfd\x01"]:
        with pytest.raises(crdt.InvalidUpdate):
            crdt.validate_update(bad)
