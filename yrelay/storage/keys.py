"""The whole Redis key layout of yrelay, in one place.

Every key that belongs to one document carries the document id as a Redis
Cluster hash tag (``yrelay:{<doc>}:...``) so that the append script, which
touches several of them atomically, always runs on a single slot. Because the
tag is delimited by braces, document ids may not contain ``{`` or ``}``.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

import xxhash

PREFIX = "yrelay"

#: The characters a document id holds as themselves; every other byte of a
#: name is written ``%XX`` (:func:`room_doc_id`).
DOC_ID_CHARS = "A-Za-z0-9._\\-:/@"
#: Allowed document ids: 1..200 characters of letters, digits, ``._-:/@`` and
#: ``%XX`` escapes (two upper-case hex digits). No braces (they would break
#: the hash tag), no whitespace, no control bytes: a y-websocket room name
#: holding them reaches its document through :func:`room_doc_id`.
DOC_ID_PATTERN = re.compile(rf"^(?=.{{1,200}}\Z)(?:[{DOC_ID_CHARS}]|%[0-9A-F]{{2}})+\Z")
#: A byte that stays as it is in a document id.
_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-:/@")
#: Session ids are issued by the server (``secrets.token_urlsafe``).
SESSION_ID_PATTERN = re.compile(r"^[A-Za-z0-9_\-]{16,64}$")


class InvalidDocumentId(ValueError):
    """Raised for a document id outside :data:`DOC_ID_PATTERN`."""


def validate_doc_id(doc: object) -> str:
    """Return ``doc`` if it is a valid document id, else raise :class:`InvalidDocumentId`."""
    if not isinstance(doc, str) or not DOC_ID_PATTERN.fullmatch(doc):
        raise InvalidDocumentId("document ids are 1-200 characters of letters, digits, ._-:/@ and %XX escapes")
    return doc


def room_doc_id(room: str) -> str:
    """The document id of a y-websocket room name (``/yws/<room>``).

    Apps name rooms as they like; ids keep to :data:`DOC_ID_PATTERN` (no
    braces: the hash tag). Each UTF-8 byte outside the id characters, ``%``
    included, becomes ``%XX`` (upper-case hex), so the mapping is one-to-one
    (:func:`doc_id_room` gives the room back) and a name that already is a
    valid id without ``%`` stays the same. Raises :class:`InvalidDocumentId`
    for a name whose id would be empty or longer than 200 characters: no
    id can hold it without two names sharing one.
    """
    try:
        data = room.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no bytes to escape, so no id
        raise InvalidDocumentId("a room name must be valid Unicode text (a URL's %XX escapes UTF-8 bytes)") from exc
    doc = "".join(chr(byte) if byte in _PLAIN else f"%{byte:02X}" for byte in data)
    if not doc:
        raise InvalidDocumentId("a room name may not be empty")
    if len(doc) > 200:
        raise InvalidDocumentId(
            f"a room name becomes a document id of at most 200 characters (each byte outside letters, digits "
            f"and ._-:/@ counts 3): this one would be {len(doc)}"
        )
    return doc


def doc_id_room(doc: str) -> str:
    """The room name a :func:`room_doc_id` came from (``%XX`` escapes decoded)."""
    return unquote(doc, errors="strict")


def stream_key(doc: str) -> str:
    """The append-only stream of Yjs updates of one document."""
    return f"{PREFIX}:{{{doc}}}:stream"


def tracker_key(doc: str) -> str:
    """Sorted set: member = session id, score = the session's acked offset."""
    return f"{PREFIX}:{{{doc}}}:tracker"


def meta_key(doc: str) -> str:
    """Hash: ``last_id`` (last id ever appended), ``trimmed_through``,
    ``snapshot_offset``."""
    return f"{PREFIX}:{{{doc}}}:meta"


def snapshot_key(doc: str) -> str:
    """String: a Yjs update holding the document up to ``snapshot_offset``."""
    return f"{PREFIX}:{{{doc}}}:snapshot"


def dedup_key(doc: str) -> str:
    """Hash: ``<session>:<clock>`` -> stream id of the entry that update became.

    Makes a resent update idempotent. A field lives as long as its stream
    entry; trimming the entry removes the field.
    """
    return f"{PREFIX}:{{{doc}}}:dedup"


def clocks_key(doc: str) -> str:
    """Hash: Yjs client id -> the next clock the document expects of it (the
    document's state vector; yrelay/yjs/admission.py). Changed only by the append
    script, with ``meta.clocks_through`` = the last entry it accounts for."""
    return f"{PREFIX}:{{{doc}}}:clocks"


def dropped_key(doc: str) -> str:
    """Set: ids of stream entries an operator dropped because no replica could
    apply them (yrelay/gc/blocked.py); GC folds them as empty updates."""
    return f"{PREFIX}:{{{doc}}}:dropped"


def presence_key(doc: str) -> str:
    """Hash: awareness clientID -> ``<ms>|<session>|<origin>|<encoded entry>``,
    the last state each present client sent (ephemeral: the key expires
    ``presence_timeout`` after the last write; never in the stream)."""
    return f"{PREFIX}:{{{doc}}}:presence"


def presence_channel(doc: str) -> str:
    """Pub/sub channel relaying a document's awareness updates between processes."""
    return f"{PREFIX}:presence:{doc}"


def doc_of_presence_channel(channel: str) -> str:
    """Inverse of :func:`presence_channel`."""
    return channel[len(f"{PREFIX}:presence:") :]


def revoked_tokens_key() -> str:
    """Sorted set: revoked token id (JWT ``jti``) -> when the token expires anyway."""
    return f"{PREFIX}:revoked-tokens"


def session_key(session: str) -> str:
    """String with a TTL: marks a session id the server issued as resumable."""
    return f"{PREFIX}:session:{session}"


def session_documents_key(session: str) -> str:
    """Sorted set (all scores 0, ordered by id): the documents whose tracker
    holds ``session``. What the subscription-set digest is computed over."""
    return f"{PREFIX}:session:{{{session}}}:docs"


def session_of_documents_key(key: str) -> str:
    """Inverse of :func:`session_documents_key`."""
    return key[len(f"{PREFIX}:session:{{") : -len("}:docs")]


def session_documents_digest_key(session: str) -> str:
    """Hash: count + XOR hash of :func:`session_documents_key`, kept by the
    same script that changes the set (same hash tag: one cluster slot)."""
    return f"{PREFIX}:session:{{{session}}}:docs:digest"


#: Buckets the document registry and the GC due set are split into (fixed:
#: changing it moves every document to another bucket). Each bucket has its
#: own hash tag, so in a Redis Cluster the buckets spread over the shards and
#: no key is written by every append of every document (yrelay/storage/listing.py).
DOCUMENT_BUCKETS = 16


def document_bucket(doc: str) -> int:
    """The bucket of ``doc``: a stable hash of its id (the same in every
    process and release)."""
    return xxhash.xxh3_64_intdigest(doc.encode()) % DOCUMENT_BUCKETS


def bucket_gc_due_key(bucket: int) -> str:
    """Sorted set: document -> when its next GC is due (ms; 0 = changed), for
    the documents of one bucket.

    Appends reset a document to 0; a collection pushes it to its next check or
    drops it when nothing is left to collect. A GC pass reads only these sets,
    never the keyspace.
    """
    return f"{PREFIX}:{{bucket:{bucket:02d}}}:gc:due"


def bucket_documents_key(bucket: int) -> str:
    """Sorted set (all scores 0, ordered by id): every document of one bucket
    ever appended to. Pages the ops listing and ``yrelay gc`` over all
    documents, merged across buckets (yrelay/storage/listing.py)."""
    return f"{PREFIX}:{{bucket:{bucket:02d}}}:docs"


def changes_key() -> str:
    """Stream (capped): on one Redis, one entry per append batch naming the
    documents it appended to (field ``d``, newline-separated): what wakes the
    reader loop (yrelay/storage/reader.py)."""
    return f"{PREFIX}:changes"


def bucket_changes_key(bucket: int) -> str:
    """Stream (capped): on a Redis Cluster only, one entry per append batch
    naming the documents of this bucket it appended to (field ``d``,
    newline-separated): what wakes the reader loop there
    (yrelay/storage/reader.py)."""
    return f"{PREFIX}:{{bucket:{bucket:02d}}}:changes"


def gc_due_key() -> str:
    """The GC due set before it was split into buckets (layout 2 and older):
    read only to fold it into the buckets (yrelay/storage/listing.py)."""
    return f"{PREFIX}:gc:due"


def documents_key() -> str:
    """The document registry before it was split into buckets: read only to
    fold it into the buckets (yrelay/storage/listing.py)."""
    return f"{PREFIX}:docs"


def document_keys(doc: str) -> list[str]:
    """Every key of one document (all on the same cluster slot)."""
    return [
        stream_key(doc),
        tracker_key(doc),
        meta_key(doc),
        snapshot_key(doc),
        dedup_key(doc),
        presence_key(doc),
        clocks_key(doc),
        dropped_key(doc),
        presence_owners_key(doc),
        group_progress_key(doc),
        group_leases_key(doc),
    ]


def presence_owners_key(doc: str) -> str:
    """Hash: awareness clientID -> ``<ms>|<owner>|<origin>``: who may speak
    for the clientID. Kept ``presence_timeout`` past its owner's last word,
    leaving included, so nobody else can take a clientID its user is about
    to come back with; ``<origin>`` is empty once its connection left."""
    return f"{PREFIX}:{{{doc}}}:presence:owners"


def subject_id(identity: str) -> str:
    """A fixed-length id for a subject (``sub:<jwt sub>``, or ``addr:<ip>``
    with auth off): safe in a hash tag whatever characters the subject has."""
    return xxhash.xxh3_128_hexdigest(identity.encode())


def subject_bucket_key(subject: str, kind: str) -> str:
    """Hash ``tokens``, ``at``: one token bucket of a subject (``kind``:
    ``updates`` or ``presence``), shared by every process. ``subject`` is a
    :func:`subject_id`; every key of one subject is on one cluster slot."""
    return f"{PREFIX}:{{subject:{subject}}}:bucket:{kind}"


def subject_subscriptions_key(subject: str) -> str:
    """Hash: process instance -> ``<live subscriptions>|<lease expiry ms>``:
    a subject's subscriptions, counted per process; a crashed process's
    count expires with its lease."""
    return f"{PREFIX}:{{subject:{subject}}}:subscriptions"


def replication_probe_key(doc: str) -> str:
    """String, short TTL: written only so that a ``WAIT`` after a resend
    answered from the dedup (a batch that wrote nothing) covers every write
    before it (:mod:`yrelay.storage.replicas`); on the document's slot."""
    return f"{PREFIX}:{{{doc}}}:replication-probe"


# ------------------------------------------------------------ consumer groups

#: Group names: 1..100 characters of letters, digits and ``._-:``.
GROUP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9._\-:]{1,100}$")


def validate_group_name(group: object) -> str:
    """Return ``group`` if it is a valid consumer group name, else raise ValueError."""
    if not isinstance(group, str) or not GROUP_NAME_PATTERN.fullmatch(group):
        raise ValueError("group names are 1-100 characters of letters, digits and ._-:")
    return group


def group_progress_key(doc: str) -> str:
    """Sorted set: consumer group -> the offset it acked on this document
    (score as in the tracker). GC holds trimming back to its minimum, like
    the tracker's (yrelay/consumers/, yrelay/gc/groups.py)."""
    return f"{PREFIX}:{{{doc}}}:groups"


def group_leases_key(doc: str) -> str:
    """Hash: group -> the assignment version of the member that last claimed
    the document (progress is written only with it: the fence);
    ``<group>:evicted`` = 1 once GC evicted the group from the document."""
    return f"{PREFIX}:{{{doc}}}:groups:leases"


def groups_key() -> str:
    """Set: every consumer group name (what GC asks for liveness)."""
    return f"{PREFIX}:groups"


def group_members_key(group: str) -> str:
    """Sorted set: member id -> when its heartbeat lapses (Redis ms)."""
    return f"{PREFIX}:group:{{{group}}}:members"


def group_leader_key(group: str) -> str:
    """String with a TTL: the member id leading the group (its lease)."""
    return f"{PREFIX}:group:{{{group}}}:leader"


def group_assignment_key(group: str) -> str:
    """Hash: document -> ``<member>|<version>`` (written only by the leader)."""
    return f"{PREFIX}:group:{{{group}}}:assignment"


def group_handover_key(group: str) -> str:
    """Hash: document -> ``<member>|<version>|<deadline ms>``: the document
    moves to that member once its current (live) owner released it, or at
    the deadline (yrelay/consumers/handover.py)."""
    return f"{PREFIX}:group:{{{group}}}:handover"


def group_deleted_key(group: str) -> str:
    """String with a TTL: the group was deleted (``DELETE /ops/groups/{g}``);
    its members stop at their next heartbeat. A new member's join clears it."""
    return f"{PREFIX}:group:{{{group}}}:deleted"


def group_meta_key(group: str) -> str:
    """Hash: ``version`` (assignment versions handed out), ``rev`` (bumped
    on every assignment change), ``prefix``, ``rebalances``, ``elections``."""
    return f"{PREFIX}:group:{{{group}}}:meta"


def group_dead_letters_key(group: str) -> str:
    """Hash: document -> JSON of why a webhook parked it (the last error,
    attempts, time, delivery id); the group sends nothing of the document
    until the field is removed (yrelay/consumers/dead_letters.py)."""
    return f"{PREFIX}:group:{{{group}}}:dead-letters"


def group_webhook_stats_key(group: str) -> str:
    """Hash: the webhook counters of every member of the group, summed
    (``delivered``, ``failed``, ``retries``, ``dead_letters``, latency
    buckets; yrelay/consumers/webhook_stats.py); read by ``/metrics``."""
    return f"{PREFIX}:group:{{{group}}}:webhook"
