"""The names an ``/ops`` request gives (a document id, a consumer group),
validated before any key is built from them: 422 with the reason otherwise."""

from __future__ import annotations

from fastapi import HTTPException, status

from yrelay.storage.keys import validate_doc_id, validate_group_name


def doc_id(doc: str) -> str:
    """``doc`` if it is a valid document id, else 422."""
    try:
        return validate_doc_id(doc)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None


def group_name(group: str) -> str:
    """``group`` if it is a valid consumer group name, else 422."""
    try:
        return validate_group_name(group)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
