"""Snippets are tests (issue 38): every code block of README.md, web/README.md
and docs/ is classified (tests/snippets.py says how), and every runnable one
runs as pasted against one live server (``yrelay serve`` on the test Redis,
auth off as under ``make serve``): Python with this venv's Python, JavaScript
in Node with ``ws`` as the global WebSocket, HTML in headless Chromium from
a page server on another origin that the server allows
(``YRELAY_ALLOWED_ORIGINS``, as docs/quickstart.md tells a reader to set).

A block talks to ``make serve``'s address, ``127.0.0.1:8000``; the runner
puts the live server's port in its place, and gives ``YRELAY_REDIS_URL`` and
a free ``YRELAY_PORT`` for the examples that need a Redis or serve an app.
A block passes when it exits 0 having printed what it did, or, if it keeps
running, once it printed its first line (a page's code, in Node or
Chromium, never ends; a Python block keeps running only when its first line
says how to stop it, "Ctrl-C"; one that names an http URL there is stopped
once that URL answers). The quickstart's two pages are also opened twice
each, with typing in one window checked in the other, the Vite one built by
Vite itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.async_api import Browser, Page, async_playwright

from browser import CHROMIUM, CHROMIUM_ARGS, WEB_DIR, require_web_build
from snippets import REPO, Block, all_blocks, counts
from yrelay.client import YrelayClient
from yrelay.storage.embedded import free_port
from yrelay.yjs import crdt
from yrelay_tools.testing.processes import ServerProcess

BLOCKS = all_blocks()
RUNNABLE = [block for block in BLOCKS if block.kind == "run"]
#: make serve's address in the docs; the live server's in the runs.
DOCUMENTED = "127.0.0.1:8000"
#: The page origin docs/quickstart.md allows; the page server's in the runs.
DOCUMENTED_PAGE = "localhost:5173"
#: Generous: a failing block fails at once; this bounds one that hangs on a busy machine.
DEADLINE = 90.0
DOUBLE_YJS = "Yjs was already imported"
URL = re.compile(r"https?://[\w.]+:\d+")

pytestmark = pytest.mark.timeout(300)


@dataclass
class Live:
    """The live server and what the runs share."""

    port: int
    page_port: int
    redis_url: str
    work: Path  # snippet files; node_modules for the JavaScript ones
    pages: Path  # what the page server serves
    ran: list[str] = field(default_factory=list)
    #: The text of each block that passed: a listing equal to an example file runs once.
    passed: set[tuple[str, str]] = field(default_factory=set)

    def pasted(self, text: str) -> str:
        """The block as a reader pastes it, pointed at the live servers."""
        return text.replace(DOCUMENTED, f"127.0.0.1:{self.port}").replace(
            DOCUMENTED_PAGE, f"localhost:{self.page_port}"
        )

    @property
    def page_base(self) -> str:
        return f"http://localhost:{self.page_port}"


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def node_modules(work: Path) -> None:
    """web/'s node_modules, plus the package itself as @yrelay/client (one
    Yjs: both resolve to web/node_modules/yjs), and ``ws`` as the global
    WebSocket, which browsers have and Node 20 has not."""
    modules = work / "node_modules"
    modules.mkdir()
    for entry in (WEB_DIR / "node_modules").iterdir():
        if not entry.name.startswith("."):
            (modules / entry.name).symlink_to(entry.resolve())
    (modules / "@yrelay").mkdir()
    (modules / "@yrelay" / "client").symlink_to(WEB_DIR.resolve())
    (work / "websocket-global.mjs").write_text("import WebSocket from 'ws'\nglobalThis.WebSocket ??= WebSocket\n")


@pytest.fixture(scope="module")
def live(redis_process, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Live]:
    require_web_build()
    work, pages = tmp_path_factory.mktemp("snippets"), tmp_path_factory.mktemp("pages")
    node_modules(work)
    (pages / "favicon.ico").write_bytes(b"")  # what Chromium asks every origin for: not a 404 of the page
    page_port = free_port()
    page_server = ThreadingHTTPServer(("127.0.0.1", page_port), partial(QuietHandler, directory=str(pages)))
    threading.Thread(target=page_server.serve_forever, daemon=True).start()
    server = ServerProcess(
        redis_process.url, work, env={"YRELAY_ALLOWED_ORIGINS": f"http://localhost:{page_port}"}
    ).start()
    live = Live(server.port, page_port, redis_process.url, work, pages)
    asyncio.run(seed(server.ws_url))
    try:
        yield live
    finally:
        server.stop()
        page_server.shutdown()
        tally = counts(BLOCKS)
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(
                    f"\ncode blocks of the docs: {len(live.ran)} ran, {tally['fragment']} fragments, "
                    f"{tally['shell']} shell, {tally['data']} data, {tally['unclassified']} unclassified"
                )


async def seed(url: str) -> None:
    """Something in the documents the blocks open, so a reader prints it."""
    async with YrelayClient(url) as client:
        for name in ("notes", "quickstart"):
            doc = await client.subscribe(name)
            crdt.insert_text(doc.ydoc, 0, f"{name}, written by the snippet runner\n")
        await client.wait_idle()


def test_every_block_is_classified() -> None:
    tally = counts(BLOCKS)
    print(f"code blocks: {tally}")
    unclassified = [f"{block.where}: {block.why}" for block in BLOCKS if block.kind == "unclassified"]
    assert not unclassified, "blocks neither runnable nor marked as fragments:\n" + "\n".join(unclassified)
    assert tally["run"] >= 10 and tally["fragment"] >= 1  # the collection itself works


def test_shell_blocks_parse() -> None:
    """Commands are not run (they install, serve, build images), but a
    reader's shell must be able to read them."""
    failed = []
    for block in BLOCKS:
        if block.kind == "shell" and block.lang in ("sh", "bash"):
            checked = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True)
            if checked.returncode:
                failed.append(f"{block.where}: {checked.stderr.strip()}")
    assert not failed, "\n".join(failed)


def test_data_blocks_parse() -> None:
    failed = []
    for block in BLOCKS:
        try:
            if block.kind == "data" and block.lang == "json":
                json.loads(block.text)
            elif block.kind == "data" and block.lang in ("yaml", "yml"):
                yaml.safe_load(block.text)
        except ValueError as exc:
            failed.append(f"{block.where}: {exc}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
async def test_the_block_runs_as_pasted(block: Block, live: Live) -> None:
    name = re.sub(r"\W+", "-", block.where)
    if (block.runtime, block.text) in live.passed:  # docs/embedding.md's listing of docs/examples/embed_fastapi.py
        live.ran.append(block.where)
        return
    if block.runtime == "browser":
        (live.pages / f"{name}.html").write_text(live.pasted(block.text))
        async with chromium() as browser:
            lines = await first_console_line(browser, f"{live.page_base}/{name}.html")
    elif block.runtime == "node":
        script = live.work / f"{name}.mjs"
        script.write_text(live.pasted(block.text))
        lines = await run(
            ["node", "--import", "./websocket-global.mjs", script.name], live, keeps_running=lambda line: True
        )
    else:
        script = live.work / f"{name}.py"
        script.write_text(live.pasted(block.text))
        lines = await run([sys.executable, script.name], live, keeps_running=lambda line: "Ctrl-C" in line)
    assert lines, f"{block.where} printed nothing: examples print what they do"
    live.ran.append(block.where)
    live.passed.add((block.runtime, block.text))


async def run(command: list[str], live: Live, keeps_running) -> list[str]:
    """Run one block; return its stdout lines (see the module's docstring)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "YRELAY_REDIS_URL": live.redis_url, "YRELAY_PORT": str(free_port())}
    process = await asyncio.create_subprocess_exec(
        *command, cwd=live.work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    errors = asyncio.create_task(process.stderr.read())  # type: ignore[union-attr]
    lines: list[str] = []
    stopped = False
    try:
        async with asyncio.timeout(DEADLINE):
            while line := (await process.stdout.readline()).decode():  # type: ignore[union-attr]
                lines.append(line)
                if keeps_running(line):
                    await answers(line, process)
                    stopped = True
                    break
            if not stopped:
                await process.wait()
    except TimeoutError:
        raise AssertionError(
            f"{command[-1]}: no end and no output in {DEADLINE} s; "
            f"stdout: {''.join(lines)[-2000:]}\nstderr: {(await stop(process, errors))[-3000:]}"
        ) from None
    stderr = await stop(process, errors)
    assert stopped or process.returncode == 0, (
        f"{command[-1]} exited {process.returncode}:\n{''.join(lines)}\n{stderr[-3000:]}"
    )
    assert DOUBLE_YJS not in stderr, stderr
    return lines


async def answers(line: str, process: asyncio.subprocess.Process) -> None:
    """A server's first line names its URL: wait until it answers there."""
    url = URL.search(line)
    async with httpx.AsyncClient() as http:
        while url is not None:
            assert process.returncode is None, f"it exited {process.returncode} before {url[0]} answered"
            try:
                await http.get(url[0], timeout=2)
                return
            except httpx.TransportError:
                await asyncio.sleep(0.1)


async def stop(process: asyncio.subprocess.Process, errors: asyncio.Task[bytes]) -> str:
    if process.returncode is None:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
    return (await errors).decode()


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Headless Chromium (Debian's, driven by Playwright) for one test."""
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def open_page(browser: Browser, url: str) -> tuple[Page, list[str], list[str]]:
    """A page in a context of its own (a browser window of its own); its
    console lines, and its errors (uncaught, or a console error such as a
    refused CORS fetch or websocket)."""
    page = await (await browser.new_context()).new_page()
    lines: list[str] = []
    errors: list[str] = []
    page.on("console", lambda message: (errors if message.type == "error" else lines).append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(url)
    return page, lines, errors


async def until(predicate, errors: list[str], what: str) -> None:
    """Wait for ``predicate`` (plain or async); fail at once on a page error."""
    async with asyncio.timeout(DEADLINE):
        while not (await done if asyncio.iscoroutine(done := predicate()) else done):
            assert not errors, f"{what}: {errors}"
            await asyncio.sleep(0.05)
    assert not errors, f"{what}: {errors}"


async def first_console_line(browser: Browser, url: str) -> list[str]:
    _, lines, errors = await open_page(browser, url)
    await until(lambda: lines, errors, url)
    return lines


def quickstart_block(lang: str, contains: str) -> Block:
    return next(
        block
        for block in BLOCKS
        if block.path.name == "quickstart.md" and block.lang == lang and contains in block.text
    )


async def two_windows_type(base: str) -> None:
    """The quickstart's page at ``base``, in two windows: what one types
    arrives in the other's textarea, and the server holds it."""
    async with chromium() as browser:
        windows = [await open_page(browser, base) for _ in range(2)]
        for _, lines, errors in windows:
            await until(lambda lines=lines: any(line.startswith("synced quickstart") for line in lines), errors, base)
        (writer, _, writer_errors), (reader, _, reader_errors) = windows
        await writer.type("#editor", "typed in window one. ")
        typed = await writer.input_value("#editor")
        assert "typed in window one. " in typed

        async def arrived() -> bool:
            return await reader.input_value("#editor") == typed

        async def stored() -> bool:
            return await writer.text_content("#status") == "every change is stored"

        await until(arrived, reader_errors, "the other window")
        await until(stored, writer_errors, "the writer's status")


async def test_the_quickstart_page_without_a_bundler_syncs_two_windows(live: Live) -> None:
    page = quickstart_block("html", "/static/yrelay-client.js")
    (live.pages / "index.html").write_text(live.pasted(page.text))
    await two_windows_type(f"{live.page_base}/index.html")


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/quickstart.md's `npm pack` in web/ (written elsewhere: the checkout stays clean)."""
    out = tmp_path_factory.mktemp("pack")
    packed = subprocess.run(
        ["npm", "pack", "--json", "--pack-destination", str(out)],
        cwd=WEB_DIR,
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    return out / json.loads(packed.stdout)[0]["filename"]


async def test_the_quickstart_vite_app_builds_and_syncs_two_windows(live: Live, tarball: Path, tmp_path: Path) -> None:
    """The three files as the quickstart shows them, `npm install` (Vite and
    Yjs from the registry, the client from the packed tarball), `vite build`,
    the built app served from the allowed origin."""
    app = tmp_path / "my-editor"
    app.mkdir()
    manifest = json.loads(quickstart_block("json", '"vite"').text)
    manifest["dependencies"]["@yrelay/client"] = f"file:{tarball}"
    (app / "package.json").write_text(json.dumps(manifest, indent=2))
    (app / "index.html").write_text(quickstart_block("html", 'src="/main.js"').text)
    (app / "main.js").write_text(live.pasted(quickstart_block("js", "from '@yrelay/client'").text))
    npm = shutil.which("npm")
    assert npm, "npm is needed for the Vite app"
    for command in (
        [npm, "install", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"],
        [npm, "run", "build", "--", "--outDir", str(live.pages / "vite"), "--base", "/vite/"],
    ):
        done = await asyncio.to_thread(subprocess.run, command, cwd=app, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert not (app / "node_modules" / "@yrelay" / "client" / "node_modules" / "yjs").exists()  # one Yjs
    await two_windows_type(f"{live.page_base}/vite/index.html")
