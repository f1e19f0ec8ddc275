"""ragchat-lexical-rerank: BM25, the re-ranking component, its registration, and an evaluation
of full turns on a corpus where vector search ranks a near-duplicate first."""

from __future__ import annotations

import math
from importlib.metadata import entry_points

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_ragchat import checks, plugins
from django_ragchat.models import Chunk, Conversation
from django_ragchat.profiles import get_profile
from django_ragchat.text import content_terms
from django_ragchat.turn.context import TurnContext, components_for
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import Query, RetrievedChunk

import ragchat_lexical_rerank
from ragchat_lexical_rerank import LexicalRerank, bm25_scores


def ragchat(**values):
    """``override_settings`` for the RAGCHAT dict, on top of the test settings'."""
    return override_settings(RAGCHAT={**settings.RAGCHAT, **values})


WITH_PLUGIN = {"PLUGINS": ["ragchat_lexical_rerank"]}


def make_turn(question: str = "") -> TurnContext:
    profile = get_profile()
    return TurnContext(conversation=Conversation(profile=profile.name), profile=profile,
                       components=components_for(profile), question=question)


def chunk(chunk_id: int, text: str, score: float = 0.5) -> RetrievedChunk:
    return RetrievedChunk(chunk_id=chunk_id, text=text, score=score, document_id=chunk_id,
                          source=f"doc-{chunk_id}.md", retriever="vector", raw_scores={"vector": score})


# --- BM25 --------------------------------------------------------------------------------------


def test_bm25_matches_the_formula_on_a_small_example():
    documents = [["falcon", "f7", "warranty"], ["falcon", "warranty", "warranty", "cover"]]
    k1, b = 1.2, 0.75
    average = 3.5

    def term(tf, length, df):
        idf = math.log(1 + (2 - df + 0.5) / (df + 0.5))
        return idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * length / average))

    scores = bm25_scores(["f7", "warranty", "missing"], documents, k1=k1, b=b)
    assert scores[0] == pytest.approx(term(1, 3, 1) + term(1, 3, 2))
    assert scores[1] == pytest.approx(term(2, 4, 2))
    assert scores[0] > scores[1]  # the rare term outweighs a repeated common one


def test_bm25_counts_each_query_term_once_and_handles_no_documents():
    documents = [["battery", "life"], ["camera"]]
    assert bm25_scores(["battery", "battery"], documents) == bm25_scores(["battery"], documents)
    assert bm25_scores(["battery"], []) == []
    assert bm25_scores(["battery"], [[], []]) == [0.0, 0.0]


def test_bm25_parameters_control_saturation_and_length_normalisation():
    short, long = ["warranty"], ["warranty"] + ["filler"] * 9
    assert bm25_scores(["warranty"], [short, long], b=0)[0] == pytest.approx(
        bm25_scores(["warranty"], [short, long], b=0)[1])
    assert bm25_scores(["warranty"], [short, long], b=1)[0] > bm25_scores(["warranty"], [short, long], b=1)[1]
    once, thrice = ["warranty", "x", "y"], ["warranty"] * 3
    assert bm25_scores(["warranty"], [once, thrice], k1=0) == pytest.approx(
        bm25_scores(["warranty"], [thrice, once], k1=0))


# --- The component -----------------------------------------------------------------------------

CANDIDATES = [
    chunk(1, "Falcon warranty: the warranty covers parts and the warranty covers labour.", 0.9),
    chunk(2, "Falcon F2 battery lasts two days.", 0.8),
    chunk(3, "The F7 warranty covers two years of repairs.", 0.7),
]


def test_weight_zero_keeps_the_order_and_weight_one_sorts_by_bm25():
    query = Query(text="What does the F7 warranty cover?")
    kept = LexicalRerank(get_profile(), weight=0).process(query, list(CANDIDATES), make_turn())
    assert [c.chunk_id for c in kept] == [1, 2, 3]
    by_bm25 = LexicalRerank(get_profile(), weight=1).process(query, list(CANDIDATES), make_turn())
    assert [c.chunk_id for c in by_bm25] == [3, 1, 2]


def test_the_blend_lifts_the_exact_match_and_records_its_scores():
    turn = make_turn()
    query = Query(text="F7 warranty cover")
    reranked = LexicalRerank(get_profile(), weight=0.75).process(query, list(CANDIDATES), turn)
    assert [c.chunk_id for c in reranked] == [3, 1, 2]
    bm25 = bm25_scores(["f7", "warranty", "cover"], [content_terms(c.text) for c in CANDIDATES])
    priors = [1, 2 / 3, 1 / 3]  # incoming ranks 1..3 of 3
    expected = [0.75 * b / max(bm25) + 0.25 * p for b, p in zip(bm25, priors)]
    assert [c.score for c in reranked] == pytest.approx([expected[2], expected[0], expected[1]])
    top = reranked[0]
    # A new chunk with a new raw_scores dict: the incoming (frozen) chunk is untouched.
    assert top.raw_scores == {"vector": 0.7, "lexical_rerank": pytest.approx(bm25[2])}
    assert CANDIDATES[2].raw_scores == {"vector": 0.7}
    trace = turn.trace["rerank"]["lexical_rerank"]
    assert trace["query_terms"] == ["f7", "warranty", "cover"]
    assert [(c["chunk_id"], c["rank_before"]) for c in trace["candidates"]] == [(3, 3), (1, 1), (2, 2)]
    assert trace["candidates"][0]["score"] == pytest.approx(top.score, abs=1e-6)
    assert trace["candidates"][2]["bm25"] == 0  # chunk 2 shares no query term
    # With the default weight (0.5) one rank of three is worth more than this BM25 margin.
    default = LexicalRerank(get_profile()).process(query, list(CANDIDATES), make_turn())
    assert [c.chunk_id for c in default] == [1, 3, 2]


def test_no_shared_term_keeps_the_list_unchanged():
    turn = make_turn()
    documents = list(CANDIDATES)
    result = LexicalRerank(get_profile()).process(Query(text="stylus bundle price"), documents, turn)
    assert result == documents and [c.score for c in result] == [0.9, 0.8, 0.7]
    assert "no query term" in turn.trace["rerank"]["lexical_rerank"]["note"]
    assert LexicalRerank(get_profile()).process(Query(text="warranty"), [], turn) == []


@pytest.mark.parametrize("options, message", [
    ({"weight": 1.5}, "'weight' must be a number between 0 and 1"),
    ({"k1": -1}, "'k1' must be a number at least 0"),
    ({"b": "high"}, "'b' must be a number between 0 and 1"),
    ({"wieght": 0.3}, "has no option 'wieght'"),
])
def test_bad_options_are_reported_by_the_system_check(options, message):
    with ragchat(**WITH_PLUGIN, PROFILES={"default": {"options": {"lexical_rerank": options}}}):
        with pytest.raises(ImproperlyConfigured, match=message):
            LexicalRerank(get_profile(), **options)
        errors = checks.check_profiles()
    assert [e.id for e in errors] == ["ragchat.E002"]
    assert message in errors[0].msg


def test_profile_options_reach_the_component_and_it_runs_between_threshold_and_top_k():
    with ragchat(**WITH_PLUGIN, PROFILES={"default": {"options": {"lexical_rerank": {"weight": 0.8, "k1": 2.0}}}}):
        processors = components_for(get_profile()).document_postprocessors
        assert [p.name for p in processors] == ["similarity_threshold", "lexical_rerank", "top_k"]
        assert (processors[1].weight, processors[1].k1, processors[1].b) == (0.8, 2.0, 0.75)
        assert checks.check_plugins() == []


# --- Installation ------------------------------------------------------------------------------


def test_the_distribution_declares_its_entry_point():
    (entry_point,) = [ep for ep in entry_points(group="django_ragchat") if ep.name == "lexical_rerank"]
    assert entry_point.value == "ragchat_lexical_rerank"
    assert entry_point.dist.name == "ragchat-lexical-rerank"
    assert entry_point.load() is ragchat_lexical_rerank


def test_installing_is_enough_with_entry_points_on():
    with ragchat(LOAD_ENTRY_POINTS=True):
        registration = plugins.get_registry().get("document_postprocessor", "lexical_rerank")
        assert registration.plugin == "lexical_rerank"  # loaded through the entry point
        names = [p.name for p in components_for(get_profile()).document_postprocessors]
    assert "lexical_rerank" in names
    assert "lexical_rerank" not in [p.name for p in components_for(get_profile()).document_postprocessors]


# --- Evaluation: full turns on near-duplicates --------------------------------------------------

# Eight products of one family. The even ones' warranty sections are boilerplate that repeats
# "Falcon" and "warranty"; the odd ones' are terse. Without IDF, the hashing embedder's cosine
# favours the boilerplate of *another* product over the terse section of the product asked
# about; BM25 over the candidates discounts the words they all share and finds the model code.
VERBOSE = ("The Falcon warranty covers the Falcon {code}: the warranty covers parts, the warranty "
           "covers labour and the warranty covers the battery.")
TERSE = "The {code} warranty covers {years} years of free repairs at any service centre, parts and labour included."
CODES = [f"F{i}" for i in range(1, 9)]


@pytest.fixture
def falcon_corpus(db):
    """{model code: chunk id of its warranty section}, ingested with the default embedder."""
    from django_ragchat.ingestion.pipeline import ingest_text

    for i, code in enumerate(CODES, start=1):
        warranty = (VERBOSE if i % 2 == 0 else TERSE).format(code=code, years=i)
        ingest_text(f"falcon-{code.lower()}.md", f"# Falcon {code}\n\n## Warranty\n{warranty}\n\n"
                    f"## Battery\nThe Falcon {code} battery lasts {i} days on one charge.\n")
    return {code: Chunk.objects.get(document__source=f"falcon-{code.lower()}.md", heading__endswith="Warranty").pk
            for code in CODES}


def evaluate(corpus: dict[str, int]) -> dict[str, dict]:
    """One fresh conversation per product: which chunk the prompt put first, and whether
    retrieval found the right one at all."""
    outcome = {}
    for code, target in corpus.items():
        result = run_turn_sync(Conversation.objects.create(), f"What does the warranty of the Falcon {code} cover?")
        assert result.status == "complete"
        retrieved = [hit["chunk_id"] for hit in result.trace["retrieval"][0]["hits"]]
        outcome[code] = {"first": result.trace["documents"][0]["chunk_id"] == target,
                         "retrieved": target in retrieved, "trace": result.trace}
    return outcome


def test_rerank_fixes_near_duplicates_that_vector_search_ranks_first(falcon_corpus):
    baseline = evaluate(falcon_corpus)
    # Vector search finds every right section, but puts another product's boilerplate first
    # for the four terse ones.
    assert all(o["retrieved"] for o in baseline.values())
    assert [code for code, o in baseline.items() if o["first"]] == ["F2", "F4", "F6", "F8"]
    assert all("rerank" not in o["trace"] for o in baseline.values())

    with ragchat(**WITH_PLUGIN):
        reranked = evaluate(falcon_corpus)
    assert [code for code, o in reranked.items() if o["first"]] == CODES
    trace = reranked["F1"]["trace"]
    assert trace["rerank"]["lexical_rerank"]["candidates"][0]["chunk_id"] == falcon_corpus["F1"]
    assert trace["documents"][0]["raw_scores"]["lexical_rerank"] > 0
    assert "f1" in trace["rerank"]["lexical_rerank"]["query_terms"]
    assert len(trace["documents"]) == get_profile().top_k  # top_k still cuts after the rerank
