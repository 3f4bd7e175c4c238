"""The options of the ``yrelay`` Spark data source, parsed and checked once.

Spark hands a data source its options as strings in a case-insensitive map.
They are turned into one frozen :class:`SourceOptions` before any Redis call,
so a typo fails at ``load()`` with the option's name in the message instead of
deep inside a Python worker.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from yrelay.storage.keys import InvalidDocumentId, validate_doc_id
from yrelay.tracker.lag import COUNT_CAP

DEFAULT_DOCS_PER_PARTITION = 100
#: What redis-py's ``Redis.from_url`` accepts.
URL_SCHEMES = ("redis", "rediss", "unix")


class SourceOptionError(ValueError):
    """An option of the data source is missing or malformed."""


class Kind(enum.Enum):
    """Which table the source reads."""

    #: One row per stream entry.
    ENTRIES = "entries"
    #: One row per (document, tracked session), with its lag.
    TRACKER = "tracker"


@dataclass(frozen=True)
class SourceOptions:
    """Everything a reader needs; picklable, sent to every Spark task."""

    url: str
    kind: Kind = Kind.ENTRIES
    #: None: every document in the registry (yrelay/storage/listing.py).
    docs: tuple[str, ...] | None = None
    docs_per_partition: int = DEFAULT_DOCS_PER_PARTITION
    #: entries: also ship the Yjs update bytes (column ``update``).
    with_updates: bool = False
    #: tracker: at most this many stream entries are walked per document to
    #: count ``lag_entries`` (the cap of the /ops figures; a lower bound past it).
    lag_cap: int = COUNT_CAP
    #: ``url`` is a seed node of a Redis Cluster (option ``cluster``).
    cluster: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check Spark's string options; raise :class:`SourceOptionError` on the first bad one."""
        return cls(
            url=_url(options.get("url")),
            kind=_kind(options.get("kind", Kind.ENTRIES.value)),
            docs=_docs(options.get("docs")),
            docs_per_partition=_positive_int(options, "docsPerPartition", DEFAULT_DOCS_PER_PARTITION),
            with_updates=_boolean(options, "withUpdates"),
            lag_cap=_positive_int(options, "lagCap", COUNT_CAP),
            cluster=_boolean(options, "cluster"),
        )


def _url(raw: str | None) -> str:
    url = (raw or "").strip()
    if not url:
        raise SourceOptionError("the yrelay data source needs option 'url' (e.g. redis://localhost:6379/0)")
    if urlsplit(url).scheme not in URL_SCHEMES:
        raise SourceOptionError(f"option 'url' is {redacted(url)!r}; expected a {', '.join(URL_SCHEMES)} URL")
    return url


def redacted(url: str) -> str:
    """``url`` with its password replaced by ``***``, fit for an error message."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _kind(raw: str) -> Kind:
    try:
        return Kind(raw.strip().lower())
    except ValueError:
        known = ", ".join(repr(kind.value) for kind in Kind)
        raise SourceOptionError(f"option 'kind' is {raw!r}; expected one of {known}") from None


def _docs(raw: str | None) -> tuple[str, ...] | None:
    """Comma-separated document ids, in order, without repeats; None when absent."""
    if raw is None:
        return None
    docs = [doc.strip() for doc in raw.split(",") if doc.strip()]
    for doc in docs:
        try:
            validate_doc_id(doc)
        except InvalidDocumentId as error:
            raise SourceOptionError(f"option 'docs': {doc[:40]!r}: {error}") from None
    return tuple(dict.fromkeys(docs))


def _positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise SourceOptionError(f"option {name!r} is {raw!r}; expected a positive integer")
    return value


def _boolean(options: Mapping[str, str], name: str) -> bool:
    raw = str(options.get(name, "false")).strip().lower()
    if raw not in ("true", "false"):
        raise SourceOptionError(f"option {name!r} is {raw!r}; expected true or false")
    return raw == "true"
