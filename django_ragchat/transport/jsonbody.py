"""JSON read from clients, with the limits every transport applies.

The REST API's parser, the server-sent events endpoint and the websocket consumer all read
client JSON through ``loads``, so the same body gets the same answer everywhere: a depth past
``MAX_DEPTH`` (or one deep enough to exhaust Python's recursion limit) is a ``parse_error``,
never a ``RecursionError`` that would surface as a 500.
"""

from __future__ import annotations

import json
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

#: Nesting deeper than this is refused. No request of the API nests more than three levels.
MAX_DEPTH = 32


class JSONRefused(ValueError):
    """The text is not JSON the server accepts; ``str()`` is safe to show."""


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative, so a value just under the parser's recursion limit cannot exhaust ours.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def loads(text: str | bytes, *, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` that raises ``JSONRefused`` for invalid JSON and for nesting deeper than
    ``max_depth`` (objects and arrays count one level each)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JSONRefused(f"The JSON is nested more than {max_depth} levels deep.") from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise JSONRefused(f"The body is not valid JSON ({exc}).") from None
    if _depth_exceeds(value, max_depth):
        raise JSONRefused(f"The JSON is nested more than {max_depth} levels deep.")
    return value


class LimitedJSONParser(JSONParser):
    """DRF's JSON parser with ``loads``'s limits: every refusal is 400 ``parse_error``."""

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", "utf-8")
        try:
            raw = stream.read() if stream is not None else b""
            return loads(raw.decode(encoding))
        except UnicodeDecodeError:
            raise ParseError("The body is not valid UTF-8 JSON.", code="parse_error") from None
        except JSONRefused as exc:
            raise ParseError(str(exc), code="parse_error") from None
