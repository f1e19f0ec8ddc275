"""Retrievers and the search package on both databases: vector, full-text and hybrid search,
metadata and source filters applied in SQL, and the same results on SQLite and PostgreSQL.

The suite runs once on SQLite and once on PostgreSQL (scripts/test.sh); every test here runs in
both, so the literal expectations below hold on both databases.

This module is also a plugin (listed in ``RAGCHAT["PLUGINS"]`` by the tests that need it): its
query transformer turns "[product=x]" in a question into a request filter.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from django.core.exceptions import ImproperlyConfigured

from django_ragchat import hookimpl, search
from django_ragchat.checks import check_profiles
from django_ragchat.models import Chunk, Conversation, Document
from django_ragchat.profiles import get_profile
from django_ragchat.search import InvalidFilters, SearchFilters, store_chunks
from django_ragchat.stages.retrievers import FullTextRetriever, HybridRetriever, VectorRetriever
from django_ragchat.stages.transformers import QueryTransformer
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync

pytestmark = pytest.mark.django_db

AURORA, NIMBUS, ZEPHYR = "products/aurora-x2.md", "products/nimbus-tab.md", "support/zephyr-buds.md"
DOCS = {
    AURORA: ({"product": "aurora", "kind": "phone", "tags": ["pricing", "phone"], "year": 2024, "public": True,
              "specs": {"color": "blue", "ports": 1}}, [
        "Aurora X2 > Overview\nThe Aurora X2 is a 6.1-inch phone with a titanium frame and a 48 MP camera.",
        "Aurora X2 > Pricing\nThe Aurora X2 costs $699 with 128 GB of storage; the 256 GB model costs $799.",
    ]),
    NIMBUS: ({"product": "nimbus", "kind": "tablet", "tags": ["pricing"], "year": 2023, "public": False}, [
        "Nimbus Tab > Overview\nThe Nimbus Tab is an 11-inch tablet for drawing and reading, with a matte screen.",
        "Nimbus Tab > Pricing\nThe Nimbus Tab is priced at $449; the bundle with the stylus costs $529.",
    ]),
    ZEPHYR: ({"product": "zephyr", "kind": "audio", "year": 2024.0, "public": True, "note": None}, [
        "Zephyr Buds > Overview\nZephyr Buds are wireless earbuds with noise cancelling and eight hours of playback.",
        "Zephyr Buds > Warranty\nZephyr Buds come with a two-year warranty that covers battery failure.",
    ]),
}
# Words found in every chunk (each starts with its product's name).
EVERY_PRODUCT = "aurora nimbus zephyr"


def embedder():
    return components_for(get_profile()).embedder


@pytest.fixture
def corpus(db):
    """The three documents, two chunks each, embedded by the default profile's embedder and
    stored with ``store_chunks`` (COPY on PostgreSQL). Returns {(source, ordinal): id}."""
    model = embedder()
    chunks = []
    for source, (metadata, texts) in DOCS.items():
        document = Document.objects.create(source=source, title=source.split("/")[-1], checksum="x",
                                           metadata=metadata)
        vectors = model.embed(texts)
        chunks += [Chunk(document=document, ordinal=i, text=text, heading=text.split("\n")[0],
                         space=model.space, embedding=vector, token_count=len(text.split()), metadata=metadata)
                   for i, (text, vector) in enumerate(zip(texts, vectors))]
    assert store_chunks(chunks) == 6
    return {(source, ordinal): pk for pk, source, ordinal in
            Chunk.objects.values_list("id", "document__source", "ordinal")}


def keys(hits):
    return [(h.source, h.ordinal) for h in hits]


def sources(hits):
    return {h.source for h in hits}


def vector_of(text):
    return embedder().embed([text])[0]


def run_search(kind: str, filters=None, k: int = 10, text: str = EVERY_PRODUCT):
    space = embedder().space
    if kind == "vector":
        return search.vector_search(space, vector_of(text), k, filters=filters)
    if kind == "fulltext":
        return search.fulltext_search(space, text, k, filters=filters)
    return search.hybrid_search(space, vector_of(text), text, k, filters=filters)


# --- Vector search: the same, exact results on both databases ---------------------------------


def test_exact_vector_search_matches_numpy_cosine_on_both_databases(corpus):
    question = "How much does the Aurora X2 phone cost?"
    stored = list(Chunk.objects.values_list("id", "embedding"))
    matrix = np.vstack([v for _, v in stored]).astype(np.float64)
    query = vector_of(question).astype(np.float64)
    similarity = matrix @ query / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(query))
    expected = sorted(zip([pk for pk, _ in stored], similarity), key=lambda item: (-item[1], item[0]))

    for exact in (True, False):  # no HNSW index here: the default path is exact too
        hits = search.vector_search(embedder().space, vector_of(question), 6, exact=exact)
        assert [h.chunk_id for h in hits] == [pk for pk, _ in expected]
        assert [h.score for h in hits] == pytest.approx([s for _, s in expected], abs=1e-5)
    # The same order, written down, on both databases (the default embedder's: wordllama).
    assert keys(hits)[:3] == [(AURORA, 1), (AURORA, 0), (ZEPHYR, 0)]
    assert hits[0].raw_scores == {"vector": hits[0].score} and hits[0].metadata["product"] == "aurora"
    assert search.vector_ids(embedder().space, vector_of(question), 2) == [(h.chunk_id, pytest.approx(h.score, abs=1e-6))
                                                                           for h in hits[:2]]


def test_vector_search_of_an_empty_query_vector_finds_nothing(corpus):
    assert search.vector_search(embedder().space, np.zeros(embedder().dimension, np.float32), 5) == []


# --- Filters, inside the SQL ------------------------------------------------------------------

METADATA_CASES = [
    ({"product": "aurora"}, {AURORA}),
    ({"kind": "phone", "product": "nimbus"}, set()),
    ({"tags": ["pricing"]}, {AURORA, NIMBUS}),
    ({"tags": ["pricing", "phone"]}, {AURORA}),
    ({"tags": []}, {AURORA, NIMBUS}),
    ({"tags": "pricing"}, set()),  # a scalar is not contained in a list below the top level
    ({"specs": {"color": "blue"}}, {AURORA}),
    ({"specs": {}}, {AURORA}),
    ({"specs": {"color": "red"}}, set()),
    ({"public": True}, {AURORA, ZEPHYR}),
    ({"public": False}, {NIMBUS}),
    ({"specs": {"ports": True}}, set()),  # true is not 1
    ({"year": 2024}, {AURORA, ZEPHYR}),  # 2024 == 2024.0
    ({"year": "2024"}, set()),  # a string is not a number
    ({"note": None}, {ZEPHYR}),
    ({"missing": None}, set()),
]


@pytest.mark.parametrize("kind", ["vector", "fulltext", "hybrid"])
@pytest.mark.parametrize(("metadata", "expected"), METADATA_CASES, ids=[str(c[0]) for c in METADATA_CASES])
def test_metadata_filters_mean_json_containment_on_both_databases(corpus, kind, metadata, expected):
    hits = run_search(kind, {"metadata": metadata})
    assert sources(hits) == expected
    assert all(h.metadata == DOCS[h.source][0] for h in hits)
    if expected:
        assert len(hits) == 2 * len(expected)  # every chunk of the matching documents


@pytest.mark.parametrize("kind", ["vector", "fulltext", "hybrid"])
def test_a_filter_is_applied_before_the_top_k_is_cut(corpus, kind):
    # The best match for the question is an Aurora chunk; filtering after fetching the top 1
    # would return nothing.
    hits = run_search(kind, {"metadata": {"product": "zephyr"}}, k=1, text="Aurora X2 phone price zephyr")
    assert keys(hits) and sources(hits) == {ZEPHYR}


@pytest.mark.parametrize("kind", ["vector", "fulltext", "hybrid"])
@pytest.mark.parametrize(("filters", "expected"), [
    ({"sources": [ZEPHYR]}, {ZEPHYR}),
    ({"sources": [ZEPHYR, NIMBUS, "nowhere.md"]}, {ZEPHYR, NIMBUS}),
    ({"source_prefixes": ["products/"]}, {AURORA, NIMBUS}),
    ({"source_prefixes": ["Products/"]}, set()),  # case-sensitive on both databases
    ({"source_prefixes": ["products/%"]}, set()),  # no LIKE wildcards
    ({"source_prefixes": ["support/", "products/nim"]}, {ZEPHYR, NIMBUS}),
    ({"source_prefixes": ["products/"], "metadata": {"public": True}}, {AURORA}),
])
def test_source_filters(corpus, kind, filters, expected):
    assert sources(run_search(kind, filters)) == expected


def test_profile_filters_and_request_filters_must_both_hold(corpus):
    profile = get_profile()
    space, vector = embedder().space, vector_of(EVERY_PRODUCT)
    retriever = VectorRetriever(profile, filters={"metadata": {"public": True}})
    assert sources(retriever.search(space, vector, 10)) == {AURORA, ZEPHYR}
    assert sources(retriever.search(space, vector, 10, {"sources": [AURORA, NIMBUS]})) == {AURORA}
    assert retriever.search(space, vector, 10, {"metadata": {"product": "nimbus"}}) == []
    fulltext = FullTextRetriever(profile, filters={"source_prefixes": ["products/"]})
    assert sources(fulltext.search(space, EVERY_PRODUCT, 10, {"metadata": {"tags": ["phone"]}})) == {AURORA}


@pytest.mark.parametrize(("filters", "message"), [
    ({"product": "aurora"}, "Unknown filter key(s) ['product']"),
    ("product=aurora", "must be a dict"),
    ({"metadata": ["aurora"]}, '"metadata" must be a dict'),
    ({"metadata": {"tags": [["a"]]}}, "may hold strings, numbers, booleans and null only"),
    ({"metadata": {"tags": [{"a": 1}]}}, "may hold strings, numbers, booleans and null only"),
    ({"metadata": {'pro"duct': "x"}}, "keys must be non-empty strings"),
    ({"metadata": {"": "x"}}, "keys must be non-empty strings"),
    ({"metadata": {"price": float("nan")}}, "finite number"),
    ({"metadata": {"when": object()}}, "unsupported type object"),
    ({"sources": "a.md"}, "must be a list of strings"),
    ({"sources": ["a.md", ""]}, "non-empty strings only"),
    ({"source_prefixes": [3]}, "non-empty strings only"),
])
def test_bad_filters_are_rejected_with_a_message(corpus, filters, message):
    with pytest.raises(InvalidFilters) as caught:
        run_search("vector", filters)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_filters_combine_and_parse_idempotently():
    a = SearchFilters.parse({"metadata": {"x": 1}})
    b = SearchFilters.parse({"sources": ["s"]})
    assert len((a & b).clauses) == 2 and (a & {"sources": ["s"]}) == a & b
    assert SearchFilters.parse(a) is a and not SearchFilters.parse(None) and not SearchFilters.parse({"metadata": {}})


# --- Full text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("question", "best"), [
    ("warranty for battery failure", (ZEPHYR, 1)),
    ("drawing tablets", (NIMBUS, 0)),  # stemmed: tablets ~ tablet, drawing ~ draw
    ("What are the prices?", (NIMBUS, 1)),  # "priced" and "prices" share a stem
    ("titanium camera", (AURORA, 0)),
])
def test_fulltext_finds_stemmed_words_on_both_databases(corpus, question, best):
    hits = search.fulltext_search(embedder().space, question, 3)
    assert keys(hits)[0] == best
    assert hits[0].retriever == "fulltext" and hits[0].score > 0
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_fulltext_without_searchable_words_finds_nothing(corpus):
    assert search.fulltext_search(embedder().space, "?!", 5) == []
    assert search.fulltext_search(embedder().space, "quantum chromodynamics", 5) == []


def test_fulltext_follows_inserts_updates_and_deletes(corpus):
    space = embedder().space
    chunk = Chunk.objects.get(pk=corpus[(AURORA, 0)])
    chunk.text = "Aurora X2 > Overview\nNow with a sapphire display."
    chunk.save()
    assert keys(search.fulltext_search(space, "sapphire", 5)) == [(AURORA, 0)]
    assert search.fulltext_search(space, "titanium", 5) == []
    Chunk.objects.filter(pk=chunk.pk).delete()
    assert search.fulltext_search(space, "sapphire", 5) == []
    Chunk.objects.create(document=chunk.document, ordinal=7, text="Sapphire is hard.", space=space,
                         embedding=vector_of("Sapphire is hard."))
    assert keys(search.fulltext_search(space, "sapphire", 5)) == [(AURORA, 7)]


def test_fulltext_searches_only_the_given_space(corpus):
    Chunk.objects.create(document=Document.objects.get(source=AURORA), ordinal=0, text="Aurora warranty copy",
                         space="other-space", embedding=np.ones(8, np.float32))
    assert sources(search.fulltext_search(embedder().space, "warranty", 5)) == {ZEPHYR}
    assert sources(search.fulltext_search("other-space", "warranty", 5)) == {AURORA}


# --- Hybrid -------------------------------------------------------------------------------------


@pytest.mark.parametrize("question", ["How much does the Aurora X2 cost?", "battery warranty", "stylus bundle"])
def test_hybrid_is_reciprocal_rank_fusion_of_the_two_searches(corpus, question):
    space, vector = embedder().space, vector_of(question)
    by_vector = search.vector_ids(space, vector, 20)
    by_text = [(h.chunk_id, h.score) for h in search.fulltext_search(space, question, 20)]
    expected = search.rrf([by_vector, by_text], (1.0, 0.5), 10)
    hits = search.hybrid_search(space, vector, question, 4, weights=(1.0, 0.5), rrf_k=10, candidates=20)
    assert [(h.chunk_id, h.score) for h in hits] == [(cid, pytest.approx(s)) for cid, s in expected[:4]]
    vector_scores, text_scores = dict(by_vector), dict(by_text)
    for hit in hits:
        assert hit.retriever == "hybrid" and hit.raw_scores["hybrid"] == hit.score
        assert hit.raw_scores.get("vector") == (pytest.approx(vector_scores[hit.chunk_id], abs=1e-6)
                                                if hit.chunk_id in vector_scores else None)
        assert hit.raw_scores.get("fulltext") == (pytest.approx(text_scores[hit.chunk_id])
                                                  if hit.chunk_id in text_scores else None)


def test_hybrid_weights_decide_which_search_leads(corpus):
    space, question = embedder().space, "warranty stylus"
    vector = vector_of(question)
    vector_only = search.hybrid_search(space, vector, question, 6, weights=(1.0, 0.0))
    assert [h.chunk_id for h in vector_only] == [cid for cid, _ in search.vector_ids(space, vector, 6)]
    text_only = search.hybrid_search(space, vector, question, 2, weights=(0.0, 1.0))
    assert [h.chunk_id for h in text_only] == [h.chunk_id for h in search.fulltext_search(space, question, 2)]


def test_hybrid_with_no_words_or_no_vector_uses_the_other_search(corpus):
    space = embedder().space
    hits = search.hybrid_search(space, vector_of("Aurora price"), "?", 3)
    assert [h.chunk_id for h in hits] == [cid for cid, _ in search.vector_ids(space, vector_of("Aurora price"), 3)]
    hits = search.hybrid_search(space, np.zeros(embedder().dimension, np.float32), "warranty", 3)
    assert keys(hits) == [(ZEPHYR, 1)] and "vector" not in hits[0].raw_scores
    assert search.hybrid_search(space, np.zeros(embedder().dimension, np.float32), "?", 3) == []


# --- Retrievers as profile components --------------------------------------------------------


def test_default_profile_retrieves_with_vector_search_only():
    assert [r.name for r in components_for(get_profile()).retrievers] == ["vector"]


class ProductFilterFromQuestion(QueryTransformer):
    """Turns "[product=x]" in the question into a request filter."""

    name = "product_filter"

    def transform(self, query, turn):
        match = re.search(r"\[product=(\w+)\]", query.text)
        if not match:
            return query
        return query.replace(text=query.text.replace(match.group(0), ""),
                             metadata={**query.metadata, "filters": {"metadata": {"product": match.group(1)}}})


@hookimpl
def register_query_transformers(register):
    register(ProductFilterFromQuestion)


@pytest.mark.parametrize("retriever", ["vector", "fulltext", "hybrid"])
def test_profiles_configure_retrievers_and_requests_filter_them(corpus, ragchat_settings_override, user, retriever):
    ragchat_settings_override(
        PLUGINS=["tests.test_retrievers"],
        PROFILES={"default": {}, "shop": {
            "retrievers": [retriever], "query_transformers": ["product_filter"], "empty_context": "answer",
            "options": {retriever: {"filters": {"source_prefixes": ["products/"]}}},
        }},
    )
    conversation = Conversation.objects.create(owner=user, profile="shop")
    result = run_turn_sync(conversation, "What does the tablet cost? [product=nimbus]")
    (searched,) = result.trace["retrieval"]
    assert searched["retriever"] == retriever and searched["query"] == "What does the tablet cost? "
    found = Chunk.objects.filter(pk__in=[h["chunk_id"] for h in searched["hits"]])
    assert {c.document.source for c in found} == {NIMBUS}
    # The profile's filter holds even when the request asks for a product outside it.
    result = run_turn_sync(conversation, "Which earbuds? [product=zephyr]")
    assert result.trace["retrieval"][0]["hits"] == []


@pytest.mark.parametrize(("options", "message"), [
    ({"vector": {"ef_search": 0}}, "ef_search must be an integer from 1 to 1000"),
    ({"vector": {"ef_search": "40"}}, "ef_search must be an integer from 1 to 1000"),
    ({"hybrid": {"weights": {"bm25": 1}}}, "hybrid weights must be"),
    ({"hybrid": {"weights": {"vector": -1}}}, "hybrid weights must be"),
    ({"hybrid": {"rrf_k": 0}}, "rrf_k must be a positive integer"),
    ({"hybrid": {"candidates": 0}}, "candidates must be a positive integer"),
    ({"fulltext": {"config": "english; DROP TABLE x"}}, "is not a text search configuration name"),
    ({"fulltext": {"filters": {"metadata": {"a": [[1]]}}}}, "may hold strings, numbers"),
    ({"fulltext": {"k1": 1.2}}, "has no option 'k1' (its options: config)"),
])
def test_bad_retriever_options_are_system_check_errors(ragchat_settings_override, options, message):
    ragchat_settings_override(PROFILES={"default": {"retrievers": ["vector", "fulltext", "hybrid"],
                                                    "options": options}})
    errors = [e for e in check_profiles() if e.id == "ragchat.E002"]
    assert len(errors) == 1 and message in errors[0].msg, errors


def test_retriever_options_are_read(ragchat_settings_override):
    profile = get_profile()
    hybrid = HybridRetriever(profile, weights={"fulltext": 0.25}, rrf_k=30, candidates=50, config="simple",
                             ef_search=100, exact=True, filters={"sources": ["a"]})
    assert (hybrid.weights, hybrid.rrf_k, hybrid.candidates, hybrid.config, hybrid.ef_search, hybrid.exact) == (
        (1.0, 0.25), 30, 50, "simple", 100, True)
    assert hybrid.filters == SearchFilters.parse({"sources": ["a"]})
    with pytest.raises(ImproperlyConfigured):
        VectorRetriever(profile, ef_search=True)


def test_a_space_mismatch_is_reported_by_every_retriever(corpus):
    from django_ragchat.stages.retrievers import EmbeddingSpaceMismatch

    for retriever in (VectorRetriever(get_profile()), HybridRetriever(get_profile())):
        with pytest.raises(EmbeddingSpaceMismatch):
            retriever.search("hashing-v1-16", np.ones(16, np.float32), 3)
    with pytest.raises(EmbeddingSpaceMismatch):
        FullTextRetriever(get_profile()).search("hashing-v1-16", "warranty", 3)


# --- Storing chunks ----------------------------------------------------------------------------


def test_store_chunks_round_trips_every_field(db):
    document = Document.objects.create(source="a.md", checksum="x")
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((3, 12)).astype(np.float32)
    chunks = [Chunk(document=document, ordinal=i, text=f"text {i} ü 🙂", heading=f"h{i}", space="s-12",
                    embedding=vectors[i], token_count=i + 1, metadata={"i": i, "nested": {"ok": True}, "l": [1, "a"]})
              for i in range(3)] + [Chunk(document=document, ordinal=3, text="no vector", space="s-12")]
    assert store_chunks(chunks) == 4
    stored = list(Chunk.objects.order_by("ordinal"))
    assert [(c.ordinal, c.text, c.heading, c.space, c.token_count, c.metadata) for c in stored] == [
        (c.ordinal, c.text, c.heading, c.space, c.token_count, c.metadata) for c in chunks]
    for chunk, vector in zip(stored, vectors):
        assert chunk.embedding.dtype == np.float32 and np.array_equal(chunk.embedding, vector)
    assert stored[3].embedding is None
    assert store_chunks([]) == 0


def test_store_chunks_is_atomic_with_the_callers_transaction(db):
    from django.db import IntegrityError, transaction

    document = Document.objects.create(source="a.md", checksum="x")
    duplicate = [Chunk(document=document, ordinal=0, text="a", space="s"), Chunk(document=document, ordinal=0,
                                                                               text="b", space="s")]
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            store_chunks(duplicate)
    assert not Chunk.objects.exists()
