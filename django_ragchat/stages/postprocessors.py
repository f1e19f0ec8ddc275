"""Document post-processors: filter, re-rank or cut the joined list, in ``order``.

Built in: ``similarity_threshold`` (order 50; drops chunks whose best similarity is below the
profile's ``similarity_threshold``; off when that is ``None``, the default, as in Spring AI and
LangChain4j) and ``top_k`` (order 1000, last: keeps the profile's ``top_k`` best).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django_ragchat import hookimpl
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
    """Keeps the profile's ``top_k`` best chunks."""

    name = "top_k"
    order = 1000

    def process(self, query, documents, turn):
        return documents[: self.profile.top_k]


@hookimpl
def register_document_postprocessors(register):
    register(SimilarityThreshold)
    register(TopK)
