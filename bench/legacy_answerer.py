"""The first offline answerer (before issue #9), kept out of the package as the baseline that
``bench/bench_extractive.py`` compares against ("old" in bench/README.md). Not for sites.

Composes an answer from the passages' most relevant sentences, with ``[n]`` citations. A
sentence's score is the IDF-weighted share of the question's content words it contains (words of
the transformed search query count half, so a resolved follow-up still finds "Aurora X2").
Sentences scoring below ``min_score`` are not relevant; with none left the answer is
``no_answer``.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from django_ragchat.answerer.passages import cite, is_prose
from django_ragchat.stages.llms import ExtractiveAnswerer, LLMBackend
from django_ragchat.text import content_terms, sentences
from django_ragchat.types import Prompt


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
    uses_vocabulary = False  # it reads with no vocabulary: content words only
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
            parts.append(cite(sentence, index))
        return " ".join(parts)
