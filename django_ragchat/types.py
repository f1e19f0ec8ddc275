"""The small, frozen objects that pass between pipeline stages.

Every component of the turn pipeline takes and returns these, so a plugin author learns one
vocabulary: a ``Query`` goes through transformers and expanders, retrievers return
``RetrievedChunk`` lists, the prompt augmenter builds a ``Prompt``, the LLM backend returns an
``LLMResponse`` (or streams ``LLMDelta``), and any stage may return an ``EndTurn`` to finish
the turn early.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True)
class HistoryMessage:
    """One earlier message of the conversation as the model may see it (original text only).

    A turn that called tools also carries its tool exchange, in the OpenAI chat format: an
    ``assistant`` message with ``tool_calls`` (the calls of one step, each
    ``{"id", "type": "function", "function": {"name", "arguments"}}``) followed by one ``tool``
    message per call (``tool_call_id``, the result as ``content``). Memory sends them back only
    to profiles that offer tools (docs/tools.md).
    """

    role: Role
    content: str
    seq: int = 0
    token_count: int = 0
    tool_calls: tuple[dict[str, Any], ...] = ()
    tool_call_id: str = ""
    #: Written by the memory (a summary, facts about the user), not said in the conversation:
    #: the model reads it, the follow-up rules do not take it for what the user asked.
    from_memory: bool = False

    @property
    def is_tool_exchange(self) -> bool:
        """A tool step (the calls, or a result) rather than words of the user or the answer."""
        return self.role == "tool" or bool(self.tool_calls)

    def as_message(self) -> dict[str, Any]:
        """The message in the OpenAI chat format."""
        if self.tool_calls:
            return {"role": "assistant", "content": self.content or None, "tool_calls": list(self.tool_calls)}
        if self.role == "tool":
            return {"role": "tool", "tool_call_id": self.tool_call_id, "content": self.content}
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Query:
    """A search query on its way to the retrievers.

    ``text`` is what retrievers search with; ``original`` is the user's words, unchanged by
    transformers. ``history`` is what the memory strategy selected, so a transformer can resolve
    "How much is it?" against earlier turns. ``metadata`` carries hints (e.g. filters) between
    components.
    """

    text: str
    original: str = ""
    history: tuple[HistoryMessage, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def replace(self, **changes: Any) -> Query:
        """A copy with ``changes`` applied (the object itself is immutable)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RetrievedChunk:
    """A stored chunk found for a query, with the score the finding component gave it.

    ``score`` is comparable only within one retriever (cosine similarity for vector search, a
    rank-fusion score after joining). ``retriever`` names who found it.
    """

    chunk_id: int
    text: str
    score: float
    document_id: int
    source: str
    title: str = ""
    heading: str = ""
    ordinal: int = 0
    retriever: str = ""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    # Each finding retriever's own score (e.g. {"vector": 0.83}): fusion replaces ``score``,
    # these stay comparable for thresholds.
    raw_scores: dict[str, float] = field(default_factory=dict, compare=False, hash=False)
    # The principals (``django_ragchat.access.Principals``) the search that found it read as;
    # ``None`` for a chunk made by other means, which the turn checks in SQL before using it.
    read_as: Any = field(default=None, compare=False, hash=False, repr=False)
    # The answerer's reading of the chunk stored at ingestion (``Chunk.analysis``, see
    # ``django_ragchat.answerer.stored``), fetched in the search's query; None when there is none.
    analysis: bytes | None = field(default=None, compare=False, hash=False, repr=False)
    # Who may read it (``Chunk.access``, principal tokens); empty for a chunk made by other means.
    access: tuple[str, ...] = field(default=(), compare=False, hash=False, repr=False)

    def with_score(self, score: float, **changes: Any) -> RetrievedChunk:
        return dataclasses.replace(self, score=score, **changes)

    def as_source(self, index: int) -> dict[str, Any]:
        """The JSON shape clients receive for this chunk as the ``index``-th source (1-based)."""
        return {
            "index": index,
            "chunk_id": self.chunk_id,
            "document_id": self.document_id,
            "source": self.source,
            "title": self.title,
            "heading": self.heading,
            "score": round(float(self.score), 6),
            "snippet": self.text[:300],
        }


@dataclass(frozen=True)
class Prompt:
    """What the LLM backend receives.

    ``messages`` is in the OpenAI chat format (system first, then history, then the user turn
    carrying the retrieved context). ``documents`` are the chunks in the order they are numbered
    in the context ([1] is ``documents[0]``), kept structured so an offline backend can answer
    without parsing text, and so citations can be resolved afterwards.
    """

    messages: tuple[dict[str, Any], ...]
    question: str
    search_query: str
    documents: tuple[RetrievedChunk, ...] = ()
    token_count: int = 0
    #: The tools offered to the model, as OpenAI ``tools`` entries (``{"type": "function",
    #: "function": {"name", "description", "parameters"}}``); empty: none.
    tools: tuple[dict[str, Any], ...] = ()
    #: ``"none"`` forbids calls this time (the last step of the tool loop); ``None``: the model decides.
    tool_choice: str | None = None
    #: The asking user's own names (username, first name, full name; none for a visitor who is
    #: not signed in): the offline answerer reads "alice's order", asked by alice, as hers.
    asker_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class ToolCall:
    """A call of a tool the model asked for: its ``id`` (the model's, echoed back with the
    result), the tool's ``name`` and the ``arguments`` exactly as the model wrote them (a JSON
    object as text, possibly malformed: the tool loop validates it)."""

    id: str
    name: str
    arguments: str = "{}"

    @property
    def parsed_arguments(self) -> dict[str, Any] | None:
        """The arguments as a dict, or ``None`` when they are not a JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def with_arguments(self, arguments: dict[str, Any]) -> ToolCall:
        """A copy with other arguments (an advisor's ``around_tool`` correcting a call)."""
        return dataclasses.replace(self, arguments=json.dumps(arguments, ensure_ascii=False))

    def as_openai(self) -> dict[str, Any]:
        """The call as an entry of an assistant message's ``tool_calls``."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced, as the model and the client see it.

    ``content`` is what goes back to the model (the tool's return value as JSON, or its text);
    ``status`` is ``"done"`` or, when the tool did not run or failed, ``"error"``,
    ``"rejected"`` (the user said no), ``"abandoned"`` (nobody decided in time) or
    ``"cancelled"`` (the turn was stopped); ``error`` then says why (``{"code", "message"}``,
    the codes in docs/tools.md). ``ms`` is the time the call took, without the time it waited
    for the user's approval (the trace keeps that apart, ``wait_ms``).
    """

    call_id: str
    name: str
    content: str
    status: str = "done"
    error: dict[str, str] | None = None
    ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "done"

    def as_message(self) -> dict[str, Any]:
        """The ``tool`` message that carries the result back to the model."""
        return {"role": "tool", "tool_call_id": self.call_id, "content": self.content}


@dataclass(frozen=True)
class LLMResponse:
    """A whole answer from an LLM backend; ``tool_calls`` when the model asked for tools
    (``finish_reason`` ``"tool_calls"``)."""

    text: str
    model: str = ""
    usage: Usage | None = None
    finish_reason: str = "stop"
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class LLMDelta:
    """One piece of a streamed answer. The last piece may carry ``usage`` and ``model`` only,
    and the tool calls the model asked for, assembled from the stream's fragments."""

    text: str = ""
    model: str = ""
    usage: Usage | None = None
    finish_reason: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class Citation:
    """A ``[n]`` reference in the answer, resolved to the n-th document of the prompt."""

    index: int
    chunk_id: int


@dataclass(frozen=True)
class Answer:
    """The answer as response augmenters see and change it.

    ``citations`` are in prompt order. ``sources`` is the subset of the prompt's documents to
    store as the message's sources (``None``: all of them); each keeps its prompt index, so
    ``[n]`` still means the n-th document the model saw.
    """

    text: str
    citations: tuple[Citation, ...] = ()
    sources: tuple[RetrievedChunk, ...] | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def replace(self, **changes: Any) -> Answer:
        return dataclasses.replace(self, **changes)


# --- Ending a turn early ------------------------------------------------------------------


@dataclass(frozen=True)
class EndTurn:
    """Returned by any component to finish the turn at its stage with ``answer``.

    The answer is saved as the assistant message, the trace records which stage ended the
    turn and why, and no later stage runs. Use the subclasses to say what kind of ending it is.
    """

    answer: str
    reason: str = ""
    kind: str = "end"


@dataclass(frozen=True)
class Refusal(EndTurn):
    """A guardrail refused the input or the output.

    From ``check_input``, ``redacted`` (``None``: keep the message as typed) is the user's
    message as it may be kept: the turn saves it in place of the text typed, in the message's
    row, the trace and wherever the conversation is named after it, before the refusal is
    saved. Say what was taken out (``"my card is [redacted card]"``); it must show something.
    Ignored from ``check_output``, whose text is the answer.
    """

    kind: str = "refusal"
    redacted: str | None = None


@dataclass(frozen=True)
class CannedAnswer(EndTurn):
    """A fixed answer (a greeting, the no-context policy, an FAQ hit)."""

    kind: str = "canned"


@dataclass(frozen=True)
class SkipRetrieval:
    """Returned by a query transformer or expander: answer without retrieving anything.

    The turn goes on to the LLM with history only (a router deciding "hello" needs no search).
    """

    reason: str = ""


@dataclass(frozen=True)
class Reprompt:
    """Returned by an output guardrail: ask the model again.

    ``feedback`` is appended to the prompt as a user message after the rejected answer (say
    what was wrong and what to do instead); ``reason`` goes to the trace. The guardrail's
    ``max_reprompts`` bounds the attempts; after the last one its ``exhausted`` method decides
    (by default a refusal).
    """

    feedback: str
    reason: str = ""


@dataclass(frozen=True)
class Redaction:
    """Returned by an input guardrail (``check_input``): the turn goes on, with ``text`` in
    place of the user's message.

    The guardrails after this one check ``text``; the search and the model see it; the
    message's row (saved as typed before input guardrails run, rewritten at once), the trace
    and a conversation named after the message keep it instead of the text as typed.
    ``reason`` goes to the trace (``trace["redactions"]``), so write what was taken out by kind
    ("an e-mail address"), never the data itself. ``text`` must show something.
    """

    text: str
    reason: str = ""
