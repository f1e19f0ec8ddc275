"""A turn's events in OpenAI's shapes: a ``chat.completion`` object for a whole answer, and
``chat.completion.chunk`` server-sent events for a streamed one.

Streamed: the first chunk (sent once the message is saved) carries the role, then one chunk
per piece of the answer, then a chunk with ``finish_reason`` and an empty delta, then, with
``stream_options.include_usage``, a chunk with no choices and the usage (every chunk before
carries ``"usage": null``), then ``data: [DONE]``. A turn that fails after it started ends the
stream with ``data: {"error": {...}}`` (the ``openai`` client raises it as an ``APIError``).

Beyond OpenAI's fields, which strict clients ignore: ``conversation`` (the stored conversation's
id, to continue it) on the first chunk, the last ones and the whole answer; ``sources`` (the
passages the answer was given, numbered as its ``[n]`` citations, each with ``cited``) on the
chunk with ``finish_reason``, on the usage chunk and on the whole answer.

A profile whose output guardrails may replace the answer after it was written (a reprompt, a
refusal) cannot stream it as it is written: a stream of chunks cannot take text back. Its
answer is sent as one piece once the guardrails passed it (``holds_answer``).
"""

from __future__ import annotations

import json
import time
from typing import Any

from django_ragchat.events import Accepted, Completed, Delta, Failed, TurnEvent
from django_ragchat.openai_api.errors import OpenAIError
from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.turn.context import components_for

DONE = b"data: [DONE]\n\n"


def holds_answer(profile) -> bool:
    """Whether ``profile`` runs an output guardrail (one that overrides ``check_output``): its
    answer may change after the model wrote it, so a stream sends it whole at the end."""
    return any(type(g).check_output is not Guardrail.check_output for g in components_for(profile).guardrails)


def sources_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The saved answer's sources, each marked ``cited`` or not."""
    cited = {c["index"] for c in message.get("citations") or ()}
    return [{**source, "cited": source["index"] in cited} for source in message.get("sources") or ()]


def usage_of(message: dict[str, Any]) -> dict[str, int]:
    usage = message.get("usage") or {}
    prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_id(accepted: Accepted) -> str:
    return f"chatcmpl-{accepted.assistant_message_id}"


def whole_completion(model: str, events: list[TurnEvent], created: int | None = None) -> dict[str, Any]:
    """The ``chat.completion`` object of a turn's events; ``OpenAIError`` when it failed."""
    accepted = next(e for e in events if isinstance(e, Accepted))
    final = events[-1]
    if isinstance(final, Failed):
        raise OpenAIError.from_failed(final.code, final.message, final.retry_after, accepted.conversation_id)
    if not isinstance(final, Completed):  # the turn stopped without an end (cannot happen unless cancelled)
        raise OpenAIError.from_failed("internal_error", "The answer stopped before its end.", None,
                                      accepted.conversation_id)
    message = final.message
    return {
        "id": completion_id(accepted),
        "object": "chat.completion",
        "created": created or int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": message["content"], "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": usage_of(message),
        "system_fingerprint": None,
        "conversation": accepted.conversation_id,
        "sources": sources_of(message),
    }


def _sse(data: dict[str, Any]) -> bytes:
    # json.dumps escapes newlines (and non-ASCII), so one event is one line.
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class ChunkEncoder:
    """Turns a turn's events into ``chat.completion.chunk`` events, one call per event
    (``b""`` for the events OpenAI's stream has nothing for: status, sources)."""

    def __init__(self, model: str, *, include_usage: bool = False, hold: bool = False):
        self.model = model
        self.include_usage = include_usage
        self.hold = hold
        self.created = int(time.time())
        self.id = ""
        self.conversation_id = ""
        self.sent: list[str] = []  # the answer's pieces as streamed so far
        self._around = (b"", b"")

    def __call__(self, event: TurnEvent) -> bytes:
        if isinstance(event, Delta):
            if self.hold:
                return b""
            self.sent.append(event.text)
            # The one event per token: its chunk is the same bytes around the text each time.
            before, after = self._around
            return before + json.dumps(event.text).encode() + after
        if isinstance(event, Accepted):
            self.id, self.conversation_id = completion_id(event), event.conversation_id
            before, _, after = self._chunk({"content": "\x00"}).partition(b'"\\u0000"')
            self._around = (before, after)
            return self._chunk({"role": "assistant", "content": ""}, conversation=self.conversation_id)
        if isinstance(event, Completed):
            return self._end(event.message)
        if isinstance(event, Failed):
            error = OpenAIError.from_failed(event.code, event.message, event.retry_after, self.conversation_id or None)
            return _sse(error.body())
        return b""

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> bytes:
        chunk = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                 "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
                 **extra}
        if self.include_usage:
            chunk["usage"] = None
        return _sse(chunk)

    def _end(self, message: dict[str, Any]) -> bytes:
        parts = []
        final, sent = message["content"], "".join(self.sent)
        if final.startswith(sent) and final != sent:
            # Held back (the guardrails' answer) or written after the stream (nothing else
            # appends to the saved text): sent before the end. A final text that is not a
            # continuation of what was streamed cannot be taken back; the saved one is kept.
            parts.append(self._chunk({"content": final[len(sent):]}))
            self.sent = [final]
        extra = {"conversation": self.conversation_id, "sources": sources_of(message)}
        parts.append(self._chunk({}, "stop", **extra))
        if self.include_usage:
            parts.append(_sse({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                               "model": self.model, "choices": [], "usage": usage_of(message), **extra}))
        parts.append(DONE)
        return b"".join(parts)
