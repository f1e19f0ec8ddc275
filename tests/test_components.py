"""Unit tests of the built-in components, each on its own."""

from __future__ import annotations

import numpy as np
import pytest

from django_ragchat.answerer.vocabulary import default_vocabulary
from django_ragchat.profiles import Profile
from django_ragchat.stages.answers import parse_default_references
from django_ragchat.stages.embedders import HashingEmbedder
from django_ragchat.stages.joiners import ConcatJoiner, ReciprocalRankFusion
from django_ragchat.stages.llms import ExtractiveAnswerer
from django_ragchat.stages.memory import newest_turns_within, split_turns
from django_ragchat.stages.postprocessors import SimilarityThreshold, TopK
from django_ragchat.stages.transformers import FollowUpEnricher
from django_ragchat.text import content_terms, sentences, stem
from django_ragchat.tokens import count_tokens, estimate_tokens
from django_ragchat.types import HistoryMessage, Prompt, Query, RetrievedChunk

PROFILE = Profile()
VOCABULARY = default_vocabulary()


def msg(role, content, seq, tokens=10):
    return HistoryMessage(role=role, content=content, seq=seq, token_count=tokens)


# --- memory ------------------------------------------------------------------------------


def test_turns_start_at_user_messages_and_orphan_replies_are_dropped():
    messages = [msg("assistant", "orphan", 1), msg("user", "q1", 2), msg("assistant", "a1", 3),
                msg("user", "q2", 4), msg("assistant", "a2", 5), msg("tool", "t", 6)]
    turns = split_turns(messages)
    assert [[m.seq for m in t] for t in turns] == [[2, 3], [4, 5, 6]]


def test_window_cuts_only_at_turn_boundaries():
    messages = [msg("user", "q", i * 2 + 1) for i in range(5)]
    messages = [m for i in range(5) for m in (msg("user", "q", 2 * i + 1), msg("assistant", "a", 2 * i + 2))]
    kept = newest_turns_within(split_turns(messages), max_tokens=1000, max_messages=5)
    # 5 messages allowed, but a turn is 2: two whole turns, never a reply without its question.
    assert [m.seq for m in kept] == [7, 8, 9, 10]
    assert kept[0].role == "user"


def test_token_window_keeps_newest_turns_within_budget():
    messages = [m for i in range(10) for m in (msg("user", "q", 2 * i + 1, 30), msg("assistant", "a", 2 * i + 2, 70))]
    kept = newest_turns_within(split_turns(messages), max_tokens=250)
    assert [m.seq for m in kept] == [17, 18, 19, 20]
    assert newest_turns_within(split_turns(messages), max_tokens=50) == []


# --- follow-up transformer ---------------------------------------------------------------


def history(*pairs):
    out, seq = [], 0
    for q, a in pairs:
        out += [msg("user", q, seq + 1), msg("assistant", a, seq + 2)]
        seq += 2
    return tuple(out)


@pytest.mark.parametrize("question, dependent", [
    ("How much does it cost?", True),
    ("And the battery?", True),
    ("What about their warranty?", True),
    ("Which warranty do the Zephyr Buds earbuds have?", False),
    ("What is the price of the Nimbus Tab tablet?", False),
])
def test_dependent_follow_ups_are_detected(question, dependent):
    assert FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).is_dependent(question) is dependent


def test_follow_up_gets_names_from_the_history_newest_first():
    enricher = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY)
    query = Query(text="How much does it cost?", original="How much does it cost?", history=history(
        ("Tell me about the Nimbus Tab", "The Nimbus Tab is a tablet."),
        ("Tell me about the Aurora X2 phone", "The Aurora X2 is a 6.1-inch phone with a 48 MP camera."),
    ))
    terms = enricher.salient_terms(query)
    assert terms[:2] == ["Aurora", "X2"]
    assert terms.index("X2") < terms.index("Nimbus")
    assert "48" not in " ".join(terms) and "MP" not in terms  # an answer's details are noise


def test_the_conversations_subject_outranks_a_name_mentioned_once():
    query = Query(text="Why did they break up?", original="Why did they break up?", history=(
        msg("user", "Frank Zappa: Disbandment", 1),
        msg("user", "What group disbanded?", 2),
        msg("assistant", "Zappa and the Mothers of Invention", 3),
        msg("user", "Did they tour with Captain Beefheart?", 4),
        msg("assistant", "Zappa produced his album Trout Mask Replica.", 5),
    ))
    terms = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).salient_terms(query)
    # "Frank" opens a sentence but is followed by a name: it is a name too. Zappa, mentioned
    # by the user and twice in answers, leads; the answers' own names are not added.
    assert terms[0] == "Zappa" and "Frank" in terms and "Beefheart" in terms
    assert not {"Mothers", "Invention", "Trout", "Mask"} & set(terms)


def test_names_from_the_latest_answer_stand_in_when_the_user_named_nothing():
    query = Query(text="How much is it?", original="How much is it?", history=history(
        ("Which phone has the best camera?", "The Aurora X2 has a 48 MP camera."),
    ))
    assert FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).salient_terms(query) == ["Aurora", "X2"]
    assert FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, use_answers=False).salient_terms(query) == ["phone", "best", "camera"]


def test_topic_words_of_the_last_question_are_the_last_resort():
    query = Query(text="And the ports?", original="And the ports?", history=history(
        ("How do I configure the firewall?", "Open the settings page and add a rule."),
    ))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).transform(query, None)
    assert result.text == "And the ports? configure firewall"


def test_no_history_leaves_the_query_alone():
    query = Query(text="How much does it cost?", original="How much does it cost?")
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).transform(query, None)
    assert result.text == query.text and result.metadata["transform_note"] == "no history"


# --- embedder and text -------------------------------------------------------------------


def test_hashing_embedder_is_deterministic_normalised_and_semantic_enough():
    embedder = HashingEmbedder(PROFILE, dimension=256)
    a, b, c = embedder.embed(["The phone's price is $699", "What do phones cost? prices", "warranty for earbuds"])
    assert a.dtype == np.float32 and a.shape == (256,)
    assert np.isclose(np.linalg.norm(a), 1.0)
    assert float(a @ b) > float(a @ c)
    again = HashingEmbedder(PROFILE, dimension=256).embed(["The phone's price is $699"])[0]
    assert np.array_equal(a, again)
    assert embedder.space == "hashing-v1-256"


def test_empty_text_embeds_to_zero_vector():
    assert not HashingEmbedder(PROFILE).embed([""]).any()


def test_text_helpers():
    for family in (["price", "prices", "pricing", "priced"], ["cost", "costs", "costing"],
                   ["battery", "batteries"], ["box", "boxes"], ["class", "classes"]):
        assert len({stem(w) for w in family}) == 1, family
    assert stem("bus") == "bus" and stem("this") == "this"
    assert content_terms("What is the Price of it?") == [stem("price")]
    assert sentences("One sentence. Two sentences! Three?\n\n- item") == ["One sentence.", "Two sentences!", "Three?", "- item"]


def test_token_estimator_works_offline():
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd" * 10) == 10
    assert estimate_tokens("a b c d e f") == 6  # words floor the estimate
    assert count_tokens("hello world") >= 2


# --- joiners and post-processors ---------------------------------------------------------


def chunk(cid, score, retriever="vector"):
    return RetrievedChunk(chunk_id=cid, text=f"text {cid}", score=score, document_id=1, source="s",
                          retriever=retriever, raw_scores={retriever: score})


def test_rrf_dedupes_and_fuses_ranks():
    q = Query(text="q")
    results = [(q, "vector", [chunk(1, 0.9), chunk(2, 0.8)]), (q, "fulltext", [chunk(2, 7.0, "fulltext"), chunk(3, 5.0, "fulltext")])]
    joined = ReciprocalRankFusion(PROFILE).join(results, None)
    assert [c.chunk_id for c in joined] == [2, 1, 3]
    assert joined[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert joined[0].raw_scores == {"vector": 0.8, "fulltext": 7.0}


def test_concat_joiner_keeps_best_score():
    q = Query(text="q")
    joined = ConcatJoiner(PROFILE).join([(q, "vector", [chunk(1, 0.5)]), (q, "vector", [chunk(1, 0.7), chunk(2, 0.6)])], None)
    assert [(c.chunk_id, c.score) for c in joined] == [(1, 0.7), (2, 0.6)]


def test_threshold_uses_the_retrievers_own_score_and_top_k_cuts():
    docs = [chunk(1, 0.9), chunk(2, 0.2), chunk(3, 3.0, "fulltext")]
    kept = SimilarityThreshold(Profile(similarity_threshold=0.5)).process(Query(text="q"), docs, None)
    assert [d.chunk_id for d in kept] == [1, 3]
    assert SimilarityThreshold(PROFILE).process(Query(text="q"), docs, None) == docs  # off by default
    assert [d.chunk_id for d in TopK(Profile(top_k=2)).process(Query(text="q"), docs, None)] == [1, 2]


# --- citations and the extractive answerer ------------------------------------------------


@pytest.mark.parametrize("text, refs, bad", [
    ("A [1]. B [2][1].", [1, 2], []),
    ("Both [1, 3].", [1, 3], []),
    ("Range [2-4].", [2, 3, 4], []),
    ("Backwards [4-2].", [], [4, 2]),
    ("None here, [a] or [].", [], []),
])
def test_reference_parsing(text, refs, bad):
    assert parse_default_references(text) == (refs, bad)


def test_extractive_answer_cites_the_best_sentences():
    docs = (
        RetrievedChunk(chunk_id=1, text="Nimbus Tab\nThe Nimbus Tab costs $449.", score=1, document_id=1, source="n", heading="Nimbus Tab"),
        RetrievedChunk(chunk_id=2, text="The Aurora X2 costs $699. It has a titanium frame.", score=1, document_id=2, source="a"),
    )
    prompt = Prompt(messages=(), question="How much does it cost?", search_query="How much does it cost? Aurora X2", documents=docs)
    answer = ExtractiveAnswerer(PROFILE, vocabulary=VOCABULARY).answer(prompt)
    assert "The Aurora X2 costs $699 [2]." in answer
    assert "titanium" not in answer


def test_extractive_answer_says_plainly_when_nothing_is_relevant():
    docs = (RetrievedChunk(chunk_id=1, text="Zephyr Buds have a warranty.", score=1, document_id=1, source="z"),)
    prompt = Prompt(messages=(), question="Who painted the Mona Lisa?", search_query="Who painted the Mona Lisa?", documents=docs)
    # The question names something no passage knows: a plain decline that says so, citing nothing.
    answer = ExtractiveAnswerer(PROFILE, vocabulary=VOCABULARY).answer(prompt)
    assert answer == "The documents don't mention Mona Lisa, so I can't answer that from them."
    assert ExtractiveAnswerer(PROFILE, vocabulary=VOCABULARY).answer(Prompt(messages=(), question="hi", search_query="hi")) == (
        "I can't answer that from the documents I have.")


def test_extractive_answer_never_quotes_code_or_json():
    docs = (
        RetrievedChunk(chunk_id=1, text='{"content": "The Aurora X2 costs $699 [1].", "status": "complete"}', score=1, document_id=1, source="api.md"),
        RetrievedChunk(chunk_id=2, text="| Aurora X2 | costs | $699 |", score=1, document_id=1, source="table.md"),
        RetrievedChunk(chunk_id=3, text="The Aurora X2 costs $699.", score=1, document_id=2, source="a"),
    )
    prompt = Prompt(messages=(), question="How much does the Aurora X2 cost?", search_query="Aurora X2 cost", documents=docs)
    assert ExtractiveAnswerer(PROFILE, vocabulary=VOCABULARY).answer(prompt) == "The Aurora X2 costs $699 [3]."
