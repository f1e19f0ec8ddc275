"""JSON read from clients, with the limits every transport applies.

The REST API's parser, the server-sent events endpoint, the OpenAI-compatible endpoint and the
websocket consumer all read client JSON through ``loads`` (the HTTP ones decode the body with
its declared charset first, ``body_text``), so the same body gets the same answer everywhere: a depth past
``MAX_DEPTH`` (or one deep enough to exhaust Python's recursion limit) is a ``parse_error``,
never a ``RecursionError`` that would surface as a 500, and more object keys than Django's
``DATA_UPLOAD_MAX_NUMBER_FIELDS`` is ``too_many_fields``, as it is for a form.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import BaseParser, FormParser, JSONParser, MultiPartParser
from rest_framework.request import is_form_media_type

#: Nesting deeper than this is refused. No request of the API nests more than three levels.
MAX_DEPTH = 32
#: A body refused as larger than Django reads (``DATA_UPLOAD_MAX_MEMORY_SIZE``) is read to its end
#: and dropped when it declares at most this many bytes: Django refuses it unread, and a WSGI
#: server cannot answer the next request on a connection whose body was left unread (a new
#: user's trial: gunicorn's 413 said keep-alive, and the client's next message found the
#: connection closed). A larger one is left for the server to close the connection on.
DRAIN_LIMIT = 32 * 2**20
_DRAIN_CHUNK = 2**16


def drain_refused_body(request) -> None:
    """Read and drop what is left of ``request``'s body (a Django ``HttpRequest``) after Django
    refused it as too large, up to ``DRAIN_LIMIT`` bytes, so the client's connection stays usable."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except (TypeError, ValueError):
        return
    stream = getattr(request, "_stream", None)
    if not 0 < declared <= DRAIN_LIMIT or stream is None:
        return
    try:
        while stream.read(_DRAIN_CHUNK):
            pass
    except OSError:  # the client went away: nothing left to keep usable
        pass


class JSONRefused(ValueError):
    """The text is not JSON the server accepts; ``str()`` is safe to show, ``code`` the error's."""

    code = "parse_error"


#: A write with no body at all: the same code as a body that is not JSON, in its own words, on
#: the REST API and the server-sent events endpoint alike.
NO_BODY = "The request has no body: send a JSON object."


class TooManyFields(JSONRefused):
    """More keys than ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (code ``too_many_fields``)."""

    code = "too_many_fields"


class UnsupportedMediaType(JSONRefused):
    """A body declared as something other than JSON (code ``unsupported_media_type``, 415)."""

    code = "unsupported_media_type"


def _media(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def declares_json(content_type: str | None) -> bool:
    """Whether a body with this ``Content-Type`` is read as JSON: ``application/json``, a
    ``...+json`` type, or none declared."""
    media = _media(content_type)
    return not media or media == "application/json" or media.endswith("+json")


def check_media_type(content_type: str) -> None:
    """Refuse a body whose ``Content-Type`` (Django's ``request.content_type``, parameters left
    out) is not JSON (``declares_json``), as on the REST API: a form or ``text/plain`` is a
    client's mistake worth naming, not a ``parse_error``."""
    if not declares_json(content_type):
        raise UnsupportedMediaType(f'Unsupported media type "{_media(content_type)}": send JSON, with '
                                   '"Content-Type: application/json".')


def max_fields() -> int | None:
    """The most object keys a body may hold, all objects together: Django's own limit on form
    fields, ``DATA_UPLOAD_MAX_NUMBER_FIELDS`` (1,000 by default; ``None``: no limit). No request
    of the app needs more than a handful."""
    return settings.DATA_UPLOAD_MAX_NUMBER_FIELDS


def _refusal(value: Any, depth_limit: int, field_limit: int | None) -> JSONRefused | None:
    # Iterative, so a value just under the parser's recursion limit cannot exhaust ours.
    stack = [(value, 1)]
    keys = 0
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
            keys += len(item)
            if field_limit is not None and keys > field_limit:
                return TooManyFields(f"The JSON has more than {field_limit:,} fields.")
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > depth_limit:
            return JSONRefused(f"The JSON is nested more than {depth_limit} levels deep.")
        stack.extend((child, depth + 1) for child in children)
    return None


def body_text(raw: bytes, charset: str | None) -> str:
    """A request body as text, decoded with the charset its ``Content-Type`` declares (Django's
    ``request.encoding``), else ``DEFAULT_CHARSET`` (UTF-8, what JSON's RFC 8259 asks for): the
    same bytes read alike on every transport. ``JSONRefused`` when they are not that charset."""
    encoding = charset or settings.DEFAULT_CHARSET
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError:
        raise JSONRefused(f"The body is not valid {encoding} text.") from None
    except LookupError:  # known to ``codecs`` but not a text encoding ("base64", "zlib")
        raise JSONRefused(f"The charset {encoding} is not a text encoding.") from None


def declared_charset(request) -> str | None:
    """The charset ``request``'s ``Content-Type`` declares, as written, else ``request.encoding``:
    Django drops a charset no codec knows ("bogus-xyz") from ``request.encoding`` and the body
    was read as UTF-8, where ``body_text`` refuses it as it refuses "base64" (an outside probe)."""
    params = getattr(request, "content_params", None) or {}
    return params.get("charset") or getattr(request, "encoding", None)


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises ``JSONRefused`` for invalid JSON and for nesting deeper than
    ``max_depth`` (objects and arrays count one level each), ``TooManyFields`` for more object
    keys than ``max_fields()``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONRefused(f"The JSON is nested more than {max_depth} levels deep.") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise JSONRefused(f"The body is not valid JSON ({exc}).") from None
    refusal = _refusal(value, max_depth, max_fields())
    if refusal is not None:
        raise refusal
    return value


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser with ``loads``'s limits: every refusal is 400 ``parse_error`` (or
    ``too_many_fields``)."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        try:
            raw = stream.read() if stream is not None else b""
            return loads(body_text(raw, declared_charset(parser_context.get("request"))))
        except JSONRefused as exc:
            raise ParseError(str(exc), code=exc.code) from None


class JSONBodyNegotiation(DefaultContentNegotiation):
    """DRF's negotiation, but a body ``declares_json`` (no ``Content-Type``, or a ``...+json``
    one too) goes to the JSON parser, as on the server-sent events and OpenAI-compatible
    endpoints: DRF matches ``application/json`` alone and answered such a body 415."""

    def select_parser(self, request, parsers):
        json_parser = next((p for p in parsers if isinstance(p, JSONParser)), None)
        if json_parser is not None and declares_json(request.content_type):
            return json_parser
        return super().select_parser(request, parsers) or _UnreadBody()


#: The attribute ``_UnreadBody`` sets on the DRF request: the media type no parser reads.
UNREAD_MEDIA_TYPE = "ragchat_unread_media_type"


class _UnreadBody(BaseParser):
    """What ``JSONBodyNegotiation`` picks for a body none of the view's parsers reads: it reads
    nothing (so a session CSRF check finds no form token in it, as in a JSON body) and marks the
    request, and the view answers 415 after the CSRF check and the permissions
    (``RagchatAPIView.initial``). DRF raised the 415 from inside the CSRF check, which reads the
    form: a caller without a token or without rights learnt the format was wrong before being
    refused (an outside probe's finding)."""

    media_type = "*/*"

    def parse(self, stream, media_type=None, parser_context=None):
        setattr(parser_context["request"], UNREAD_MEDIA_TYPE, media_type)
        if not is_form_media_type(media_type or ""):
            return {}
        # A form is read for its CSRF token only, as the server-sent events endpoint reads it.
        parser = MultiPartParser() if media_type.startswith("multipart/") else FormParser()
        try:
            return parser.parse(stream, media_type, parser_context)
        except ParseError:  # an unreadable form carries no token
            return {}
