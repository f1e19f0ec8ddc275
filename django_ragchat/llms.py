"""LLM backends: answer a ``Prompt``, whole or streamed.

Built in: ``extractive``, an offline answerer for the embedded default (no model, no server,
no key). It answers with the sentences of the retrieved passages that state what was asked about
the subject asked about, cites each as ``[n]``, streams the answer word by word, and says plainly
when the documents don't say (the engine is ``django_ragchat.extractive``; docs/answerer.md).
``openai`` (any OpenAI-compatible server) lives in ``django_ragchat.openai_backend``.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.exceptions import LLMError  # noqa: F401  (its historical home)
from django_ragchat.extractive import DEFAULT_MIN_COVERAGE, AnswerSelector, is_prose
from django_ragchat.text import content_terms, sentences
from django_ragchat.tokens import count_tokens
from django_ragchat.types import LLMDelta, LLMResponse, Prompt, Usage

if TYPE_CHECKING:
    from django_ragchat.context import TurnContext


class LLMBackend(Component):
    """Base class. Implement ``complete`` or ``stream`` (or both); each has a default in terms
    of the other. ``model`` names the model for traces."""

    kind = "llm"
    model: str = ""

    async def complete(self, prompt: Prompt, turn: TurnContext) -> LLMResponse:
        parts, usage, model = [], None, self.model
        async for delta in self.stream(prompt, turn):
            parts.append(delta.text)
            usage = delta.usage or usage
            model = delta.model or model
        return LLMResponse(text="".join(parts), model=model, usage=usage)

    async def stream(self, prompt: Prompt, turn: TurnContext) -> AsyncIterator[LLMDelta]:
        response = await self.complete(prompt, turn)
        yield LLMDelta(text=response.text, model=response.model, usage=response.usage,
                       finish_reason=response.finish_reason)


_CITE_BEFORE_STOP = re.compile(r"([.!?])$")


class ExtractiveAnswerer(LLMBackend):
    """The offline answerer: the sentences that state what was asked about the subject asked
    about, each cited as ``[n]``; a plain decline naming what the documents do describe when
    none does. Options: ``synonyms`` (extra synonym groups, see ``extractive.SYNONYMS``),
    ``min_coverage`` (0.5), ``max_sentences`` (4), ``no_answer`` (used when no passage was
    given). The engine is ``django_ragchat.extractive.AnswerSelector``.
    """

    name = "extractive"
    model = "extractive"

    def __init__(self, profile, *, synonyms: dict[str, list[str]] | None = None,
                 min_coverage: float = DEFAULT_MIN_COVERAGE,
                 max_sentences: int = 4, no_answer: str = "I can't answer that from the documents I have.",
                 **options: Any):
        super().__init__(profile, **options)
        self.selector = AnswerSelector(synonyms=synonyms, min_coverage=min_coverage,
                                       max_sentences=max_sentences, no_answer=no_answer)

    def answer(self, prompt: Prompt) -> str:
        return self.selector.answer(prompt)

    async def complete(self, prompt, turn):
        text = self.answer(prompt)
        return LLMResponse(text=text, model=self.model,
                           usage=Usage(prompt.token_count, count_tokens(text)))

    async def stream(self, prompt, turn):
        text = self.answer(prompt)
        for piece in re.findall(r"\S+\s*", text):
            yield LLMDelta(text=piece)
            await asyncio.sleep(0)  # let other turns on this event loop run between words
        yield LLMDelta(model=self.model, usage=Usage(prompt.token_count, count_tokens(text)),
                       finish_reason="stop")


class LegacyExtractiveAnswerer(ExtractiveAnswerer):
    """The first offline answerer (before issue #9), kept, unregistered, as the baseline that
    ``bench/bench_extractive.py`` compares against. Not for new sites.

    Composes an answer from the passages' most relevant sentences, with ``[n]`` citations.

    A sentence's score is the IDF-weighted share of the question's content words it contains
    (words of the transformed search query count half, so a resolved follow-up still finds
    "Aurora X2"). Sentences scoring below ``min_score`` are not relevant; with none left the
    answer is ``no_answer``. Options: ``max_sentences`` (3), ``min_score`` (0.2),
    ``no_answer``.
    """

    name = "extractive_legacy"
    model = "extractive_legacy"

    def __init__(self, profile, *, max_sentences: int = 3, min_score: float = 0.2,
                 no_answer: str = "I can't answer that from the documents I have.", **options: Any):
        LLMBackend.__init__(self, profile, **options)
        self.max_sentences = max_sentences
        self.min_score = min_score
        self.no_answer = no_answer

    def candidate_sentences(self, prompt: Prompt) -> list[tuple[int, int, str]]:
        """(document index, position, sentence) for every sentence of every passage."""
        found = []
        for index, chunk in enumerate(prompt.documents, start=1):
            text = chunk.text
            if chunk.heading and text.startswith(chunk.heading):
                text = text[len(chunk.heading):]  # the heading line is a label, not a sentence
            for position, sentence in enumerate(sentences(text)):
                if len(sentence) >= 12 and is_prose(sentence):
                    found.append((index, position, sentence))
        return found

    def answer(self, prompt: Prompt) -> str:
        own_terms = set(content_terms(prompt.question))
        weights: dict[str, float] = {t: 1.0 for t in own_terms}
        for term in content_terms(prompt.search_query):
            weights.setdefault(term, 0.5)
        candidates = self.candidate_sentences(prompt)
        if not weights or not candidates:
            return self.no_answer
        terms_of = [set(content_terms(s)) for _, _, s in candidates]
        df = Counter(t for terms in terms_of for t in terms if t in weights)
        n = len(candidates)
        idf = {t: math.log(1 + n / (1 + df[t])) for t in weights}
        total = sum(weights[t] * idf[t] for t in weights) or 1.0
        scored = []
        for (index, position, sentence), terms in zip(candidates, terms_of, strict=True):
            matched = sum(weights[t] * idf[t] for t in weights if t in terms)
            # A mild preference for higher-ranked passages and for concise sentences.
            score = matched / total - 0.01 * index - 0.0005 * max(0, len(terms) - 25)
            # When the question has words of its own, a sentence must share one of them: a
            # follow-up's resolved terms ("Aurora X2") alone don't make a sentence an answer.
            if own_terms and not own_terms & terms:
                continue
            if matched and score >= self.min_score:
                scored.append((score, index, position, sentence))
        if not scored:
            return self.no_answer
        best = sorted(scored, key=lambda s: -s[0])[: self.max_sentences]
        parts = []
        for _score, index, _position, sentence in sorted(best, key=lambda s: (s[1], s[2])):
            parts.append(_CITE_BEFORE_STOP.sub(rf" [{index}]\1", sentence)
                         if _CITE_BEFORE_STOP.search(sentence) else f"{sentence} [{index}]")
        return " ".join(parts)


@hookimpl
def register_llm_backends(register):
    register(ExtractiveAnswerer)
