"""The ``citations`` augmenter (the answer builder in a turn): options per profile, the saved
``MessageSource.cited`` flags, and the same citations in the same order live and through REST."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.cache import cache
from rest_framework.test import APIClient

from django_ragchat import hookimpl
from django_ragchat.checks import check_profiles
from django_ragchat.models import MessageSource, TurnTrace
from django_ragchat.stages.answers import build_answer
from django_ragchat.stages.llms import LLMBackend
from django_ragchat.turn.pipeline import run_turn_sync, stream_turn
from django_ragchat.types import LLMDelta

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"
REASONED = ("<thinking>Passage [3] is about earbuds; [1] and [2] look relevant.</thinking>\n"
            "<answer>The Aurora X2 costs $699 [2][1]. See also [7].</answer>")


class ScriptedBackend(LLMBackend):
    """Answers with the ``reply`` option, streamed a few characters at a time."""

    name = "scripted"
    model = "scripted"

    def __init__(self, profile, *, reply: str = "", **options):
        super().__init__(profile, **options)
        self.reply = reply

    async def stream(self, prompt, turn):
        for start in range(0, len(self.reply), 7):
            yield LLMDelta(text=self.reply[start:start + 7])


class ReindexingBackend(LLMBackend):
    """Answers after the documents it was given were ingested again: their chunks are replaced
    while the answer is written, as when a tool changes the object a source indexes."""

    name = "reindexing"
    model = "reindexing"

    async def stream(self, prompt, turn):
        from django_ragchat.ingestion.pipeline import ingest_text
        from tests.conftest import PRODUCT_DOCS

        for source, text in PRODUCT_DOCS.items():
            await sync_to_async(ingest_text)(source, text + "\n\nUpdated today.", content_type="markdown")
        yield LLMDelta(text="The Aurora X2 costs $699 [1].")


class UnsavableTraceBackend(LLMBackend):
    """Answers, and leaves in the turn's trace what JSON cannot hold (a plugin's bug)."""

    name = "unsavable_trace"
    model = "unsavable_trace"

    async def stream(self, prompt, turn):
        turn.trace["plugin"] = {"started": object()}
        yield LLMDelta(text="The Aurora X2 costs $699 [1].")


class ScriptedPlugin:
    @staticmethod
    @hookimpl
    def register_llm_backends(register):
        register(ScriptedBackend)
        register(ReindexingBackend)
        register(UnsavableTraceBackend)


def profile(reply=REASONED, **citations):
    return {"llm": "scripted", "top_k": 3,
            "options": {"scripted": {"reply": reply}, "citations": citations}}


@pytest.fixture
def scripted(ragchat_settings_override):
    def configure(**profiles):
        ragchat_settings_override(PLUGINS=["tests.test_answers_pipeline.ScriptedPlugin"], PROFILES=profiles)
    return configure


def collect(conversation, text, **kwargs):
    async def run():
        return [event async for event in stream_turn(conversation, text, **kwargs)]
    return async_to_sync(run)()


def listed_assistant(conversation):
    cache.clear()  # the rate limiter counts in the cache
    client = APIClient()
    client.force_login(conversation.owner)
    body = client.get(f"/api/ragchat/conversations/{conversation.pk}/messages/").json()
    return [m for m in body["results"] if m["role"] == "assistant"][-1]


@pytest.mark.parametrize("stream", [False, True])
def test_xml_answer_citations_in_prompt_order_live_and_through_rest(scripted, product_corpus, conversation, stream):
    scripted(default=profile(extract_xml_tags=["answer"]))
    events = collect(conversation, QUESTION, stream=stream)
    done = events[-1]
    assert done.type == "done", done
    message = done.message
    # The answer is the tag's content; the thinking is in the trace, not in the message.
    assert message["content"] == "The Aurora X2 costs $699 [2][1]. See also [7]."
    # [2][1] in the text, but citations come in prompt order; [3] was only in the thinking; [7]
    # is out of range.
    assert [c["index"] for c in message["citations"]] == [1, 2]
    trace = TurnTrace.objects.get(message_id=message["id"]).data
    assert "Passage [3] is about earbuds" in trace["answer_builder"]["discarded"]
    assert any("[7]" in w for w in trace["warnings"])
    saved = MessageSource.objects.filter(message_id=message["id"]).order_by("rank")
    assert [s.rank for s in saved if s.cited] == [1, 2] and len(saved) == 3
    assert {s.chunk_id for s in saved if s.cited} == {c["chunk_id"] for c in message["citations"]}
    # The function itself, on the same reply and the prompt's documents, says the same.
    prompt_chunks = [d["chunk_id"] for d in trace["documents"]]
    built = build_answer(REASONED, prompt_chunks, reference_pattern="default", extract_xml_tags=["answer"])
    assert built.text == message["content"]
    assert [d.document for d in built.referenced] == [c["chunk_id"] for c in message["citations"]]
    rest = listed_assistant(conversation)
    assert rest["content"] == message["content"]
    assert [(c["index"], c["chunk_id"]) for c in rest["citations"]] == \
        [(c["index"], c["chunk_id"]) for c in message["citations"]]


def test_acm_reference_pattern_as_a_profile_option(scripted, product_corpus, conversation):
    scripted(default=profile(reply="It costs $699 [1, 3].", reference_pattern="acm"))
    result = run_turn_sync(conversation, QUESTION)
    assert [c["index"] for c in result.message["citations"]] == [1, 3]


def test_answer_pattern_option_and_references_in_the_discarded_part(scripted, product_corpus, conversation):
    scripted(default=profile(reply="Notes about [3]. FINAL ANSWER: $699 [1]", pattern=r"FINAL ANSWER: (.*)"))
    result = run_turn_sync(conversation, QUESTION)
    assert result.answer == "$699 [1]"
    assert [c["index"] for c in result.message["citations"]] == [1]


def test_no_reference_pattern_cites_every_document(scripted, product_corpus, conversation):
    scripted(default=profile(reply="It costs $699.", reference_pattern=None))
    result = run_turn_sync(conversation, QUESTION)
    assert [c["index"] for c in result.message["citations"]] == [1, 2, 3]
    assert all(s["cited"] for s in listed_assistant(conversation)["sources"])


def test_return_only_referenced_keeps_only_cited_sources_with_their_prompt_index(scripted, product_corpus, conversation):
    scripted(default=profile(reply="It costs $699 [2].", return_only_referenced=True))
    result = run_turn_sync(conversation, QUESTION)
    assert [s["index"] for s in result.message["sources"]] == [2]
    rest = listed_assistant(conversation)
    assert [(s["index"], s["cited"]) for s in rest["sources"]] == [(2, True)]
    assert [c["index"] for c in rest["citations"]] == [2]


def test_a_pattern_with_two_groups_is_a_system_check_error(scripted):
    scripted(default={}, broken={"options": {"citations": {"pattern": r"(a)(b)"}}},
             acm_typo={"options": {"citations": {"reference_pattern": "[unclosed"}}})
    errors = [e for e in check_profiles() if e.id == "ragchat.E002"]
    assert len(errors) == 2
    assert "'broken'" in errors[0].msg and "2 capture groups" in errors[0].msg
    assert "'acm_typo'" in errors[1].msg and "not a valid regular expression" in errors[1].msg


def test_the_api_never_500s_on_a_hostile_reply(scripted, product_corpus, conversation):
    scripted(default=profile(reply="<answer>[0] [99999999999999999999] [5-1] <b>x</b>", extract_xml_tags=["answer"]))
    cache.clear()
    client = APIClient()
    client.force_login(conversation.owner)
    response = client.post(f"/api/ragchat/conversations/{conversation.pk}/messages/",
                           json.dumps({"content": QUESTION}), content_type="application/json")
    assert response.status_code == 201, response.content
    answer = response.json()["assistant_message"]
    assert answer["status"] == "complete" and answer["citations"] == []


def test_streamed_thinking_never_reaches_the_client(scripted, product_corpus, conversation):
    scripted(default=profile(extract_xml_tags=["answer"]))
    events = collect(conversation, QUESTION, stream=True)
    streamed = "".join(e.text for e in events if e.type == "delta")
    assert streamed == "The Aurora X2 costs $699 [2][1]. See also [7]."
    assert "earbuds" not in streamed and "thinking" not in streamed
    assert events[-1].message["content"] == streamed


@pytest.mark.django_db(transaction=True)  # the link to a chunk is checked at commit
@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_whose_sources_were_replaced_while_it_was_written_is_saved(scripted, product_corpus,
                                                                           conversation, stream):
    """A new user's gym: a tool cancelling a booking re-indexed the booking, and the answer's
    sources pointed at chunks gone by then. Saving failed (the error path too): the user read
    "Stopped before the end.", the conversation refused messages until the lease ran out, REST
    answered 500. The sources are now saved without their link, as a replaced chunk's are."""
    from django_ragchat.models import Chunk, Message

    scripted(default={"llm": "reindexing", "top_k": 3})
    if stream:
        events = collect(conversation, QUESTION)
        assert events[-1].type == "done", events[-1]
    else:
        run_turn_sync(conversation, QUESTION)
    answer = Message.objects.get(conversation=conversation, role="assistant")
    assert (answer.status, answer.content) == ("complete", "The Aurora X2 costs $699 [1].")
    sources = list(MessageSource.objects.filter(message=answer).order_by("rank"))
    assert len(sources) == 3 and all(s.chunk_id is None and s.title for s in sources)
    assert sources[0].cited and not Chunk.objects.filter(pk__in=[s.chunk_id for s in sources]).exists()
    assert not Message.objects.filter(lease_expires_at__isnull=False).exists()  # nothing holds the conversation
    assert run_turn_sync(conversation, "And the Nimbus Tab?").message["status"] == "complete"


@pytest.mark.django_db(transaction=True)
def test_an_answer_that_cannot_be_saved_is_saved_as_an_error_and_holds_nothing(scripted, product_corpus,
                                                                             conversation, caplog):
    """Saving an answer failed, then saving the failure failed the same way: the answer kept its
    lease and the conversation refused messages until it expired. Now the answer's text is
    saved as an error without its sources and trace, and the next message is answered."""
    from django_ragchat.models import Message

    scripted(default={"llm": "unsavable_trace", "top_k": 3})
    events = collect(conversation, QUESTION)
    assert events[-1].type == "error" and events[-1].code == "internal_error", events[-1]
    answer = Message.objects.get(conversation=conversation, role="assistant")
    assert (answer.status, answer.lease_expires_at) == ("error", None)
    assert answer.content == "The Aurora X2 costs $699 [1]." and answer.metadata["error"]["code"] == "internal_error"
    assert not MessageSource.objects.exists() and not TurnTrace.objects.exists()
    assert "could not save the failed answer" in caplog.text
    scripted(default={"llm": "scripted", "top_k": 3, "options": {"scripted": {"reply": "Yes [1]."}}})
    assert run_turn_sync(conversation, "And the Nimbus Tab?").message["status"] == "complete"

