"""The Python client on either CRDT engine (issue 32): pycrdt by default,
y-py with ``engine="y-py"`` (the ``ypy`` extra). Both speak Yjs v1 updates,
so clients of the two converge, and a state file a y-py client wrote loads
in a pycrdt client."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pycrdt
import pytest

from conftest import eventually
from engines import needs_ypy
from yrelay.client import YrelayClient
from yrelay.client.persistence import ClientStateFile
from yrelay.yjs import crdt, update_format

ENGINES = [crdt.PYCRDT, pytest.param(crdt.YPY, marks=needs_ypy)]
REPO = Path(__file__).resolve().parent.parent


async def test_the_default_client_holds_pycrdt_documents(server_url, make_client):
    client = await make_client(server_url)
    assert client.engine == "pycrdt"
    doc = await client.subscribe("default-engine")
    assert isinstance(doc.ydoc, pycrdt.Doc)
    crdt.insert_text(doc.ydoc, 0, "hi")
    await client.wait_idle()


def test_an_unknown_engine_is_refused():
    with pytest.raises(ValueError, match="unknown CRDT engine 'yjs'"):
        YrelayClient("ws://127.0.0.1:1/ws", engine="yjs")


def test_without_y_py_the_y_py_engine_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "y_py", None)  # import y_py raises ImportError
    monkeypatch.delitem(sys.modules, "yrelay.yjs.crdt.ypy_doc", raising=False)
    monkeypatch.delattr(crdt, "ypy_doc", raising=False)  # a test before this one imported it: the package holds it
    with pytest.raises(crdt.EngineMissing, match=r"pip install 'yrelay\[ypy\]'"):
        YrelayClient("ws://127.0.0.1:1/ws", engine="y-py")
    with pytest.raises(crdt.EngineMissing):
        crdt.new_doc(engine="y-py")
    crdt.validate_update(crdt.encode_state(_typed("ok")))  # pycrdt alone needs no y-py


def _typed(text: str, engine: str = crdt.PYCRDT) -> crdt.Doc:
    doc = crdt.new_doc(engine=engine)
    crdt.insert_text(doc, 0, text)
    return doc


@pytest.mark.parametrize("engine", ENGINES)
def test_the_helpers_read_the_same_on_both_engines(engine):
    assert all(crdt.new_doc(engine=engine).client_id < 2**32 for _ in range(50))  # y-py reads 32 bits
    doc = crdt.new_doc(5, engine=engine)
    updates: list[bytes] = []
    crdt.observe_updates(doc, updates.append)
    crdt.insert_text(doc, 0, "hello world")
    crdt.delete_text(doc, 5, 6)
    crdt.replace_text(doc, 0, 1, "J")
    assert crdt.text_of(doc) == "Jello" and doc.client_id == 5 and len(updates) == 3
    assert crdt.engine_of(doc) == engine
    for other_engine in [crdt.PYCRDT] + ([crdt.YPY] if crdt.ypy_available() else []):
        other = crdt.new_doc(engine=other_engine)
        crdt.apply_updates(other, updates[::-1])  # any order
        assert crdt.text_of(other) == "Jello"
        assert crdt.held_prefix(other, updates) == 3
        assert update_format.decode_state_vector(crdt.state_vector(other)) == update_format.decode_state_vector(
            crdt.state_vector(doc)
        )
    assert crdt.text_of(_merged(updates, engine)) == "Jello"


def _merged(updates: list[bytes], engine: str) -> crdt.Doc:
    doc = crdt.new_doc(engine=engine)
    crdt.apply_update(doc, crdt.merge_updates(updates, engine=engine))
    return doc


@pytest.mark.parametrize("engine", ENGINES)
def test_a_replica_keeps_what_is_pending_until_it_lands(engine):
    """Neither engine encodes pending structs: a replica keeps the updates
    that wait for a dependency (the client persists them beside the state)
    and lets go of them once they are in the document."""
    source = crdt.new_doc(3)
    updates: list[bytes] = []
    crdt.observe_updates(source, updates.append)
    for index, word in enumerate("abc"):
        crdt.insert_text(source, index, word)
    replica = crdt.Replica(crdt.new_doc(engine=engine))
    replica.apply(updates[2])
    replica.apply(updates[1])
    assert crdt.text_of(replica.doc) == "" and replica.suspects == [updates[2], updates[1]]
    replica.apply(updates[0])
    assert crdt.text_of(replica.doc) == "abc" and replica.suspects == []
    replica.apply(updates[0])  # a duplicate is held: not kept
    assert replica.suspects == []


@pytest.mark.parametrize("engines", [(crdt.YPY, crdt.PYCRDT)], ids=["y-py+pycrdt"])
@needs_ypy
async def test_a_y_py_client_and_a_pycrdt_client_converge(server_url, make_client, engines):
    clients = [await make_client(server_url, engine=engine) for engine in engines]
    docs = [await client.subscribe("mixed") for client in clients]
    assert [crdt.engine_of(doc.ydoc) for doc in docs] == list(engines)

    async def type_into(doc, tag: str) -> None:
        for index in range(30):
            crdt.insert_text(doc.ydoc, len(crdt.text_of(doc.ydoc)) // 2, f"<{tag}{index}>")
            if index % 7 == 3:
                crdt.delete_text(doc.ydoc, 0, 1)
            await asyncio.sleep(0.002)

    await asyncio.gather(type_into(docs[0], "y"), type_into(docs[1], "p"))
    for client in clients:
        await client.wait_idle()
    await eventually(lambda: crdt.text_of(docs[0].ydoc) == crdt.text_of(docs[1].ydoc))
    text = crdt.text_of(docs[0].ydoc)
    assert "<y29>" in text and "<p29>" in text, text
    vectors = [update_format.decode_state_vector(crdt.state_vector(doc.ydoc)) for doc in docs]
    assert vectors[0] == vectors[1], vectors


@needs_ypy
async def test_a_state_file_a_y_py_client_wrote_loads_in_a_pycrdt_client(server_url, make_client, tmp_path):
    """Plain Yjs v1 updates either way: switching a client's engine keeps its
    session, documents and unacked edits."""
    path = tmp_path / "state.json"
    before = await make_client(server_url, engine="y-py", state_file=ClientStateFile(path))
    doc = await before.subscribe("moved")
    crdt.insert_text(doc.ydoc, 0, "written by y-py")
    await before.wait_idle()
    crdt.insert_text(doc.ydoc, 0, "unacked: ")  # journaled; the client stops before the ack
    session = before.session
    before.state_file = None  # stop as a crash would: no final snapshot
    await before.close()

    after = await make_client(server_url, state_file=ClientStateFile(path))
    moved = await after.subscribe("moved")
    assert after.session == session and isinstance(moved.ydoc, pycrdt.Doc)
    assert crdt.text_of(moved.ydoc) == "unacked: written by y-py"
    await after.wait_idle()
    reader = await make_client(server_url)
    seen = await reader.subscribe("moved")
    await eventually(lambda: crdt.text_of(seen.ydoc) == "unacked: written by y-py")


@needs_ypy
def test_the_client_tests_pass_on_the_y_py_engine():
    """Today's y-py client API unchanged: ordered sending, sync pushes,
    persistence and presence, with every document a ``y_py.YDoc``
    (yrelay_tools/testing/ypy_engine.py)."""
    files = [
        "tests/test_ordered_sending.py",
        "tests/test_client_persistence.py",
        "tests/test_client_presence.py",
        "tests/test_synced.py",
    ]
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "-p",
            "yrelay_tools.testing.ypy_engine",
            *files,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
