"""The LLM ``rewrite`` transformer's default prompt states the follow-up rules of the offline
``followup`` transformer, one example each (``REWRITE_EXAMPLES``); the loopback
OpenAI-compatible server is scripted with those examples, through full turns."""

from __future__ import annotations

from pathlib import Path

import pytest

from django_ragchat.stages.llm_transformers import REWRITE_EXAMPLES, RewriteTransformer
from django_ragchat.turn.pipeline import run_turn_sync
from tests.test_openai_backend import use_openai

pytestmark = pytest.mark.django_db

SAMPLE_DOCS = Path(__file__).resolve().parent.parent / "example_project" / "sample_docs"


def test_the_default_instructions_state_each_rule_with_its_example():
    instructions = RewriteTransformer.DEFAULT_INSTRUCTIONS.format(question="q", history="h")
    assert "replaces the old subject" in instructions and "never add the old subject's name" in instructions
    assert "keeps the subject" in instructions and "carries nothing" in instructions
    assert '"And the X?", "What about X?", "How about X?", "X?", "Same for X"' in instructions
    assert len(REWRITE_EXAMPLES) == 4
    for _rule, earlier, latest, query in REWRITE_EXAMPLES:
        assert f'after "{earlier}", the message "{latest}" becomes: {query}' in instructions


@pytest.fixture
def rewriting(openai_server, ragchat_settings_override):
    """``rewrite`` alone (no offline ``followup``), answering and embedding on the server, over
    the sample documents."""
    from django_ragchat.ingestion.pipeline import ingest_text

    use_openai(ragchat_settings_override, openai_server, ingest=False, query_transformers=["rewrite"], top_k=1)
    for path in sorted(SAMPLE_DOCS.glob("*.md")):
        ingest_text(f"sample/{path.name}", path.read_text(encoding="utf-8"), content_type="markdown")
    openai_server.reset()
    return openai_server


@pytest.mark.parametrize("rule, earlier, latest, query", REWRITE_EXAMPLES,
                         ids=[e[0].split(":")[0] for e in REWRITE_EXAMPLES])
def test_each_example_is_sent_with_the_rules_and_its_rewrite_is_searched(rewriting, conversation,
                                                                          rule, earlier, latest, query):
    run_turn_sync(conversation, earlier)
    rewriting.reset()
    rewriting.when(contains=f"Latest message: {latest}", reply=query, times=1)

    result = run_turn_sync(conversation, latest)

    assert result.trace["queries"]["final"] == query
    assert [r["query"] for r in result.trace["retrieval"]] == [query]
    rewrite_call = next(r.json for r in rewriting.requests if r.path.endswith("chat/completions"))
    system, user = rewrite_call["messages"]
    assert system["content"] == RewriteTransformer.DEFAULT_INSTRUCTIONS.format()
    assert f"User: {earlier}" in user["content"]
    assert user["content"].endswith(f"Latest message: {latest}\n\nSearch query:")


# The same rules over the sample documents: the model's reply (scripted as the rules say) finds
# the new subject's document, never the subject left behind.
SAMPLE_CASES = [
    ("What is the battery life of the Zephyr Buds?", "What about the Nimbus Tab?", "Nimbus Tab battery life",
     "nimbus-tab"),
    ("How much does the Aurora X2 cost?", "What is the battery life of the Zephyr Buds?", "Zephyr Buds battery life",
     "zephyr-buds"),
    ("How much do the Zephyr Buds cost?", "And their warranty?", "Zephyr Buds warranty", "zephyr-buds"),
    ("How much does the Nimbus Tab cost?", "Thanks. Now, what is your return policy?", "return policy", "support"),
]


@pytest.mark.parametrize("earlier, latest, query, document", SAMPLE_CASES)
def test_the_rules_over_the_sample_documents(rewriting, conversation, earlier, latest, query, document):
    run_turn_sync(conversation, earlier)
    rewriting.reset()
    rewriting.when(contains=f"Latest message: {latest}", reply=query, times=1)

    result = run_turn_sync(conversation, latest)

    assert result.trace["queries"]["final"] == query
    assert result.message["sources"][0]["source"] == f"sample/{document}.md"
