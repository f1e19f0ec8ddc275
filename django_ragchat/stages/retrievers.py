"""Retrievers: find stored chunks for a query.

Built in, each the same on every database (see ``django_ragchat.search`` for how):

* ``vector`` (enabled by default): cosine similarity between the query's embedding and the
  chunks' in the profile embedder's space. HNSW in pgvector on PostgreSQL, exact in process
  elsewhere. Options: ``ef_search`` (PostgreSQL: HNSW candidates, default 40; more is slower
  and finds more of the true nearest), ``exact`` (PostgreSQL: skip the index), ``filters``.
* ``fulltext``: chunks sharing words with the query (stemmed), best text rank first.
  ``tsvector`` + GIN on PostgreSQL, FTS5 on SQLite. Options: ``config`` (PostgreSQL's text
  search configuration, default "english"), ``filters``.
* ``hybrid``: both, fused by reciprocal rank in the database. Options: those of both, plus
  ``weights`` ({"vector": 1.0, "fulltext": 1.0}), ``rrf_k`` (60) and ``candidates`` (hits each
  search contributes, default max(2 * k, 20)).

``fulltext`` and ``hybrid`` are off unless a profile lists them (``"retrievers": ["hybrid"]``),
so the default profile stays vector-only. Options come from the profile
(``"options": {"hybrid": {"weights": {"vector": 1, "fulltext": 0.5}}}``).

Filters (``{"metadata": {...}, "sources": [...], "source_prefixes": [...]}``, see
``django_ragchat.search.filters``) are applied inside the search's SQL: a profile's ``filters``
option always, and a request's ``query.metadata["filters"]`` on top (both must hold).

Access: every search reads as the turn's asker (``turn.principals``, see
``django_ragchat.access``), inside its SQL. A plugin retriever built on ``django_ragchat.search``
(or ``search_vectors`` and ``fetch_chunks`` here) reads as the asker without asking: the turn
sets the reader of its stages. Chunks a retriever makes another way are checked by the turn
in SQL before anything sees them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from django_ragchat import hookimpl, search
from django_ragchat.access import Principals
from django_ragchat.components import Component
from django_ragchat.models import Chunk
from django_ragchat.search import SearchFilters, fetch_chunks
from django_ragchat.search.postgres import check_config
from django_ragchat.stages.expanders import ASKER_ROWS, principals_for_query
from django_ragchat.types import Query, RetrievedChunk

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext

__all__ = ["EmbeddingSpaceMismatch", "FullTextRetriever", "HybridRetriever", "Retriever", "VectorRetriever",
           "check_space_has_chunks", "fetch_chunks", "search_vectors"]


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


def search_vectors(space: str, vector: np.ndarray, k: int, *, using: str = "default",
                   filters: Any = None, ef_search: int | None = None,
                   exact: bool = False, principals: Principals | None = None) -> list[tuple[int, float]]:
    """Nearest chunk ids in ``space`` readable by ``principals`` (by default the turn's asker),
    with cosine similarities, best first (``django_ragchat.search.vector_ids``)."""
    return search.vector_ids(space, vector, k, filters=filters, ef_search=ef_search, exact=exact, using=using,
                             principals=principals)


def check_space_has_chunks(space: str, using: str = "default") -> None:
    """Raise ``EmbeddingSpaceMismatch`` when chunks exist, but none in ``space``."""

    if Chunk.objects.using(using).filter(space=space).exists():
        return
    other = list(Chunk.objects.using(using).values_list("space", flat=True).distinct()[:5])
    if other:
        raise EmbeddingSpaceMismatch(
            f"The documents are embedded in space(s) {other}, but this profile's embedder "
            f"produces {space!r}; vectors of different spaces cannot be compared. Run "
            f"`python manage.py ragchat_reembed` to embed the documents in the new space."
        )


def _check_ef_search(ef_search: Any) -> int | None:
    if ef_search is not None and (isinstance(ef_search, bool) or not isinstance(ef_search, int)
                                  or not 1 <= ef_search <= 1000):
        raise ImproperlyConfigured(f"ef_search must be an integer from 1 to 1000, not {ef_search!r}.")
    return ef_search


class _FilteredRetriever(Retriever):
    """Shared by the built-in retrievers: the profile's filters and the request's."""

    def __init__(self, profile, *, filters: dict | None = None, **options: Any):
        super().__init__(profile, **options)
        self.filters = SearchFilters.parse(filters)

    def filters_for(self, query: Query) -> SearchFilters:
        """The profile's filters and the request's (``query.metadata["filters"]``), both to hold."""
        return self.filters & SearchFilters.parse(query.metadata.get("filters"))

    def _found(self, hits: list[RetrievedChunk], space: str, check_space: bool) -> list[RetrievedChunk]:
        if not hits and check_space:
            check_space_has_chunks(space)
        return hits


def _reading(query: Query, turn) -> dict[str, Any]:
    """How ``query`` is searched for ``turn``: as whom (``principals_for_query``), and whether an
    empty result checks the embedding space. An empty asker's-rows search says nothing of the
    space: the same text is searched unnarrowed beside it, and that search checks (one statement
    less per such turn)."""
    return {"principals": principals_for_query(query, turn), "check_space": not query.metadata.get(ASKER_ROWS)}


class VectorRetriever(_FilteredRetriever):
    """Cosine similarity search in the profile embedder's space. Options: ``ef_search``,
    ``exact``, ``filters``."""

    name = "vector"
    uses_embeddings = True

    def __init__(self, profile, *, ef_search: int | None = None, exact: bool = False, **options: Any):
        super().__init__(profile, **options)
        self.ef_search = _check_ef_search(ef_search)
        self.exact = bool(exact)

    def search(self, space: str, vector: np.ndarray, k: int, filters: Any = None, *,
               principals: Principals | None = None, check_space: bool = True) -> list[RetrievedChunk]:
        """The search itself, synchronous (``filters`` on top of the profile's), reading as
        ``principals`` (by default the turn's asker, else the public); when nothing is found,
        ``check_space`` raises ``EmbeddingSpaceMismatch`` if the documents are in another space."""
        hits = search.vector_search(space, vector, k, filters=self.filters & SearchFilters.parse(filters),
                                    ef_search=self.ef_search, exact=self.exact, retriever=self.name,
                                    principals=principals)
        return self._found(hits, space, check_space)

    async def retrieve(self, query, turn, k):
        vector = (await turn.embed([query.text]))[0]
        return await sync_to_async(self.search)(turn.components.embedder.space, vector, k,
                                                query.metadata.get("filters"), **_reading(query, turn))


class FullTextRetriever(_FilteredRetriever):
    """Chunks sharing (stemmed) words with the query, in the profile embedder's space (so that
    a chunk is not found twice while a second space is being filled). Options: ``config``,
    ``filters``."""

    name = "fulltext"
    enabled_by_default = False

    def __init__(self, profile, *, config: str = "english", **options: Any):
        super().__init__(profile, **options)
        self.config = check_config(config)

    def search(self, space: str, text: str, k: int, filters: Any = None, *,
               principals: Principals | None = None, check_space: bool = True) -> list[RetrievedChunk]:
        hits = search.fulltext_search(space, text, k, filters=self.filters & SearchFilters.parse(filters),
                                      config=self.config, retriever=self.name, principals=principals)
        return self._found(hits, space, check_space)

    async def retrieve(self, query, turn, k):
        return await sync_to_async(self.search)(turn.components.embedder.space, query.text, k,
                                                query.metadata.get("filters"), **_reading(query, turn))


class HybridRetriever(VectorRetriever):
    """Vector and full-text search fused by reciprocal rank, in one query on PostgreSQL.
    Options: ``weights``, ``rrf_k``, ``candidates``, ``config``, ``ef_search``, ``exact``,
    ``filters``."""

    name = "hybrid"
    enabled_by_default = False

    def __init__(self, profile, *, weights: dict[str, float] | None = None, rrf_k: int = 60,
                 candidates: int | None = None, config: str = "english", **options: Any):
        super().__init__(profile, **options)
        weights = {"vector": 1.0, "fulltext": 1.0, **(weights or {})}
        if set(weights) != {"vector", "fulltext"} or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in weights.values()):
            raise ImproperlyConfigured(f'hybrid weights must be {{"vector": w, "fulltext": w}} with numbers >= 0, '
                                       f"not {weights!r}.")
        if isinstance(rrf_k, bool) or not isinstance(rrf_k, int) or rrf_k < 1:
            raise ImproperlyConfigured(f"rrf_k must be a positive integer, not {rrf_k!r}.")
        if candidates is not None and (isinstance(candidates, bool) or not isinstance(candidates, int)
                                       or candidates < 1):
            raise ImproperlyConfigured(f"candidates must be a positive integer, not {candidates!r}.")
        self.weights = (float(weights["vector"]), float(weights["fulltext"]))
        self.rrf_k = rrf_k
        self.candidates = candidates
        self.config = check_config(config)

    def search(self, space: str, vector: np.ndarray, k: int, filters: Any = None, *,
               text: str = "", principals: Principals | None = None,
               check_space: bool = True) -> list[RetrievedChunk]:
        hits = search.hybrid_search(
            space, vector, text, k, filters=self.filters & SearchFilters.parse(filters), ef_search=self.ef_search,
            exact=self.exact, config=self.config, weights=self.weights, rrf_k=self.rrf_k,
            candidates=self.candidates, retriever=self.name, principals=principals,
        )
        return self._found(hits, space, check_space)

    async def retrieve(self, query, turn, k):
        vector = (await turn.embed([query.text]))[0]
        return await sync_to_async(self.search)(turn.components.embedder.space, vector, k,
                                                query.metadata.get("filters"), text=query.text,
                                                **_reading(query, turn))


@hookimpl
def register_retrievers(register):
    register(VectorRetriever)
    register(FullTextRetriever)
    register(HybridRetriever)
