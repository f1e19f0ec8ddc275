"""The REST API through the real stack: URL routing, DRF, the pipeline and the database.

Who may call what is in test_permissions_matrix.py; here: what each endpoint does, its bad
input, its failure modes and its query counts.
"""

from __future__ import annotations

import json
import re

import pytest
from django.core.cache import cache
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.crypto import get_random_string
from rest_framework.test import APIClient

from django_ragchat import hookimpl, plugins
from django_ragchat.exceptions import LLMError
from django_ragchat.models import (
    Chunk,
    Conversation,
    Document,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
)
from django_ragchat.stages.guardrails import Guardrail
from django_ragchat.stages.llms import LLMBackend
from django_ragchat.tokens import count_tokens
from django_ragchat.turn import limits
from django_ragchat.types import LLMDelta, Redaction, Refusal

pytestmark = pytest.mark.django_db

API = "/api/ragchat"
QUESTION = "How much does the Aurora X2 cost?"


@pytest.fixture(autouse=True)
def _clear_limits():
    # The rate limiter counts in the cache; user ids repeat between tests.
    cache.clear()
    yield
    cache.clear()


def client_for(user=None, **kwargs) -> APIClient:
    client = APIClient(**kwargs)
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def alice(user):
    return client_for(user)


def post_json(client, url, body, **extra):
    return client.post(url, json.dumps(body), content_type="application/json", **extra)


def messages_url(conversation) -> str:
    return f"{API}/conversations/{conversation.pk}/messages/"


# --- Conversations ----------------------------------------------------------------------------


def test_create_list_rename_and_delete_a_conversation(alice, user, other_user):
    created = post_json(alice, f"{API}/conversations/", {"title": "Phones"})
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["title"] == "Phones" and body["profile"] == "default" and body["last_seq"] == 0
    conversation = Conversation.objects.get(pk=body["id"])
    assert conversation.owner == user
    Conversation.objects.create(owner=other_user, title="Bob's")

    listed = alice.get(f"{API}/conversations/").json()
    assert listed["count"] == 1 and [c["title"] for c in listed["results"]] == ["Phones"]

    renamed = alice.patch(f"{API}/conversations/{conversation.pk}/", {"title": "Tablets"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["title"] == "Tablets"
    conversation.refresh_from_db()
    assert conversation.title == "Tablets"
    # Only the title can change, and PUT is not offered.
    assert alice.put(f"{API}/conversations/{conversation.pk}/", {"title": "x"}, format="json").status_code == 405

    assert alice.delete(f"{API}/conversations/{conversation.pk}/").status_code == 204
    assert not Conversation.objects.filter(pk=conversation.pk).exists()
    assert alice.get(f"{API}/conversations/{conversation.pk}/").status_code == 404


def test_conversations_are_listed_most_recently_active_first_and_paginated(alice, user):
    conversations = [Conversation.objects.create(owner=user, title=f"c{i}") for i in range(5)]
    # A message makes the oldest conversation the most recently active.
    post_json(alice, messages_url(conversations[0]), {"content": QUESTION})

    page = alice.get(f"{API}/conversations/", {"limit": 2}).json()
    assert page["count"] == 5
    assert [c["title"] for c in page["results"]] == ["c0", "c4"]
    rest = alice.get(page["next"]).json()
    assert [c["title"] for c in rest["results"]] == ["c3", "c2"]


def test_an_untitled_conversation_is_labelled_by_its_first_question(alice, user, django_assert_max_num_queries):
    """Started through the API, a conversation has no title: its ``label`` is its first question,
    shortened at a word boundary, so a list of them does not read "Conversation of <date>" each
    time (found by a new user); a title wins; with neither the label is empty."""
    question = "Is the Aurora X2 available in blue, and if it is, is the price the same as the black one?"
    asked = post_json(alice, f"{API}/conversations/", {}).json()
    assert asked["title"] == "" and asked["label"] == ""
    assert post_json(alice, f"{API}/conversations/{asked['id']}/messages/", {"content": question}).status_code == 201
    post_json(alice, f"{API}/conversations/{asked['id']}/messages/", {"content": "And in green?"})
    titled = post_json(alice, f"{API}/conversations/", {"title": "Phones"}).json()
    assert titled["label"] == "Phones"
    label = "Is the Aurora X2 available in blue, and if it is, is the price the same as the…"
    assert len(label) <= 81 and question.startswith(label[:-1])
    assert alice.get(f"{API}/conversations/{asked['id']}/").json()["label"] == label
    for i in range(3):
        other = Conversation.objects.create(owner=user)
        Message.objects.create(conversation=other, seq=1, role="user", content=f"Question {i}")
    with django_assert_max_num_queries(8):  # one query for the page's labels, not one each
        listed = alice.get(f"{API}/conversations/").json()["results"]
    labels = {c["id"]: c["label"] for c in listed}
    assert labels[asked["id"]] == label and labels[titled["id"]] == "Phones"
    assert {"Question 0", "Question 1", "Question 2"} <= set(labels.values())
    # Renamed, the title is the label; blank again, the question is.
    alice.patch(f"{API}/conversations/{asked['id']}/", {"title": "Blue"}, format="json")
    assert alice.get(f"{API}/conversations/{asked['id']}/").json()["label"] == "Blue"
    renamed = alice.patch(f"{API}/conversations/{asked['id']}/", {"title": ""}, format="json").json()
    assert renamed["label"] == label


#: What a new user's helpdesk had a guardrail refuse, then saw as the conversation's name.
SECRET = "password: Hunter2-xyz"


def test_a_question_an_input_guardrail_refused_never_names_the_conversation(alice, user, ragchat_settings_override):
    """A new user's helpdesk: an input guardrail refused "password: Hunter2-xyz", and the
    conversation was named after it, so the password stood in the chat page's list, the admin
    and the API. Neither the label nor a title made from it (as a client may name a new
    conversation before its turn runs) keeps it; the message itself is kept (the log and its
    trace: docs/plugins.md). The next question that is not refused names it."""
    ragchat_settings_override(PROFILES={"default": {"options": {"blocked_phrases": {"phrases": ["password:"]}}}})
    named_after_it = Conversation.objects.create(owner=user, title=SECRET)
    untitled = post_json(alice, f"{API}/conversations/", {}).json()
    own_title = Conversation.objects.create(owner=user, title="Printer on floor 3")
    for pk in (named_after_it.pk, untitled["id"], own_title.pk):
        sent = post_json(alice, f"{API}/conversations/{pk}/messages/", {"content": SECRET})
        assert sent.status_code == 201 and sent.json()["assistant_message"]["content"] == "I can't help with that request."
    assert Conversation.objects.get(pk=named_after_it.pk).title == ""
    assert Conversation.objects.get(pk=own_title.pk).title == "Printer on floor 3"  # the user's own stays
    for pk in (named_after_it.pk, untitled["id"]):
        assert alice.get(f"{API}/conversations/{pk}/").json()["label"] == ""
    listed = alice.get(f"{API}/conversations/")
    assert "Hunter2" not in listed.content.decode()
    assert Message.objects.filter(conversation=named_after_it, content=SECRET).exists()  # kept, as documented
    post_json(alice, f"{API}/conversations/{untitled['id']}/messages/", {"content": QUESTION})
    labels = {c["id"]: c["label"] for c in alice.get(f"{API}/conversations/").json()["results"]}
    assert labels[untitled["id"]] == QUESTION and labels[str(named_after_it.pk)] == ""
    assert alice.get(f"{API}/conversations/{untitled['id']}/").json()["label"] == QUESTION


def test_a_conversation_with_a_named_profile(alice, ragchat_settings_override):
    ragchat_settings_override(PROFILES={"default": {}, "support": {"top_k": 2}})
    response = post_json(alice, f"{API}/conversations/", {"profile": "support"})
    assert response.status_code == 201 and response.json()["profile"] == "support"


@pytest.mark.parametrize("body, field, code", [
    ({"profile": "nope"}, "profile", "unknown_profile"),  # the streaming transports' code for it
    ({"title": "x" * 201}, "title", "invalid"),
    ({"title": 12}, "title", "invalid"),
    ({"title": "a\x00b"}, "title", "invalid"),
    ({"title": "\ud800"}, "title", "invalid"),
])
def test_bad_conversation_input_is_a_400_naming_the_field(alice, body, field, code):
    response = post_json(alice, f"{API}/conversations/", body)
    assert response.status_code == 400
    error = response.json()
    assert error["code"] == code and field in error["errors"] and error["detail"]
    assert not Conversation.objects.exists()


def test_the_conversation_list_filters_by_profile(alice, user, ragchat_settings_override):
    """What a widget with a profile lists (docs/widget.md)."""
    ragchat_settings_override(PROFILES={"default": {}, "support": {}})
    support = Conversation.objects.create(owner=user, profile="support")
    Conversation.objects.create(owner=user)
    listed = alice.get(f"{API}/conversations/?profile=support").json()["results"]
    assert [c["id"] for c in listed] == [str(support.pk)]
    assert len(alice.get(f"{API}/conversations/").json()["results"]) == 2
    assert alice.get(f"{API}/conversations/?profile=gone").json()["results"] == []
    for bad in ("%00", "x" * 101):
        response = alice.get(f"{API}/conversations/?profile={bad}")
        assert response.status_code == 400 and response.json()["errors"]["profile"], response.content


def test_a_message_may_start_a_conversation_only_with_a_profile_its_sender_may_use(user, ragchat_settings_override):
    """The streaming transports' ``profile`` (tests/test_sse.py, tests/test_websocket.py run it
    over real servers): a profile PROFILE_PERMISSION withholds is refused as an unknown one."""
    from django_ragchat.transport.turns import TurnRefused, new_conversation_options

    ragchat_settings_override(PROFILES={"default": {}, "support": {}},
                              PROFILE_PERMISSION="tests.test_openai_api_keys.no_profiles")
    assert new_conversation_options(user, None) == {}
    assert new_conversation_options(user, "default") == {"profile": "default"}  # always allowed
    for withheld in ("support", "nope", 5, "x" * 5_000):
        with pytest.raises(TurnRefused) as refused:
            new_conversation_options(user, withheld)
        assert (refused.value.code, refused.value.http_status) == ("unknown_profile", 400)
        assert len(refused.value.message) < 150
    ragchat_settings_override(PROFILE_PERMISSION="django_ragchat.permissions.any_profile")
    assert new_conversation_options(user, "support") == {"profile": "support"}


def test_unknown_profile_says_so(alice):
    error = post_json(alice, f"{API}/conversations/", {"profile": "nope"}).json()
    # The code the websocket and server-sent events give for the same cause (an outside probe).
    assert (error["code"], error["errors"]["profile"]) == ("unknown_profile", ["There is no profile named 'nope'."])
    error = post_json(alice, f"{API}/conversations/", {"profile": "nope", "title": 5}).json()
    assert error["code"] == "invalid"  # two problems: the general code
    # A profile that is no string, as the streaming transports say it (a new user's trial:
    # '"['default']" is not a valid choice.').
    for value in (["default"], 5, {"name": "default"}):
        error = post_json(alice, f"{API}/conversations/", {"profile": value}).json()
        assert error["errors"]["profile"] == ["A profile is named by a string."], value


def test_unknown_malformed_and_foreign_ids_answer_the_same_404(alice, other_user):
    foreign = Conversation.objects.create(owner=other_user)
    bodies = []
    for conversation_id in (foreign.pk, "0b3f2a47-0000-4000-8000-000000000000", "not-a-uuid", "1"):
        for url in (f"{API}/conversations/{conversation_id}/", f"{API}/conversations/{conversation_id}/messages/"):
            response = alice.get(url)
            assert response.status_code == 404
            bodies.append(response.content)
        response = post_json(alice, f"{API}/conversations/{conversation_id}/messages/", {"content": "hi"})
        assert response.status_code == 404
        bodies.append(response.content)
    assert set(bodies) == {b'{"code":"not_found","detail":"Not found."}'}
    assert not Message.objects.exists()


def test_reviewers_read_other_users_conversations_but_do_not_write_to_them(reviewer, conversation,
                                                                           django_user_model):
    # Being staff alone reads nobody's chats (a new user's trial: any staff account read every
    # conversation over the API while the admin turned it away): it takes view_conversation.
    clerk = django_user_model.objects.create_user("clerk", password="pw", is_staff=True)
    assert client_for(clerk).get(f"{API}/conversations/{conversation.pk}/").status_code == 404
    staff = client_for(reviewer)
    assert staff.get(f"{API}/conversations/{conversation.pk}/").status_code == 200
    for response in (post_json(staff, messages_url(conversation), {"content": QUESTION}),
                     staff.patch(f"{API}/conversations/{conversation.pk}/", {"title": "x"}, format="json"),
                     staff.delete(f"{API}/conversations/{conversation.pk}/")):
        assert response.status_code == 403
        assert response.json() == {"code": "forbidden",
                                   "detail": "You may read this conversation but not change it."}
    conversation.refresh_from_db()
    assert conversation.title == "" and not conversation.messages.exists()


# --- Messages ---------------------------------------------------------------------------------


def test_sending_a_message_answers_with_both_saved_messages(alice, product_corpus, conversation):
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == 201, response.json()
    body = response.json()
    user_message, answer = body["user_message"], body["assistant_message"]
    assert user_message["role"] == "user" and user_message["content"] == QUESTION and user_message["seq"] == 1
    assert answer["role"] == "assistant" and answer["status"] == "complete" and answer["seq"] == 2
    assert "$699" in answer["content"] and answer["error"] is None
    assert answer["conversation_id"] == str(conversation.pk)
    # The answer cites the Aurora X2 document, and lists every source it was given.
    assert answer["citations"] and all(c["source"] == "products/aurora-x2.md" for c in answer["citations"])
    assert [s["index"] for s in answer["sources"]] == list(range(1, len(answer["sources"]) + 1))
    first = answer["sources"][0]
    assert first["source"] == "products/aurora-x2.md" and first["snippet"] and first["document_id"]
    assert {c["index"] for c in answer["citations"]} == {s["index"] for s in answer["sources"] if s["cited"]}

    # What the turn returned is what the log shows.
    listed = alice.get(messages_url(conversation)).json()
    assert listed["count"] == 2
    assert listed["results"] == [user_message, answer]
    assert Message.objects.get(pk=answer["id"]).content == answer["content"]


def test_messages_are_paginated_in_sequence_order(alice, product_corpus, conversation):
    for question in (QUESTION, "Which warranty do Zephyr Buds have?", "How much is the Nimbus Tab?"):
        assert post_json(alice, messages_url(conversation), {"content": question}).status_code == 201
    page = alice.get(messages_url(conversation), {"limit": 4}).json()
    assert page["count"] == 6 and [m["seq"] for m in page["results"]] == [1, 2, 3, 4]
    assert [m["seq"] for m in alice.get(page["next"]).json()["results"]] == [5, 6]
    assert [m["seq"] for m in alice.get(messages_url(conversation), {"after": 4}).json()["results"]] == [5, 6]
    assert alice.get(messages_url(conversation), {"after": "x"}).status_code == 400


@pytest.mark.parametrize("raw_body, code", [
    ('{"content": ""}', "empty"),
    ('{"content": "  \\n\\t "}', "empty"),
    ('{"content": "\\u200b\\ufeff"}', "empty"),
    ('{"content": "a\\u0000b"}', "invalid_characters"),
    ('{"content": "half a pair: \\ud800"}', "invalid_characters"),
    ('{"content": 42}', "invalid_type"),
    ('{"content": null}', "invalid_type"),
    ('{"content": ["a list"]}', "invalid_type"),
    ('{"content": {"an": "object"}}', "invalid_type"),
    ('{"text": "the wrong key"}', "invalid_type"),
    ('{}', "invalid_type"),
    ('["not", "an", "object"]', "invalid_type"),
    ('"just a string"', "invalid_type"),
    ('{"content": "unterminated', "parse_error"),
])
def test_bad_messages_are_a_400_and_save_nothing(alice, conversation, raw_body, code):
    response = alice.post(messages_url(conversation), raw_body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == code and response.json()["detail"]
    assert not Message.objects.exists()
    conversation.refresh_from_db()
    assert conversation.last_seq == 0


def test_a_missing_content_says_it_is_required(alice, conversation):
    # The same code and words on every transport (test_sse.py, test_websocket.py, test_openai_endpoint.py).
    for body in ({}, {"content": None}, {"content": 42}):
        response = post_json(alice, messages_url(conversation), body)
        assert (response.status_code, response.json()["code"]) == (400, "invalid_type")
        assert response.json()["detail"] == "The message (content) is required and must be a string."


def test_a_body_is_read_in_its_declared_charset(alice, conversation):
    # The same bytes read alike on every transport (tests/test_sse.py, test_openai_endpoint.py).
    body = json.dumps({"content": "Crème brûlée?"}, ensure_ascii=False).encode("iso-8859-1")
    response = alice.post(messages_url(conversation), body, content_type="application/json; charset=iso-8859-1")
    assert response.status_code == 201 and response.json()["user_message"]["content"] == "Crème brûlée?"
    response = alice.post(messages_url(conversation), body, content_type="application/json")  # not UTF-8
    assert (response.status_code, response.json()["code"]) == (400, "parse_error")
    response = alice.post(messages_url(conversation), b'{"content": "hi"}', content_type="application/json; charset=base64")
    assert (response.status_code, response.json()["code"]) == (400, "parse_error")
    response = alice.post(messages_url(conversation), b'{"content": "hi"}', content_type="application/json; charset=bogus-xyz")
    assert (response.status_code, response.json()["code"]) == (400, "parse_error")  # no codec: not read as UTF-8
    assert conversation.messages.count() == 2


def test_a_form_encoded_message_is_refused_as_unsupported(alice, conversation):
    response = alice.post(messages_url(conversation), {"content": "hi"})  # multipart
    assert response.status_code == 415 and response.json()["code"] == "unsupported_media_type"


def test_a_message_over_the_character_limit_is_a_413(alice, conversation, ragchat_settings_override):
    ragchat_settings_override(MAX_MESSAGE_CHARS=1000)
    response = post_json(alice, messages_url(conversation), {"content": "x" * 1001})
    assert response.status_code == 413
    assert response.json() == {"code": "too_long", "detail": "The message has 1,001 characters; the limit is 1,000."}
    assert post_json(alice, messages_url(conversation), {"content": "x" * 1000}).status_code == 201


def test_a_20_mb_body_is_a_clean_413(alice, conversation):
    response = alice.post(messages_url(conversation), json.dumps({"content": "x" * (20 * 2**20)}),
                          content_type="application/json")
    assert response.status_code == 413
    assert response.json() == {"code": "too_large", "detail": "The request body is too large."}
    assert not Message.objects.exists()


def test_the_rate_limit_answers_429_with_retry_after(alice, user, conversation, ragchat_settings_override,
                                                     limits_clock):
    ragchat_settings_override(TURNS_PER_MINUTE=2)
    limits_clock.advance(45)
    for _ in range(2):
        assert post_json(alice, messages_url(conversation), {"content": QUESTION}).status_code == 201
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == 429
    assert response.json()["code"] == "rate_limited"
    # The two turns' bucket (40-50 s) weighs 2 * (1 - 5/10) = 1 once 5 s of the bucket a minute
    # after it have passed: one more fits in 60 s.
    assert response["Retry-After"] == "60"
    assert conversation.messages.count() == 4  # the refused turn saved nothing
    # The limit is per user: another user's turns are not refused.
    other = Conversation.objects.create(owner=user.__class__.objects.create_user("carol"))
    assert post_json(client_for(other.owner), messages_url(other), {"content": QUESTION}).status_code == 201


def test_too_many_concurrent_answers_is_a_429(alice, user, conversation, ragchat_settings_override):
    ragchat_settings_override(MAX_CONCURRENT_STREAMS=1)
    with limits.stream_slot(user):  # an answer being written elsewhere (another tab, another worker)
        response = post_json(alice, messages_url(conversation), {"content": QUESTION})
        assert response.status_code == 429
        # Soon: the held slot frees when its answer ends, not when its lease runs out.
        assert response.json()["code"] == "too_many_streams"
        assert response.json()["detail"] == "Another answer of yours is being written; wait for it to finish."
        assert response["Retry-After"] == "1"
    assert not conversation.messages.exists()
    assert post_json(alice, messages_url(conversation), {"content": QUESTION}).status_code == 201


def test_a_second_message_while_an_answer_is_streaming_is_a_409(alice, conversation):
    Message.objects.create(conversation=conversation, seq=1, role="assistant", status="streaming")
    Conversation.objects.filter(pk=conversation.pk).update(last_seq=1)
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == 409 and response.json()["code"] == "turn_in_progress"
    assert response["Retry-After"] == "1"  # as for a resend whose answer is still being written
    assert conversation.messages.count() == 1


class FailingBackend(LLMBackend):
    """Fails the way the configured error says (set per test through the profile's options)."""

    name = "failing"

    def __init__(self, profile, *, code="bad_response", retry_after=None, partial=""):
        super().__init__(profile)
        self.code, self.retry_after, self.partial = code, retry_after, partial

    async def stream(self, prompt, turn):
        if self.partial:
            yield LLMDelta(text=self.partial)
        raise LLMError(self.code, f"The model failed ({self.code}).", retry_after=self.retry_after)


class _FailingPlugin:
    @staticmethod
    @hookimpl
    def register_llm_backends(register):
        register(FailingBackend)


@pytest.mark.parametrize("options, status, retry_after", [
    ({"code": "bad_response"}, 502, None),
    ({"code": "stream_interrupted", "partial": "The Aurora "}, 502, None),
    ({"code": "timeout"}, 504, None),
    ({"code": "model_unavailable"}, 503, None),
    ({"code": "rate_limited", "retry_after": 7.2}, 503, "8"),
])
def test_a_model_failure_answers_with_the_error_and_both_saved_messages(
    alice, product_corpus, conversation, ragchat_settings_override, options, status, retry_after,
):
    ragchat_settings_override(PLUGINS=["tests.test_api._FailingPlugin"],
                              PROFILES={"default": {"llm": "failing", "options": {"failing": options}}})
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == status
    assert response.get("Retry-After") == retry_after
    body = response.json()
    assert body["code"] == options["code"] and body["detail"] == f"The model failed ({options['code']})."
    assert body["user_message"]["content"] == QUESTION and body["user_message"]["status"] == "complete"
    answer = body["assistant_message"]
    assert answer["status"] == "error" and answer["error"]["code"] == options["code"]
    # Whole answers come through complete(), which the streaming backend implements by
    # collecting the stream: a failure half-way loses nothing already saved.
    saved = Message.objects.get(pk=answer["id"])
    assert saved.status == "error" and saved.content == answer["content"]
    assert list(conversation.messages.values_list("seq", flat=True)) == [1, 2]
    # The conversation is not blocked.
    ragchat_settings_override(PROFILES={"default": {}})
    assert post_json(alice, messages_url(conversation), {"content": QUESTION}).status_code == 201


@pytest.fixture
def openai_profile(openai_server, ragchat_settings_override):
    """The default profile answering through the ``openai`` backend and the loopback server."""
    ragchat_settings_override(PROFILES={"default": {"llm": "openai", "options": {"openai": {
        "base_url": openai_server.base_url, "model": "test-model", "max_retries": 0, "timeout": 0.5,
    }}}})
    return openai_server


def test_a_turn_through_the_openai_backend(alice, product_corpus, conversation, openai_profile):
    openai_profile.script("The Aurora X2 costs $699 [1].")
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == 201
    answer = response.json()["assistant_message"]
    assert answer["content"] == "The Aurora X2 costs $699 [1]." and answer["status"] == "complete"
    assert answer["citations"][0]["index"] == 1 and answer["citations"][0]["source"] == "products/aurora-x2.md"
    assert openai_profile.count("chat/completions") == 1


#: A message with a password in it, as a new user's helpdesk had one typed; what may be kept of it.
TYPED = "My password: Hunter2-xyz stopped working on the printer"
KEPT = "My password: [redacted] stopped working on the printer"
CARD = "4111 1111 1111 1111"


class SecretsGuard(Guardrail):
    """Takes a password out of the message and lets it go on (a ``Redaction``); refuses a
    message with a card number, which is kept without it (``Refusal.redacted``)."""

    name = "secrets"

    def check_input(self, text, turn):
        kept = re.sub(r"(password: )\S+", r"\1[redacted]", text)
        if CARD in text:
            return Refusal("Please don't send card numbers here.", reason="a card number",
                           redacted=kept.replace(CARD, "[card]"))
        return Redaction(kept, reason="a password") if kept != text else None


class _SecretsPlugin:
    @staticmethod
    @hookimpl
    def register_guardrails(register):
        register(SecretsGuard)


def test_an_input_guardrail_keeps_what_it_redacts_out_of_everything_stored(
        alice, user, admin_client, openai_profile, ragchat_settings_override):
    """A new user's trial: a guardrail that refused or sanitised a message with a password or
    a card number in it could not keep that text out of the saved message and the trace. Its
    verdict carries the text to keep: a ``Redaction`` goes on with it (the search and the model
    see it), a ``Refusal``'s ``redacted`` replaces the refused message. The message's row, the
    trace, the conversation's title (made from the message as typed, as a client may name it)
    and label, the API's lists and the admin hold only it."""
    profile = ragchat_settings_override()["PROFILES"]["default"]
    ragchat_settings_override(PLUGINS=["tests.test_api._SecretsPlugin"], PROFILES={"default": {
        **profile, "guardrails": ["blocked_phrases", "secrets"], "empty_context": "answer"}})
    openai_profile.script(*["Try resetting it from the printer's menu."] * 2)
    named = Conversation.objects.create(owner=user, title=TYPED)  # as a client names one, from what was typed
    untitled = Conversation.objects.create(owner=user)
    for conversation in (named, untitled):
        sent = post_json(alice, messages_url(conversation), {"content": TYPED})
        assert sent.status_code == 201, sent.content
        assert sent.json()["user_message"]["content"] == KEPT
        assert sent.json()["assistant_message"]["content"] == "Try resetting it from the printer's menu."
    assert openai_profile.last("chat/completions").json["messages"][-1]["content"] == KEPT  # what the model saw
    refused = post_json(alice, messages_url(untitled), {"content": f"Charge {CARD} for the toner, {TYPED}"})
    assert refused.json()["assistant_message"]["content"] == "Please don't send card numbers here."
    assert refused.json()["user_message"]["content"] == f"Charge [card] for the toner, {KEPT}"

    rows = list(Message.objects.filter(role="user").order_by("pk").values("content", "token_count", "metadata"))
    assert [row["content"] for row in rows] == [KEPT, KEPT, f"Charge [card] for the toner, {KEPT}"]
    assert rows[0]["metadata"] == {"redacted_by": ["secrets"]} and rows[0]["token_count"] == count_tokens(KEPT)
    traces = [answer.trace.data for answer in Message.objects.filter(role="assistant").order_by("pk")]
    assert traces[0]["question"] == KEPT and traces[0]["queries"]["original"] == KEPT
    assert traces[0]["redactions"] == [{"by": "secrets", "reason": "a password"}]
    assert traces[2]["ended_by"]["stage"] == "input_guardrails" and traces[2]["redactions"][0]["reason"] == "a card number"
    assert Conversation.objects.get(pk=named.pk).title == KEPT  # the name made from the message, made again
    pages = {
        "conversations": alice.get(f"{API}/conversations/"),
        "named": alice.get(f"{API}/conversations/{named.pk}/"),
        "messages": alice.get(messages_url(untitled)),
        "admin list": admin_client.get(reverse("admin:django_ragchat_conversation_changelist")),
        "admin conversation": admin_client.get(reverse("admin:django_ragchat_conversation_change",
                                                       args=[untitled.pk])),
    }
    everything = json.dumps([list(Message.objects.values()), traces, list(Conversation.objects.values())],
                            default=str)
    for name, page in {**pages, "database": None}.items():
        text = everything if page is None else page.content.decode()
        assert page is None or page.status_code == 200, name
        assert "Hunter2" not in text and CARD not in text, name
    assert [m["content"] for m in pages["messages"].json()["results"] if m["role"] == "user"] == [
        KEPT, f"Charge [card] for the toner, {KEPT}"]
    assert alice.get(f"{API}/conversations/{untitled.pk}/").json()["label"] == KEPT
    assert "Redacted by <code>secrets</code>" in pages["admin conversation"].content.decode()


@pytest.mark.parametrize("fault, options, status, code, retry_after", [
    ("latency", {"seconds": 3}, 504, "timeout", None),
    ("rate_limit", {"retry_after": 3}, 503, "rate_limited", "3"),
    ("server_error", {"status": 500}, 503, "model_unavailable", None),
    ("malformed_json", {}, 502, "bad_response", None),
])
def test_model_server_failures_through_the_openai_backend(
    alice, product_corpus, conversation, openai_profile, fault, options, status, code, retry_after,
):
    openai_profile.fail_next(fault, path="chat/completions", **options)
    response = post_json(alice, messages_url(conversation), {"content": QUESTION})
    assert response.status_code == status
    assert response.get("Retry-After") == retry_after
    body = response.json()
    assert body["code"] == code and body["assistant_message"]["status"] == "error"
    assert body["user_message"]["content"] == QUESTION
    assert [m.status for m in conversation.messages.order_by("seq")] == ["complete", "error"]


# --- Feedback ---------------------------------------------------------------------------------


@pytest.fixture
def answered(alice, product_corpus, conversation):
    body = post_json(alice, messages_url(conversation), {"content": QUESTION}).json()
    return Message.objects.get(pk=body["user_message"]["id"]), Message.objects.get(pk=body["assistant_message"]["id"])


def test_rating_an_answer_and_changing_the_rating(alice, user, answered):
    _, answer = answered
    url = f"{API}/messages/{answer.pk}/feedback/"
    assert alice.get(url).status_code == 404
    first = post_json(alice, url, {"rating": "up"})
    assert first.status_code == 201 and first.json()["rating"] == "up" and first.json()["comment"] == ""
    second = alice.put(url, {"rating": "down", "comment": "Wrong storage size."}, format="json")
    assert second.status_code == 200
    assert second.json()["id"] == first.json()["id"] and second.json()["message_id"] == answer.pk
    feedback = Feedback.objects.get()
    assert (feedback.user, feedback.rating, feedback.comment) == (user, "down", "Wrong storage size.")
    assert alice.get(url).json()["rating"] == "down"
    assert alice.delete(url).status_code == 204
    assert not Feedback.objects.exists()


@pytest.mark.parametrize("body", [{}, {"rating": "meh"}, {"rating": "up", "comment": "x" * 2001},
                                  {"rating": "up", "comment": "a\x00b"}, {"rating": ["up"]}])
def test_bad_feedback_is_a_400(alice, answered, body):
    response = post_json(alice, f"{API}/messages/{answered[1].pk}/feedback/", body)
    assert response.status_code == 400 and response.json()["code"] == "invalid"
    assert not Feedback.objects.exists()


def test_only_answers_can_be_rated(alice, answered):
    question, _ = answered
    response = post_json(alice, f"{API}/messages/{question.pk}/feedback/", {"rating": "up"})
    assert response.status_code == 409 and response.json()["code"] == "not_rateable"
    assert post_json(alice, f"{API}/messages/999999/feedback/", {"rating": "up"}).status_code == 404
    assert post_json(alice, f"{API}/messages/abc/feedback/", {"rating": "up"}).status_code == 404


def test_the_feedback_list_is_your_own_and_reviewers_see_all(alice, answered, other_user, reviewer):
    _, answer = answered
    post_json(alice, f"{API}/messages/{answer.pk}/feedback/", {"rating": "down"})
    staff = client_for(reviewer)
    post_json(staff, f"{API}/messages/{answer.pk}/feedback/", {"rating": "up"})
    assert [f["rating"] for f in alice.get(f"{API}/feedback/").json()["results"]] == ["down"]
    assert client_for(other_user).get(f"{API}/feedback/").json()["count"] == 0
    assert staff.get(f"{API}/feedback/").json()["count"] == 2
    assert [f["rating"] for f in staff.get(f"{API}/feedback/", {"rating": "down"}).json()["results"]] == ["down"]


# --- Memory -----------------------------------------------------------------------------------


def test_memory_records_can_be_listed_corrected_and_deleted(alice, user, other_user, conversation):
    fact = MemoryRecord.objects.create(user=user, kind="fact", content="Prefers the 256 GB model.")
    summary = MemoryRecord.objects.create(conversation=conversation, kind="summary", content="Asked about prices.")
    MemoryRecord.objects.create(user=other_user, kind="fact", content="Bob's secret.")

    listed = alice.get(f"{API}/memory/").json()
    assert {r["id"] for r in listed["results"]} == {fact.pk, summary.pk}

    response = alice.patch(f"{API}/memory/{fact.pk}/", {"content": "Prefers 128 GB.", "kind": "summary"},
                           format="json")
    assert response.status_code == 200
    fact.refresh_from_db()
    assert fact.content == "Prefers 128 GB." and fact.kind == "fact"  # the kind is read-only

    for bad in ({"content": ""}, {"content": "a\x00b"}, {"content": "\ud800"}, {"content": 5}):
        response = alice.patch(f"{API}/memory/{fact.pk}/", json.dumps(bad), content_type="application/json")
        assert response.status_code == 400 and response.json()["errors"]["content"]
    fact.refresh_from_db()
    assert fact.content == "Prefers 128 GB."

    assert alice.delete(f"{API}/memory/{summary.pk}/").status_code == 204
    assert not MemoryRecord.objects.filter(pk=summary.pk).exists()


# --- Documents --------------------------------------------------------------------------------


def upload(client, name, content: bytes, **fields):
    return client.post(f"{API}/documents/", {"file": SimpleUploadedFile(name, content), **fields},
                       format="multipart")


def test_staff_upload_a_document_that_the_chat_then_cites(uploader, alice, conversation):
    staff = client_for(uploader)
    text = b"# Orion Watch\n\n## Pricing\nThe Orion Watch costs $249 and comes in two sizes.\n"
    response = upload(staff, "orion.md", text)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["outcome"] == "created"
    document = body["document"]
    assert document["source"] == "upload/orion.md" and document["title"] == "Orion Watch"
    assert document["content_type"] == "markdown" and document["chunk_count"] >= 1

    answer = post_json(alice, messages_url(conversation), {"content": "How much is the Orion Watch?"}).json()
    assert "$249" in answer["assistant_message"]["content"]
    assert answer["assistant_message"]["citations"][0]["source"] == "upload/orion.md"

    # The same upload again changes nothing; a changed one replaces the document's chunks.
    assert upload(staff, "orion.md", text).json()["outcome"] == "unchanged"
    changed = upload(staff, "orion.md", text.replace(b"$249", b"$199"))
    assert changed.status_code == 200 and changed.json()["outcome"] == "updated"
    assert Document.objects.count() == 1
    assert "$199" in Chunk.objects.get(document_id=document["id"], ordinal=0).text

    listed = alice.get(f"{API}/documents/").json()
    assert [d["source"] for d in listed["results"]] == ["upload/orion.md"]

    assert staff.delete(f"{API}/documents/{document['id']}/").status_code == 204
    assert not Document.objects.exists() and not Chunk.objects.exists()
    # Answers keep their source labels after the chunk is gone.
    source = MessageSource.objects.get(cited=True)
    assert source.chunk is None and source.source == "upload/orion.md"
    listed = alice.get(messages_url(conversation)).json()["results"][1]
    assert listed["citations"][0]["source"] == "upload/orion.md" and listed["sources"][0]["document_id"] is None


def test_upload_options_and_bad_uploads(uploader):
    staff = client_for(uploader)
    response = upload(staff, "notes", b"Plain words.", content_type="text", source="kb/notes", title="Notes")
    assert response.status_code == 201
    assert {"source": "kb/notes", "title": "Notes", "content_type": "text"}.items() <= response.json()["document"].items()

    for name, content, fields, code in [
        ("data.pdf", b"%PDF-1.4", {}, "unsupported_type"),
        ("latin1.txt", "caf\xe9".encode("latin-1"), {}, "invalid_encoding"),
        ("nul.md", b"a\x00b", {}, "invalid_document"),
        ("ok.md", b"# Hi", {"profile": "nope"}, "unknown_profile"),
        ("ok.md", b"# Hi", {"content_type": "pdf"}, "invalid"),
    ]:
        response = upload(staff, name, content, **fields)
        assert response.status_code == 400, (name, response.json())
        assert response.json()["code"] == code, (name, response.json())
    assert staff.post(f"{API}/documents/", {"source": "x"}, format="multipart").json()["code"] == "invalid"
    assert Document.objects.count() == 1


def test_an_upload_over_the_size_limit_is_a_413(uploader, monkeypatch):
    from django_ragchat.api.views import DocumentList

    monkeypatch.setattr(DocumentList, "max_upload_bytes", 1000)
    response = upload(client_for(uploader), "big.md", b"x" * 1001)
    assert response.status_code == 413 and response.json()["code"] == "too_large"
    assert not Document.objects.exists()


# --- Plugins and the schema -------------------------------------------------------------------


def test_staff_see_the_plugins_and_components(staff_user):
    body = client_for(staff_user).get(f"{API}/plugins/").json()
    names = {p["name"]: p for p in body["plugins"]}
    assert names["django_ragchat.stages.llms"]["builtin"] is True
    assert "register_llm_backends" in names["django_ragchat.stages.llms"]["hooks"]
    extractive = next(c for c in body["components"] if c["kind"] == "llm" and c["name"] == "extractive")
    assert extractive["path"] == "django_ragchat.stages.llms.ExtractiveAnswerer"
    assert extractive["plugin"] == "django_ragchat.stages.llms"
    assert body["errors"] == []


def test_staff_see_the_tools_and_what_each_profile_runs(staff_user, alice, ragchat_settings_override):
    """A plugin author's trial: GET plugins/ listed neither the tools nor what a profile runs,
    which ragchat_plugins prints (the same gathering code, plugins.profile_listing/tool_listing)."""
    ragchat_settings_override(PLUGINS=["tests.tool_plugins"], PROFILES={
        "default": {"llm": "openai", "tools": ["weather"], "retrievers": ["fulltext"], "title": "Help desk",
                    "options": {"openai": {"base_url": "http://127.0.0.1:9/v1"}}},
        "broken": {"llm": "gpt-9", "title": "Broken desk"},
    })
    body = client_for(staff_user).get(f"{API}/plugins/").json()
    weather = next(t for t in body["tools"] if t["name"] == "weather")
    assert weather["plugin"] == "tests.tool_plugins" and weather["requires_confirmation"] is False
    assert weather["description"]
    profiles = {p["name"]: p for p in body["profiles"]}
    assert set(profiles) == {"default", "broken"}
    default = profiles["default"]
    assert default["tools"] == ["weather"] and default["error"] is None
    assert default["title"] == "Help desk" and profiles["broken"]["title"] == "Broken desk"
    assert default["components"]["llm"] == ["openai"] and default["components"]["retrievers"] == ["fulltext"]
    assert list(default["components"]) == list(plugins.PIPELINE_ORDER)
    assert profiles["broken"]["components"] is None and "No llm named 'gpt-9'" in profiles["broken"]["error"]
    # The same as ragchat_plugins --json says.
    from django_ragchat.management.commands.ragchat_plugins import describe

    listed = describe()
    assert body["tools"] == listed["tools"]
    assert {"title": default["title"], **default["components"], "tools": default["tools"]} == \
        listed["profiles"]["default"]
    # Within the endpoint's existing permission: staff only.
    assert alice.get(f"{API}/plugins/").status_code == 403


def test_the_schema_describes_the_tools_and_profiles_of_the_plugin_listing(alice):
    schema = json.loads(alice.get(f"{API}/schema/", {"format": "json"}).content)
    listing = schema["components"]["schemas"]["PluginListing"]
    assert {"plugins", "components", "tools", "profiles", "errors"} <= set(listing["properties"])
    assert set(schema["components"]["schemas"]["ProfileComponents"]["properties"]) == set(plugins.PIPELINE_ORDER)
    assert "title" in schema["components"]["schemas"]["ProfileRuns"]["required"]
    assert set(schema["components"]["schemas"]["Tool"]["properties"]) == {
        "name", "plugin", "label", "description", "requires_confirmation"}


def test_the_schema_is_served_for_these_endpoints_and_validates(alice, tmp_path):
    response = alice.get(f"{API}/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = json.loads(response.content)
    assert schema["info"]["title"] == "django-ragchat API"
    assert set(schema["paths"]) == {
        f"{API}/conversations/", f"{API}/conversations/{{conversation_id}}/",
        f"{API}/conversations/{{conversation_id}}/messages/", f"{API}/conversations/{{conversation_id}}/cancel/",
        f"{API}/messages/{{message_id}}/feedback/",
        f"{API}/feedback/", f"{API}/memory/", f"{API}/memory/{{id}}/", f"{API}/documents/",
        f"{API}/documents/{{id}}/", f"{API}/documents/tasks/{{task_id}}/", f"{API}/plugins/",
        f"{API}/tool-calls/{{confirmation_id}}/", f"{API}/tool-calls/{{confirmation_id}}/decision/",
    }
    post = schema["paths"][f"{API}/conversations/{{conversation_id}}/messages/"]["post"]
    assert set(post["responses"]) == {"200", "201", "400", "403", "404", "409", "410", "413", "429", "500", "502",
                                      "503", "504"}
    for status_code in ("409", "429", "503"):
        assert "Retry-After" in post["responses"][status_code]["headers"], status_code
    # drf-spectacular's own validation, failing on any warning.
    # (drf-spectacular's own generator, on a site that never set REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"].)
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "schema.yaml"))
    assert (tmp_path / "schema.yaml").read_text().count("/api/ragchat/") >= 10

    for page in ("docs", "redoc"):
        response = alice.get(f"{API}/{page}/")
        assert response.status_code == 200 and f"{API}/schema/".encode() in response.content


# --- CSRF and anonymous use -------------------------------------------------------------------


def csrf_token(client) -> str:
    """What a page of the site gives the browser: the csrftoken cookie, echoed in a header."""
    token = get_random_string(32)
    client.cookies["csrftoken"] = token
    return token


def test_session_authenticated_writes_need_the_csrf_token(user, conversation):
    client = client_for(user, enforce_csrf_checks=True)
    refused = post_json(client, f"{API}/conversations/", {})
    assert (refused.status_code, refused.json()["code"]) == (403, "csrf_failed")
    assert refused.json()["detail"].startswith("CSRF check failed (CSRF cookie not set.)")
    token = csrf_token(client)
    assert post_json(client, f"{API}/conversations/", {}, HTTP_X_CSRFTOKEN=token).status_code == 201
    assert client.get(f"{API}/conversations/").status_code == 200  # reads need no token


@pytest.mark.parametrize("raw_body", ['["not", "an", "object"]', '"just a string"', "null", "42"])
def test_a_body_that_is_no_json_object_is_invalid_type_on_every_write(alice, conversation, raw_body):
    """An outside trial: POST conversations/ with a JSON array answered ``invalid`` ("Expected a
    dictionary") while messages/ answered ``invalid_type``, as api.md says of such a body."""
    writes = [(alice, "post", f"{API}/conversations/"), (alice, "patch", f"{API}/conversations/{conversation.pk}/"),
              (alice, "post", messages_url(conversation)), (alice, "post", f"{API}/messages/1/feedback/"),
              (alice, "post", f"{API}/tool-calls/1/decision/"), (alice, "patch", f"{API}/memory/1/")]
    for client, method, url in writes:
        response = getattr(client, method)(url, raw_body, content_type="application/json")
        assert (response.status_code, response.json()["code"]) == (400, "invalid_type"), (method, url, response.json())
        assert response.json()["detail"].startswith("The body must be a JSON object"), url
    assert Conversation.objects.count() == 1 and not Message.objects.exists()


def test_a_body_the_view_does_not_read_is_refused_after_the_csrf_check_and_the_permissions(user, uploader,
                                                                                           conversation):
    # DRF raised the 415 from inside the session CSRF check (it reads the form), so a caller
    # without the token or without the right heard about the format first (an outside probe).
    client = client_for(user, enforce_csrf_checks=True)
    body = json.dumps({"source": "x"})
    refused = client.post(f"{API}/documents/", body, content_type="application/json")
    assert (refused.status_code, refused.json()["code"]) == (403, "csrf_failed")
    assert "(CSRF cookie not set.)" in refused.json()["detail"]
    token = csrf_token(client)
    for content_type in ("application/json", "text/plain"):
        refused = client.post(f"{API}/documents/", body, content_type=content_type, HTTP_X_CSRFTOKEN=token)
        assert (refused.status_code, refused.json()["code"]) == (403, "permission_denied"), content_type
        staff = client_for(uploader, enforce_csrf_checks=True)
        refused = staff.post(f"{API}/documents/", body, content_type=content_type, HTTP_X_CSRFTOKEN=csrf_token(staff))
        assert (refused.status_code, refused.json()["code"]) == (415, "unsupported_media_type"), content_type
    # A form sent to a JSON endpoint is still read for its token, then refused for its format,
    # as the server-sent events endpoint answers it; without a token it is a CSRF failure.
    form = client.post(messages_url(conversation), {"content": "hi", "csrfmiddlewaretoken": token})
    assert (form.status_code, form.json()["code"]) == (415, "unsupported_media_type")
    form = client.post(messages_url(conversation), {"content": "hi"})
    assert (form.status_code, form.json()["code"]) == (403, "csrf_failed")
    assert "(CSRF token missing.)" in form.json()["detail"]
    assert not conversation.messages.exists() and not Document.objects.exists()


def test_anonymous_use_is_bound_to_the_session(ragchat_settings_override, product_corpus):
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    visitor, stranger = APIClient(enforce_csrf_checks=True), APIClient(enforce_csrf_checks=True)
    # An anonymous visitor is identified by their session cookie, so their writes need the
    # CSRF token like a signed-in user's.
    assert post_json(visitor, f"{API}/conversations/", {}).status_code == 403
    token = csrf_token(visitor)
    created = post_json(visitor, f"{API}/conversations/", {"title": "Mine"}, HTTP_X_CSRFTOKEN=token)
    assert created.status_code == 201
    conversation = Conversation.objects.get(pk=created.json()["id"])
    assert conversation.owner is None and conversation.session_key == visitor.session.session_key
    answer = post_json(visitor, messages_url(conversation), {"content": QUESTION}, HTTP_X_CSRFTOKEN=token)
    assert answer.status_code == 201
    answer_id = answer.json()["assistant_message"]["id"]
    rated = post_json(visitor, f"{API}/messages/{answer_id}/feedback/", {"rating": "up"}, HTTP_X_CSRFTOKEN=token)
    assert rated.status_code == 201
    assert Feedback.objects.get().session_key == conversation.session_key

    assert [c["title"] for c in visitor.get(f"{API}/conversations/").json()["results"]] == ["Mine"]
    assert stranger.get(f"{API}/conversations/").json()["count"] == 0
    assert stranger.get(f"{API}/conversations/{conversation.pk}/").status_code == 404
    assert stranger.get(messages_url(conversation)).status_code == 404
    assert stranger.get(f"{API}/messages/{answer_id}/feedback/").status_code == 404


# --- Query counts -----------------------------------------------------------------------------


def count_queries(client, url) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


def test_list_endpoints_issue_the_same_number_of_queries_for_2_and_50_rows(alice, user, staff_user,
                                                                           product_corpus):
    chunks = list(Chunk.objects.all()[:3])
    staff = client_for(staff_user)

    def fill(n):
        conversation = Conversation.objects.create(owner=user)
        for _ in range(n - 1):
            Conversation.objects.create(owner=user)
        for seq in range(1, n + 1):
            message = Message.objects.create(conversation=conversation, seq=seq,
                                             role="assistant" if seq % 2 == 0 else "user", content=f"m{seq}")
            for rank, chunk in enumerate(chunks, start=1):
                MessageSource.objects.create(message=message, chunk=chunk, rank=rank, score=0.5,
                                             cited=rank == 1, source=chunk.document.source)
            MemoryRecord.objects.create(user=user, kind="fact", content=f"fact {seq}")
            Feedback.objects.create(message=message, user=user, rating="up")
        Conversation.objects.filter(pk=conversation.pk).update(last_seq=n)
        return conversation

    def counts(conversation):
        return [count_queries(alice, url) for url in (
            f"{API}/conversations/?limit=100", f"{messages_url(conversation)}?limit=100",
            f"{API}/memory/?limit=100", f"{API}/feedback/?limit=100", f"{API}/documents/?limit=100",
        )] + [count_queries(staff, f"{API}/memory/?limit=100")]

    small = counts(fill(2))
    Conversation.objects.all().delete()
    MemoryRecord.objects.all().delete()
    big = counts(fill(50))
    assert alice.get(f"{messages_url(Conversation.objects.order_by('created_at').first())}?limit=100").json()[
        "count"] == 50
    assert small == big


def test_the_schema_says_what_needs_no_sign_in_and_how_long_a_message_may_be(ragchat_settings_override, client):
    def schema():
        return json.loads(client.get(f"{API}/schema/", {"format": "json"}).content)

    ragchat_settings_override(ALLOW_ANONYMOUS=False, MAX_MESSAGE_CHARS=1234)
    closed = schema()
    assert closed["components"]["schemas"]["MessageCreate"]["properties"]["content"]["maxLength"] == 1234
    assert {} not in closed["paths"][f"{API}/conversations/"]["post"]["security"]
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    paths = schema()["paths"]
    for path, method in ((f"{API}/conversations/", "post"), (f"{API}/conversations/", "get"),
                         (f"{API}/conversations/{{conversation_id}}/messages/", "post"),
                         (f"{API}/memory/", "get")):
        assert {} in paths[path][method]["security"], (path, method)
    for path, method in ((f"{API}/documents/", "get"), (f"{API}/plugins/", "get")):
        assert {} not in paths[path][method]["security"], (path, method)  # signed-in users (or staff) only
