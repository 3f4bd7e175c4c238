"""The browser client end to end, in real headless Chromium: the demo page
served by `yrelay serve` at `/`, two pages (separate browser contexts, so
separate storage and sockets) editing one document through the CodeMirror
binding, while the network drops, the server process is killed and restarted,
and a Python client (y-py) edits the same document."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from playwright.async_api import Browser, Page, async_playwright

from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, require_web_build
from conftest import FAST_BACKOFF, running_server
from gcutil import FAST_GC
from yrelay.client import YrelayClient
from yrelay.storage.embedded import free_port
from yrelay.storage.reads import DocumentStore
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def chromium() -> AsyncIterator[Browser]:
    require_web_build()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


def http_of(ws_url: str) -> str:
    return ws_url.replace("ws://", "http://").removesuffix("/ws")


async def open_editor(browser: Browser, base: str, doc: str, user: str) -> Page:
    """The demo page for ``doc`` in a fresh context, once it holds the server's state."""
    context = await browser.new_context(viewport={"width": 1100, "height": 600})
    page = await context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.errors = errors  # type: ignore[attr-defined]
    await page.goto(f"{base}/?doc={doc}&user={user}")
    await page.wait_for_function("window.yrelay && window.yrelay.provider.synced", timeout=15_000)
    return page


async def type_into(page: Page, text: str) -> None:
    await page.click(".cm-content")
    await page.keyboard.press("End")
    await page.keyboard.type(text)


async def text_of(page: Page) -> str:
    return await page.evaluate("window.yrelay.text.toString()")


async def settled(page: Page, timeout: float = 30_000) -> None:
    """Every local change acked, and the socket up."""
    await page.wait_for_function(
        "window.yrelay.provider.pending === 0 && window.yrelay.provider.status === 'connected'"
        " && window.yrelay.provider.synced",
        timeout=timeout,
    )


async def converged(pages: list[Page], tokens: list[str], timeout: float = 30.0) -> str:
    """Wait until every page shows the same text holding every token; return it."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        texts = [await text_of(page) for page in pages]
        if len(set(texts)) == 1 and all(token in texts[0] for token in tokens):
            return texts[0]
        if asyncio.get_running_loop().time() > deadline:
            missing = {i: [t for t in tokens if t not in text] for i, text in enumerate(texts)}
            raise AssertionError(f"pages did not converge: missing {missing}; texts {texts}")
        await asyncio.sleep(0.1)


def new_doc() -> str:
    return f"browser-{uuid.uuid4().hex[:8]}"


async def test_two_pages_converge_see_each_other_and_show_their_state(redis_url, chromium):
    doc = new_doc()
    async with running_server(redis_url) as url:
        alice = await open_editor(chromium, http_of(url), doc, "alice")
        bob = await open_editor(chromium, http_of(url), doc, "bob")
        await type_into(alice, "alice was here. ")  # one after the other: keystrokes typed at the
        await converged([alice, bob], ["alice was here."])  # same spot at once may interleave
        await type_into(bob, "bob too. ")
        text = await converged([alice, bob], ["alice was here.", "bob too."])
        assert len(text) == len("alice was here. bob too. ")
        for page in (alice, bob):
            await settled(page)
        # Presence: alice's name and caret appear in bob's page, bob's in alice's.
        await bob.wait_for_function(
            "[...window.yrelay.awareness.getStates().values()].some(s => s.user && s.user.name === 'alice')"
        )
        await alice.click(".cm-content")
        await alice.keyboard.press("Home")
        await bob.wait_for_selector(".cm-ySelectionCaret", timeout=10_000)
        assert "alice" in await bob.inner_text("#peers")
        assert await bob.inner_text("#status") == "connected"
        assert await bob.inner_text("#pending") == "0"
        assert "-" in await bob.inner_text("#offset")  # a stream id, acked
        ARTIFACTS.mkdir(exist_ok=True)
        await bob.screenshot(path=str(ARTIFACTS / "demo-editor.png"))
        # Leaving clears the cursor from the other page.
        await alice.context.close()
        await bob.wait_for_function(
            "![...window.yrelay.awareness.getStates().values()].some(s => s.user && s.user.name === 'alice')",
            timeout=10_000,
        )
        assert bob.errors == []  # type: ignore[attr-defined]


async def test_a_page_offline_keeps_editing_and_nothing_is_lost(redis_url, chromium):
    doc = new_doc()
    async with running_server(redis_url) as url:
        online = await open_editor(chromium, http_of(url), doc, "online")
        offline = await open_editor(chromium, http_of(url), doc, "offline")
        await type_into(online, "start. ")
        await converged([online, offline], ["start."])
        await offline.context.set_offline(True)
        await offline.wait_for_function("window.yrelay.provider.status !== 'connected'", timeout=10_000)
        tokens = []
        for i in range(5):
            tokens += [f"on{i}.", f"off{i}."]
            await type_into(online, f" on{i}.")
            await type_into(offline, f" off{i}.")
        assert await offline.evaluate("window.yrelay.provider.pending") > 0
        await asyncio.sleep(0.5)
        assert "off0." not in await text_of(online)  # really cut off
        await offline.context.set_offline(False)
        await converged([online, offline], tokens)
        for page in (online, offline):
            await settled(page)


async def test_pages_recover_when_the_server_process_is_killed_and_restarted(redis_url, chromium, tmp_path):
    doc = new_doc()
    server = ServerProcess(redis_url, tmp_path).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        left = await open_editor(chromium, base, doc, "left")
        right = await open_editor(chromium, base, doc, "right")
        tokens: list[str] = []
        for i in range(3):  # each page waits for the other's words: typing at one spot at once may interleave
            for page, word in ((left, f"L{i}."), (right, f"R{i}.")):
                tokens.append(word)
                await type_into(page, f" {word}")
                await converged([left, right], tokens)
        server.kill()  # SIGKILL mid-session: whatever was acked is in Redis
        for i in range(3, 6):
            tokens += [f"L{i}.", f"R{i}."]
            await type_into(left, f" L{i}.")
            await type_into(right, f" R{i}.")
        await left.wait_for_function("window.yrelay.provider.status !== 'connected'", timeout=10_000)
        server.start()
        await converged([left, right], tokens, timeout=60)
        for page in (left, right):
            await settled(page, timeout=60_000)
    finally:
        server.stop()


async def test_browser_and_python_client_edit_at_once_and_converge(redis_url, chromium):
    doc = new_doc()
    async with running_server(redis_url) as url:
        page = await open_editor(chromium, http_of(url), doc, "browser")
        python = await YrelayClient(url, backoff=FAST_BACKOFF).connect()
        try:
            pydoc = await python.subscribe(doc)

            async def python_edits() -> None:
                for i in range(20):
                    crdt.insert_text(pydoc.ydoc, 0, f"py{i}.")
                    await asyncio.sleep(0.02)

            await asyncio.gather(python_edits(), type_into(page, "".join(f"js{i}." for i in range(20))))
            await python.wait_idle()
            await settled(page)
            tokens = [f"py{i}." for i in range(20)] + [f"js{i}." for i in range(20)]
            deadline = asyncio.get_running_loop().time() + 30
            while (browser_text := await text_of(page)) != pydoc.text or not all(t in pydoc.text for t in tokens):
                assert asyncio.get_running_loop().time() < deadline, (browser_text, pydoc.text)
                await asyncio.sleep(0.1)
            assert browser_text == crdt.text_of(pydoc.ydoc)
        finally:
            await python.close()


async def test_a_reload_while_the_server_is_down_loses_no_unsent_edit(redis_url, chromium, tmp_path):
    """The page is served by one server, synced through another (?server=):
    the sync server dies, the user types, the tab reloads. IndexedDB gives the
    page back its text, its session and its unacked updates, which reach the
    server once it is back."""
    doc = new_doc()
    page_port = free_port()  # the page's origin must be on the sync server's allowlist
    sync = ServerProcess(redis_url, tmp_path, env={"YRELAY_ALLOWED_ORIGINS": f"http://127.0.0.1:{page_port}"}).start()
    async with running_server(redis_url, port=page_port) as page_server:
        page = await open_editor(chromium, http_of(page_server), f"{doc}&server=ws://127.0.0.1:{sync.port}/ws", "a")
        try:
            await type_into(page, "before.")
            await settled(page)
            session = await page.evaluate("window.yrelay.provider.client.session")
            sync.kill()
            await page.wait_for_function("window.yrelay.provider.status !== 'connected'", timeout=10_000)
            await type_into(page, " unsent1. unsent2.")
            await page.wait_for_function("window.yrelay.provider.pending > 0")
            await page.wait_for_timeout(600)  # let the queued writes reach IndexedDB (no timing is asserted)
            await page.reload()
            await page.wait_for_function(
                "window.yrelay && window.yrelay.text.toString().includes('unsent2.')", timeout=10_000
            )
            assert await page.evaluate("window.yrelay.provider.pending") > 0  # restored, still unacked
            assert await page.evaluate("window.yrelay.provider.status") != "connected"
            sync.start()
            await settled(page, timeout=60_000)
            assert await page.evaluate("window.yrelay.provider.client.session") == session  # resumed
            async with YrelayClient(sync.ws_url, backoff=FAST_BACKOFF) as python:
                pydoc = await python.subscribe(doc)
                deadline = asyncio.get_running_loop().time() + 20
                while "unsent2." not in pydoc.text:
                    assert asyncio.get_running_loop().time() < deadline, pydoc.text
                    await asyncio.sleep(0.1)
                assert pydoc.text == await text_of(page) == "before. unsent1. unsent2."
        finally:
            sync.stop()


async def test_a_page_opened_after_compaction_loads_snapshot_and_stream(redis_url, redis_client, chromium):
    """GC folded the history into a snapshot: a new page gets snapshot + the
    rest of the stream, and says `synced` only once it holds all of it."""
    doc = new_doc()
    async with running_server(redis_url, **FAST_GC) as url:
        async with YrelayClient(url, backoff=FAST_BACKOFF) as python:
            pydoc = await python.subscribe(doc)
            for i in range(40):
                crdt.insert_text(pydoc.ydoc, len(pydoc.text), f"w{i} ")
            await python.wait_idle()
            store = DocumentStore(redis_client)
            deadline = asyncio.get_running_loop().time() + 20
            while not (await store.load_snapshot(doc)).update:
                assert asyncio.get_running_loop().time() < deadline, "GC never folded the document"
                await asyncio.sleep(0.05)
            page = await open_editor(chromium, http_of(url), doc, "late")
            assert await text_of(page) == pydoc.text  # complete the moment it says synced
            await type_into(page, " page.")
            deadline = asyncio.get_running_loop().time() + 20
            while not pydoc.text.endswith(" page."):
                assert asyncio.get_running_loop().time() < deadline, pydoc.text
                await asyncio.sleep(0.05)


#: In a page: the same `size` characters every time (words of base-36 numbers), so two pages can compare.
PASTE_JS = """(size) => {
    let s = ''
    for (let i = 0; s.length < size; i++) s += i.toString(36) + ' '
    return s.slice(0, size)
}"""


async def test_a_5_mb_paste_arrives_intact_and_a_20_mb_one_is_refused_without_costing_the_socket(redis_url, chromium):
    """Issue 15 in the browser: the 5 MB paste goes in parts; the 20 MB one
    is refused by the page with an error naming the document, the clock and
    the size, and another document on the same socket still syncs in a second."""
    doc, other = new_doc(), new_doc()
    async with running_server(redis_url) as url:
        writer = await open_editor(chromium, http_of(url), doc, "writer")
        reader = await open_editor(chromium, http_of(url), doc, "reader")
        for page in (writer, reader):  # a second document on the page's socket
            await page.evaluate(
                """(name) => {
                const { provider, doc } = window.yrelay
                const Provider = provider.constructor
                window.other = new Provider(provider.client, name, new doc.constructor(), { awareness: null })
                window.errors = []
                provider.on('error', (e) =>
                    window.errors.push({code: e.code, doc: e.doc, clock: e.clock, size: e.size}))
            }""",
                other,
            )
            await page.wait_for_function("window.other.synced")
        five = 5 * 1024 * 1024
        await writer.evaluate(f"window.yrelay.text.insert(0, ({PASTE_JS})({five}))")
        await reader.wait_for_function(f"window.yrelay.text.length === {five}", timeout=60_000)
        assert await reader.evaluate(f"window.yrelay.text.toString() === ({PASTE_JS})({five})")
        await settled(writer, timeout=60_000)
        socket = await writer.evaluate("window.socketBefore = window.yrelay.provider.client._ws, true")
        assert socket
        twenty = 20 * 1024 * 1024
        await writer.evaluate(f"window.yrelay.text.insert(0, ({PASTE_JS})({twenty}))")
        await writer.wait_for_function("window.errors.length > 0", timeout=60_000)
        [error] = await writer.evaluate("window.errors")
        assert error["code"] == "update_too_large" and error["doc"] == doc, error
        assert isinstance(error["clock"], int) and error["size"] > twenty, error
        assert await writer.evaluate("window.yrelay.provider.pending") == 0
        # The refusal costs the connection nothing: another document's edit
        # still syncs, over the same socket (no reconnect, no backoff). Its
        # time is not the check (it was "< 1 s", a figure of a quiet machine
        # that Chromium on a busy one misses, issue 31); the socket is.
        await writer.evaluate("window.other.doc.getText('text').insert(0, 'still syncing')")
        await reader.wait_for_function(
            "window.other.doc.getText('text').toString() === 'still syncing'", timeout=30_000
        )
        assert await writer.evaluate("window.yrelay.provider.client._ws === window.socketBefore")
        assert writer.errors == [] and reader.errors == []  # type: ignore[attr-defined]
