"""The JavaScript provider's own tests (web/test, node --test), run against a
live server and redis-server: the unit tests of its digest, held ids, backoff,
send buffer, ordering and update parts, and the protocol tests (convergence,
several documents on one socket, offline edits, resume without resync,
batching, two-way sync, rejected updates, presence; issue 15: ordered resends
and causal refusals while Redis refuses writes, 5 MB and 20 MB pastes,
`synced` only with the text there, the bundle of 2455dc5 against this server;
issue 30: 4429 closes wait retry_after_ms and back off, against a `ws` peer;
no resends of updates a server slowing the client down answers late, against
a server with low update rates)."""

from __future__ import annotations

import json
import shutil

import pytest

from browser import WEB_DIR, require_web_build, run_node, tap_failures
from conftest import running_server
from yrelay.auth import issue_token

SECRET = "web-test-secret-0123456789abcdef012345"
OPS_TOKEN = "web-test-ops-token"


@pytest.mark.timeout(300)
async def test_node_provider_suite_passes_against_a_live_server(redis_url):
    require_web_build()
    assert shutil.which("node"), "Node.js is needed for the provider tests"
    tests = sorted(str(path.relative_to(WEB_DIR)) for path in (WEB_DIR / "test").glob("*.test.js"))
    assert len(tests) >= 2, tests
    tokens = {
        "write": issue_token(SECRET, "writer", ["auth-*"], "write"),
        "read": issue_token(SECRET, "reader", ["auth-*"], "read"),
    }
    # The rate limits are off: a test seeds a document with 5,000 updates.
    async with (
        running_server(
            redis_url,
            ops_token=OPS_TOKEN,
            updates_per_second=1e6,
            update_burst=10**6,
            subject_updates_per_second=1e6,
            subject_update_burst=10**6,
        ) as url,
        running_server(redis_url, insecure_no_auth=False, auth_secret=SECRET) as auth_url,
        running_server(redis_url, updates_per_second=50, update_burst=10) as paced_url,
    ):
        # One file at a time: reliability.test.js makes the shared Redis refuse writes for a moment.
        returncode, report, _ = await run_node(
            "--test",
            "--test-concurrency=1",
            "--test-reporter=tap",
            *tests,
            cwd=WEB_DIR,
            timeout=240,
            env={
                "YRELAY_WS_URL": url,
                "YRELAY_AUTH_WS_URL": auth_url,
                "YRELAY_PACED_WS_URL": paced_url,
                "YRELAY_AUTH_TOKENS": json.dumps(tokens),
                "YRELAY_REDIS_URL": redis_url,
                "YRELAY_OPS_TOKEN": OPS_TOKEN,
            },
            merge_stderr=True,
        )
    assert returncode == 0, tap_failures(report)
    passed = [line for line in report.splitlines() if line.startswith("# pass ")]
    assert passed and int(passed[-1].split()[-1]) >= 40, tap_failures(report)
    assert "# fail 0" in report and "# skipped 0" in report, tap_failures(report)
