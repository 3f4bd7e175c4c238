"""The JavaScript provider's own tests (web/test, node --test), run against a
live server: the unit tests of its digest, held ids, backoff and send buffer,
and the protocol tests (convergence, several documents on one socket, offline
edits, resume without resync, batching, two-way sync, rejected updates,
presence)."""

from __future__ import annotations

import asyncio
import os
import shutil

from browser import WEB_DIR, require_web_build
from conftest import running_server


async def test_node_provider_suite_passes_against_a_live_server(redis_url):
    require_web_build()
    node = shutil.which("node")
    assert node, "Node.js is needed for the provider tests"
    tests = sorted(str(path.relative_to(WEB_DIR)) for path in (WEB_DIR / "test").glob("*.test.js"))
    assert len(tests) >= 2, tests
    async with running_server(redis_url) as url:
        process = await asyncio.create_subprocess_exec(
            node, "--test", "--test-reporter=tap", *tests, cwd=WEB_DIR,
            env={**os.environ, "YRELAY_WS_URL": url},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 110)
    report = output.decode()
    assert process.returncode == 0, report[-6000:]
    passed = [line for line in report.splitlines() if line.startswith("# pass ")]
    assert passed and int(passed[-1].split()[-1]) >= 10, report[-3000:]
    assert "# fail 0" in report and "# skipped 0" in report, report[-3000:]
