"""The offline ``followup`` transformer's subject and attribute tracking (issue 13).

The end-to-end tests play the issue's conversations through the real pipeline over
``example_project/sample_docs`` (and a two-product catalogue written as "product A" /
"product B"); the rule tests drive ``FollowUpEnricher.resolve`` with a ``SubjectIndex`` built
from rows, as ingestion records them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from django_ragchat.answerer.vocabulary import Vocabulary, default_vocabulary
from django_ragchat.language import read_language
from django_ragchat.profiles import Profile
from django_ragchat.search.subjects import SubjectIndex, clear_cache, subject_index
from django_ragchat.stages.transformers import FollowUpEnricher, Grammar, read_message
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import HistoryMessage, Query

SAMPLE_DOCS = Path(__file__).resolve().parent.parent / "example_project" / "sample_docs"
PROFILE = Profile()
VOCABULARY = default_vocabulary()


@pytest.fixture(autouse=True)
def _fresh_subject_cache():
    # Rolled-back test transactions can hand out the same ids twice; start every test clean.
    clear_cache()
    yield
    clear_cache()


@pytest.fixture
def sample_docs(db):
    from django_ragchat.ingestion.pipeline import ingest_text

    return [ingest_text(f"sample/{path.name}", path.read_text(encoding="utf-8"), content_type="markdown")
            for path in sorted(SAMPLE_DOCS.glob("*.md"))]


def first_source(result) -> str:
    return result.trace["documents"][0]["source"]


def step_of(result) -> dict:
    [step] = result.trace["queries"]["transformed"]
    return step


# --- The examples, end to end ---------------------------------------------------------


def test_what_about_the_nimbus_tab_after_the_zephyr_buds_battery_asks_the_nimbus_tab_battery(sample_docs, conversation):
    run_turn_sync(conversation, "What is the battery life of the Zephyr Buds?")

    result = run_turn_sync(conversation, "What about the Nimbus Tab?")

    final = result.trace["queries"]["final"]
    assert "battery" in final and "Zephyr" not in final
    assert first_source(result) == "sample/nimbus-tab.md"
    sources = result.message["sources"]
    battery = next(i for i, s in enumerate(sources) if "twelve hours" in s["snippet"])
    assert all(s["source"] == "sample/nimbus-tab.md" for s in sources[: battery + 1])
    assert result.trace["queries"]["followup"] == {
        "subject": "Nimbus Tab", "previous_subject": "Zephyr Buds", "subject_rule": "replaced",
        "attribute": "battery life", "attribute_rule": "inherited",
    }
    assert "subject replaced (Nimbus Tab), attribute inherited (battery life)" in step_of(result)["note"]


def test_the_subject_blind_transformer_searched_the_old_subject(sample_docs, conversation, ragchat_settings_override):
    """The counter-test: as before issue 13, the old subject is appended, the attribute lost
    (and, as before issue 25, names rather than the opening message)."""
    ragchat_settings_override(PROFILES={"default": {"options": {"followup": {"track_subjects": False,
                                                                             "carry_opening": False}}}})
    run_turn_sync(conversation, "What is the battery life of the Zephyr Buds?")

    result = run_turn_sync(conversation, "What about the Nimbus Tab?")

    assert result.trace["queries"]["final"] == "What about the Nimbus Tab? Zephyr Buds"
    assert "followup" not in result.trace["queries"]


def test_how_much_does_it_cost_then_what_about_another_product_asks_its_price(sample_docs, conversation):
    run_turn_sync(conversation, "Tell me about the Aurora X2.")
    run_turn_sync(conversation, "How much does it cost?")

    result = run_turn_sync(conversation, "What about the Nimbus Tab?")

    assert first_source(result) == "sample/nimbus-tab.md"
    assert "$449" in result.answer
    assert "Aurora" not in result.trace["queries"]["final"]
    assert result.trace["queries"]["followup"]["attribute_rule"] == "inherited"


# Another shop's catalogue: two products whose names share a word and differ by a number (the
# default hashing embedder ignores one-letter words, so "product A" and "product B" would be
# the same to its search; see docs/followup.md).
PRODUCTS = {
    "shop/trail-500.md": "# Trail 500\n\n## Overview\n\nThe Trail 500 is a folding bike for city commutes.\n\n"
                         "## Pricing\n\nThe Trail 500 costs $540, lights and mudguards included.\n\n## Warranty\n\n"
                         "The Trail 500 has a five-year warranty on the frame.\n",
    "shop/trail-700.md": "# Trail 700\n\n## Overview\n\nThe Trail 700 is an electric cargo bike for families.\n\n"
                         "## Pricing\n\nThe Trail 700 costs $2,900 with its charger and a rear rack.\n\n## Warranty\n\n"
                         "The Trail 700 has a two-year warranty on the motor and the battery.\n",
}


def ingest_markdown(documents: dict[str, str]) -> list:
    """``documents`` ({source: Markdown text}) ingested with the default profile."""
    from django_ragchat.ingestion.pipeline import ingest_text

    return [ingest_text(source, text, content_type="markdown") for source, text in documents.items()]


@pytest.fixture
def shop(db):
    return ingest_markdown(PRODUCTS)


def test_and_for_the_other_product_after_the_warranty_of_the_first(shop, conversation):
    run_turn_sync(conversation, "How long is the warranty on the Trail 500?")

    result = run_turn_sync(conversation, "And for the Trail 700?")

    assert first_source(result) == "shop/trail-700.md"
    assert "two-year warranty" in result.message["sources"][0]["snippet"]
    assert "two-year warranty" in result.answer


def test_how_much_does_it_cost_then_what_about_the_other_product(shop, conversation):
    run_turn_sync(conversation, "Tell me about the Trail 500.")
    run_turn_sync(conversation, "How much does it cost?")

    result = run_turn_sync(conversation, "What about the Trail 700?")

    assert first_source(result) == "shop/trail-700.md"
    assert "$2,900" in result.answer


def test_a_pronoun_after_a_switch_keeps_the_new_subject_only(shop, conversation):
    run_turn_sync(conversation, "How much does the Trail 500 cost?")
    run_turn_sync(conversation, "And the Trail 700?")

    result = run_turn_sync(conversation, "And its warranty?")

    assert result.trace["queries"]["final"] == "And its warranty? Trail 700"
    assert result.trace["queries"]["followup"]["subject_rule"] == "kept"
    assert result.trace["queries"]["followup"]["attribute_rule"] == "new"
    assert "two-year warranty" in result.answer


def test_a_fresh_start_carries_nothing(sample_docs, conversation):
    run_turn_sync(conversation, "What is the battery life of the Zephyr Buds?")

    result = run_turn_sync(conversation, "Thanks. Now, what is your return policy?")

    assert result.trace["queries"]["final"] == "Thanks. Now, what is your return policy?"
    assert step_of(result)["note"].startswith("fresh start: nothing carried")
    assert first_source(result) == "sample/support.md"


# "Do you sell blenders?" after another product (found twice by new users of the example project):
# a thing the current subject's documents never write is the question's own subject.


@pytest.mark.parametrize("opening", ["How long does the Zephyr Kettle take to boil?", "How much do the Zephyr Buds cost?"])
def test_a_question_about_a_thing_of_its_own_carries_nothing_and_its_decline_names_only_it(
        sample_docs, conversation, opening):
    run_turn_sync(conversation, opening)

    result = run_turn_sync(conversation, "Do you sell blenders?")

    assert result.trace["queries"]["final"] == "Do you sell blenders?"
    assert result.trace["queries"]["followup"]["subject_rule"] == "fresh"
    assert "asks about a thing of its own (blenders): nothing carried" in step_of(result)["note"]
    assert result.answer.startswith("The documents don't say anything about blenders."), result.answer
    assert "Zephyr" not in result.answer and "sell" not in result.answer


@pytest.mark.parametrize("opening", ["What is the battery life of the Zephyr Buds?", "How much is the Aurora X2?"])
def test_a_name_sharing_a_word_with_a_product_is_a_thing_of_its_own_and_carries_nothing(
        sample_docs, conversation, opening):
    run_turn_sync(conversation, opening)

    result = run_turn_sync(conversation, "How long does the Zephyr Kettle take to boil?")

    assert result.trace["queries"]["final"] == "How long does the Zephyr Kettle take to boil?"
    assert "asks about a thing of its own (Kettle): nothing carried" in step_of(result)["note"]
    assert result.answer.startswith("The documents don't mention Zephyr Kettle,"), result.answer


def test_a_kind_of_another_product_searches_that_product(sample_docs, conversation):
    run_turn_sync(conversation, "How much do the Zephyr Buds cost?")

    result = run_turn_sync(conversation, "Do you sell tablets?")

    assert "Zephyr" not in result.trace["queries"]["final"]
    assert first_source(result) == "sample/nimbus-tab.md"
    assert "Zephyr" not in result.answer and "sell" not in result.answer
    # What comes after leans on the new question, never on the product left behind.
    later = run_turn_sync(conversation, "How much is it?")
    assert "Zephyr" not in later.trace["queries"]["final"] and "$449" in later.answer


@pytest.mark.parametrize("question", ["Do you sell spare ear tips?", "How much does it cost?", "And the warranty?",
                                      "What about the blue one?", "Do you have any in blue?",
                                      "Do you sell cases for them?"])
def test_genuine_follow_ups_still_lean_on_the_conversation(sample_docs, conversation, question):
    run_turn_sync(conversation, "Tell me about the Zephyr Buds.")

    result = run_turn_sync(conversation, question)

    assert "Zephyr Buds" in result.trace["queries"]["final"], step_of(result)["note"]
    assert result.trace["queries"]["followup"]["subject_rule"] == "kept"
    assert first_source(result) == "sample/zephyr-buds.md"


def test_subjects_come_from_ingested_titles_and_are_reloaded_when_the_corpus_changes(shop):
    from django_ragchat.ingestion.pipeline import ingest_text
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn.context import components_for

    space = components_for(get_profile()).embedder.space
    assert {s.name for s in subject_index(space).subjects} == {"Trail 500", "Trail 700"}

    ingest_text("shop/trail-900.md", "# Trail 900\n\n## Pricing\n\nThe Trail 900 costs $99.\n", content_type="markdown")

    assert {s.name for s in subject_index(space).subjects} == {"Trail 500", "Trail 700", "Trail 900"}
    assert subject_index("another-space").subjects == []


# --- The rules, one by one ------------------------------------------------------------------

INDEX = SubjectIndex.from_rows([
    (1, "Zephyr Buds", ["Zephyr Buds", "Warranty"]),
    (2, "Nimbus Tab", ["Nimbus Tab", "Pricing"]),
    (3, "Aurora X2", ["Aurora X2", "Pricing"]),
    (4, "Kestrel coffee subscriptions", ["Kestrel coffee subscriptions", "Basic Plan"]),
    (4, "Kestrel coffee subscriptions", ["Kestrel coffee subscriptions", "Pro Plan"]),
    (5, "Orbit Devices support", ["Orbit Devices support", "Returns"]),
    (6, "Sun Ra", ["Sun Ra", "Early life"]),
    (7, "The Daily Show", ["The Daily Show", "Early life"]),
])


def history(*user_turns: str) -> tuple[HistoryMessage, ...]:
    messages, seq = [], 1
    for text in user_turns:
        messages += [HistoryMessage(role="user", content=text, seq=seq, token_count=10),
                     HistoryMessage(role="assistant", content="An answer.", seq=seq + 1, token_count=3)]
        seq += 2
    return tuple(messages)


def resolve(question: str, *earlier: str, **options) -> Query:
    query = Query(text=question, original=question, history=history(*earlier))
    return FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, **options).resolve(query, None, INDEX)


def test_titles_and_name_like_unique_headings_are_subjects_section_headings_are_not():
    names = {s.name for s in INDEX.subjects}
    assert {"Zephyr Buds", "Nimbus Tab", "Aurora X2", "Basic Plan", "Pro Plan", "Orbit Devices"} <= names
    # "Pricing" recurs, "Returns" is one word, "Early life" is not written as a name.
    assert not {"Pricing", "Warranty", "Returns", "Early life"} & names


@pytest.mark.parametrize("text, names", [
    ("What about the Nimbus Tab?", ["Nimbus Tab"]),
    ("what about the nimbus tab?", ["Nimbus Tab"]),               # lower case, in a row
    ("Compare the Aurora X2 and the Zephyr Buds", ["Aurora X2", "Zephyr Buds"]),
    ("And the Pro plan?", ["Pro Plan"]),
    ("When did he start playing for the Suns?", []),               # one word of "Sun Ra" is not it
    ("how did she do in that show she wrote daily?", []),          # scattered common words
    ("Is the tab light?", []),
])
def test_a_subject_is_named_by_all_its_words_written_as_a_name(text, names):
    assert [s.name for s in INDEX.find(text)] == names


@pytest.mark.parametrize("question", [
    "What about the Nimbus Tab?", "How about the Nimbus Tab?", "And the Nimbus Tab?", "Nimbus Tab?",
    "Same for the Nimbus Tab", "Thanks. What about the Nimbus Tab?",
])
def test_a_new_subject_asking_nothing_inherits_the_last_attribute(question):
    result = resolve(question, "What is the battery life of the Zephyr Buds?")
    assert result.text == f"{question} battery life"
    assert "subject replaced (Nimbus Tab), attribute inherited (battery life)" in result.metadata["transform_note"]


def test_the_word_after_how_is_not_inherited_unless_it_is_all_that_was_asked():
    # "long" alone would make the next subject's question one about length.
    assert resolve("And the Aurora X2?", "How long is the warranty of the Nimbus Tab?").text == \
        "And the Aurora X2? warranty"
    assert resolve("And the Aurora X2?", "How heavy is the Nimbus Tab?").text == "And the Aurora X2? heavy"


def test_how_much_is_inherited_as_the_price():
    assert resolve("And the Aurora X2?", "How much is the Nimbus Tab?").text == "And the Aurora X2? price cost"


def test_a_new_subject_with_its_own_question_is_searched_as_typed():
    result = resolve("How long is the warranty of the Nimbus Tab?", "How much do the Zephyr Buds cost?")
    assert result.text == "How long is the warranty of the Nimbus Tab?"
    assert "subject replaced (Nimbus Tab), attribute new (warranty)" in result.metadata["transform_note"]


def test_a_switch_back_inherits_too():
    result = resolve("And the Zephyr Buds again?", "How much do the Zephyr Buds cost?", "And the Nimbus Tab?")
    assert result.text == "And the Zephyr Buds again? cost"


def test_a_pronoun_with_a_new_attribute_keeps_the_subject_and_never_adds_the_old_one():
    result = resolve("And its warranty?", "How much do the Zephyr Buds cost?", "What about the Nimbus Tab?")
    assert result.text == "And its warranty? Nimbus Tab"
    assert "subject kept (Nimbus Tab), attribute new (warranty)" in result.metadata["transform_note"]


def test_a_conversation_on_one_subject_is_enriched_as_before():
    question, earlier = "How much does it cost?", "Tell me about the Zephyr Buds"
    assert resolve(question, earlier).text == resolve(question, earlier, track_subjects=False).text
    assert resolve(question, earlier).text == "How much does it cost? Zephyr Buds"


def test_a_fresh_start_carries_nothing_now_or_later():
    fresh = resolve("Thanks. Now, what is your return policy?", "How much do the Zephyr Buds cost?")
    assert fresh.text == "Thanks. Now, what is your return policy?"
    assert fresh.metadata["transform_note"].startswith("fresh start: nothing carried")
    later = resolve("And the repair times?",
                    "How much do the Zephyr Buds cost?", "Thanks. Now, what is your return policy?")
    assert "Zephyr" not in later.text


def test_without_subjects_in_the_corpus_the_transformer_is_subject_blind():
    query = Query(text="What about the Nimbus Tab?", original="What about the Nimbus Tab?",
                  history=history("What is the battery life of the Zephyr Buds?"))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, SubjectIndex([]))
    assert result.text == "What about the Nimbus Tab? Zephyr Buds"


@pytest.mark.parametrize("text, attribute, elliptical, fresh", [
    ("What is the battery life of the Zephyr Buds?", ("battery", "life"), False, False),
    ("And the Nimbus Tab?", (), True, False),
    ("Same for the Aurora X2.", (), True, False),
    ("Tell me about the Aurora X2.", (), False, False),   # a new subject, nothing to inherit
    ("How much is it?", ("price", "cost"), False, False),
    ("Thanks! What is your shipping cost?", ("shipping", "cost"), False, True),
    ("Thanks.", (), False, False),
])
def test_reading_a_message(text, attribute, elliptical, fresh):
    reading = read_message(text, INDEX, Grammar.of(VOCABULARY))
    assert (reading.attribute, reading.elliptical, reading.fresh) == (attribute, elliptical, fresh)


def test_a_title_case_heading_is_a_subject_only_when_its_text_writes_it_as_a_name(db):
    from django_ragchat.ingestion.pipeline import ingest_text
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn.context import components_for

    ingest_text("shop/plans.md", "# Coffee subscriptions\n\n## Basic Plan\n\nThe Basic Plan costs $14 a month.\n\n"
                "## Return Policy\n\nOur return policy gives you 60 days.\n", content_type="markdown")

    names = {s.name for s in subject_index(components_for(get_profile()).embedder.space).subjects}
    assert names == {"Coffee subscriptions", "Basic Plan"}


# --- Kinds: "the tablet" names the one subject the corpus defines as a tablet ------------------

OPENINGS = {
    1: "Zephyr Buds > Overview\nZephyr Buds are wireless earbuds with active noise cancelling.",
    2: "Nimbus Tab > Overview\nThe Nimbus Tab is an 11-inch tablet for drawing and reading.",
    3: "Aurora X2 > Overview\nThe Aurora X2 is a 6.1-inch phone with a titanium frame and an OLED display that "
       "reaches 2,000 nits outdoors.",
    8: "Aurora X3 > Overview\nThe Aurora X3 is a 6.7-inch phone.",
}
KIND_ROWS = [(1, "Zephyr Buds", ["Zephyr Buds", "Overview"]), (2, "Nimbus Tab", ["Nimbus Tab", "Overview"]),
             (3, "Aurora X2", ["Aurora X2", "Overview"])]


def test_a_documents_defining_sentence_gives_its_subjects_kind():
    from django_ragchat.search.subjects import kind_of

    assert kind_of("Nimbus Tab", OPENINGS[2]) == "tablet"
    assert kind_of("Aurora X2", OPENINGS[3]) == "phone"  # "6.1" does not end the sentence
    assert kind_of("Zephyr Buds", OPENINGS[1]) == "earbuds"
    assert kind_of("Orbit Devices support", "Orders ship within two business days.") == ""


def test_the_kind_names_its_subject_only_when_one_subject_has_it():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    assert [s.name for s in index.find("What about the tablet?")] == ["Nimbus Tab"]
    assert [s.name for s in index.find("Do the Zephyr Buds work with my phone?")] == ["Zephyr Buds"]  # the user's own
    two_phones = SubjectIndex.from_rows(KIND_ROWS + [(8, "Aurora X3", ["Aurora X3", "Overview"])], openings=OPENINGS)
    assert two_phones.find("And the phone?") == []  # two phones: "the phone" names neither


def test_a_follow_up_naming_a_kind_switches_to_that_subject_and_inherits_the_attribute():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    query = Query(text="And the tablet?", original="And the tablet?", history=history("How much do the Zephyr Buds cost?"))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index)
    assert result.text.startswith("And the tablet? Nimbus Tab"), result.text
    assert "cost" in result.text.split("Nimbus Tab")[1], result.text


def test_a_question_asking_only_the_kind_of_value_inherits_the_attribute():
    result = resolve("How long is it?", "What's the warranty on the Zephyr Buds?")
    assert result.text == "How long is it? Zephyr Buds warranty", result.text
    assert "attribute inherited (warranty)" in result.metadata["transform_note"]


def test_and_with_a_detail_refines_the_last_question():
    result = resolve("And with the pen?", "What does the Nimbus Tab cost?")
    assert result.text.endswith("cost"), result.text  # the price, with the pen
    assert "attribute inherited" in result.metadata["transform_note"]


def test_a_possessive_names_its_subject():
    result = resolve("And the Nimbus Tab's?", "How long does the Aurora X2 battery last?")
    assert "Aurora" not in result.text and "battery" in result.text, result.text


def test_a_first_message_naming_a_kind_searches_its_subject():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    query = Query(text="How much is the tablet?", original="How much is the tablet?", history=())
    assert FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index).text == "How much is the tablet? Nimbus Tab"
    named = Query(text="Do the Zephyr Buds work with the phone?", original="", history=())
    assert FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(named, None, index).text == named.text  # it names its subject


def test_one_or_too_points_back_at_the_attribute_asked_before():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    query = Query(text="Does the phone have one too?", original="", history=history("What's the warranty on the Zephyr Buds?"))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index)
    assert result.text == "Does the phone have one too? Aurora X2 warranty", result.text


def test_a_shop_policy_question_about_a_product_carries_no_product():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    query = Query(text="Will I get my money back?", original="", history=history("I'd like to return my Zephyr Buds"))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index)
    assert result.text == "Will I get my money back?", result.text
    assert "asks a shop policy" in result.metadata["transform_note"]
    warranty = Query(text="How long is the warranty?", original="", history=history("Tell me about the Zephyr Buds"))
    assert "Zephyr Buds" in FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(warranty, None, index).text  # its own


def test_the_shop_policy_rule_reads_the_profiles_own_synonyms():
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    query = Query(text="Can I hand it back?", original="", history=history("I'd like to return my Zephyr Buds"))
    assert "Zephyr Buds" in FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index).text  # no group knows "hand it back"
    shop = Profile(vocabulary={"synonyms": {"return": ["hand it back"]}})
    enricher = FollowUpEnricher(shop, vocabulary=Vocabulary.for_profile(shop))
    assert enricher.resolve(query, None, index).text == "Can I hand it back?"


TEXTS = {1: "Zephyr Buds are wireless earbuds. Spare ear tips cost $9 a pair.",
         2: "The Nimbus Tab is an 11-inch tablet for drawing.", 3: "The Aurora X2 is a 6.1-inch phone."}


def index_with_texts() -> SubjectIndex:
    return SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS, document_text=lambda ids: [TEXTS[i] for i in ids])


@pytest.mark.parametrize("carry_opening", [True, False])
def test_asking_whether_the_shop_has_a_thing_the_subjects_documents_never_write_starts_afresh(carry_opening):
    enricher, index = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, carry_opening=carry_opening), index_with_texts()

    def resolved(question: str, *earlier: str) -> Query:
        return enricher.resolve(Query(text=question, original=question, history=history(*earlier)), None, index)

    for question in ("Do you sell blenders?", "Do you guys stock tablets?", "Have you got any kettles for a cafe?"):
        assert resolved(question, "How much do the Zephyr Buds cost?").text == question
    assert resolved("Do you sell blenders?", "How long does the Zephyr Kettle take to boil?").text == \
        "Do you sell blenders?"  # no subject of the corpus talked about: nothing to tie it to
    # The subject's documents write it, or it points back: a follow-up, searched as before.
    for question in ("Do you sell spare ear tips?", "Do you have any in blue?", "Do you sell anything cheaper?",
                     "Do you sell cases for them?"):
        note = resolved(question, "How much do the Zephyr Buds cost?").metadata["transform_note"]
        assert "subject kept (Zephyr Buds)" in note, (question, note)
    # What follows leans on the new question, not the product left behind.
    later = resolved("How much are they?", "How much do the Zephyr Buds cost?", "Do you sell blenders?")
    assert "Zephyr" not in later.text and "blenders" in later.text, later.text


def transform_note(index: SubjectIndex, question: str, *earlier: str) -> str:
    """The followup transformer's note on ``question`` after the user turns ``earlier``."""
    query = Query(text=question, original=question, history=history(*earlier))
    return FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index).metadata["transform_note"]


def test_a_capitalised_word_a_subjects_name_and_documents_lack_names_a_thing_of_its_own():
    index = index_with_texts()

    def note(question: str) -> str:
        return transform_note(index, question, "How much do the Zephyr Buds cost?")

    assert "a thing of its own (Kettle)" in note("How long does the Zephyr Kettle take to boil?")
    assert "a thing of its own (Toaster)" in note("Is the Aurora Toaster any good?")
    # Its documents write it, it is lower case, or it only starts the sentence: the subject's own.
    for question in ("Do the Zephyr Ear Tips fit?", "Does the Zephyr kettle boil?", "Zephyr Buds battery?",
                     "Kettle Zephyr?", "How long is the Zephyr warranty?"):
        assert "subject kept (Zephyr Buds)" in note(question), (question, note(question))


def test_without_the_documents_texts_a_thing_is_not_known_to_be_new():
    query = Query(text="Do you sell blenders?", original="", history=history("How much do the Zephyr Buds cost?"))
    index = SubjectIndex.from_rows(KIND_ROWS, openings=OPENINGS)
    assert index.uses(index.subjects[0], "blenders") is None
    assert "Zephyr" in FollowUpEnricher(PROFILE, vocabulary=VOCABULARY).resolve(query, None, index).text


def test_a_language_folder_without_the_catalogue_pattern_keeps_working(tmp_path):
    """A site's own language folder written before the rule: the rule is off, nothing fails."""
    folder = tmp_path / "en"
    shutil.copytree(Path(VOCABULARY.language.directory), folder)
    patterns = folder / "patterns.toml"
    patterns.write_text("\n".join(line for line in patterns.read_text().splitlines()
                                  if not line.startswith("catalogue_question")))
    vocabulary = Vocabulary(read_language(folder))
    query = Query(text="Do you sell blenders?", original="", history=history("How much do the Zephyr Buds cost?"))
    resolved = FollowUpEnricher(PROFILE, vocabulary=vocabulary).resolve(query, None, index_with_texts())
    assert "Zephyr" in resolved.text  # a follow-up, as before the rule


# --- A new user's coffee shop: names written in part, an opening about something else ----------

COFFEE_SHOP = {
    "coffee/grinder.md": "# Millstone G2 Coffee Grinder\n\n## Overview\n\nThe Millstone G2 Coffee Grinder is a burr "
                         "grinder for home baristas.\n\n## Price\n\nThe Millstone G2 Coffee Grinder costs $149.\n\n"
                         "## Warranty\n\nThe Millstone G2 Coffee Grinder comes with a two-year warranty.\n",
    "coffee/kettle.md": "# Brightwater Kettle\n\n## Overview\n\nThe Brightwater Kettle is a gooseneck kettle for "
                        "pour-over coffee.\n\n## Price\n\nThe Brightwater Kettle costs $79.\n\n## Warranty\n\n"
                        "The Brightwater Kettle is covered by a one-year warranty.\n",
    "coffee/gift-cards.md": "# Gift cards\n\nGift cards are sold in amounts from $10 to $200 and never expire.\n",
}


@pytest.fixture
def coffee_shop(db):
    return ingest_markdown(COFFEE_SHOP)


def test_a_subject_named_in_part_is_carried_not_an_opening_about_something_else(coffee_shop, conversation):
    run_turn_sync(conversation, "Do you sell espresso machines?")
    named = run_turn_sync(conversation, "What about the Millstone G2 grinder, how long is its warranty?")
    assert named.trace["queries"]["followup"]["subject"] == "Millstone G2 Coffee Grinder"

    result = run_turn_sync(conversation, "and how much is it?")

    assert result.trace["queries"]["final"] == "and how much is it? Millstone G2 Coffee Grinder"
    assert "not the opening message" in step_of(result)["note"]
    assert "$149" in result.answer, result.answer


@pytest.mark.parametrize("opening, follow_up, stated", [
    ("What is the warranty on the kettle?", "And the grinder?", "two-year warranty"),
    ("Does the Millstone G2 Coffee Grinder have a warranty?", "What about the kettle?", "one-year warranty"),
])
def test_the_kind_a_name_holds_switches_to_its_subject(coffee_shop, conversation, opening, follow_up, stated):
    run_turn_sync(conversation, opening)

    result = run_turn_sync(conversation, follow_up)

    assert result.trace["queries"]["followup"]["subject_rule"] == "replaced"
    assert stated in result.answer, result.answer


def test_a_model_code_one_subject_has_names_it():
    index = SubjectIndex.from_rows([(1, "Millstone G2 Coffee Grinder", []), (2, "Trail 500", []),
                                    (3, "Trail 700", []), (4, "Aurora X2", []), (5, "Nimbus X2", [])])
    assert [s.name for s in index.find("How much is the G2?")] == ["Millstone G2 Coffee Grinder"]
    assert [s.name for s in index.find("the millstone g2 grinder")] == ["Millstone G2 Coffee Grinder"]
    assert index.find("Is 500 grams too heavy?") == []  # a number alone is an amount, not a name
    assert index.find("And the X2?") == []  # two subjects have it: it names neither


def test_a_title_names_its_subject_by_the_name_it_opens_with():
    # Found by a new user: "Trailblazer 300 mountain bike" was a subject only when a message wrote
    # all four words, so "What about the CityStream E?" after its price carried the opening.
    index = SubjectIndex.from_rows([(1, "Trailblazer 300 mountain bike", []), (2, "CityStream E electric bike", []),
                                    (3, "Returns and refunds", []), (4, "Trail 500", []), (5, "Trail 700", [])])
    assert {s.name for s in index.subjects} >= {"CityStream E", "Trailblazer 300", "Returns and refunds"}
    assert [s.name for s in index.find("What about the CityStream E?")] == ["CityStream E"]
    assert [s.name for s in index.find("How much is the Trailblazer 300?")] == ["Trailblazer 300"]
    # The name's words without its number, when no other subject has them: "the Trailblazer".
    assert [s.name for s in index.find("back to the Trailblazer, does it have a battery?")] == ["Trailblazer 300"]
    assert index.find("And the Trail?") == []  # the Trail 500 and the Trail 700 share it
    assert index.find("a trailblazer of a bike") == []  # not written as a name


def test_a_name_of_three_words_is_named_by_all_but_its_last_or_first_when_no_other_name_has_them_so():
    # A dental practice's trial: "How long does a root canal take?" did not name "Root canal
    # treatment", so "How much does it cost?" stayed on the conversation's first treatment.
    index = SubjectIndex.from_rows([(1, "Root canal treatment", []), (2, "Teeth whitening", []),
                                    (3, "Gum disease treatment", []), (4, "Gum disease check", [])])
    assert [s.name for s in index.find("How long does a root canal take?")] == ["Root canal treatment"]
    assert index.find("Is my gum disease bad?") == []  # two names start with "gum disease"
    # All but its first word too, since a recipe site's trial ("the lentil soup" of the Red
    # Lentil Soup was read as the curry asked of before); "disease treatment" also ends "Gum
    # disease treatment" alone, while "disease" and "check" are not written in a row.
    assert [s.name for s in index.find("the canal treatment")] == ["Root canal treatment"]
    assert index.find("which treatment for a canal") == []
    recipes = SubjectIndex.from_rows([(1, "Red Lentil Soup", []), (2, "Vegetable Curry", [])])
    assert [s.name for s in recipes.find("How many people does the lentil soup serve?")] == ["Red Lentil Soup"]
    assert index.find("a root and a canal") == []  # not written in a row
    assert index.find("whitening") == []  # a name of two words needs both


def test_a_name_of_three_words_or_more_is_named_by_its_first_and_last_words():
    # A cookbook site's trial: "How many people does the chickpea curry serve?" named no recipe
    # ("Chickpea and Spinach Curry"), so the cake asked of before was carried in and answered.
    recipes = SubjectIndex.from_rows([(1, "Chickpea and Spinach Curry", []), (2, "Lemon Drizzle Cake", []),
                                      (3, "Chickpea Salad", [])])
    assert [s.name for s in recipes.find("How many does the chickpea curry serve?")] == ["Chickpea and Spinach Curry"]
    assert [s.name for s in recipes.find("the lemon cake")] == ["Lemon Drizzle Cake"]
    assert recipes.find("a curry with chickpea") == []  # not written in a row
    assert [s.name for s in recipes.find("the chickpea salad")] == ["Chickpea Salad"]  # a whole name
    shared = SubjectIndex.from_rows([(1, "Lemon Drizzle Cake", []), (2, "Lemon Sponge Cake", [])])
    assert shared.find("the lemon cake") == []  # two names open and end so


def test_a_switch_to_a_product_titled_with_a_descriptor_is_followed(db, conversation):
    ingest_markdown({
        "trailblazer.md": "# Trailblazer 300 mountain bike\n\nThe Trailblazer 300 is a hardtail mountain bike."
                          "\n\n## Price\nThe Trailblazer 300 costs £1,249.\n\n## Warranty\nThe frame has a "
                          "lifetime warranty.",
        "citystream.md": "# CityStream E electric bike\n\nThe CityStream E is an electric city bike.\n\n## Price\n"
                         "The CityStream E costs £2,199.\n\n## Warranty\nThe frame and motor are covered for "
                         "three years.\n\n## Charging\nA full charge takes about five hours.",
    })
    run_turn_sync(conversation, "How much is the Trailblazer 300?")
    assert "£2,199" in run_turn_sync(conversation, "What about the CityStream E?").answer
    assert "three years" in run_turn_sync(conversation, "and the warranty?").answer
    assert "five hours" in run_turn_sync(conversation, "How long does a charge take?").answer
    assert "lifetime" in run_turn_sync(conversation, "Back to the Trailblazer, what is its warranty?").answer


def test_an_opening_question_about_a_thing_of_its_own_gives_way_to_the_newest_topic(db, conversation):
    """A vet practice's trial: "When is the appointment for Rex the labrador?" (declined), then
    "How much does neutering cost?", then "What does it include?" was searched with the opening
    question, because it named something (Rex), and answered with the first visit's check-up."""
    ingest_markdown({
        "neutering.md": "# Neutering\n\nNeutering costs £220. It includes a pre-op health check, the operation "
                        "and a post-op check a week later.\n",
        "new-patients.md": "# Registering a new pet\n\nRegistration is free. The first visit includes a full health "
                           "check with one of our vets and takes about 30 minutes.\n",
    })
    run_turn_sync(conversation, "When is the appointment for Rex the labrador?")
    run_turn_sync(conversation, "How much does neutering cost?")
    result = run_turn_sync(conversation, "What does it include?")
    assert result.trace["queries"]["final"] == "What does it include? How much does neutering cost?"
    assert "pre-op health check" in result.answer, result.answer


@pytest.mark.parametrize("turns, searched, stated", [
    (["What is the status of my order?", "How big is the Nimbus Tab's screen?", "and how much is it?"],
     "and how much is it? Nimbus Tab", "$449"),
    (["Do you ship to Canada?", "What about the Zephyr Buds battery?", "and the warranty?"],
     "and the warranty? Zephyr Buds", "two-year warranty"),
])
def test_a_question_before_the_subject_was_named_is_not_carried_after_it(sample_docs, conversation, turns, searched,
                                                                         stated):
    """A new user's trial: "and the warranty?" after "What is the range of the CityStream E?" was
    searched with the conversation's opening question ("How do I contact you?") and answered with
    another bike's warranty."""
    for question in turns[:-1]:
        run_turn_sync(conversation, question)

    result = run_turn_sync(conversation, turns[-1])

    assert result.trace["queries"]["final"] == searched
    assert stated in result.answer, result.answer


def test_an_opening_that_names_nothing_is_still_carried_as_context():
    index = SubjectIndex.from_rows([(1, "Central Library", []), (2, "Millbrook Library", [])])
    query = Query(text="Is the entrance OK for me?", original="",
                  history=history("I'm a wheelchair user.", "I want to visit Central Library."))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, carry_opening=True).resolve(query, None, index)
    assert result.text == "Is the entrance OK for me? I'm a wheelchair user.", result.text


# --- A new question after a product: what only a topic's page writes -------------------------

SUPPORT_PAGE = {"coffee/support.md": "# Customer support\n\n## Contact\n\nTo contact support, email "
                                     "help@brewhouse.example or call 0800 123 456.\n"}


def test_a_question_only_a_topic_page_answers_carries_nothing_of_the_product_before(coffee_shop, conversation):
    """A new user's trial: "How do I contact support?" after the grinder was declined "...about
    contact support for Millstone G2 Coffee Grinder", though the contact passage was retrieved."""
    ingest_markdown(SUPPORT_PAGE)
    run_turn_sync(conversation, "What about the Millstone G2 grinder, how long is its warranty?")
    run_turn_sync(conversation, "and how much is it?")

    result = run_turn_sync(conversation, "How do I contact support?")

    assert result.trace["queries"]["final"] == "How do I contact support?"
    assert result.trace["queries"]["followup"]["subject_rule"] == "fresh"
    assert "help@brewhouse.example" in result.answer, result.answer
    assert "Millstone" not in result.answer


def large_catalogue(extra: str = "") -> dict[str, str]:
    """More items than ``SubjectIndex.MAX_TOPIC_SCAN``, each defined as a kettle, and a support page."""
    pages = {f"shop/kettle-{n}.md": f"# Kettle K{n}\n\nThe Kettle K{n} is a kettle for tea.\n\n## Price\n"
                                     f"The Kettle K{n} costs ${20 + n}.{extra if n == 7 else ''}\n"
             for n in range(1, SubjectIndex.MAX_TOPIC_SCAN + 8)}
    return {**pages, "shop/support.md": "# Customer support\n\nTo contact support, email help@kettles.example.\n"}


@pytest.mark.parametrize("extra, fresh", [("", True), (" Contact support to register it.", False)])
def test_a_topic_page_is_found_in_a_catalogue_too_large_to_read(db, conversation, extra, fresh):
    # Past MAX_TOPIC_SCAN items the items' texts are not read on a turn: the database says whether
    # one writes every asked word (the Kettle K7's page, in the second case).
    clear_cache()
    ingest_markdown(large_catalogue(extra))
    run_turn_sync(conversation, "How much is the Kettle K3?")

    result = run_turn_sync(conversation, "How do I contact support?")

    assert (result.trace["queries"]["followup"]["subject_rule"] == "fresh") is fresh
    if fresh:
        assert "help@kettles.example" in result.answer, result.answer


TOPIC_TEXTS = {**TEXTS, 4: "Orbit Devices support. To contact support, email help@orbit.example. "
                           "The Zephyr Buds have a headphone jack adapter.",
               5: "Returns are accepted within 30 days."}


def topic_index() -> SubjectIndex:
    rows = [*KIND_ROWS, (4, "Customer support", []), (5, "Returns", [])]
    return SubjectIndex.from_rows(rows, openings=OPENINGS, document_text=lambda ids: [TOPIC_TEXTS[i] for i in ids])


def test_the_topic_page_is_a_subject_with_no_kind_that_writes_every_asked_word():
    index = topic_index()
    [aurora] = [s for s in index.subjects if s.name == "Aurora X2"]
    assert index.topic_page(aurora, ["contact", "support"]).name == "Customer support"
    assert index.topic_page(aurora, ["returns"]).name == "Returns"
    assert index.topic_page(aurora, ["contact", "refund"]) is None  # no page writes both
    assert index.topic_page(aurora, ["phone"]) is None  # the Aurora's own page writes it
    # An item's page writes them all: the question is of an item's kind, declined on this one.
    assert index.topic_page(aurora, ["spare", "tips"]) is None
    assert index.topic_page(aurora, []) is None
    without_texts = SubjectIndex.from_rows(KIND_ROWS + [(4, "Customer support", [])], openings=OPENINGS)
    assert without_texts.topic_page(without_texts.subjects[0], ["contact"]) is None


def test_a_topic_pages_whole_name_decides_alone():
    """A bike shop's trial: "How much does delivery cost?" after a tyre's price stayed on the tyre
    (its page writes "costs" too) and was answered with the tyre's price, the Delivery page at rank 3."""
    texts = {**TEXTS, 6: "Standard delivery costs $4.95. Orders over $60 ship free."}
    index = SubjectIndex.from_rows([*KIND_ROWS, (6, "Delivery", [])], openings=OPENINGS,
                                   document_text=lambda ids: [texts[i] for i in ids])
    [buds] = [s for s in index.subjects if s.name == "Zephyr Buds"]  # "Spare ear tips cost $9 a pair."
    assert index.topic_page(buds, ["delivery", "cost"]).name == "Delivery"
    assert index.topic_page(buds, ["spare", "cost"]) is None  # no page's name: the buds write both
    assert index.topic_page(buds, ["ship", "cost"]) is None  # "ship" makes no page's name


def test_only_a_plain_question_leaves_the_subject_for_a_topic_page():
    index = topic_index()

    def note(question: str) -> str:
        return transform_note(index, question, "How much does the Aurora X2 cost?")

    assert "a thing of its own (contact support)" in note("How do I contact support?")
    # A pronoun or an opening that points back keeps the subject, whatever the words.
    for question in ("How do I contact support about it?", "And contact support?"):
        assert "subject kept (Aurora X2)" in note(question), (question, note(question))


# --- A shop of topic pages only: the newest question that opened a topic ---------------------

BIKE_SHOP_PAGES = {
    "bikes/delivery.md": "# Delivery\n\nWe deliver within 20 miles of the shop, Monday to Friday. Delivery costs "
                         "£15 and bikes arrive ready to ride.\n",
    "bikes/servicing.md": "# Servicing\n\nA full service costs £60. A service takes about two working days, and "
                          "we call you when the bike is ready.\n",
}


@pytest.mark.parametrize("turns, searched, stated", [
    (["Do you deliver on Saturdays?", "How much does a service cost?", "and how long does it take?"],
     "and how long does it take? How much does a service cost?", "two working days"),
    # A later question that leans on the one before opens nothing: the opening is still carried.
    (["How much does a service cost?", "and when will it be ready?", "and how long does it take?"],
     "and how long does it take? How much does a service cost?", "two working days"),
])
def test_a_later_question_that_needs_nothing_before_it_opens_the_topic_carried(db, conversation, turns, searched,
                                                                               stated):
    """A new user's trial: in a shop whose pages are topics only, "and how long does it take?"
    after "How much does a service cost?" was searched with the conversation's first question
    ("Do you deliver on Saturdays?") and declined as about delivery on Saturdays."""
    ingest_markdown(BIKE_SHOP_PAGES)
    for question in turns[:-1]:
        run_turn_sync(conversation, question)

    result = run_turn_sync(conversation, turns[-1])

    assert result.trace["queries"]["final"] == searched
    assert stated in result.answer, result.answer
    opened = "the opening message" if turns[0] in searched else "the question that opened the topic"
    assert f"added {opened} " in step_of(result)["note"]


GARDEN_CENTRE_PAGES = {
    "garden/plant-care.md": "# Plant care service\n\n## Prices\n\nThe plant care service costs £35 per visit.\n\n"
                            "## How long a visit takes\n\nA standard visit lasts about two hours.\n",
    "garden/delivery.md": "# Delivery\n\n## What it costs\n\nDelivery costs £6.50 for orders under £50.\n\n"
                          "## How long it takes\n\nMost orders arrive within three working days.\n",
}


def test_a_question_after_a_turn_to_a_thing_of_its_own_carries_that_turn(db, conversation):
    """A new user's garden centre: after "How much does the plant care service cost?" and
    "what about delivery?", "and how long does that take?" was searched with the plant care
    question and answered with the visit's length."""
    ingest_markdown(GARDEN_CENTRE_PAGES)
    for question in ("How much does the plant care service cost?", "what about delivery?"):
        run_turn_sync(conversation, question)

    result = run_turn_sync(conversation, "and how long does that take?")

    assert result.trace["queries"]["final"] == "and how long does that take? what about delivery?"
    assert "which turned from 'Plant care service'" in step_of(result)["note"]
    assert "three working days" in result.answer, result.answer
    # A qualifier of the same topic turns nothing: "and on Saturdays?" is still about plant care.
    again = type(conversation).objects.create(owner=conversation.owner)
    for question in ("How much does the plant care service cost?", "and on Saturdays?"):
        run_turn_sync(again, question)
    assert "plant care" in run_turn_sync(again, "and how long does it take?").trace["queries"]["final"]


BOOKSHOP_PAGES = {
    "shop/delivery.md": "# Delivery\n\n## What it costs\n\nDelivery costs £3.95 per order, free over £25.\n",
    "shop/loyalty-card.md": "# Loyalty card\n\nOur loyalty card earns you a stamp for every book you buy.\n\n"
                            "## Getting a card\n\nAsk at the till for a card: it is free and issued on the spot.\n",
    "shop/book-token.md": "# Gift Voucher\n\nThe Gift Voucher is a printed card for any book in the shop. It comes in £10, £20 or £50.\n",
}


@pytest.mark.parametrize(("named", "inherits"), [("what about the loyalty card?", False),
                                                 ("and the Gift Voucher?", True)])
def test_a_topic_pages_name_is_no_attribute_of_another_topic_page(db, conversation, named, inherits):
    """A new user's bookshop: after "How much is delivery?", "what about the loyalty card?" was
    searched with "delivery" added, as if it asked the card's delivery. The Delivery page's name
    is what that question was about, not an attribute the card's page can have; an item of the
    catalogue (the Gift Voucher, which the shop sells) may still be asked its delivery."""
    ingest_markdown(BOOKSHOP_PAGES)
    run_turn_sync(conversation, "How much is delivery?")

    result = run_turn_sync(conversation, named)

    followup = result.trace["queries"]["followup"]
    assert ("delivery" in result.trace["queries"]["final"]) is inherits, (followup, step_of(result))
    assert followup["attribute_rule"] == ("inherited" if inherits else "none"), followup
    if not inherits:
        later = run_turn_sync(conversation, "and how do I get one?")
        assert "delivery" not in later.trace["queries"]["final"], later.trace["queries"]



@pytest.mark.parametrize("index", [None, SubjectIndex.from_rows([])])
def test_a_short_question_of_its_own_opens_the_topic_a_later_it_carries(index):
    """A new user's trial (a bakery whose pages name no subject): "How much does it cost?" after
    "Do you deliver?" was searched with the first question ("How far in advance do I need to
    order a celebration cake?"), for "Do you deliver?" asks in one word of its own, and declined
    as about "far". "it" is the newest thing asked about."""
    query = Query(text="How much does it cost?", original="",
                  history=history("How far in advance do I need to order a celebration cake?", "Do you deliver?"))
    result = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, carry_opening=True).resolve(query, None, index)
    assert result.text == "How much does it cost? Do you deliver?", result.text
    assert result.metadata["transform_note"].startswith("follow-up: added the question that opened the topic ")


def test_a_fresh_start_carries_nothing_in_a_corpus_naming_no_subject():
    """A new user's trial (a helpdesk whose pages are topics, no subject): "Thanks. Now, how
    long does it take to get a new laptop?" was searched with the conversation's first question
    ("Has my Illustrator request been approved?"), though docs/followup.md says a fresh start is
    searched as typed, and declined as about "laptop for Adobe Illustrator"."""
    enricher, index = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, carry_opening=True), SubjectIndex.from_rows([])
    earlier = history("Has my Illustrator request been approved?")
    fresh = Query(text="Thanks. Now, how long does it take to get a new laptop?", original="", history=earlier)
    result = enricher.resolve(fresh, None, index)
    assert (result.text, result.metadata["transform_note"]) == (fresh.text, "fresh start: nothing carried")
    # Nor is what was said before it carried later.
    later = Query(text="And is it insured?", original="",
                  history=earlier + history("Thanks. Now, how long does it take to get a new laptop?"))
    assert enricher.resolve(later, None, index).text == (
        "And is it insured? Thanks. Now, how long does it take to get a new laptop?")


HELPDESK_PAGES = {
    "it/laptops.md": "# Laptop requests\n\nA new laptop is delivered within 5 working days of your manager's "
                     "approval.\n",
    "it/email.md": "# Email on your phone\n\nTo read your work email on your phone, install Outlook and sign in "
                   "with your work account.\n",
    "it/software.md": "# Software requests\n\nAdobe Illustrator licences are approved by the design team lead "
                      "within two days.\n",
}


@pytest.mark.parametrize("question, stated", [
    ("Thanks. Now, how long does it take to get a new laptop?", "5 working days"),
    ("Thanks. Now, how do I read my work email on my phone?", "install Outlook"),
])
def test_a_helpdesk_question_after_thanks_now_is_searched_as_typed(db, conversation, question, stated):
    """A new user's helpdesk (topic pages): after "Has my Illustrator request been approved?",
    "Thanks. Now, how long does it take to get a new laptop?" was searched with that question
    (its "it" read as pointing back) and declined as about "laptop for Adobe Illustrator"."""
    ingest_markdown(HELPDESK_PAGES)
    run_turn_sync(conversation, "Has my Illustrator request been approved?")
    result = run_turn_sync(conversation, question)
    assert result.trace["queries"]["final"] == question, step_of(result)["note"]
    assert stated in result.answer, result.answer


def test_a_question_of_its_own_is_answered_from_its_page_not_of_the_carried_subject(db, conversation):
    """A new user's helpdesk (F1): "How long does it take to get a new laptop?" after "Has my
    Illustrator request been approved?" is searched with that question (a carried opening helps
    "How long does a session last?" after the wifi), and was declined as about "laptop for Adobe
    Illustrator": the name the search query alone carried is not the subject of a question
    that points back at nothing, when a page about no subject states all it asks."""
    ingest_markdown(HELPDESK_PAGES)
    run_turn_sync(conversation, "Has my Illustrator request been approved?")
    result = run_turn_sync(conversation, "How long does it take to get a new laptop?")
    assert "Illustrator" in result.trace["queries"]["final"]  # still searched with the opening
    assert "5 working days" in result.answer and "Illustrator" not in result.answer, result.answer
    assert result.trace["answerer"].get("subjects") is None  # the Why names no subject


def test_a_question_pointing_back_keeps_the_carried_subject(db, conversation):
    """... but "How many days does it take them?" points back: it is asked of Adobe Illustrator."""
    ingest_markdown(HELPDESK_PAGES)
    run_turn_sync(conversation, "Has my Illustrator request been approved?")
    result = run_turn_sync(conversation, "How many days does it take them?")
    assert "two days" in result.answer and "laptop" not in result.answer, result.answer


def test_what_the_memory_wrote_is_never_carried_as_the_users_opening():
    """A new user's helpdesk (summary memory): "Please reopen ticket 3" was searched with the
    memory's "Facts about me: - Alice works on floor 4 ..." appended, the memory's message
    taken for the conversation's opening question."""
    memory = (HistoryMessage(role="user", content="Facts about me:\n- Alice works on floor 4.", seq=2, token_count=9,
                             from_memory=True),
              HistoryMessage(role="assistant", content="Noted.", seq=2, token_count=2, from_memory=True))
    enricher = FollowUpEnricher(PROFILE, vocabulary=VOCABULARY, carry_opening=True)
    for index in (None, SubjectIndex.from_rows([])):
        query = Query(text="And how long does that take?", original="", history=memory + history("How do I get a laptop?"))
        result = enricher.resolve(query, None, index)
        assert result.text == "And how long does that take? How do I get a laptop?", result.text
        assert result.history == query.history  # the model still reads the memory
        alone = enricher.resolve(Query(text="Please reopen ticket 3", original="", history=memory), None, index)
        assert alone.text == "Please reopen ticket 3", alone.text
