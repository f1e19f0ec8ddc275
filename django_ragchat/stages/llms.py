"""LLM backends: answer a ``Prompt``, whole or streamed.

Built in: ``extractive``, an offline answerer for the embedded default (no model, no server,
no key). It answers with the sentences of the retrieved passages that state what was asked about
the subject asked about, cites each as ``[n]``, streams the answer word by word, and says plainly
when the documents don't say (the engine is ``django_ragchat.answerer``; docs/answerer.md).
``openai``: any OpenAI-compatible server, through ``django_ragchat.backends.openai``
(docs/openai.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar

from django_ragchat import hookimpl
from django_ragchat.answerer.selector import (
    DEFAULT_MIN_COVERAGE,
    MIN_SIMILARITY,
    NEAR_WORD_SIMILARITY,
    SEMANTIC_WEIGHT,
    AnswerSelector,
)
from django_ragchat.answerer.semantic import SentenceSimilarity
from django_ragchat.answerer.stored import analyse_chunks, analysis_key, stored_key
from django_ragchat.answerer.vocabulary import Vocabulary
from django_ragchat.backends.openai import (
    CHAT_OPTIONS,
    CONNECTION_OPTIONS,
    DEFAULT_CHAT_MODEL,
    EMBEDDING_OPTIONS,
    ChatModel,
    OpenAIConnection,
    check_options,
)
from django_ragchat.components import Component
from django_ragchat.plugins import build_component, embedder_for
from django_ragchat.tokens import count_tokens
from django_ragchat.types import LLMDelta, LLMResponse, Prompt, Usage

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


class LLMBackend(Component):
    """Base class. Implement ``complete`` or ``stream`` (or both); each has a default in terms
    of the other. ``model`` names the model for traces.

    A backend that calls tools reads ``prompt.tools`` (the ``tools`` entries offered) and
    ``prompt.tool_choice``, and returns the calls the model asked for as
    ``LLMResponse.tool_calls`` (streamed: on the last ``LLMDelta``); the turn runs them and
    asks again with the results (docs/tools.md). One that calls none ignores them.
    """

    kind = "llm"
    model: str = ""
    #: False for a backend that never calls tools: the turn then offers it none, and a profile
    #: with ``"retrieval": "tool"`` retrieves before every answer instead.
    calls_tools: ClassVar[bool] = True

    async def complete(self, prompt: Prompt, turn: TurnContext) -> LLMResponse:
        parts, usage, model, calls, finish = [], None, self.model, (), "stop"
        async for delta in self.stream(prompt, turn):
            parts.append(delta.text)
            usage = delta.usage or usage
            model = delta.model or model
            calls = delta.tool_calls or calls
            finish = delta.finish_reason or finish
        return LLMResponse(text="".join(parts), model=model, usage=usage, finish_reason=finish, tool_calls=calls)

    async def stream(self, prompt: Prompt, turn: TurnContext) -> AsyncIterator[LLMDelta]:
        response = await self.complete(prompt, turn)
        yield LLMDelta(text=response.text, model=response.model, usage=response.usage,
                       finish_reason=response.finish_reason, tool_calls=response.tool_calls)



class ExtractiveAnswerer(LLMBackend):
    """The offline answerer: the sentences that state what was asked about the subject asked
    about, each cited as ``[n]``; a plain decline naming what the documents do describe when
    none does. Options: ``min_coverage`` (0.5), ``max_sentences`` (4), ``no_answer`` (used when
    no passage was given; default: the language's); with a semantic embedder (``wordllama``)
    also ``semantic_weight`` (0.5), ``min_similarity`` (0.7) and ``near_word_similarity`` (0.45).
    It reads with the profile's vocabulary (``vocabulary`` setting: language, synonym groups) and,
    when that is a semantic model running in process, its embedder. The engine is
    ``django_ragchat.answerer.selector.AnswerSelector``; docs/answerer.md. It calls no tools:
    a profile's ``tools`` are never offered to it (the system check ragchat.W041 says so).
    """

    name = "extractive"
    model = "extractive"
    uses_vocabulary = True
    uses_embedder = True
    calls_tools = False

    def __init__(self, profile, *, vocabulary: Vocabulary, embedder: Any = None,
                 min_coverage: float = DEFAULT_MIN_COVERAGE, max_sentences: int = 4, no_answer: str | None = None,
                 semantic_weight: float = SEMANTIC_WEIGHT, min_similarity: float = MIN_SIMILARITY,
                 near_word_similarity: float = NEAR_WORD_SIMILARITY, **options: Any):
        super().__init__(profile, **options)
        # The profile's embedder reads meaning when it is a semantic model in this process
        # (wordllama); then sentences are also scored by their similarity to the question.
        semantic = embedder is not None and getattr(embedder, "local_semantic", False)
        self.selector = AnswerSelector(vocabulary=vocabulary, min_coverage=min_coverage,
                                       max_sentences=max_sentences, no_answer=no_answer,
                                       similarity=SentenceSimilarity(
                                           embedder.embed, encode_ids=getattr(embedder, "embed_ids", None),
                                           word_norms=getattr(embedder, "word_norms", None),
                                           token_ids=getattr(embedder, "token_ids", None))
                                       if semantic else None,
                                       semantic_weight=semantic_weight, min_similarity=min_similarity,
                                       near_word_similarity=near_word_similarity,
                                       space=embedder.space if semantic else "")
        self.vocabulary = vocabulary
        self.embedder = embedder if semantic else None

    def analyse_chunks(self, chunks: list[tuple[str, str, str]]) -> list[bytes]:
        """Each chunk's (text, heading, document title) read as this answerer reads it, with its
        sentences' vectors when it reads meaning: what ingestion stores in
        ``Chunk.analysis`` so that a turn need not read it (``django_ragchat.answerer.stored``)."""
        return analyse_chunks(chunks, self.vocabulary, self.embedder)

    def is_current(self, analysis: bytes | None) -> bool:
        """Whether ``analysis`` (``Chunk.analysis``) is what ``analyse_chunks`` writes now: made
        by this code with this language data and model (else a turn reads the chunk's text)."""
        return stored_key(analysis) == analysis_key(self.vocabulary, self.embedder)

    @classmethod
    def chunk_reader(cls, profile) -> ExtractiveAnswerer:
        """``profile``'s answerer (the instance its turns use), for ingestion to store its reading."""
        return build_component(profile, "llm", profile.llm, vocabulary=Vocabulary.for_profile(profile),
                               embedder=embedder_for(profile))

    def answer(self, prompt: Prompt) -> str:
        return self.explained(prompt)[0]

    def explained(self, prompt: Prompt) -> tuple[str, dict]:
        """The answer and why it is what it is (``AnswerSelector.explained``)."""
        return self.selector.explained(prompt)

    def _answer_for(self, prompt: Prompt, turn: TurnContext | None) -> str:
        """The answer, with why it is what it is in the turn's trace (``answerer``: the admin's
        "Why this answer")."""
        text, why = self.explained(prompt)
        if isinstance(getattr(turn, "trace", None), dict):
            turn.trace["answerer"] = why
        return text

    async def complete(self, prompt, turn):
        text = self._answer_for(prompt, turn)
        return LLMResponse(text=text, model=self.model,
                           usage=Usage(prompt.token_count, count_tokens(text)))

    async def stream(self, prompt, turn):
        text = self._answer_for(prompt, turn)
        for piece in re.findall(r"\S+\s*", text):
            yield LLMDelta(text=piece)
            await asyncio.sleep(0)  # let other turns on this event loop run between words
        yield LLMDelta(model=self.model, usage=Usage(prompt.token_count, count_tokens(text)),
                       finish_reason="stop")


class OpenAIChatBackend(LLMBackend):
    """Answers through the chat completions API of an OpenAI-compatible server.

    Options (in ``options["openai"]``, shared with the ``openai`` embedder): the connection's
    (``base_url``, ``api_key_env``, ``timeout``, ``max_retries``, ``headers``) and
    ``model`` (default ``gpt-4o-mini``), ``temperature`` (server default), ``max_tokens``
    (default: the profile's ``max_answer_tokens``), ``max_tokens_param``, ``stream_usage``
    (True), ``extra_body``.
    """

    name = "openai"

    def __init__(self, profile, **options: Any):
        check_options("The openai LLM backend", options, (*CONNECTION_OPTIONS, *CHAT_OPTIONS, *EMBEDDING_OPTIONS))
        super().__init__(profile)
        self.chat = ChatModel(
            OpenAIConnection.from_options(options),
            model=options.get("model") or DEFAULT_CHAT_MODEL,
            temperature=options.get("temperature"),
            max_tokens=options.get("max_tokens") or profile.max_answer_tokens,
            max_tokens_param=options.get("max_tokens_param", "max_tokens"),
            stream_usage=options.get("stream_usage", True),
            extra_body=options.get("extra_body"),
        )
        self.model = self.chat.model
        self.connection = self.chat.connection

    def _note_finish(self, turn: TurnContext, finish_reason: str | None) -> None:
        if finish_reason == "length":
            turn.warn(f"the answer was cut at {self.chat.max_tokens} tokens (max_tokens)")

    async def complete(self, prompt, turn):
        response = await self.chat.complete(list(prompt.messages), tools=prompt.tools, tool_choice=prompt.tool_choice)
        self._note_finish(turn, response.finish_reason)
        return response

    async def stream(self, prompt, turn):
        # aclosing: a turn stopped mid-answer closes the HTTP response now, not at garbage collection.
        deltas = self.chat.stream(list(prompt.messages), tools=prompt.tools, tool_choice=prompt.tool_choice)
        async with contextlib.aclosing(deltas) as deltas:
            async for delta in deltas:
                if delta.finish_reason:
                    self._note_finish(turn, delta.finish_reason)
                yield delta


@hookimpl
def register_llm_backends(register):
    register(ExtractiveAnswerer)
    register(OpenAIChatBackend)
