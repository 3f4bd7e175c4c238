"""Document ids in URL paths, taken exactly as sent.

Starlette's ``{doc:path}`` parameter is ``.*`` in a pattern ending in ``$``:
``.`` stops at a newline and ``$`` matches before a final one, so
``DELETE /ops/docs/ctl/nl%0A`` was routed with ``doc = "ctl/nl"`` and
deleted that document (issue 30), although ``ctl/nl\\n`` is no valid id
(``%0D`` and ``%00`` were refused with 422). :data:`DOC` is the same
parameter with newlines matched too, so the route sees every character
sent and :func:`yrelay.storage.keys.validate_doc_id` refuses the id (422). Every
document id in a route's path is :data:`DOC_PARAM`: ``"/docs/" + DOC_PARAM``.
"""

from __future__ import annotations

from starlette.convertors import PathConvertor, register_url_convertor

#: The convertor's name in route paths (Starlette's registry is global: a name of yrelay's own).
DOC = "yrelay_doc"
#: A route path's document id parameter, ``doc``.
DOC_PARAM = "{doc:" + DOC + "}"


class ExactPathConvertor(PathConvertor):
    """``path`` with ``.`` matching newlines: nothing of the path is dropped."""

    regex = "(?s:.*)"


register_url_convertor(DOC, ExactPathConvertor())
