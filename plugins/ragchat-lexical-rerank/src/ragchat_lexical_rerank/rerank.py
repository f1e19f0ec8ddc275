"""BM25 over the retrieved candidates, blended with the order they arrived in."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured

from django_ragchat.stages.postprocessors import DocumentPostProcessor
from django_ragchat.text import content_terms
from django_ragchat.types import Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


def bm25_scores(query_terms: Sequence[str], documents: Sequence[Sequence[str]], *,
                k1: float = 1.2, b: float = 0.75) -> list[float]:
    """Okapi BM25 of each tokenised document for the query, the documents being the corpus.

    Each distinct query term counts once. The IDF is ``log(1 + (N - df + 0.5) / (df + 0.5))``
    (always positive), computed over ``documents`` alone: a term every candidate contains says
    little about which candidate is best, whatever its frequency in the whole collection.
    """
    n = len(documents)
    if not n:
        return []
    counts = [Counter(terms) for terms in documents]
    lengths = [len(terms) for terms in documents]
    average_length = sum(lengths) / n or 1.0
    idf = {}
    for term in set(query_terms):
        df = sum(1 for c in counts if term in c)
        if df:
            idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scores = []
    for count, length in zip(counts, lengths):
        norm = k1 * (1 - b + b * length / average_length)
        scores.append(sum(
            weight * count[term] * (k1 + 1) / (count[term] + norm)
            for term, weight in idf.items() if count[term]
        ))
    return scores


class LexicalRerank(DocumentPostProcessor):
    """Re-ranks the joined candidates by ``weight * lexical + (1 - weight) * prior``.

    ``lexical`` is the candidate's BM25 score for the transformed query (``query.text``,
    tokenised with ``django_ragchat.text.content_terms``, the same stemming as the built-in
    embedder), divided by the best candidate's so it lies in [0, 1]. ``prior`` is the
    candidate's incoming rank mapped linearly to [1/n, 1] (the first of n candidates gets 1),
    so ``weight`` 0 keeps the order and 1 sorts by BM25 alone (ties keep their order).

    Options (``profile.options["lexical_rerank"]``): ``weight`` (0.5, between 0 and 1), ``k1``
    (1.2, term-frequency saturation, >= 0), ``b`` (0.75, length normalisation, 0..1).

    The chunk's ``score`` becomes the blended score and its ``raw_scores`` gain
    ``"lexical_rerank"`` (the raw BM25 score); ``turn.trace["rerank"]["lexical_rerank"]``
    records the query terms and every candidate's old rank, BM25 and blended score. When no
    query term occurs in any candidate the list is returned unchanged.
    """

    name = "lexical_rerank"
    order = 500  # after similarity_threshold (50), before top_k (1000) cuts the list

    def __init__(self, profile, *, weight: float = 0.5, k1: float = 1.2, b: float = 0.75, **options: Any):
        super().__init__(profile, **options)
        for option, value, low, high in (("weight", weight, 0, 1), ("k1", k1, 0, math.inf), ("b", b, 0, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                bounds = f"at least {low}" if high == math.inf else f"between {low} and {high}"
                raise ImproperlyConfigured(
                    f"lexical_rerank option {option!r} must be a number {bounds}, not {value!r} "
                    f"(profile {profile.name!r})."
                )
        self.weight = float(weight)
        self.k1 = float(k1)
        self.b = float(b)

    def process(self, query: Query, documents: list[RetrievedChunk], turn: TurnContext) -> list[RetrievedChunk]:
        query_terms = list(dict.fromkeys(content_terms(query.text)))
        trace: dict[str, Any] = {"query_terms": query_terms, "weight": self.weight, "candidates": []}
        turn.trace.setdefault("rerank", {})[self.name] = trace
        if not documents or not query_terms:
            return documents
        raw = bm25_scores(query_terms, [content_terms(d.text) for d in documents], k1=self.k1, b=self.b)
        best = max(raw)
        if best <= 0:
            trace["note"] = "no query term occurs in any candidate: order kept"
            return documents
        n = len(documents)
        scored = []
        for rank, (chunk, bm25) in enumerate(zip(documents, raw), start=1):
            prior = 1 - (rank - 1) / n
            score = self.weight * bm25 / best + (1 - self.weight) * prior
            scored.append((score, rank, bm25, chunk))
        scored.sort(key=lambda s: (-s[0], s[1]))
        trace["candidates"] = [
            {"chunk_id": chunk.chunk_id, "rank_before": rank, "bm25": round(bm25, 6), "score": round(score, 6)}
            for score, rank, bm25, chunk in scored
        ]
        return [
            chunk.with_score(score, raw_scores={**chunk.raw_scores, self.name: bm25})
            for score, _rank, bm25, chunk in scored
        ]
