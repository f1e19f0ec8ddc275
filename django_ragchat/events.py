"""The events a turn emits, shared by every transport (websocket, server-sent events, the
API, the terminal). ``to_dict()`` gives the wire form documented in docs/protocol.md.

A turn's events, in order: ``ack`` -> ``status`` ("retrieving") -> ``sources`` -> ``status``
("generating") -> ``delta``... -> (``replace``) -> ``done``; or ``error`` at any point after
``ack``. An output guardrail that asks the model again sends ``retry`` after the deltas: the
text so far is discarded and the new answer's deltas start again at index 0. When the model
calls tools, each call sends ``tool_call`` (again when it awaits the user's approval, and once
approved) and ends with ``tool_result``; the model's text goes on after them with the next
``delta`` index. A streamed turn always ends with the deltas (or their ``replace``) spelling the
saved answer: a turn a component ended early streams its answer as one ``delta``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class TurnEvent:
    type: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``type`` and the fields. Their values are the event's own (a
        ``sources`` list, a ``message`` payload), not deep copies as ``dataclasses.asdict``
        makes: an event is encoded once and sent as it is, never changed afterwards."""
        data = {"type": self.type}
        for name in _field_names(type(self)):
            data[name] = getattr(self, name)
        return data


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


@dataclass(frozen=True)
class Accepted(TurnEvent):
    """The user's message is saved; the assistant message exists with status "streaming"."""

    type: ClassVar[str] = "ack"
    conversation_id: str
    user_message_id: int
    user_seq: int
    assistant_message_id: int
    #: The ack answering a resend (a ``client_id`` already used): nothing new was saved, the
    #: first attempt's result follows. On the wire only when true (``"replayed": true``).
    replayed: bool = False

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        if not self.replayed:
            del data["replayed"]
        return data


@dataclass(frozen=True)
class StageChanged(TurnEvent):
    type: ClassVar[str] = "status"
    stage: str  # "retrieving" | "generating"


@dataclass(frozen=True)
class SourcesFound(TurnEvent):
    """The documents the model will see, numbered as it will cite them; sent before the first
    token so a client can show them while the answer streams."""

    type: ClassVar[str] = "sources"
    sources: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Delta(TurnEvent):
    type: ClassVar[str] = "delta"
    text: str
    index: int  # 0-based position of this piece in the answer: clients can detect gaps

    def to_dict(self) -> dict[str, Any]:
        # Written out: one per token, and ``dataclasses.asdict`` copies recursively.
        return {"type": "delta", "text": self.text, "index": self.index}


@dataclass(frozen=True)
class Retry(TurnEvent):
    """An output guardrail rejected the answer streamed so far and the model is answering
    again (whole-answer). Clients discard the text received since the last ``retry`` (or
    since the start); the new answer's ``delta`` events start again at index 0, and ``done``
    carries the final text as always. ``attempt`` counts from 1; ``guardrail`` names the
    guardrail that asked (its feedback to the model stays in the trace)."""

    type: ClassVar[str] = "retry"
    attempt: int
    guardrail: str


@dataclass(frozen=True)
class Replace(TurnEvent):
    """The answer's final text, when it differs from what the ``delta`` events assembled (an
    advisor or an output guardrail changed it after the model, a response augmenter rebuilt
    it): clients replace the text they assembled with ``text``. Sent after the last ``delta``,
    before ``done`` (whose message carries the same text)."""

    type: ClassVar[str] = "replace"
    text: str


@dataclass(frozen=True)
class Completed(TurnEvent):
    """The assistant message is saved: its id, content, citations and status."""

    type: ClassVar[str] = "done"
    message: dict[str, Any]


@dataclass(frozen=True)
class Failed(TurnEvent):
    """The turn failed; ``message`` is safe to show. The partial answer, if any, is saved with
    status "error" (or "incomplete" when cancelled) as ``assistant_message``."""

    type: ClassVar[str] = "error"
    code: str
    message: str
    assistant_message: dict[str, Any] | None = None
    retry_after: float | None = None


@dataclass(frozen=True)
class ToolCallUpdate(TurnEvent):
    """A tool call the model asked for, and where it stands: ``"requested"`` (sent for every
    call, as soon as the model asked), ``"awaiting_confirmation"`` (the tool needs the user's
    approval: decide with ``confirmation_id``, docs/protocol.md) or ``"approved"`` (it runs
    now). ``id`` is the model's id of the call (the ``tool_result`` carries it too);
    ``arguments`` as the model wrote them (an object, or the text when it is not one);
    ``label`` says what is being done, for people ("Looking up order ORD-17…"); ``step`` counts
    the model's rounds of calls from 1."""

    type: ClassVar[str] = "tool_call"
    id: str
    name: str
    arguments: Any
    label: str
    step: int
    status: str = "requested"
    confirmation_id: int | None = None


@dataclass(frozen=True)
class ToolCallFinished(TurnEvent):
    """A tool call ended: ``status`` ``"done"`` (``content`` is the result the model reads),
    ``"error"``, ``"rejected"``, ``"abandoned"`` or ``"cancelled"`` (``error`` says why, as
    ``{"code", "message"}``); ``ms`` is how long it took."""

    type: ClassVar[str] = "tool_result"
    id: str
    name: str
    status: str
    content: str
    error: dict[str, str] | None = None
    ms: float = 0.0
