"""The LLM query transformers (rewrite, compress, translate) and the multi_query expander,
through full turns against the loopback OpenAI-compatible server."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_ragchat.checks import check_profiles
from django_ragchat.profiles import get_profile
from django_ragchat.stages.llm_transformers import MultiQueryExpander, check_reply
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import Query
from tests.test_openai_backend import use_openai

pytestmark = pytest.mark.django_db

FIRST = "Tell me about the Aurora X2 phone"
FOLLOW_UP = "How much is it?"
AURORA_PRICING = "The Aurora X2 costs $699"


def top_source(result) -> str:
    return result.message["sources"][0]["snippet"]


@pytest.fixture
def rewriting(openai_server, ragchat_settings_override):
    """The rewrite transformer, one retrieved passage, the answering model on the server."""
    use_openai(ragchat_settings_override, openai_server, query_transformers=["rewrite"], top_k=1)
    return openai_server


def test_rewrite_turns_the_follow_up_into_a_search_query_that_finds_the_pricing(rewriting, conversation):
    first = run_turn_sync(conversation, FIRST)
    assert first.trace["queries"]["transformed"] == [{"by": "rewrite", "text": FIRST, "note": "no history: skipped"}]
    assert rewriting.count("chat/completions") == 1  # no history: no rewrite call, only the answer
    rewriting.reset()
    rewriting.when(contains=FOLLOW_UP, reply="Aurora X2 price", times=1)  # the rewrite call comes first

    result = run_turn_sync(conversation, FOLLOW_UP)

    assert result.error is None
    assert AURORA_PRICING in top_source(result)
    queries = result.trace["queries"]
    assert queries["original"] == FOLLOW_UP and queries["final"] == "Aurora X2 price"
    assert queries["transformed"] == [{"by": "rewrite", "text": "Aurora X2 price", "note": "rewrite by gpt-4o-mini"}]
    assert [r["query"] for r in result.trace["retrieval"]] == ["Aurora X2 price"]
    rewrite_call, answer_call = [r.json for r in rewriting.requests if r.path.endswith("chat/completions")]
    assert FIRST in rewrite_call["messages"][1]["content"]  # the model saw the history
    # The model answers the user's own words, with the passage the rewrite found.
    assert answer_call["messages"][-1]["content"].endswith(f"Question: {FOLLOW_UP}")
    assert rewriting.count("embeddings") == 1 and rewriting.count("chat/completions") == 2
    [call] = result.trace["llm_calls"]
    assert call["by"] == "rewrite" and call["model"] == "gpt-4o-mini" and call["completion_tokens"] == 3


def test_without_rewriting_the_follow_up_finds_the_wrong_product(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, query_transformers=[], top_k=1)
    run_turn_sync(conversation, FIRST)

    result = run_turn_sync(conversation, FOLLOW_UP)

    assert AURORA_PRICING not in top_source(result) and "Nimbus Tab" in top_source(result)


@pytest.mark.parametrize("reply,why", [
    ("", "the reply was empty"),
    ("   \n\n  ", "the reply was empty"),
    ("Aurora X2 price\nAurora X2 cost", "the reply had 2 lines where 1 was asked"),
    ("I'm sorry, but I can't help with that request.", "the reply looks like a refusal"),
    ("I cannot determine what 'it' refers to.", "the reply looks like a refusal"),
    ("price " * 200, "the reply was too long"),
])
def test_a_reply_of_the_wrong_shape_keeps_the_original_query_and_says_so(rewriting, conversation, reply, why):
    run_turn_sync(conversation, FIRST)
    rewriting.when(contains="Search query:", reply=reply, times=1)

    result = run_turn_sync(conversation, FOLLOW_UP)

    [step] = result.trace["queries"]["transformed"]
    assert step["text"] == FOLLOW_UP and step["note"].startswith(f"kept the original query: {why}")
    assert result.trace["queries"]["final"] == FOLLOW_UP
    assert [r["query"] for r in result.trace["retrieval"]] == [FOLLOW_UP]
    assert result.error is None


@pytest.mark.parametrize("fault,code", [("server_error", "model_unavailable"), ("malformed_json", "bad_response"),
                                        ("rate_limit", "rate_limited")])
def test_a_failed_rewrite_call_keeps_the_original_query_and_the_turn_goes_on(rewriting, conversation, fault, code):
    run_turn_sync(conversation, FIRST)
    rewriting.fail_next(fault, path="chat/completions")  # the next chat call is the rewrite

    result = run_turn_sync(conversation, FOLLOW_UP)

    assert result.error is None and result.status == "complete"
    [step] = result.trace["queries"]["transformed"]
    assert step == {"by": "rewrite", "text": FOLLOW_UP, "note": f"kept the original query: the model call failed ({code})"}
    assert result.trace["llm_calls"] == [{"by": "rewrite", "ms": result.trace["llm_calls"][0]["ms"], "error": code}]


def test_rewriting_can_use_a_cheaper_model_than_answering(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, {"model": "gpt-4o"}, query_transformers=["rewrite"],
               options={"rewrite": {"model": "gpt-4o-mini", "max_tokens": 20}})
    run_turn_sync(conversation, FIRST)
    openai_server.reset()

    run_turn_sync(conversation, FOLLOW_UP)

    rewrite_call, answer_call = [r.json for r in openai_server.requests if r.path.endswith("chat/completions")]
    assert (rewrite_call["model"], rewrite_call["max_tokens"], rewrite_call["temperature"]) == ("gpt-4o-mini", 20, 0.0)
    assert answer_call["model"] == "gpt-4o" and "temperature" not in answer_call


def test_the_prompt_templates_can_be_overridden(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, query_transformers=["rewrite"], options={"rewrite": {
        "instructions": "Rewrite. One line.", "prompt": "H: {history} || Q: {question}", "history_messages": 1}})
    run_turn_sync(conversation, FIRST)
    openai_server.reset()

    run_turn_sync(conversation, FOLLOW_UP)

    rewrite_call = openai_server.requests[0].json
    assert rewrite_call["messages"][0] == {"role": "system", "content": "Rewrite. One line."}
    # Only the newest history message: the first turn's answer.
    assert rewrite_call["messages"][1]["content"].startswith("H: Assistant: ")
    assert rewrite_call["messages"][1]["content"].endswith(f"|| Q: {FOLLOW_UP}")


def test_compress_condenses_history_and_follow_up_into_one_question(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, query_transformers=["compress"], top_k=1)
    run_turn_sync(conversation, FIRST)
    openai_server.when(contains="Standalone question:", reply="Standalone question: What does the Aurora X2 cost?")

    result = run_turn_sync(conversation, FOLLOW_UP)

    assert result.trace["queries"]["final"] == "What does the Aurora X2 cost?"  # the label is dropped
    assert AURORA_PRICING in top_source(result)


def test_translate_turns_the_query_into_the_collections_language(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, query_transformers=["rewrite", "translate"], top_k=1,
               options={"translate": {"language": "English"}})
    openai_server.when(contains="Combien coûte l'Aurora X2 ?", reply='"What does the Aurora X2 cost?"')

    result = run_turn_sync(conversation, "Combien coûte l'Aurora X2 ?")

    steps = result.trace["queries"]["transformed"]
    assert [s["by"] for s in steps] == ["rewrite", "translate"]  # rewrite skipped (no history), translate runs
    assert steps[1]["text"] == "What does the Aurora X2 cost?"
    translate_call = next(r.json for r in openai_server.requests if r.path.endswith("chat/completions"))
    assert "into English" in translate_call["messages"][0]["content"]
    assert AURORA_PRICING in top_source(result)


def test_translate_needs_a_language_and_templates_are_checked(ragchat_settings_override):
    ragchat_settings_override(PROFILES={
        "no_language": {"query_transformers": ["translate"]},
        "bad_template": {"query_transformers": ["rewrite"], "options": {"rewrite": {"prompt": "{questoin}"}}},
        "bad_n": {"query_expanders": ["multi_query"], "options": {"multi_query": {"n": 0}}},
    })

    messages = {e.msg.split(":")[0]: e.msg for e in check_profiles()}

    assert 'needs the option "language"' in messages["Profile 'no_language'"]
    assert "{question}" in messages["Profile 'bad_template'"] and "questoin" in messages["Profile 'bad_template'"]
    assert "'n'" in messages["Profile 'bad_n'"]


# --- multi_query -------------------------------------------------------------------------------

VARIANTS_REPLY = """Here are the queries:
1. Aurora X2 price

2) cost of the Aurora X2 phone
- Aurora X2 price
• "What is the Aurora X2 pricing?"
* Tell me about the Aurora X2 phone
"""


def test_multi_query_retrieves_the_original_and_every_variant(openai_server, ragchat_settings_override, conversation):
    use_openai(ragchat_settings_override, openai_server, query_expanders=["multi_query"], query_transformers=[])
    openai_server.when(contains="Search queries:", reply=VARIANTS_REPLY)

    result = run_turn_sync(conversation, FIRST)

    expanded = result.trace["queries"]["expanded"]
    # The introduction, numbering, bullets, quotes and blank lines tolerated; duplicates and the
    # original dropped.
    assert expanded == [FIRST, "Aurora X2 price", "cost of the Aurora X2 phone", "What is the Aurora X2 pricing?"]
    assert sorted(r["query"] for r in result.trace["retrieval"]) == sorted(expanded)
    assert result.trace["queries"]["expansion_notes"] == [{"by": "multi_query", "note": "3 variant(s) by gpt-4o-mini"}]
    # One expansion call, one answer call, and every query embedded in one batch.
    assert openai_server.count("chat/completions") == 2 and openai_server.count("embeddings") == 1
    assert openai_server.last("embeddings").json["input"] == expanded
    assert openai_server.requests[0].json["messages"][0]["content"].startswith("You help a document search engine")
    assert "Write 3 different search queries" in openai_server.requests[0].json["messages"][0]["content"]


@pytest.mark.parametrize("reply", ["", "I'm sorry, I can't help with that.", f"1. {FIRST}\n2. {FIRST.upper()}"])
def test_multi_query_without_usable_variants_keeps_the_original_and_says_so(
    openai_server, ragchat_settings_override, conversation, reply,
):
    use_openai(ragchat_settings_override, openai_server, query_expanders=["multi_query"], query_transformers=[])
    openai_server.when(contains="Search queries:", reply=reply)

    result = run_turn_sync(conversation, FIRST)

    assert result.trace["queries"]["expanded"] == [FIRST]
    [note] = result.trace["queries"]["expansion_notes"]
    assert note["note"].startswith("kept only the original query: no usable variant")
    assert result.error is None


def test_the_model_requests_per_turn_are_exactly_what_the_profile_implies(
    openai_server, ragchat_settings_override, conversation,
):
    use_openai(ragchat_settings_override, openai_server, query_transformers=["rewrite"],
               query_expanders=["multi_query"], options={"multi_query": {"n": 3}})
    openai_server.when(contains="Search queries:", reply="a\nb\nc")
    counts = []
    for text in (FIRST, FOLLOW_UP, "And the camera?"):
        openai_server.reset()
        openai_server.when(contains="Search queries:", reply="Aurora X2 a\nAurora X2 b\nAurora X2 c")
        result = run_turn_sync(conversation, text)
        assert result.error is None
        counts.append((openai_server.count("chat/completions"), openai_server.count("embeddings")))
        assert len(result.trace["queries"]["expanded"]) == 4  # the query and 3 variants, one embedding batch

    # First turn: expansion + answer (no history, no rewrite); then rewrite + expansion + answer.
    assert counts == [(2, 1), (3, 1), (3, 1)]


def test_offline_profiles_are_unchanged():
    components = components_for(get_profile())
    assert [c.name for c in components.query_transformers] == ["followup"]
    assert [c.name for c in components.query_expanders] == ["synonyms", "asker_rows"]  # offline; no multi_query


# --- The reply checks, directly ------------------------------------------------------------------


@pytest.mark.parametrize("reply,expected", [
    ("Aurora X2 price", "Aurora X2 price"),
    ('  "Aurora X2 price"  ', "Aurora X2 price"),
    ("Search query: `Aurora X2 price`", "Aurora X2 price"),
    ("«Aurora X2 Preis»", "Aurora X2 Preis"),
    ("\n\nAurora X2 price\n", "Aurora X2 price"),
])
def test_check_reply_accepts_one_line_with_its_decorations_removed(reply, expected):
    assert check_reply(reply, max_lines=1, max_chars=300) == (expected, "")


def test_multi_query_variants_parsing(openai_server, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {"query_expanders": ["multi_query"],
                                                    "options": {"multi_query": {"n": 2}}}})
    [expander] = components_for(get_profile()).query_expanders
    assert isinstance(expander, MultiQueryExpander)
    query = Query(text="battery life")
    assert expander.variants("1) Battery life\n2) battery runtime\n3. charge duration\n4. more", query) == [
        "battery runtime", "charge duration"]
    with pytest.raises(ImproperlyConfigured):
        MultiQueryExpander(get_profile(), n=2, prompt="{nope}")
