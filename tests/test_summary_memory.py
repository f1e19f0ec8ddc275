"""Summary memory: older turns folded into a rolling summary by the model, off the hot path,
through full turns against the loopback OpenAI-compatible server.

Folds are tasks of Django's tasks framework: on the immediate backend (the default) they run as
the turn completes; on the database backend a worker (``db_worker``) runs them. The worker has
its own database connection, so these tests use a committed database (``transaction=True``).
"""

from __future__ import annotations

import logging
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_ragchat import hookimpl
from django_ragchat.models import Conversation, MemoryRecord, Message
from django_ragchat.profiles import get_profile
from django_ragchat.stages.summary_memory import SummaryMemory
from django_ragchat.testing.openai_server import call, tool_calls
from django_ragchat.tokens import count_tokens
from django_ragchat.turn.context import components_for
from django_ragchat.turn.pipeline import run_turn_sync

pytestmark = pytest.mark.django_db(transaction=True)

SUMMARY_PREFIX = "Summary of our conversation so far (older messages are not shown):"


def summarise(request: dict) -> str:
    """The scripted summariser: names how many messages it was given and the newest question."""
    transcript = request["messages"][1]["content"].split("New messages:\n", 1)[1]
    users = re.findall(r"^User: (.*)$", transcript, flags=re.MULTILINE)
    return f"The user asked {len(users)} more questions, lately: {users[-1][:80]}"


@pytest.fixture
def summary_site(openai_server, ragchat_settings_override, product_corpus):
    """Answers and summaries from the loopback server, a small context window (so 300
    messages are far beyond it), the offline embedder over the product documents."""
    ragchat_settings_override(PROFILES={"default": {
        "llm": "openai", "memory": "summary", "context_window": 2000, "max_answer_tokens": 300,
        "options": {"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 5}},
    }})
    openai_server.when(contains="running summary of a conversation", reply=summarise, any_message=True)
    yield openai_server


def summary_calls(server) -> list[dict]:
    return [r.json for r in server.requests
            if r.path.endswith("chat/completions") and "running summary" in r.json["messages"][0]["content"]]


def answer_calls(server) -> list[dict]:
    return [r.json for r in server.requests
            if r.path.endswith("chat/completions") and "running summary" not in r.json["messages"][0]["content"]]


def question(i: int) -> str:
    product = ("Aurora X2", "Nimbus Tab", "Zephyr Buds")[i % 3]
    return f"Question {i}: what does the {product} cost and how long does its battery last?"


def test_the_prompt_stays_under_budget_across_a_300_message_conversation(summary_site, conversation):
    profile = get_profile()
    share = components_for(profile).memory.summary_share
    prompts, memories = [], []
    for i in range(150):
        result = run_turn_sync(conversation, question(i))
        assert result.error is None, result.error
        prompts.append(result.trace["prompt"])
        memories.append(result.trace["memory"])

    assert Message.objects.filter(conversation=conversation).count() == 300  # the log is never changed
    for prompt in prompts:
        assert prompt["history_tokens"] <= prompt["history_budget"]
        assert prompt["tokens"] <= profile.prompt_budget
    # With every fold in place before the next turn, nothing unsummarised is ever left out.
    assert all(m["not_shown"] == 0 for m in memories)
    assert max(m["unsummarized_messages"] for m in memories) < 20
    # The summary rolls forward: a handful of folds, each over the messages since the last.
    record = MemoryRecord.objects.get(conversation=conversation, kind="summary")
    assert record.covers_until_seq >= 280 and record.metadata["model"] == "gpt-4o-mini"
    folds = summary_calls(summary_site)
    assert 5 <= len(folds) <= 50  # the history budget holds some 6 turns: not a fold per turn
    assert folds[0]["messages"][1]["content"].startswith("Previous summary:\n(none yet)")
    assert all(fold["messages"][1]["content"].startswith("Previous summary:\nThe user asked") for fold in folds[1:])
    # A summary is asked to fit its share of the history budget.
    caps = {int(p["history_budget"] * share) for p in prompts}
    assert all(fold["max_tokens"] in caps for fold in folds)
    assert all(m["memory_tokens"] <= int(p["history_budget"] * share) for m, p in zip(memories, prompts))
    # What the model saw last: system prompt, the summary as a user/assistant pair, the newest turns.
    last = answer_calls(summary_site)[-1]["messages"]
    assert last[0]["role"] == "system" and last[0]["content"] == profile.system_prompt
    assert last[1]["role"] == "user" and last[1]["content"].startswith(f"{SUMMARY_PREFIX}\nThe user asked")
    assert memories[-1]["summary_covers_until_seq"] <= record.covers_until_seq  # a fold may follow the last turn
    assert last[2] == {"role": "assistant", "content": "Understood."}
    assert [m["role"] for m in last[3:]] == ["user", "assistant"] * ((len(last) - 4) // 2) + ["user"]
    assert question(149) in last[-1]["content"]


def test_with_a_worker_the_turn_only_enqueues_its_fold(summary_site, conversation, ragchat_settings_override):
    from django.core.management import call_command
    from django_tasks_db.models import DBTaskResult

    ragchat_settings_override(TASK_BACKEND="database")
    turns = 0
    while not DBTaskResult.objects.exists():
        run_turn_sync(conversation, question(turns))
        turns += 1
        assert turns < 40, "no fold was ever enqueued"

    # The turn that enqueued the fold returned without it: no summarising call, no summary.
    [task] = DBTaskResult.objects.all()
    assert task.task_path == "django_ragchat.tasks.fold_summary" and task.status == "READY"
    assert not summary_calls(summary_site)
    assert not MemoryRecord.objects.filter(conversation=conversation).exists()

    call_command("db_worker", "--batch", "--backend", "database", "--no-startup-delay", verbosity=0)
    task.refresh_from_db()
    assert task.status == "SUCCESSFUL", task.exception_class_path
    assert len(summary_calls(summary_site)) >= 1
    record = MemoryRecord.objects.get(conversation=conversation, kind="summary")
    result = run_turn_sync(conversation, "And the warranty?")
    assert result.trace["memory"]["summary_covers_until_seq"] == record.covers_until_seq


def test_while_no_summary_lands_the_oldest_turns_are_left_out_and_the_trace_says_so(
    summary_site, conversation, caplog,
):
    summary_site.reset()
    summary_site.when(contains="running summary of a conversation", any_message=True,
                      reply="I'm sorry, but I can't summarise this conversation.")
    profile = get_profile()
    with caplog.at_level(logging.WARNING, logger="django_ragchat.stages.summary_memory"):
        for i in range(30):
            result = run_turn_sync(conversation, question(i))
            assert result.trace["prompt"]["tokens"] <= profile.prompt_budget

    assert not MemoryRecord.objects.filter(conversation=conversation).exists()
    assert result.trace["memory"]["not_shown"] > 0
    assert result.trace["memory"]["memory_tokens"] == 0
    assert result.trace["prompt"]["history_tokens"] <= result.trace["prompt"]["history_budget"]
    assert "which is not a summary" in caplog.text


def test_staff_read_and_correct_the_summary_and_the_model_sees_the_correction(
    summary_site, conversation, admin_client,
):
    for i in range(12):
        run_turn_sync(conversation, question(i))
    record = MemoryRecord.objects.get(conversation=conversation, kind="summary")

    page = admin_client.get(f"/admin/django_ragchat/conversation/{conversation.pk}/change/")
    assert page.status_code == 200 and record.content in page.content.decode()

    record.content = "The user is comparing the Aurora X2 and the Nimbus Tab for a gift."
    record.save()
    summary_site.reset()
    summary_site.when(contains="running summary of a conversation", reply=summarise, any_message=True)
    run_turn_sync(conversation, "Which one has the better battery?")

    assert answer_calls(summary_site)[-1]["messages"][1]["content"] == f"{SUMMARY_PREFIX}\n{record.content}"
    for i in range(12, 20):  # until the next fold, which starts from the corrected text
        run_turn_sync(conversation, question(i))
    assert summary_calls(summary_site)[0]["messages"][1]["content"].startswith(f"Previous summary:\n{record.content}")


def test_long_term_facts_about_the_user_are_shown_to_the_model(summary_site, conversation, other_user):
    MemoryRecord.objects.create(user=conversation.owner, kind="fact", content="Prefers prices in euros.")
    MemoryRecord.objects.create(user=other_user, kind="fact", content="Lives in Oslo.")
    MemoryRecord.objects.create(conversation=conversation, kind="fact", content="Is buying a gift.")
    elsewhere = Conversation.objects.create(owner=other_user)
    MemoryRecord.objects.create(conversation=elsewhere, kind="fact", content="Owns a Nimbus Tab.")

    result = run_turn_sync(conversation, "How much is the Aurora X2?")

    memory = answer_calls(summary_site)[-1]["messages"][1]
    assert memory["role"] == "user" and memory["content"].startswith("Facts about me:\n")
    assert "- Prefers prices in euros." in memory["content"] and "- Is buying a gift." in memory["content"]
    assert "Oslo" not in memory["content"] and "Nimbus Tab" not in memory["content"]
    assert result.trace["memory"]["facts"] == 2
    # The facts are the memory's words, not the user's opening question: never searched with.
    assert "Facts about me" not in result.trace["queries"]["final"], result.trace["queries"]
    assert "Facts about me" not in run_turn_sync(conversation, "And how long is its warranty?").trace[
        "queries"]["final"]


class FactsPlugin:
    """The plugin of docs/openai.md: contributes a long-term fact from the user's words."""

    @hookimpl
    async def on_turn_completed(turn, message):
        if "metric units" in turn.question.lower() and turn.conversation.owner_id:
            await MemoryRecord.objects.aget_or_create(user_id=turn.conversation.owner_id, kind="fact",
                                                      conversation=None, content="Prefers metric units.")


def test_a_plugin_contributes_facts_by_creating_memory_records(summary_site, conversation, ragchat_settings_override):
    ragchat_settings_override(PLUGINS=["tests.test_summary_memory.FactsPlugin"])

    run_turn_sync(conversation, "Please answer in metric units. How heavy is the Aurora X2?")
    elsewhere = Conversation.objects.create(owner=conversation.owner)
    result = run_turn_sync(elsewhere, "How big is the Nimbus Tab?")

    assert MemoryRecord.objects.get(kind="fact").user_id == conversation.owner_id
    assert answer_calls(summary_site)[-1]["messages"][1]["content"] == "Facts about me:\n- Prefers metric units."
    assert result.trace["memory"]["facts"] == 1


def test_a_turn_issues_the_same_number_of_queries_whatever_the_history_length(summary_site, user,
                                                                             ragchat_settings_override):
    def conversation_with(earlier: int) -> Conversation:
        conversation = Conversation.objects.create(owner=user, last_seq=earlier)
        Message.objects.bulk_create([
            Message(conversation=conversation, seq=seq, role="user" if seq % 2 else "assistant",
                    content=f"Message {seq} about the Aurora X2 battery.", token_count=count_tokens("x " * 9))
            for seq in range(1, earlier + 1)
        ])
        return conversation

    # The fold that 200 messages call for is a task of its own, not part of the turn's queries.
    ragchat_settings_override(TASK_BACKEND="dummy")
    counts = []
    for earlier in (2, 200):
        conversation = conversation_with(earlier)
        run_turn_sync(conversation, "warm-up: how long does the battery last?")  # loads the vector index
        with CaptureQueriesContext(connection) as queries:
            run_turn_sync(conversation, "How long does the Aurora X2 battery last?")
        counts.append(len(queries))

    assert counts[0] == counts[1]


# --- tool calls ----------------------------------------------------------------------------------


@pytest.fixture
def summary_tools(openai_server, ragchat_settings_override):
    """``summary_tools(**profile)``: summary memory on a profile offering the tests' ``weather``
    tool, answers and summaries from the loopback server."""

    def apply(**profile):
        ragchat_settings_override(PLUGINS=["tests.tool_plugins"], PROFILES={"default": {
            "llm": "openai", "memory": "summary", "tools": ["weather"], "empty_context": "answer",
            "options": {"openai": {"base_url": openai_server.base_url, "max_retries": 0, "timeout": 5}}, **profile,
        }})
        openai_server.when(contains="running summary of a conversation", reply=summarise, any_message=True)

    return apply


def weather_turn(server, conversation, city: str, call_id: str | None = None):
    server.script(tool_calls(call("weather", city=city, id=call_id)), f"Warm in {city.split()[0]}.")
    result = run_turn_sync(conversation, f"Is it warm in {city.split()[0]}?")
    assert result.error is None and result.trace["tool_steps"] == 1, result.error
    return result


def test_the_turns_shown_verbatim_carry_their_tool_calls_and_the_summarised_ones_do_not(
    summary_tools, openai_server, conversation,
):
    """As the token-window memory does (docs/tools.md, "Memory sends them back"): the summary
    memory sent only the words of earlier answers, so "And tomorrow?" after a looked-up result
    was asked without it (a new user's trial). The calls of the turns folded into the summary
    are not sent: the summary stands for them."""
    summary_tools()
    weather_turn(openai_server, conversation, "Lyon", "w1")
    weather_turn(openai_server, conversation, "Oslo", "w2")
    # The first turn is summarised (as a fold leaves it).
    MemoryRecord.objects.create(conversation=conversation, kind="summary", covers_until_seq=2,
                                content="The user asked about the weather in Lyon: warm.")
    openai_server.script("Mild.")
    result = run_turn_sync(conversation, "And tomorrow?")

    messages = answer_calls(openai_server)[-1]["messages"]
    shape = [(m["role"], [c["id"] for c in m.get("tool_calls") or ()], m.get("tool_call_id")) for m in messages]
    assert shape == [("system", [], None), ("user", [], None), ("assistant", [], None),  # the summary's pair
                     ("user", [], None), ("assistant", ["w2"], None), ("tool", [], "w2"), ("assistant", [], None),
                     ("user", [], None)]
    assert messages[1]["content"].endswith("The user asked about the weather in Lyon: warm.")
    assert messages[4]["tool_calls"][0]["function"] == {"name": "weather", "arguments": '{"city": "Oslo"}'}
    assert '"city": "Oslo"' in messages[5]["content"] and messages[6]["content"] == "Warm in Oslo."
    assert not any("w1" in str(m) or '"Lyon"' in str(m) for m in messages)
    assert result.trace["memory"]["not_shown"] == 0


def test_a_fold_counts_the_tool_calls_of_the_turns_it_keeps(summary_tools, openai_server, conversation):
    """The turns a fold leaves unsummarised are sent with their calls: it keeps as many as fit
    with them, so the next turns still fit beside the summary and none is left out unsummarised
    (counted without them, a fold kept every turn, folded nothing, and the oldest turns were
    dropped unsummarised)."""
    summary_tools(context_window=2000, max_answer_tokens=300)
    results = [weather_turn(openai_server, conversation, f"City{i} " + "x" * 200) for i in range(8)]

    assert len(summary_calls(openai_server)) >= 2
    record = MemoryRecord.objects.get(conversation=conversation, kind="summary")
    assert record.covers_until_seq >= 8 and "City" in record.content
    for result in results:
        assert result.trace["memory"]["not_shown"] == 0
        assert result.trace["prompt"]["history_tokens"] <= result.trace["prompt"]["history_budget"]
    last = answer_calls(openai_server)[-2]["messages"]  # the last turn's first request: its history
    assert last[1]["content"].startswith(SUMMARY_PREFIX)
    assert [m["role"] for m in last[3:]] == ["user", "assistant", "tool", "assistant", "user"]
    assert "City6" in last[5]["content"] and "City7" in last[-1]["content"]


def test_summary_memory_options_are_checked(ragchat_settings_override):
    from django_ragchat.checks import check_profiles

    ragchat_settings_override(PROFILES={
        "shares": {"memory": "summary", "options": {"summary": {"summary_share": 0.5, "keep_share": 0.5}}},
        "template": {"memory": "summary", "options": {"summary": {"summary_template": "no field"}}},
        "fine": {"memory": "summary", "options": {"summary": {"model": "small-model", "max_facts": 5}}},
    })

    messages = {e.msg.split(":")[0]: e.msg for e in check_profiles()}

    assert "add up to less than 1" in messages["Profile 'shares'"]
    assert "{summary}" in messages["Profile 'template'"]
    assert "Profile 'fine'" not in messages
    memory = components_for(get_profile("fine")).memory
    assert isinstance(memory, SummaryMemory) and memory.model.chat.model == "small-model"
