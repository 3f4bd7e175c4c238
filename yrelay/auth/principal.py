"""Who is on the other end of a connection, and which documents they may
read or write.

A grant is an exact document id (``notes/42``) or a prefix ending in ``*``
(``team-7/*``; a lone ``*`` is every document). Permission is ``read``
(subscribe, receive, presence) or ``write`` (also send updates).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from yrelay.storage.keys import DOC_ID_PATTERN


class Permission(str, enum.Enum):
    READ = "read"
    WRITE = "write"


class InvalidGrant(ValueError):
    """A document grant that is neither a document id nor an id prefix + ``*``."""


@dataclass(frozen=True)
class DocumentGrant:
    pattern: str

    @classmethod
    def parse(cls, text: object) -> DocumentGrant:
        if not isinstance(text, str):
            raise InvalidGrant("document grants are strings")
        stem = text[:-1] if text.endswith("*") else text
        if text != "*" and not DOC_ID_PATTERN.fullmatch(stem):
            raise InvalidGrant(f"not a document id or prefix*: {text[:60]!r}")
        return cls(text)

    def covers(self, doc: str) -> bool:
        if self.pattern.endswith("*"):
            return doc.startswith(self.pattern[:-1])
        return doc == self.pattern


@dataclass(frozen=True)
class Principal:
    """An authenticated subject with its grants. ``expires_at`` (Unix seconds)
    and ``token_id`` let the server cut the connection off when the token
    expires or is revoked."""

    subject: str
    grants: tuple[DocumentGrant, ...]
    permission: Permission
    expires_at: float | None = None
    token_id: str | None = None

    @classmethod
    def of(
        cls,
        subject: str,
        grants: Iterable[str],
        permission: Permission | str,
        *,
        expires_at: float | None = None,
        token_id: str | None = None,
    ) -> Principal:
        grants_of = tuple(DocumentGrant.parse(g) for g in grants)
        return cls(subject, grants_of, Permission(permission), expires_at=expires_at, token_id=token_id)

    def can_read(self, doc: str) -> bool:
        return any(grant.covers(doc) for grant in self.grants)

    def can_write(self, doc: str) -> bool:
        return self.permission is Permission.WRITE and self.can_read(doc)


#: The principal of a server started with ``--insecure-no-auth``: everything.
ANYONE = Principal("anonymous", (DocumentGrant("*"),), Permission.WRITE)
