"""Searching stored chunks: vector, full-text and hybrid search, with filters, on every database.

This package is the one place that knows how chunks are searched and bulk-stored; the
retrievers in ``django_ragchat.stages.retrievers`` are thin components over it, and work the same
whichever database the site runs:

=================  ===========================================  ===================================
                   PostgreSQL + pgvector (``search.postgres``)  SQLite and others (``search.sqlite``)
=================  ===========================================  ===================================
vector             HNSW index per embedding space, in SQL       exact, in process (``vectorindex``)
full text          ``tsvector`` column + GIN, ``ts_rank``       FTS5 table kept by triggers, BM25
hybrid             reciprocal rank fusion in one SQL query      the two searches, fused in Python
filters            in the SQL of each search                    in SQL: ids resolved, then searched
bulk storage       binary ``COPY``                              ``bulk_create``
=================  ===========================================  ===================================

Access: every search reads as someone (``principals``, see ``django_ragchat.access``): the
chunks whose ``access`` shares no token with the principals are filtered out inside the query
(PostgreSQL: ``access ?| principals``, with pgvector's iterative index scan so that a vector
search still finds ``k`` rows when few are readable; SQLite: the in-process index keeps each
chunk's access, and the fetch of the winners checks it again in SQL). A search not given
``principals`` reads as the turn in progress, or outside one as an anonymous visitor
(``access.current_principals``): nothing built on this package can read past its reader.

Scores: cosine similarity for vector search; the database's text rank (``ts_rank`` or BM25,
not comparable across databases) for full text; the fused RRF score for hybrid, whose hits
also carry the similarity and text rank they were found with in ``raw_scores``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from django.db import connections

from django_ragchat.access import Principals, access_sql, current_principals
from django_ragchat.models import Chunk
from django_ragchat.plugins import build_component, embedder_for, get_registry
from django_ragchat.profiles import get_profile, profile_names
from django_ragchat.search import postgres, readings, sqlite
from django_ragchat.search.filters import FILTER_KEYS, InvalidFilters, SearchFilters
from django_ragchat.search.postgres import decode_access, decode_metadata
from django_ragchat.search.vectorindex import vector_index
from django_ragchat.text import STOPWORDS
from django_ragchat.types import RetrievedChunk

__all__ = [
    "FILTER_KEYS", "InvalidFilters", "SearchFilters", "configured_spaces", "configured_text_configs", "fetch_chunks",
    "fulltext_search", "hybrid_search", "query_terms", "reader", "store_chunks", "vector_ids", "vector_search",
]

#: Query terms kept for full-text search: a longer question adds noise, not recall.
MAX_QUERY_TERMS = 32
_WORD = re.compile(r"\w+")


def _is_postgres(using: str) -> bool:
    return connections[using].vendor == "postgresql"


def query_terms(text: str, config: str = "english") -> list[str]:
    """The words of ``text`` that full-text search looks for (any of them may match).

    Words are ``\\w+`` runs, lowercased, deduplicated, at most ``MAX_QUERY_TERMS``; "or" is
    dropped (PostgreSQL's websearch OR operator). For the ``english`` configuration, English stop
    words are dropped here, so SQLite's FTS5 (which has no stop words) searches for the same
    words PostgreSQL does. Each database then applies its own stemming.
    """

    terms = dict.fromkeys(w.lower() for w in _WORD.findall(text or ""))
    terms.pop("or", None)
    if config == "english":
        terms = {t: None for t in terms if t not in STOPWORDS}
    return list(terms)[:MAX_QUERY_TERMS]


def reader(principals: Principals | None) -> Principals:
    """Whom a search reads as: ``principals`` when given, else the turn's (or the public's)."""
    return principals if principals is not None else current_principals()


def _hit(row: Sequence, score: float, retriever: str, raw_scores: dict[str, float],
         principals: Principals) -> RetrievedChunk:
    chunk_id, text, heading, ordinal, metadata, document_id, source, title, access = row[:9]
    analysis = row[9] if len(row) > 9 else None
    return RetrievedChunk(
        chunk_id=int(chunk_id), text=text, score=float(score), document_id=int(document_id), source=source,
        title=title, heading=heading, ordinal=ordinal, retriever=retriever, metadata=decode_metadata(metadata),
        raw_scores=raw_scores, read_as=principals, analysis=analysis, access=tuple(decode_access(access)),
    )


def _fetch_sql(using: str, ids: list[int], analysis: bool, principals: Principals) -> tuple[str, list]:
    """``fetch_chunks``' statement and parameters: written here, not built by the ORM, whose
    building cost several times the query on every search. The access condition is
    ``access.access_sql``'s, as the ORM's ``access__visible_to`` writes it."""
    connection = connections[using]
    qn = connection.ops.quote_name
    chunk, document = Chunk._meta, Chunk._meta.get_field("document").related_model._meta
    column = {name: f"c.{qn(chunk.get_field(name).column)}"
              for name in ("id", "text", "heading", "ordinal", "metadata", "document", "access", "analysis")}
    selected = [column[name] for name in ("id", "text", "heading", "ordinal", "metadata", "document")]
    selected += [f"d.{qn(document.get_field(name).column)}" for name in ("source", "title")]
    selected.append(column["access"])
    if analysis:
        selected.append(column["analysis"])
    access, params = access_sql(connection.vendor, column["access"], principals)
    where = f"{column['id']} IN ({', '.join(['%s'] * len(ids))})" + (f" AND {access}" if access else "")
    return (f"SELECT {', '.join(selected)} FROM {qn(chunk.db_table)} c INNER JOIN {qn(document.db_table)} d "
            f"ON {column['document']} = d.{qn(document.pk.column)} WHERE {where}", [*ids, *params])


def fetch_chunks(scored: list[tuple[int, float]], retriever: str, using: str = "default",
                 raw_scores: dict[int, dict[str, float]] | None = None, *,
                 principals: Principals | None = None) -> list[RetrievedChunk]:
    """``RetrievedChunk`` objects for (chunk id, score) pairs, in the given order (one query).

    Each hit's ``raw_scores`` is ``raw_scores[chunk id]`` when given, else ``{retriever: score}``.
    Chunks ``principals`` may not read (see ``reader``) are left out, whoever found their ids.
    """

    if not scored:
        return []
    principals = reader(principals)
    sql, params = _fetch_sql(using, list(dict.fromkeys(int(cid) for cid, _ in scored)), readings.wanted(), principals)
    with connections[using].cursor() as cursor:
        cursor.execute(sql, params)
        rows = {row[0]: row for row in cursor.fetchall()}
    return [
        _hit(rows[cid], score, retriever, raw_scores[cid] if raw_scores else {retriever: score}, principals)
        for cid, score in scored
        if cid in rows  # a chunk deleted between the search and the fetch (or not readable) is skipped
    ]


def _zero(vector) -> bool:
    return not np.any(np.asarray(vector, dtype=np.float32))


def vector_ids(space: str, vector, k: int, *, filters: Any = None, ef_search: int | None = None,
               exact: bool = False, using: str = "default",
               principals: Principals | None = None) -> list[tuple[int, float]]:
    """(chunk id, cosine similarity) of the ``k`` chunks of ``space`` nearest ``vector`` that
    ``principals`` may read (see ``reader``), best first.

    On PostgreSQL the space's HNSW index answers (``ef_search`` candidates, default 40 and never
    fewer than ``k``; an iterative scan goes on while filters or access leave fewer than ``k``)
    unless ``exact``; elsewhere the search is always exact.
    """
    filters = SearchFilters.parse(filters)
    principals = reader(principals)
    if k <= 0 or _zero(vector):
        return []
    if _is_postgres(using):
        return postgres.vector_ids(space, vector, k, filters=filters, ef_search=ef_search, exact=exact, using=using,
                                   principals=principals)

    allowed = sqlite.allowed_ids(space, filters, using) if filters else None
    if allowed is not None and allowed.size == 0:
        return []
    return vector_index.search(space, vector, k, using=using, allowed_ids=allowed, principals=principals)


def vector_search(space: str, vector, k: int, *, filters: Any = None, ef_search: int | None = None,
                  exact: bool = False, using: str = "default", retriever: str = "vector",
                  principals: Principals | None = None) -> list[RetrievedChunk]:
    """The ``k`` chunks of ``space`` nearest ``vector`` (see ``vector_ids``), with their text.

    One query on PostgreSQL; the in-process search and one fetch elsewhere.
    """
    filters = SearchFilters.parse(filters)
    principals = reader(principals)
    if k <= 0 or _zero(vector):
        return []
    if _is_postgres(using):
        rows = postgres.vector_search(space, vector, k, filters=filters, ef_search=ef_search, exact=exact,
                                      using=using, principals=principals)
        return [_hit(row, row[10], retriever, {retriever: float(row[10])}, principals) for row in rows]
    return fetch_chunks(vector_ids(space, vector, k, filters=filters, using=using, principals=principals),
                        retriever, using, principals=principals)


def fulltext_search(space: str, text: str, k: int, *, filters: Any = None, config: str = "english",
                    using: str = "default", retriever: str = "fulltext",
                    principals: Principals | None = None) -> list[RetrievedChunk]:
    """The ``k`` chunks of ``space`` that ``principals`` may read and that best match any word
    of ``text``, best first.

    ``config`` is PostgreSQL's text search configuration (stemming and stop words); SQLite's
    FTS5 index always uses the Porter stemmer. Raises ``sqlite.FullTextUnavailable`` on a SQLite
    without FTS5 or without the index.
    """

    filters = SearchFilters.parse(filters)
    principals = reader(principals)
    postgres.check_config(config)
    terms = query_terms(text, config)
    if k <= 0 or not terms:
        return []
    if _is_postgres(using):
        rows = postgres.fulltext_search(space, terms, k, filters=filters, config=config, using=using,
                                        principals=principals)
        return [_hit(row, row[10], retriever, {retriever: float(row[10])}, principals) for row in rows]

    return fetch_chunks(sqlite.fulltext_ids(space, terms, k, filters=filters, using=using, principals=principals),
                        retriever, using, principals=principals)


def rrf(ranked: Sequence[Sequence[tuple[int, float]]], weights: Sequence[float], rrf_k: int) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: ``sum(weight / (rrf_k + rank))`` over the lists, best first
    (ties by id, as the SQL version orders them)."""
    fused: dict[int, float] = {}
    for hits, weight in zip(ranked, weights):
        for rank, (chunk_id, _) in enumerate(hits, start=1):
            fused[chunk_id] = fused.get(chunk_id, 0.0) + weight / (rrf_k + rank)
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def hybrid_search(space: str, vector, text: str, k: int, *, filters: Any = None, ef_search: int | None = None,
                  exact: bool = False, config: str = "english", weights: tuple[float, float] = (1.0, 1.0),
                  rrf_k: int = 60, candidates: int | None = None, using: str = "default",
                  retriever: str = "hybrid", principals: Principals | None = None) -> list[RetrievedChunk]:
    """Vector and full-text search fused by reciprocal rank: the ``k`` best chunks of ``space``.

    Each search contributes ``candidates`` hits (default ``max(2 * k, 20)``); a chunk's score is
    ``weights[0] / (rrf_k + vector rank) + weights[1] / (rrf_k + text rank)``. ``raw_scores``
    holds the fused score under ``retriever`` and, where found, ``"vector"`` (the similarity)
    and ``"fulltext"`` (the text rank). One query on PostgreSQL.
    """

    filters = SearchFilters.parse(filters)
    principals = reader(principals)
    postgres.check_config(config)
    candidates = candidates or max(2 * k, 20)
    terms = query_terms(text, config)
    if _zero(vector):
        vector = None  # nothing is similar to it: the text search alone decides
    if k <= 0 or (vector is None and not terms):
        return []
    if _is_postgres(using):
        rows = postgres.hybrid_search(space, vector, terms, k, candidates=candidates, weights=tuple(weights),
                                      rrf_k=rrf_k, filters=filters, ef_search=ef_search, exact=exact,
                                      config=config, using=using, principals=principals)
        hits = []
        for row in rows:
            raw = {retriever: float(row[10])}
            if row[11] is not None:
                raw["vector"] = float(row[11])
            if row[12] is not None:
                raw["fulltext"] = float(row[12])
            hits.append(_hit(row, row[10], retriever, raw, principals))
        return hits

    by_vector = (vector_ids(space, vector, candidates, filters=filters, using=using, principals=principals)
                 if vector is not None else [])
    by_text = (sqlite.fulltext_ids(space, terms, candidates, filters=filters, using=using, principals=principals)
               if terms else [])
    fused = rrf([by_vector, by_text], weights, rrf_k)[:k]
    raw: dict[int, dict[str, float]] = {cid: {retriever: score} for cid, score in fused}
    for name, hits in (("vector", by_vector), ("fulltext", by_text)):
        for cid, score in hits:
            if cid in raw:
                raw[cid][name] = score
    return fetch_chunks(fused, retriever, using, raw_scores=raw, principals=principals)


def store_chunks(chunks: Iterable, *, using: str = "default", batch_size: int = 500) -> int:
    """Insert unsaved ``Chunk`` objects as fast as the database allows; returns how many.

    PostgreSQL: one binary ``COPY`` (primary keys are not set on the objects). Elsewhere:
    ``bulk_create`` in batches of ``batch_size``. Runs inside the caller's transaction, if any.
    """
    if _is_postgres(using):
        return postgres.copy_chunks(chunks, using)

    return len(Chunk.objects.using(using).bulk_create(list(chunks), batch_size=batch_size))


def _profiles():
    for name in profile_names():
        try:
            yield name, get_profile(name)
        except Exception:  # noqa: BLE001 - a broken profile is reported by the check ragchat.E002
            continue


def configured_spaces() -> dict[str, list[str]]:
    """The embedding space of every profile's embedder: {space: [profile names]}."""
    found: dict[str, list[str]] = {}
    for name, profile in _profiles():
        try:
            found.setdefault(embedder_for(profile).space, []).append(name)
        except Exception:  # noqa: BLE001 - an embedder that does not build is reported by ragchat.E002
            continue
    return found


def configured_text_configs() -> set[str]:
    """The text search configurations the profiles' retrievers use (their ``config`` option)."""
    found = set()
    for _, profile in _profiles():
        try:
            retrievers = [build_component(profile, "retriever", reg.name)
                          for reg in get_registry().ordered("retriever", profile.retrievers)]
        except Exception:  # noqa: BLE001 - reported by the check ragchat.E002
            continue
        found.update(r.config for r in retrievers if isinstance(getattr(r, "config", None), str))
    return found
