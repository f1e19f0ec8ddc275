"""A plugin method that returns what its stage cannot use fails the turn at once, naming the
component (``django_ragchat.turn.results``); a guardrail's fails closed. A plugin author's
trial: a guardrail returning a string let the message through; a transformer's string, a
post-processor's ``None`` and a retriever's dicts failed with internals naming no component;
a retriever's in-memory hits were dropped under a warning naming no retriever."""

from __future__ import annotations

import pytest

from django_ragchat import hookimpl
from django_ragchat.exceptions import ProfileUnavailable
from django_ragchat.models import Message
from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.stages.postprocessors import DocumentPostProcessor
from django_ragchat.stages.responses import ResponseAugmenter
from django_ragchat.stages.retrievers import Retriever
from django_ragchat.stages.transformers import QueryTransformer
from django_ragchat.turn.pipeline import run_turn_sync
from django_ragchat.types import Redaction, RetrievedChunk

pytestmark = pytest.mark.django_db

QUESTION = "How much does the Aurora X2 cost?"


class StringGuard(Guardrail):
    name = "string_guard"
    enabled_by_default = False

    def check_input(self, text, turn):
        return "Refused: no durian questions"  # a Refusal was meant


class BlankRedaction(Guardrail):
    name = "blank_redaction"
    enabled_by_default = False

    def check_input(self, text, turn):
        return Redaction(" ", reason="took everything out")  # nothing left to keep or answer


class StringTransformer(QueryTransformer):
    name = "string_transformer"
    enabled_by_default = False

    def transform(self, query, turn):
        return query.text + " vegetarian"


class NoneProcessor(DocumentPostProcessor):
    name = "none_processor"
    enabled_by_default = False

    def process(self, query, documents, turn):
        documents.sort(key=lambda d: d.score)  # sorted in place, nothing returned


class DictRetriever(Retriever):
    name = "dict_retriever"
    enabled_by_default = False

    def retrieve(self, query, turn, k):
        return [{"chunk_id": 1, "score": 1.0}]


class InMemoryRetriever(Retriever):
    name = "in_memory"
    enabled_by_default = False

    def retrieve(self, query, turn, k):
        return [RetrievedChunk(chunk_id=10_000_000, text="Soak the beans overnight.", score=1.0, document_id=1,
                               source="tips", retriever=self.name)]


class NumberDelta(ResponseAugmenter):
    name = "number_delta"
    enabled_by_default = False

    def on_delta(self, text, turn):
        return len(text)


class BrokenPlugin:
    @staticmethod
    @hookimpl
    def register_guardrails(register):
        register(StringGuard)
        register(BlankRedaction)

    @staticmethod
    @hookimpl
    def register_query_transformers(register):
        register(StringTransformer)

    @staticmethod
    @hookimpl
    def register_document_postprocessors(register):
        register(NoneProcessor)

    @staticmethod
    @hookimpl
    def register_retrievers(register):
        register(DictRetriever)
        register(InMemoryRetriever)

    @staticmethod
    @hookimpl
    def register_response_augmenters(register):
        register(NumberDelta)


@pytest.fixture
def profile_with(ragchat_settings_override):
    def configure(**profile):
        ragchat_settings_override(PLUGINS=["tests.test_wrong_results.BrokenPlugin"], PROFILES={"default": profile})
    return configure


@pytest.mark.parametrize(("profile", "said"), [
    ({"guardrails": ["string_guard"]},
     "guardrail 'string_guard': check_input() returned str, not None, a Refusal or a Redaction"),
    ({"guardrails": ["blank_redaction"]},
     "guardrail 'blank_redaction': check_input() returned Redaction, not None, a Refusal or a Redaction whose "
     "text shows something"),
    ({"query_transformers": ["string_transformer"]},
     "query_transformer 'string_transformer': transform() returned str, not a Query, SkipRetrieval or an EndTurn"),
    ({"document_postprocessors": ["none_processor"]},
     "document_postprocessor 'none_processor': process() returned NoneType, not a list of RetrievedChunk"),
    ({"retrievers": ["dict_retriever"]},
     "retriever 'dict_retriever': retrieve() returned a list holding dict, not a list of RetrievedChunk"),
])
def test_a_wrong_result_fails_the_turn_naming_the_component(profile_with, product_corpus, conversation, caplog,
                                                            profile, said):
    profile_with(**profile)
    result = run_turn_sync(conversation, QUESTION)
    assert result.status == "error" and result.error.code == "internal_error"
    assert "$699" not in result.answer  # a guardrail that says nothing usable fails closed
    name = said.split("'")[1]
    assert f"'{name}' of plugin 'tests.test_wrong_results.BrokenPlugin'" in result.trace["error"]["raised_by"]
    assert said in result.trace["error"]["detail"] and said in caplog.text


def test_a_streamed_augmenters_wrong_delta_names_it(profile_with, product_corpus, conversation):
    profile_with(response_augmenters=["citations", "number_delta"])
    result = run_turn_sync(conversation, QUESTION, stream=True)
    assert result.status == "error"
    assert "response_augmenter 'number_delta': on_delta() returned int, not a str" in result.trace["error"]["detail"]


def test_a_retrievers_hits_that_are_no_stored_chunks_are_dropped_with_a_warning_naming_it(profile_with,
                                                                                        product_corpus,
                                                                                        conversation):
    profile_with(retrievers=["vector", "in_memory"])
    result = run_turn_sync(conversation, QUESTION)
    assert "$699" in result.answer
    assert any(w.startswith("retriever 'in_memory': 1 chunk(s)") and "no stored chunk" in w
               for w in result.trace["warnings"]), result.trace.get("warnings")
    assert Message.objects.filter(role="assistant", status="complete").count() == 1


# --- A profile that cannot be built, on a running server -------------------------------------------


BROKEN_PROFILE = {"document_postprocessors": ["drop_draft"]}  # no plugin registers it: ragchat.E002


@pytest.mark.django_db(transaction=True)
def test_a_profile_that_cannot_be_built_is_refused_alike_on_every_transport(ragchat_settings_override, user,
                                                                             product_corpus, caplog):
    """A plugin author's trial: a running server serves no system check, and a profile naming
    a component no plugin registers answered REST with an HTML 500 page, and left an empty
    conversation behind each refused first message of the widget. Now: 500
    ``profile_unavailable`` as JSON (REST, server-sent events) or an ``error`` frame (websocket),
    nothing saved, no conversation created, the cause in the log."""
    import json

    from asgiref.sync import async_to_sync
    from channels.testing import WebsocketCommunicator
    from django.test import Client

    from django_ragchat.models import Conversation
    from tests.asgi import application
    from tests.live_servers import caller_for
    from tests.test_api import API, client_for, post_json

    ragchat_settings_override(PROFILES={"default": BROKEN_PROFILE})
    conversation = Conversation.objects.create(owner=user)
    rest = post_json(client_for(user), f"{API}/conversations/{conversation.pk}/messages/", {"content": QUESTION})
    assert (rest.status_code, rest.json()["code"]) == (500, "profile_unavailable"), rest.content
    browser = Client()
    browser.force_login(user)
    sse = browser.post("/chat/stream/", data=json.dumps({"content": QUESTION}), content_type="application/json")
    assert (sse.status_code, json.loads(sse.content)["code"]) == (500, "profile_unavailable")

    cookie = caller_for(user).cookie_header.encode()

    async def over_the_socket():
        communicator = WebsocketCommunicator(application, "/ws/ragchat/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)])
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=10)  # ready
        await communicator.send_json_to({"type": "message", "content": QUESTION})
        frame = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return frame

    frame = async_to_sync(over_the_socket)()
    assert (frame["type"], frame["code"]) == ("error", "profile_unavailable") and "conversation_id" not in frame
    assert list(Conversation.objects.all()) == [conversation] and not Message.objects.exists()
    assert "its profile 'default' cannot be built: No document_postprocessor named 'drop_draft'" in caplog.text


@pytest.mark.parametrize("profiles, body, cause", [
    ({"default": {}, "helpdesk": BROKEN_PROFILE}, {"profile": "helpdesk"},
     "its profile 'helpdesk' cannot be built: No document_postprocessor named 'drop_draft'"),
    ({"default": BROKEN_PROFILE}, {}, "its profile 'default' cannot be built: No document_postprocessor"),
    ({"default": {}, "helpdesk": {"top_k": 0}}, {"profile": "helpdesk"}, "Profile 'helpdesk': top_k must be"),
])
def test_a_conversation_with_a_profile_that_cannot_be_built_is_not_created(ragchat_settings_override, user,
                                                                           profiles, body, cause, caplog):
    """A new user's helpdesk: ``POST conversations/`` with a profile that cannot be built
    answered 201 and left an empty conversation no message could use. Now refused as a message
    to it is: 500 ``profile_unavailable``, nothing created, the cause in the log."""
    from django_ragchat.models import Conversation
    from tests.test_api import API, client_for, post_json

    ragchat_settings_override(PROFILES=profiles)
    response = post_json(client_for(user), f"{API}/conversations/", {"title": "Printer", **body})
    assert response.status_code == 500, response.content
    assert response.json() == {"code": "profile_unavailable", "detail": ProfileUnavailable.default_message}
    assert not Conversation.objects.exists()
    assert "ragchat cannot start a conversation" in caplog.text and cause in caplog.text
    if "helpdesk" in profiles:  # the other profiles are untouched
        assert post_json(client_for(user), f"{API}/conversations/", {"title": "Printer"}).status_code == 201


def test_an_option_that_names_no_component_of_the_profile_is_a_warning(ragchat_settings_override):
    """A plugin author's trial: ``"banned_wrds": {...}`` under a profile's options was ignored
    without a word, and the guardrail ran with its defaults."""
    from django.core.checks import run_checks

    ragchat_settings_override(PLUGINS=["tests.test_wrong_results.BrokenPlugin"], PROFILES={
        "default": {"guardrails": ["string_guard"], "options": {
            "string_gard": {"words": ["durian"]}, "openai": {"model": "m"}}}})
    warned = [m for m in run_checks() if m.id == "ragchat.W043"]
    assert [m.msg for m in warned] == [
        "Profile 'default': options['string_gard'] names no component of this profile, so nothing reads it."]
    assert "string_guard" in warned[0].hint
