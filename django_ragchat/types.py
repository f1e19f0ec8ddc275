"""The small, frozen objects that pass between pipeline stages.

Every component of the turn pipeline takes and returns these, so a plugin author learns one
vocabulary: a ``Query`` goes through transformers and expanders, retrievers return
``RetrievedChunk`` lists, the prompt augmenter builds a ``Prompt``, the LLM backend returns an
``LLMResponse`` (or streams ``LLMDelta``), and any stage may return an ``EndTurn`` to finish
the turn early.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["user", "assistant", "tool", "system"]


@dataclass(frozen=True)
class HistoryMessage:
    """One earlier message of the conversation as the model may see it (original text only)."""

    role: Role
    content: str
    seq: int = 0
    token_count: int = 0


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

    messages: tuple[dict[str, str], ...]
    question: str
    search_query: str
    documents: tuple[RetrievedChunk, ...] = ()
    token_count: int = 0


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class LLMResponse:
    """A whole answer from an LLM backend."""

    text: str
    model: str = ""
    usage: Usage | None = None
    finish_reason: str = "stop"


@dataclass(frozen=True)
class LLMDelta:
    """One piece of a streamed answer. The last piece may carry ``usage`` and ``model`` only."""

    text: str = ""
    model: str = ""
    usage: Usage | None = None
    finish_reason: str | None = None


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
    """A guardrail refused the input or the output."""

    kind: str = "refusal"


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
