"""The dashboard of a real analysis renders in headless Chromium from file://,
offline: no console errors, every chart drawn. A screenshot is kept in
test-artifacts/ for a human look."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS
from yrelay.spark_analytics.analysis import Options
from yrelay.spark_analytics.dashboard import DASHBOARD, read_table
from yrelay.spark_analytics.job import JobConfig, run
from yrelay.spark_analytics.tables import SEVERITY, Status, Table
from yrelay_tools.analytics_data import Scenario, generate


@pytest.fixture(scope="module")
def dashboard(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dashboard")
    scenario = Scenario(docs=3, readers=2, seconds=40)
    generate(root / "events", scenario)
    _never_acking_session(root / "events", scenario.start_ms + 20_000)
    run(spark, JobConfig(root / "events", root / "out", options=Options(bucket_seconds=5)))
    return root / "out" / DASHBOARD


NEVER_ACKS = "never-acks"


def _never_acking_session(events: Path, ts: int) -> None:
    """A reader of d0 that was delivered to, evicted and told to resync, and
    never acked: it has no lag, so it is in no lag chart or top-N table."""
    lines = [
        {"v": 1, "ts": ts, "type": "connect", "process": "p-extra", "session": NEVER_ACKS, "resumed": False},
        {
            "v": 1,
            "ts": ts + 5,
            "type": "evict",
            "process": "p-extra",
            "doc": "d0",
            "session": NEVER_ACKS,
            "mode": "relative",
        },
        {
            "v": 1,
            "ts": ts + 10,
            "type": "resync",
            "process": "p-extra",
            "doc": "d0",
            "session": NEVER_ACKS,
            "reason": "evicted",
            "offset": "0-0",
        },
    ]
    (events / "events-extra-0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_every_session_not_ok_is_named_with_its_status(dashboard):
    rows = table_rows(dashboard.read_text(), "troubled")
    named = {row["session"]: row for row in rows}
    assert named[NEVER_ACKS]["status"] == str(Status.ERR)  # never acked: no lag, still listed
    assert (named[NEVER_ACKS]["acks"], named[NEVER_ACKS]["last ack (UTC)"]) == ("0", "-")  # no acks, no last ack
    statuses = [row["status"] for row in rows]
    assert {str(Status.WARN), str(Status.STALL), str(Status.STOP), str(Status.REWIND), str(Status.LEFT_UNACKED)} <= set(
        statuses
    )
    assert str(Status.OK) not in statuses and str(Status.LEFT) not in statuses  # a clean leave is no trouble
    assert statuses == sorted(statuses, key=lambda s: SEVERITY.index(Status(s)))  # worst first
    assert named["d0-stop"]["last ack (UTC)"].startswith("2026-01-01T")  # the last ack, as a UTC time


def table_rows(page: str, table_id: str) -> list[dict[str, str]]:
    """The rows of the page's table ``table_id``, by column title (cells as text)."""
    table = page[page.index(f"<table id='{table_id}'>") :]
    table = table[: table.index("</table>")]
    head, body = table.split("</thead>")
    titles = [html.unescape(cell.split("</th>")[0]) for cell in head.split("<th>")[1:]]
    return [dict(zip(titles, cells(row), strict=True)) for row in body.split("</tr>") if "<td" in row]


def cells(row: str) -> list[str]:
    """The text of each cell of a row (markup inside a cell removed)."""
    texts = []
    for cell in row.split("<td")[1:]:
        inner = cell.split(">", 1)[1].split("</td>")[0]
        texts.append(html.unescape(re.sub("<[^>]+>", "", inner)).strip())
    return texts


def test_the_page_is_self_contained(dashboard):
    page = dashboard.read_text()
    assert "<script src=" not in page and "<link" not in page  # plotly.js is inlined, nothing is fetched
    assert "Plotly.newPlot" in page and len(page) > 3_000_000  # plotly.min.js itself is ~4.6 MB


def test_the_dashboard_renders_in_headless_chromium(dashboard, tmp_path):
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            offline=True,
        )
        try:
            page = browser.new_page()
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(dashboard.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('div[id^=chart-] svg.main-svg').length >= 5")
            drawn = page.eval_on_selector_all(
                "div[id^=chart-]",
                "divs => divs.map(d => [d.id, d.querySelectorAll('svg.main-svg').length, "
                "d.querySelectorAll('.trace').length])",
            )
            tables = page.eval_on_selector_all("table", "ts => ts.map(t => t.rows.length)")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        finally:
            browser.close()
    assert errors == []
    assert len(drawn) == 5 and all(svgs >= 1 and traces >= 1 for _, svgs, traces in drawn), drawn
    # sessions not OK, top lagging, hottest documents, all figures
    assert len(tables) == 4 and all(rows > 1 for rows in tables)


# ------------------------------------------------- a real server (issue 37)

SECRET = "dashboard-secret-0123456789abcdef0123"


def _score(entry_id: str) -> int:
    ms, seq = entry_id.split("-")
    return int(ms) * 1000 + int(seq)


@pytest.mark.timeout(600)
async def test_a_real_servers_stuck_client_heads_the_dashboard(spark, redis_url, redis_client, make_client, tmp_path):
    """A writer (alice), two readers that read everything and close (bob,
    carol; GC evicts them afterwards), and a raw client (erin) that acks
    until the readers are gone, then stays connected and stops acking while
    the writer goes on. The analysis runs while the server still serves it
    (as an operator's would), and the dashboard, opened in headless
    Chromium, lists erin's session first among the sessions not OK, as STOP,
    with her subject (hashed, the default)."""
    import asyncio

    import websockets

    from conftest import eventually, running_server
    from wsraw import RawPeer
    from yrelay.auth import issue_token
    from yrelay.gc import Collector, GcPolicy
    from yrelay.observability.eventlog import EventLog, subject_for_log
    from yrelay.storage.keys import tracker_key
    from yrelay.yjs import crdt

    def token(subject: str) -> str:
        return issue_token(SECRET, subject, ["board"])

    async def tracked(session: str, entry_id: str) -> bool:
        score = await redis_client.zscore(tracker_key("board"), session)
        return score is not None and score >= _score(entry_id)

    async def wait_tracked(session: str, entry_id: str) -> None:
        deadline = asyncio.get_running_loop().time() + 30
        while not await tracked(session, entry_id):
            assert asyncio.get_running_loop().time() < deadline, f"{session} never held {entry_id}"
            await asyncio.sleep(0.05)

    events_dir = tmp_path / "events"
    async with running_server(
        redis_url, insecure_no_auth=False, auth_secret=SECRET, gc_interval=0, data_dir=tmp_path
    ) as url:
        writer = await make_client(url, token=token("alice"))
        readers = [await make_client(url, token=token(name)) for name in ("bob", "carol")]
        wdoc = await writer.subscribe("board")
        rdocs = [await reader.subscribe("board") for reader in readers]
        stuck = RawPeer(await websockets.connect(url, max_size=None))
        await stuck.send({"op": "hello", "token": token("erin")})
        stuck.session = (await stuck.expect("welcome"))["session"]
        await stuck.send({"op": "subscribe", "doc": "board", "offset": None})
        await stuck.expect("subscribed")
        acking = True
        received: list[str] = []

        async def read_stuck() -> None:
            while True:
                frame = await stuck.recv(timeout=60)
                if frame["op"] == "deliver":
                    received.append(frame["entries"][-1]["id"])
                    if acking:
                        await stuck.send({"op": "ack", "doc": "board", "offset": frame["entries"][-1]["id"]})

        reading = asyncio.create_task(read_stuck())
        try:
            for i in range(5):  # phase 1: everybody reads and acks
                crdt.insert_text(wdoc.ydoc, 0, f"<a{i}>")
            await writer.wait_idle()
            first = writer.acked[-1].id
            await eventually(lambda: all(rdoc.text == wdoc.text for rdoc in rdocs))
            for reader in readers:
                await wait_tracked(reader.session, first)
                await reader.close()  # nothing unacked: they leave cleanly
            for i in range(5):  # phase 2: erin still acks
                crdt.insert_text(wdoc.ydoc, 0, f"<b{i}>")
                await writer.wait_idle()
                await asyncio.sleep(0.01)  # the readers fall behind in time, not only in entries
            await wait_tracked(stuck.session, writer.acked[-1].id)
            acking = False  # from here erin is connected and silent
            gc_log = EventLog(events_dir, process="gc:1").start()
            await Collector(redis_client, GcPolicy(relative_ms=5), events=gc_log).collect(["board"])
            gc_log.stop()
            for i in range(5):  # phase 3: erin falls behind
                crdt.insert_text(wdoc.ydoc, 0, f"<c{i}>")
            await writer.wait_idle()
            last = writer.acked[-1].id
            await eventually(lambda: last in received, timeout=20)

            def silent_long_enough() -> bool:
                """The log shows erin silent for longer than her last 10 acks
                spanned (Burrow's STOP rule, status.py), resends going on."""
                lines = [
                    json.loads(line)
                    for path in events_dir.glob("*.jsonl")
                    for line in path.read_text().splitlines()
                    if line.endswith("}")
                ]
                acks = sorted(
                    line["ts"] for line in lines if line["type"] == "ack" and line.get("session") == stuck.session
                )[-10:]
                resent = any(line["type"] == "resend" and line.get("session") == stuck.session for line in lines)
                return resent and max(line["ts"] for line in lines) - acks[-1] > acks[-1] - acks[0]

            await eventually(silent_long_enough, timeout=60, interval=0.2)
            out = tmp_path / "out"
            await asyncio.to_thread(run, spark, JobConfig(events_dir, out))
        finally:
            reading.cancel()
            await stuck.close()

    rows = table_rows((out / DASHBOARD).read_text(), "troubled")
    assert rows, "no session is listed as not OK"
    assert (rows[0]["session"], rows[0]["status"], rows[0]["subject"]) == (
        stuck.session,
        str(Status.STOP),
        subject_for_log("erin", "hash"),
    )
    assert int(rows[0]["lag now (entries)"]) == 5
    named = {row["session"] for row in rows}
    assert not named & {reader.session for reader in readers}  # they left cleanly: not trouble
    status = read_table(out, Table.STATUS).set_index("session")
    assert {status.loc[reader.session, "status"] for reader in readers} == {str(Status.LEFT)}
    assert (status.loc[readers[0].session, "last_problem"] or "").startswith("evict:")  # GC evicted it after it left
    shot = await asyncio.to_thread(_screenshot, out / DASHBOARD, tmp_path, "dashboard-stuck-client.png")
    assert shot["errors"] == [] and shot["first_row"].startswith(subject_for_log("erin", "hash"))


def _screenshot(page_path: Path, tmp_path: Path, name: str) -> dict:
    """Open the dashboard in headless Chromium (in a thread: Playwright's sync
    API refuses a running event loop), keep a screenshot, and return the
    page's errors and the text of the first session not OK as rendered."""
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
            offline=True,
        )
        try:
            page = browser.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("document.querySelectorAll('#chart-lag .trace').length >= 1")
            first_row = page.eval_on_selector(
                "#troubled tbody tr", "row => [...row.cells].slice(1).map(c => c.innerText).join(' ')"
            )
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / name), full_page=False)
        finally:
            browser.close()
    return {"errors": errors, "first_row": first_row}
