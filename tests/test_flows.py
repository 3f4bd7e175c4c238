"""The connection's flows (docs/architecture.md#the-path-of-one-update): they
are called one way, and their decisions can be checked without a socket."""

from __future__ import annotations

import ast
import base64
import time
import types
from pathlib import Path

import pytest
from starlette.datastructures import Headers

from yrelay.app.core.handshake import CLOSE_HELLO_TIMEOUT, CLOSE_UNAUTHORIZED, Handshake, offered_subprotocols, token_in
from yrelay.app.wire.payloads import decode_b64, decode_limited
from yrelay.auth import Principal
from yrelay.config import Settings
from yrelay.protocol import ErrorCode, ProtocolError

APP = Path(__file__).resolve().parents[1] / "yrelay" / "app" / "core"
#: The modules the connection hands commands to; none may import it back.
FLOWS = ("handshake", "write_path", "allowance", "presence", "documents", "subscription", "sending", "update_parts")


def _app_imports() -> dict[str, set[str]]:
    """Each yrelay.app.core module's imports of its siblings (TYPE_CHECKING ones included)."""
    graph: dict[str, set[str]] = {}
    for path in APP.glob("*.py"):
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps.update([node.module] if node.module else [alias.name for alias in node.names])
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("yrelay.app.core."):
                deps.add(node.module.removeprefix("yrelay.app.core."))
        graph[path.stem] = {dep.split(".")[0] for dep in deps} & {p.stem for p in APP.glob("*.py")}
    return graph


def test_no_flow_imports_the_connection():
    graph = _app_imports()
    assert {flow: graph[flow] & {"connection"} for flow in FLOWS} == {flow: set() for flow in FLOWS}


def test_yrelay_app_has_no_import_cycle():
    graph = _app_imports()
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        if module in path:
            pytest.fail("import cycle: " + " -> ".join(path[path.index(module) :] + (module,)))
        if module not in done:
            for dep in sorted(graph.get(module, ())):
                visit(dep, path + (module,))
            done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_a_payload_over_its_limit_is_refused_before_decoding_and_names_its_update():
    with pytest.raises(ProtocolError) as too_large:
        decode_limited("A" * 400, 100, ErrorCode.UPDATE_TOO_LARGE, "d", 7)
    assert (too_large.value.code, too_large.value.doc, too_large.value.clock) == (ErrorCode.UPDATE_TOO_LARGE, "d", 7)
    assert "update exceeds 100 bytes" in too_large.value.message
    assert decode_limited(base64.b64encode(b"x" * 100).decode(), 100, ErrorCode.UPDATE_TOO_LARGE, "d", 7) == b"x" * 100
    with pytest.raises(ProtocolError) as malformed:
        decode_b64("not base64!", "d", 8)
    assert (malformed.value.code, malformed.value.clock) == (ErrorCode.MALFORMED_FRAME, 8)


def test_the_token_subprotocol_is_read_and_the_protocol_answered_only_when_offered():
    offered = offered_subprotocols(Headers({"sec-websocket-protocol": "yrelay.v1, yrelay.auth.abc.def"}))
    assert offered == ["yrelay.v1", "yrelay.auth.abc.def"]
    assert token_in(offered) == "abc.def"
    assert token_in(["yrelay.auth."]) is None
    assert Handshake(_services(), Headers({"sec-websocket-protocol": "yrelay.auth.t"})).subprotocol is None
    assert Handshake(_services(), Headers({"sec-websocket-protocol": "yrelay.v1"})).subprotocol == "yrelay.v1"


def test_the_hello_deadline_and_the_tokens_expiry_and_revocation_cut_off():
    revoked: set[str] = set()
    handshake = Handshake(_services(hello_timeout=0.05, auth_leeway=0, revoked=revoked), Headers({}))
    handshake.accepted()
    assert handshake.hello_overdue() is None
    time.sleep(0.06)
    overdue = handshake.hello_overdue()
    assert overdue is not None and (overdue.code, overdue.close_code) == (
        ErrorCode.HANDSHAKE_REQUIRED,
        CLOSE_HELLO_TIMEOUT,
    )
    assert handshake.token_lapsed() is None  # no hello yet: nothing to check
    handshake.principal = Principal.of("u", ["*"], "write", expires_at=time.time() + 60, token_id="t1")
    assert handshake.token_lapsed() is None
    revoked.add("t1")
    lapsed = handshake.token_lapsed()
    assert lapsed is not None and (lapsed.reason, lapsed.close_code) == ("the token was revoked", CLOSE_UNAUTHORIZED)
    handshake.principal = Principal.of("u", ["*"], "write", expires_at=time.time() - 1)
    assert handshake.token_lapsed() == type(lapsed)("the token has expired")


def _services(revoked: set[str] | None = None, **settings: float) -> types.SimpleNamespace:
    """What the handshake uses (:class:`yrelay.app.core.services.HandshakeServices`),
    without Redis: the settings and the revoked list are all its decisions read."""
    revocations = types.SimpleNamespace(is_revoked=lambda token_id: token_id in (revoked or set()))
    return types.SimpleNamespace(settings=Settings(**settings), revocations=revocations)  # type: ignore[arg-type]
