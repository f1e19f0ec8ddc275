"""Retrievers: find stored chunks for a query.

Built in: ``vector``, cosine similarity between the query's embedding and the chunks' in the
profile embedder's space. On PostgreSQL the search runs in pgvector; elsewhere it runs in
process over a cached numpy matrix (``django_ragchat.vectorindex``). Either way it is two
queries: the search and one fetch of the winning chunks' text.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from asgiref.sync import sync_to_async
from django.db import connections

from django_ragchat import hookimpl
from django_ragchat.components import Component
from django_ragchat.types import Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.pipeline import TurnContext


class EmbeddingSpaceMismatch(Exception):
    """Documents were embedded in another space than the profile's embedder produces."""


class Retriever(Component):
    """Base class: ``retrieve(query, turn, k)`` returns up to ``k`` ``RetrievedChunk``, best first."""

    kind = "retriever"
    # Whether this retriever embeds the query: the pipeline then embeds all queries of the
    # turn in one batch before retrieving.
    uses_embeddings: bool = False

    def retrieve(self, query: Query, turn: TurnContext, k: int) -> list[RetrievedChunk]:
        raise NotImplementedError


def fetch_chunks(scored: list[tuple[int, float]], retriever: str, using: str = "default") -> list[RetrievedChunk]:
    """``RetrievedChunk`` objects for (chunk id, score) pairs, in the given order (one query)."""
    from django_ragchat.models import Chunk

    if not scored:
        return []
    rows = {
        row["id"]: row
        for row in Chunk.objects.using(using).filter(id__in=[cid for cid, _ in scored]).values(
            "id", "text", "heading", "ordinal", "metadata", "document_id",
            "document__source", "document__title",
        )
    }
    found = []
    for chunk_id, score in scored:
        row = rows.get(chunk_id)
        if row is None:  # deleted between the search and the fetch
            continue
        found.append(RetrievedChunk(
            chunk_id=chunk_id, text=row["text"], score=score, document_id=row["document_id"],
            source=row["document__source"], title=row["document__title"], heading=row["heading"],
            ordinal=row["ordinal"], retriever=retriever, metadata=row["metadata"] or {},
            raw_scores={retriever: score},
        ))
    return found


def _pgvector_search(space: str, vector: np.ndarray, k: int, using: str) -> list[tuple[int, float]]:
    from django_ragchat.fields import EmbeddingField
    from django_ragchat.models import Chunk

    value = EmbeddingField().get_db_prep_value(vector, connections[using])
    table = connections[using].ops.quote_name(Chunk._meta.db_table)
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT id, 1 - (embedding <=> %s::vector) FROM {table} "
            "WHERE space = %s ORDER BY embedding <=> %s::vector LIMIT %s",
            [value, space, value, k],
        )
        return [(int(i), float(s)) for i, s in cursor.fetchall()]


def search_vectors(space: str, vector: np.ndarray, k: int, *, using: str = "default") -> list[tuple[int, float]]:
    """Nearest chunk ids in ``space`` with cosine similarities, best first."""
    if connections[using].vendor == "postgresql":
        return _pgvector_search(space, vector, k, using)
    from django_ragchat.vectorindex import vector_index

    return vector_index.search(space, vector, k, using=using)


def check_space_has_chunks(space: str, using: str = "default") -> None:
    """Raise ``EmbeddingSpaceMismatch`` when chunks exist, but none in ``space``."""
    from django_ragchat.models import Chunk

    if Chunk.objects.using(using).filter(space=space).exists():
        return
    other = list(Chunk.objects.using(using).values_list("space", flat=True).distinct()[:5])
    if other:
        raise EmbeddingSpaceMismatch(
            f"The documents are embedded in space(s) {other}, but this profile's embedder "
            f"produces {space!r}; vectors of different spaces cannot be compared. Run "
            f"`python manage.py ragchat_reembed` to embed the documents in the new space."
        )


class VectorRetriever(Retriever):
    """Cosine similarity search in the profile embedder's space."""

    name = "vector"
    uses_embeddings = True

    def _search(self, space: str, vector: np.ndarray, k: int) -> list[RetrievedChunk]:
        scored = search_vectors(space, vector, k)
        if not scored:
            check_space_has_chunks(space)
        return fetch_chunks(scored, self.name)

    async def retrieve(self, query, turn, k):
        vector = (await turn.embed([query.text]))[0]
        return await sync_to_async(self._search)(turn.components.embedder.space, vector, k)


@hookimpl
def register_retrievers(register):
    register(VectorRetriever)
