"""Log lines that say which document and session they are about, and never
carry a secret.

- **Context.** The connection task sets :data:`session` once the handshake
  is done and :data:`doc` for each frame about a document; a subscription's
  pump task sets both. Tasks copy the context they are created in, so every
  ``log.warning(...)`` on those paths gets ``doc`` and ``session`` without
  passing them. A line logged elsewhere can pass ``extra={"doc": ...}``.
- **Format.** ``text`` (``... message doc=<doc> session=<session>``, the
  pairs that are set) or ``json`` (one object a line: ``ts``, ``level``,
  ``logger``, ``message``, ``doc``, ``session``, ``exc``).
- **Redaction.** Every formatted line (message, arguments and tracebacks)
  goes through :func:`redact`: the secrets given to :func:`add_secret`
  (the ops and metrics tokens, the Redis password), then anything shaped like
  one (``Bearer <token>``, a JWT ``eyJ...``, the password of a URL,
  ``token=`` / ``password=`` query parameters, a ``yrelay.auth.<token>``
  subprotocol).
- **The wire.** At debug level the websockets library (through uvicorn's
  ``uvicorn.error`` logger) logs every frame, a long one as its first and
  last characters, and every handshake header: a ``hello``'s token, whole
  when short, and the token of a subprotocol or a cookie. :func:`guard_wire`
  puts :class:`WireFilter` on those loggers, whatever handlers a host app
  configured: a data frame is logged as its type and size only, a header
  that can carry a credential as ``[redacted]``.
- **Escaping.** What a client sends (an ``Origin`` header, a path, a frame's
  text) must not forge a log line or drive a terminal: U+0085 is a line break
  to many log readers, U+009B a terminal escape. :func:`untrusted` escapes
  every control character (C0, DEL, C1, line and paragraph separators,
  bidirectional overrides) as ``\\xNN`` / ``\\uNNNN``; call it on client
  strings logged outside these formatters. The formatters here apply it to
  every string argument of every record (uvicorn's request lines too), and
  escape control characters other than newline and tab in the whole line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
from collections.abc import Mapping
from typing import IO
from urllib.parse import urlsplit

from websockets.frames import DATA_OPCODES, Frame

doc: contextvars.ContextVar[str | None] = contextvars.ContextVar("yrelay_doc", default=None)
session: contextvars.ContextVar[str | None] = contextvars.ContextVar("yrelay_session", default=None)

REDACTED = "[redacted]"
#: Shorter strings are not treated as secrets (they would blank out ordinary words).
MIN_SECRET_LENGTH = 6
_secrets: set[str] = set()
_PATTERNS = [
    (re.compile(r"(?i)(\bbearer\s+)[^\s\"',;]+"), rf"\1{REDACTED}"),
    (re.compile(r"\beyJ[\w-]{4,}(?:\.[\w-]*){0,2}"), REDACTED),  # a JWT (its header is base64url "{")
    (re.compile(r"(\b[a-zA-Z][\w+.-]*://[^/\s:@]*:)[^/\s@]+(@)"), rf"\1{REDACTED}\2"),  # scheme://user:PASSWORD@
    (re.compile(r"(?i)([?&;](?:token|access_token|auth|password|passwd|secret|key)=)[^&\s\"']+"), rf"\1{REDACTED}"),
    # the subprotocol carrying a token; not the names of yrelay.auth's own loggers
    (
        re.compile(
            r"(\byrelay\.auth\.)(?!(?:authenticator|host|origins|principal|revocation|tokens)(?:[:\"']|$))"
            r"[^\s,;\"']+"
        ),
        rf"\1{REDACTED}",
    ),
]


#: Control characters, line/paragraph separators and bidirectional controls.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: The same, less newline and tab (kept in tracebacks and multi-line messages).
_UNSAFE_IN_LINE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def untrusted(value: object, limit: int = 200) -> str:
    """A client-controlled value, safe inside a log line: control characters
    escaped, cut to ``limit`` characters (``...`` marks a cut)."""
    text = str(value)
    cut = text[:limit]
    return _UNSAFE.sub(_escape_char, cut) + ("..." if len(text) > limit else "")


def _escaped(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of ``record`` whose string arguments are escaped (not cut)."""
    args = record.args
    if not args:
        return record
    clean = logging.makeLogRecord(record.__dict__)
    if isinstance(args, Mapping):
        clean.args = {key: _UNSAFE.sub(_escape_char, v) if isinstance(v, str) else v for key, v in args.items()}
    else:
        clean.args = tuple(_UNSAFE.sub(_escape_char, a) if isinstance(a, str) else a for a in args)
    return clean


def add_secret(value: str | None) -> None:
    """Never log ``value`` (a token, a password) verbatim."""
    if value and len(value) >= MIN_SECRET_LENGTH:
        _secrets.add(value)


def add_url_secrets(url: str | None) -> None:
    """Never log the password of ``url`` (e.g. a Redis URL)."""
    if url:
        try:
            add_secret(urlsplit(url).password)
        except ValueError:
            pass


def redact(text: str) -> str:
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


#: The loggers the websockets library writes a server's frames and handshakes to.
WIRE_LOGGERS = ("uvicorn.error", "websockets.server")
#: Handshake headers whose value can be a credential.
CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "sec-websocket-protocol"}
)
_HEADER_LINES = frozenset({"< %s: %s", "> %s: %s"})


class WireFilter(logging.Filter):
    """The websockets library's debug lines without what the connection
    carries: a data frame as ``TEXT [57 bytes]``, a credential header's
    value as ``[redacted]``. A filter of the logger, so it holds before any
    handler (a host app's own included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            frame = args[0]
            if isinstance(frame, Frame) and frame.opcode in DATA_OPCODES:
                record.args = (f"{frame.opcode.name} [{len(frame.data)} bytes]", *args[1:])
            elif record.msg in _HEADER_LINES and len(args) == 2 and str(args[0]).lower() in CREDENTIAL_HEADERS:
                record.args = (args[0], REDACTED)
        return True


def guard_wire() -> None:
    """Put :class:`WireFilter` on :data:`WIRE_LOGGERS` (once)."""
    for name in WIRE_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, WireFilter) for f in logger.filters):
            logger.addFilter(WireFilter())


class ContextFilter(logging.Filter):
    """Adds ``doc`` and ``session`` to every record (unless given in ``extra``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "doc"):
            record.doc = doc.get()
        if not hasattr(record, "session"):
            record.session = session.get()
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = _UNSAFE_IN_LINE.sub(_escape_char, super().format(_escaped(record)))
        context = "".join(
            f" {name}={value}" for name in ("doc", "session") if (value := getattr(record, name, None)) is not None
        )
        if context:
            head, newline, traceback = line.partition("\n")  # keep the pairs on the message's line
            line = head + context + newline + traceback
        return redact(line)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record = _escaped(record)
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redact(_UNSAFE_IN_LINE.sub(_escape_char, record.getMessage())),
            "doc": getattr(record, "doc", None),
            "session": getattr(record, "session", None),
        }
        if record.exc_info:
            entry["exc"] = redact(_UNSAFE_IN_LINE.sub(_escape_char, self.formatException(record.exc_info)))
        elif record.exc_text:
            entry["exc"] = redact(_UNSAFE_IN_LINE.sub(_escape_char, record.exc_text))
        return json.dumps(entry, ensure_ascii=False)


FORMATS = {"text": TextFormatter, "json": JsonFormatter}


def handler(format: str = "text", stream: IO[str] | None = None) -> logging.Handler:
    """A stream handler with the context filter and a redacting formatter."""
    if format not in FORMATS:
        raise ValueError(f"log format {format!r}: use one of {', '.join(FORMATS)}")
    result = logging.StreamHandler(stream or sys.stderr)
    result.addFilter(ContextFilter())
    result.setFormatter(FORMATS[format]())
    return result


def configure(level: str = "info", format: str = "text", stream: IO[str] | None = None) -> logging.Handler:
    """Route every logger (uvicorn's too) through one such handler on the root logger."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    new = handler(format, stream)
    root.addHandler(new)
    root.setLevel(level.upper())
    return new
