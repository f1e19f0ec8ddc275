"""What every stage of a turn receives: the ``TurnContext`` and the profile's components.

Stages (``memory``, ``retrievers``, ``responses``...) and advisors import from here, never from
``django_ragchat.turn.pipeline``, which imports them: the pipeline sits on top, the stages below, and
no import goes back up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from django_ragchat.access import PUBLIC_ONLY, Principals
from django_ragchat.answerer.vocabulary import Vocabulary
from django_ragchat.plugins import build_component, get_registry, instance_cache
from django_ragchat.turn.advisors import advising

if TYPE_CHECKING:
    from django_ragchat.models import Conversation, Message
    from django_ragchat.profiles import Profile
    from django_ragchat.tools import Tool
    from django_ragchat.turn.tools import ToolRun
    from django_ragchat.types import HistoryMessage, Prompt, Query, RetrievedChunk, Usage

logger = logging.getLogger("django_ragchat.turn.pipeline")


@dataclass
class ProfileComponents:
    """The component instances one profile runs, each list in call order."""

    memory: Any
    guardrails: list
    query_transformers: list
    query_expanders: list
    retrievers: list
    joiner: Any
    document_postprocessors: list
    prompt_augmenter: Any
    llm: Any
    embedder: Any
    response_augmenters: list
    advisors: list = field(default_factory=list)
    vocabulary: Vocabulary | None = None

    def each(self) -> list:
        """Every component instance, stage by stage in the order the turn runs them."""
        found = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "vocabulary":
                found += value if isinstance(value, list) else [value]
        return found

    def __post_init__(self) -> None:
        # Which advisors take part in which call, computed once per profile, not per turn.
        self.turn_advisors = advising(self.advisors, "around_turn")
        self.llm_advisors = advising(self.advisors, "around_llm")
        self.stream_advisors = advising(self.advisors, "around_llm_stream")
        # Only an answerer that reads the chunks' stored readings needs them fetched.
        self.reads_stored_readings = hasattr(type(self.llm), "chunk_reader")
        self.tool_advisors = advising(self.advisors, "around_tool")
        # The trace's rows naming each component's plugin (pipeline._components_trace), once.
        self.trace_rows: list[dict[str, str]] | None = None


def components_for(profile: Profile) -> ProfileComponents:
    """Build (once per process and profile) the components ``profile`` selects, handing each
    that asks for it the profile's vocabulary and its embedder."""
    cache = instance_cache()
    key = ("components", profile.name)
    if key not in cache:
        registry = get_registry()
        vocabulary = Vocabulary.for_profile(profile)
        embedder = build_component(profile, "embedder", profile.embedder)

        def build(kind, names):
            return [build_component(profile, kind, reg.name, vocabulary=vocabulary, embedder=embedder)
                    for reg in registry.ordered(kind, names)]

        def one(kind, name):
            return build(kind, [name])[0]

        cache[key] = ProfileComponents(
            memory=one("memory", profile.memory),
            guardrails=build("guardrail", profile.guardrails),
            query_transformers=build("query_transformer", profile.query_transformers),
            query_expanders=build("query_expander", profile.query_expanders),
            retrievers=build("retriever", profile.retrievers),
            joiner=one("joiner", profile.joiner),
            document_postprocessors=build("document_postprocessor", profile.document_postprocessors),
            prompt_augmenter=one("prompt_augmenter", profile.prompt_augmenter),
            llm=one("llm", profile.llm),
            embedder=embedder,
            response_augmenters=build("response_augmenter", profile.response_augmenters),
            advisors=build("advisor", profile.advisors),
            vocabulary=vocabulary,
        )
    return cache[key]


@dataclass(eq=False)
class TurnContext:
    """Everything about the turn in progress; every component, advisor and tool receives it.

    ``user`` is the asking user (an ``AnonymousUser`` for an anonymous visitor): tools run as
    them. ``tools`` are the tools offered this turn, by name; ``tool_runs`` the calls made so
    far, with their results. ``state`` is free scratch space for plugins (keyed by plugin name,
    by convention). ``trace`` becomes the saved ``TurnTrace.data``. ``principals`` are the
    asker's (the conversation's owner, read at the start of the turn; an anonymous
    conversation's are ``PUBLIC_ONLY``): every search of the turn reads as them
    (``django_ragchat.access``).

    ``supplied_history`` is set when the caller sent the earlier messages with this one (a
    stateless client of the OpenAI-compatible endpoint): they stand for the conversation's log
    before this message, and memory strategies read them instead of the database
    (``MemoryStrategy.recent`` does). ``None`` (the usual case): the log is the history.

    ``can_approve`` says whether the asker can approve tool calls where they asked: false for a
    client with no way to (the OpenAI-compatible endpoint), where a call to a tool that
    ``requires_confirmation`` fails at once (``approval_unavailable``) instead of waiting.
    """

    conversation: Conversation
    profile: Profile
    components: ProfileComponents
    question: str
    user: Any = None
    user_message: Message | None = None
    assistant_message: Message | None = None
    history: list[HistoryMessage] = field(default_factory=list)
    supplied_history: list[HistoryMessage] | None = None
    can_approve: bool = True
    query: Query | None = None
    queries: list[Query] = field(default_factory=list)
    documents: list[RetrievedChunk] = field(default_factory=list)
    prompt: Prompt | None = None
    retrieval_skipped: bool = False
    context_budget: int = 0
    usage: Usage | None = None
    model: str = ""
    streaming: bool = False
    principals: Principals = PUBLIC_ONLY
    tools: dict[str, Tool] = field(default_factory=dict)
    tool_runs: list[ToolRun] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    _embeddings: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: Whether the turn used the embedder (the trace lists it only then).
    embedded: bool = False
    #: Streamed answers: each response augmenter's tail (what its ``finish`` returned, and that
    #: text as sent, after the later augmenters' ``on_delta``), by augmenter name.
    streamed_tails: dict[str, tuple[str, str]] = field(default_factory=dict)

    def warn(self, message: str) -> None:
        """Record a warning in the trace (and the log)."""
        logger.warning("ragchat turn %s: %s", self.conversation.pk, message)
        self.trace.setdefault("warnings", []).append(message)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` in the profile's space, computed once per text per turn."""
        self.embedded = True
        missing = [t for t in dict.fromkeys(texts) if t not in self._embeddings]
        if missing:
            vectors = await self.components.embedder.aembed(missing)
            self._embeddings.update(zip(missing, vectors, strict=True))
        return np.vstack([self._embeddings[t] for t in texts])
