"""Document post-processors: filter, re-rank or cut the joined list, in ``order``.

Built in: ``similarity_threshold`` (order 50; drops chunks whose best similarity is below the
profile's ``similarity_threshold``; off when that is ``None``, the default, as in Spring AI and
LangChain4j) and ``top_k`` (order 1000, last: keeps the profile's ``top_k`` best).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
from django_ragchat.access import only_for
from django_ragchat.components import Component
from django_ragchat.types import Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext


class DocumentPostProcessor(Component):
    """Base class: ``process(query, documents, turn)`` returns the new list.

    ``query`` is the transformed query (its ``original`` is the user's words).
    """

    kind = "document_postprocessor"

    def process(self, query: Query, documents: list[RetrievedChunk], turn: TurnContext) -> list[RetrievedChunk]:
        return documents


class SimilarityThreshold(DocumentPostProcessor):
    """Keeps chunks whose similarity reaches the threshold.

    The similarity is the chunk's raw score from ``retriever`` (option, default "vector");
    chunks that retriever did not find are kept (another retriever vouched for them).
    """

    name = "similarity_threshold"
    order = 50

    def __init__(self, profile, *, retriever: str = "vector", **options: Any):
        super().__init__(profile, **options)
        self.retriever = retriever

    def process(self, query, documents, turn):
        threshold = self.profile.similarity_threshold
        if threshold is None:
            return documents
        return [
            d for d in documents
            if self.retriever not in d.raw_scores or d.raw_scores[self.retriever] >= threshold
        ]


class TopK(DocumentPostProcessor):
    """Keeps the profile's ``top_k`` best chunks, and the asker's own rows besides them.

    A row only the asker may read (their booking, order: ``access.only_for``) takes no place of
    a page: up to ``top_k`` of each are kept, in their order. "Is there somewhere to leave my
    car?" still gets the parking page when three stays of the asker's match "leave" better,
    and "When is my next appointment?" every appointment of theirs beside the pages. A turn
    that found none of their rows keeps ``top_k`` chunks, as before.
    """

    name = "top_k"
    order = 1000

    def process(self, query, documents, turn):
        k = self.profile.top_k
        own = [only_for(d.access, d.read_as) for d in documents]
        if not any(own):
            return documents[:k]
        rows = [d for d, mine in zip(documents, own, strict=True) if mine][:k]
        pages = [d for d, mine in zip(documents, own, strict=True) if not mine][:k]
        kept = {d.chunk_id for d in (*rows, *pages)}
        return [d for d in documents if d.chunk_id in kept]


@hookimpl
def register_document_postprocessors(register):
    register(SimilarityThreshold)
    register(TopK)
