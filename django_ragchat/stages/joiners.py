"""Joiners: merge the result lists of every (query, retriever) pair into one list.

Built in: ``rrf`` (reciprocal rank fusion, k=60, as LangChain4j's default aggregator: scores of
different retrievers are not comparable, ranks are) and ``concat`` (dedupe by chunk, keep the
best score, sort by it, as Spring AI's default joiner).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.types import Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

ResultLists = list[tuple[Query, str, list[RetrievedChunk]]]


class Joiner(Component):
    """Base class: ``join(results, turn)`` takes [(query, retriever name, hits)] and returns
    one deduplicated list, best first."""

    kind = "joiner"

    def join(self, results: ResultLists, turn: TurnContext) -> list[RetrievedChunk]:
        raise NotImplementedError


def _merge_raw_scores(into: dict[str, float], chunk: RetrievedChunk) -> None:
    for name, score in chunk.raw_scores.items():
        into[name] = max(score, into.get(name, float("-inf")))


class ReciprocalRankFusion(Joiner):
    """score(chunk) = sum over lists of weight / (k + rank). Options: ``k`` (60), ``weights``
    ({retriever name: weight}, default 1 each)."""

    name = "rrf"

    def __init__(self, profile, *, k: int = 60, weights: dict[str, float] | None = None, **options: Any):
        super().__init__(profile, **options)
        self.k = k
        self.weights = weights or {}

    def join(self, results, turn):
        fused: dict[int, float] = {}
        first: dict[int, RetrievedChunk] = {}
        raw: dict[int, dict[str, float]] = {}
        for _query, retriever, hits in results:
            weight = self.weights.get(retriever, 1.0)
            for rank, chunk in enumerate(hits, start=1):
                fused[chunk.chunk_id] = fused.get(chunk.chunk_id, 0.0) + weight / (self.k + rank)
                first.setdefault(chunk.chunk_id, chunk)
                _merge_raw_scores(raw.setdefault(chunk.chunk_id, {}), chunk)
        order = sorted(fused, key=lambda cid: (-fused[cid], cid))
        return [first[cid].with_score(fused[cid], raw_scores=raw[cid]) for cid in order]


class ConcatJoiner(Joiner):
    """Deduplicate by chunk, keep each chunk's best score, sort by score."""

    name = "concat"

    def join(self, results, turn):
        best: dict[int, RetrievedChunk] = {}
        raw: dict[int, dict[str, float]] = {}
        for _query, _retriever, hits in results:
            for chunk in hits:
                if chunk.chunk_id not in best or chunk.score > best[chunk.chunk_id].score:
                    best[chunk.chunk_id] = chunk
                _merge_raw_scores(raw.setdefault(chunk.chunk_id, {}), chunk)
        order = sorted(best.values(), key=lambda c: (-c.score, c.chunk_id))
        return [c.with_score(c.score, raw_scores=raw[c.chunk_id]) for c in order]


@hookimpl
def register_joiners(register):
    register(ReciprocalRankFusion)
    register(ConcatJoiner)
