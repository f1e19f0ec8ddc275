"""The OpenAI-compatible endpoint with the real ``openai`` client, against real servers: uvicorn
(ASGI) and gunicorn (WSGI, the turn on the background loop), mounted at ``/openai/v1/`` as in
tests/urls.py and the example project. The ``fake`` profile answers through the loopback
OpenAI-compatible model server (``FakeOpenAIServer``), the ``default`` one offline."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import openai
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_ragchat.models import ApiKey, Conversation, Message, ToolInvocation, TurnTrace
from django_ragchat.testing import openai_server as model_server
from example_project.orders.models import Order
from tests import live_settings
from tests.live_servers import caller_for, unknown_id, wait_for, words

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How much does the Aurora X2 cost?"
# The live servers' profiles (tests/live_settings.py), the default first.
# Every profile the live servers define (tests/live_settings.py): a user may use them all.
MODELS = list(live_settings.RAGCHAT["PROFILES"])


@pytest.fixture(params=["asgi", "wsgi"])
def server(request):
    """Each test runs once under uvicorn (ASGI) and once under gunicorn (WSGI)."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def key(user) -> str:
    return ApiKey.create_key(user, "tests")[1]


def client_for(server, key: str, **options) -> openai.OpenAI:
    # No retries: a refusal must reach the test as it was answered.
    return openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, **{"max_retries": 0, "timeout": 20, **options})


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def saved():
    return list(Message.objects.order_by("conversation__created_at", "seq").values_list("role", "status", "content"))


# --- models -----------------------------------------------------------------------------------


def test_models_are_the_profiles(server, key):
    client = client_for(server, key)
    listed = client.models.list()
    assert [m.id for m in listed] == MODELS
    assert {(m.object, m.owned_by) for m in listed} == {("model", "django-ragchat")}
    assert client.models.retrieve("fake").id == "fake"
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-4o")
    assert raised.value.body["code"] == "model_not_found"


# --- answers ----------------------------------------------------------------------------------


def test_a_whole_answer_keeps_its_citations_and_carries_its_sources(server, key, user, product_corpus):
    response = client_for(server, key).chat.completions.create(model="default", messages=ask(QUESTION))
    answer = response.choices[0].message.content
    assert "$699" in answer and "[1]" in answer
    assert response.object == "chat.completion" and response.model == "default"
    assert response.choices[0].finish_reason == "stop" and response.choices[0].message.role == "assistant"
    extra = response.model_extra
    conversation = Conversation.objects.get(pk=extra["conversation"])
    assert conversation.owner == user and conversation.profile == "default"
    sources = extra["sources"]
    assert sources[0]["index"] == 1 and sources[0]["source"] == "products/aurora-x2.md" and sources[0]["cited"]
    assert [s["index"] for s in sources] == list(range(1, len(sources) + 1))
    assert response.usage.completion_tokens > 0 and response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    # Saved and traced as on every transport.
    assert list(conversation.messages.values_list("role", "status", "content")) == [
        ("user", "complete", QUESTION), ("assistant", "complete", answer)]
    assert response.id == f"chatcmpl-{conversation.messages.get(role='assistant').pk}"
    trace = TurnTrace.objects.get(message__conversation=conversation).data
    assert trace["question"] == QUESTION and trace["documents"]
    assert trace["origin"]["transport"] == "openai" and trace["origin"]["api_key"]["name"] == "tests"


def test_a_streamed_answer_arrives_in_openais_chunks(server, key, product_corpus, openai_server):
    openai_server.script(words(30))
    stream = client_for(server, key).chat.completions.create(
        model="fake", messages=ask(QUESTION), stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert {c.object for c in chunks} == {"chat.completion.chunk"} and len({c.id for c in chunks}) == 1
    first, *pieces, finish, usage = chunks
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    assert first.model_extra["conversation"]
    text = "".join(c.choices[0].delta.content for c in pieces)
    # Pieces the model wrote before the client read them may share a chunk; the text is whole.
    assert text == words(30) and 1 <= len(pieces) <= 30
    assert all(c.usage is None for c in chunks[:-1])
    assert finish.choices[0].finish_reason == "stop" and finish.choices[0].delta.content is None
    assert finish.model_extra["sources"] and finish.model_extra["sources"][0]["source"] == "products/aurora-x2.md"
    assert usage.choices == [] and usage.usage.completion_tokens > 0
    assert usage.model_extra["sources"] == finish.model_extra["sources"]
    conversation = Conversation.objects.get(pk=first.model_extra["conversation"])
    assert conversation.profile == "fake"
    assert list(conversation.messages.values_list("status", "content")) == [("complete", QUESTION),
                                                                            ("complete", text)]


def test_the_stream_is_openais_wire_format_and_ends_with_done(server, key, product_corpus, openai_server):
    openai_server.script("Short answer [1].")
    with httpx.Client(timeout=20) as http:
        response = http.post(f"{server.url}/openai/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"model": "fake", "messages": ask(QUESTION), "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    conversation_id = response.headers["x-ragchat-conversation"]
    events = response.text.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all("usage" not in c for c in chunks)  # only asked for with include_usage
    assert chunks[0]["conversation"] == conversation_id
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


def test_tokens_reach_the_client_as_the_model_writes_them(server, key, product_corpus, openai_server):
    openai_server.script(words(20))
    openai_server.hold_streams(after_tokens=3)
    received, seen_while_held = [], ""
    try:
        for chunk in client_for(server, key).chat.completions.create(model="fake", messages=ask(QUESTION),
                                                                     stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
                if "".join(received) == words(3) + " ":  # the model has not written the fourth token yet
                    seen_while_held = "".join(received)
                    openai_server.release_streams()
    finally:
        openai_server.release_streams()
    assert seen_while_held == "word0 word1 word2 " and "".join(received) == words(20)


def test_a_profile_with_output_guardrails_streams_the_answer_they_passed(server, key, product_corpus, openai_server):
    """A reprompt replaces the first answer; a chunk stream cannot take text back, so the
    answer is sent once the guardrail passed it, and the client has exactly the saved text."""
    openai_server.script("No citation here.", "The Aurora X2 costs $699 [1].")
    chunks = list(client_for(server, key).chat.completions.create(model="fake_cited", messages=ask(QUESTION),
                                                                  stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    answer = Message.objects.get(role="assistant")
    assert text == answer.content and text.startswith("The Aurora X2 costs $699 [1].")
    assert "No citation" not in text


# --- history ----------------------------------------------------------------------------------


def test_a_stateless_follow_up_is_answered_from_the_messages_it_sends(server, key, product_corpus, openai_server,
                                                                      admin_client):
    client = client_for(server, key)
    follow_up = "And how much does it cost?"
    history = [{"role": "system", "content": "Answer like a pirate."},
               {"role": "user", "content": "Tell me about the Aurora X2."},
               {"role": "assistant", "content": "The Aurora X2 is a 6.1-inch phone [1]."},
               {"role": "user", "content": follow_up}]
    alone = client.chat.completions.create(model="default", messages=ask(follow_up)).choices[0].message.content
    assert "Aurora" not in alone  # without the history "it" is not the Aurora X2
    response = client.chat.completions.create(model="default", messages=history)
    assert "$699" in response.choices[0].message.content
    # The earlier messages are not stored: the conversation holds this turn only.
    conversation = Conversation.objects.get(pk=response.model_extra["conversation"])
    assert list(conversation.messages.values_list("role", "content")) == [
        ("user", follow_up), ("assistant", response.choices[0].message.content)]
    # It is named after the request's first question, not the last one, which is all it stored
    # (the admin listed it as "And how much does it cost?": found by a new user).
    assert conversation.title == "Tell me about the Aurora X2."
    page = admin_client.get(reverse("admin:django_ragchat_conversation_changelist")).content.decode()
    assert f'/{conversation.pk}/change/">Tell me about the Aurora X2.</a>' in page
    trace = conversation.messages.get(role="assistant").trace.data
    assert trace["history"]["supplied"] == 2 and trace["origin"]["ignored_system_messages"] == 1
    assert trace["supplied_history"] == [{"role": m["role"], "content": m["content"]} for m in history[1:3]]
    # A model sees them too, and never the request's system message.
    openai_server.script("It costs $699 [1].")
    client.chat.completions.create(model="fake", messages=history)
    sent = openai_server.last("chat/completions").json["messages"]
    assert [m["content"] for m in sent[1:3]] == [history[1]["content"], history[2]["content"]]
    assert not any("pirate" in str(m["content"]) for m in sent)


def test_a_new_conversation_is_not_named_after_a_question_a_guardrail_refused(server, key, product_corpus):
    """A new user's helpdesk: an input guardrail refused "password: Hunter2-xyz" (the live
    servers' default profile refuses "password:"), and the conversation kept it as its title,
    which the endpoint made from the first question before the turn ran."""
    response = client_for(server, key).chat.completions.create(model="default", messages=ask("password: Hunter2-xyz"))
    assert response.choices[0].message.content == "I can't help with that request."
    conversation = Conversation.objects.get(pk=response.model_extra["conversation"])
    assert conversation.title == "" and conversation.messages.filter(content="password: Hunter2-xyz").exists()


def test_a_new_conversation_is_not_named_after_a_refused_message_its_request_sends_again(server, key, user,
                                                                                       product_corpus):
    """A stateless client (Open WebUI, LibreChat) sends the whole exchange with every request:
    after "password: Hunter2-xyz" was refused, the next question's request began with it, and
    the endpoint titled that request's new conversation with it, before the turn ran, so the
    password stood in the admin's and the API's lists. The endpoint names a new conversation
    once its answer is saved, as the widget does, after the request's first question only if
    the input guardrails let it through; else after the question it stored."""
    client = client_for(server, key)
    refused = client.chat.completions.create(model="default", messages=ask("password: Hunter2-xyz"))
    history = [*ask("password: Hunter2-xyz"), {"role": "assistant", "content": refused.choices[0].message.content},
               *ask(QUESTION)]
    response = client.chat.completions.create(model="default", messages=history)
    assert "$699" in response.choices[0].message.content
    conversation = Conversation.objects.get(pk=response.model_extra["conversation"])
    assert conversation.title == QUESTION
    api = Client()
    api.force_login(user)
    listed = api.get("/api/ragchat/conversations/")
    assert listed.status_code == 200 and "Hunter2" not in listed.content.decode()


def test_a_new_conversation_is_named_after_its_first_message_as_the_guardrails_redact_it(
        key, product_corpus, ragchat_settings_override):
    """The request's first message is checked as a question would be before it names the
    conversation: a guardrail that redacts a password in it (tests/test_api.py's ``secrets``)
    names the conversation without the password. In process (Django's test client), with the
    guardrail in the settings."""
    from tests.test_api import KEPT, TYPED

    ragchat_settings_override(PLUGINS=["tests.test_api._SecretsPlugin"],
                              PROFILES={"default": {"guardrails": ["secrets"]}})
    history = [*ask(TYPED), {"role": "assistant", "content": "Try the printer's menu."}, *ask(QUESTION)]
    response = Client().post("/openai/v1/chat/completions", {"model": "default", "messages": history},
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    conversation = Conversation.objects.get(pk=response.json()["conversation"])
    assert conversation.title == KEPT and list(conversation.messages.values_list("content", flat=True))[0] == QUESTION


def test_the_input_guardrails_judge_the_history_a_request_sends_again(key, product_corpus, openai_server,
                                                                     ragchat_settings_override):
    """An outside user's trial with a stateless client (Open WebUI sends the whole exchange with
    every request): a message the input guardrails had refused came back as history, reached
    the model and stood in the trace's ``supplied_history``; only the last message was checked.
    Each supplied user message is judged as the question is: a refused one is left out with the
    reply to it (the loopback model server never receives it, the trace keeps neither, only how
    many and who refused), a redacted one reaches the model redacted. In process (Django's test
    client), with tests/test_api.py's ``secrets`` guardrail: it redacts a password, refuses a
    card number."""
    from tests.test_api import CARD, KEPT, TYPED

    ragchat_settings_override(PLUGINS=["tests.test_api._SecretsPlugin"], PROFILES={"default": {
        "guardrails": ["secrets"], "llm": "openai", "options": {"openai": {
            "base_url": openai_server.base_url, "model": "test-model", "max_retries": 0, "timeout": 5}}}})
    card = f"Can I pay with {CARD}?"
    history = [*ask(TYPED), {"role": "assistant", "content": "Try the printer's menu."},
               *ask(card), {"role": "assistant", "content": "Please don't send card numbers here."},
               *ask(QUESTION)]
    openai_server.script("The Aurora X2 costs $699 [1].")
    response = Client().post("/openai/v1/chat/completions", {"model": "default", "messages": history},
                             content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["message"]["content"] == "The Aurora X2 costs $699 [1]."

    sent = openai_server.last("chat/completions").json["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:3]] == [("user", KEPT), ("assistant", "Try the printer's menu.")]
    assert sent[3]["role"] == "user" and QUESTION in sent[3]["content"] and len(sent) == 4
    assert CARD not in json.dumps(sent) and "Hunter2" not in json.dumps(sent)

    conversation = Conversation.objects.get(pk=response.json()["conversation"])
    trace = conversation.messages.get(role="assistant").trace.data
    assert trace["supplied_history"] == [{"role": "user", "content": KEPT},
                                         {"role": "assistant", "content": "Try the printer's menu."}]
    assert trace["supplied_guardrails"] == {
        "sent": 4, "left_out": 2, "refused": [{"by": "secrets", "reason": "a card number"}],
        "redacted": [{"by": "secrets", "reason": "a password"}]}
    stored = json.dumps(list(TurnTrace.objects.values_list("data", flat=True)))
    assert CARD not in stored and "Hunter2" not in stored and "card numbers here" not in stored
    assert list(conversation.messages.values_list("content", flat=True))[0] == QUESTION


def test_a_new_conversation_is_named_once_its_answer_is_saved(server, key, product_corpus, openai_server):
    """Not before its turn runs, when its question may yet be refused (and was, by then, in the
    admin's and the API's lists while the turn ran): untitled while the answer streams."""
    openai_server.script(words(12))
    openai_server.hold_streams(after_tokens=3)
    stream = iter(client_for(server, key).chat.completions.create(model="fake", messages=ask(QUESTION), stream=True))
    first = next(stream)
    next(chunk for chunk in stream if chunk.choices[0].delta.content)  # the model is writing, held
    conversation = Conversation.objects.get(pk=first.model_extra["conversation"])
    assert conversation.title == "" and conversation.messages.get(role="assistant").status == "streaming"
    openai_server.release_streams()
    assert list(stream)[-1].choices[0].finish_reason == "stop"
    assert Conversation.objects.get(pk=conversation.pk).title == QUESTION


def test_a_stored_conversation_is_continued_by_its_id(server, key, product_corpus):
    client = client_for(server, key)
    first = client.chat.completions.create(model="default", messages=ask("Tell me about the Aurora X2."))
    conversation_id = first.model_extra["conversation"]
    assert Conversation.objects.get(pk=conversation_id).title == "Tell me about the Aurora X2."
    # Only the new message: the stored log is the history (a body field, or the header).
    second = client.chat.completions.create(model="default", messages=ask("And how much does it cost?"),
                                            extra_body={"conversation": conversation_id})
    assert second.model_extra["conversation"] == conversation_id and "$699" in second.choices[0].message.content
    third = client.chat.completions.create(model="default", messages=ask("And its warranty?"),
                                           extra_headers={"X-Ragchat-Conversation": conversation_id})
    assert third.model_extra["conversation"] == conversation_id
    conversation = Conversation.objects.get(pk=conversation_id)
    assert conversation.messages.count() == 6 and Conversation.objects.count() == 1
    # Continued with another model: refused, nothing saved.
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="fake", messages=ask("Hi"), extra_body={"conversation": conversation_id})
    assert raised.value.body["code"] == "model_mismatch" and conversation.messages.count() == 6


def test_another_users_conversation_is_not_found(server, key, other_user, product_corpus):
    theirs = Conversation.objects.create(owner=other_user)
    client = client_for(server, key)
    bodies = []
    for conversation_id in (str(theirs.pk), unknown_id(), "not-a-uuid"):
        with pytest.raises(openai.NotFoundError) as raised:
            client.chat.completions.create(model="default", messages=ask(QUESTION),
                                           extra_body={"conversation": conversation_id})
        bodies.append(raised.value.body)
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["code"] == "not_found" and bodies[0]["param"] == "conversation"
    assert not Message.objects.exists() and Conversation.objects.count() == 1


# --- tools ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_call_that_needs_approval_fails_at_once_and_the_model_reads_why(server, key, user, openai_server, stream):
    """An OpenAI client has no way to approve a tool call. A new user's "Please cancel my order"
    on a profile whose tool asks first blocked for the profile's tool_confirmation_timeout
    (2 minutes), then answered "abandoned". The call now fails at once, nothing runs, and the
    model reads why (so it can tell the user where to do it), the call kept as any other."""
    order = Order.objects.create(owner=user, number="ORD-18", items="Aurora X2", total="699.00",
                                 placed_at=timezone.now(), status=Order.Status.PROCESSING)
    openai_server.script(model_server.tool_calls(model_server.call("cancel_order", order_number="ORD-18", id="c1")),
                         lambda body: "Not done: " + json.loads(body["messages"][-1]["content"])["message"])
    client = client_for(server, key, timeout=8)
    started = time.monotonic()
    response = client.chat.completions.create(model="fake_tools", messages=ask("Please cancel my order ORD-18."),
                                              stream=stream)
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in response if c.choices)
    else:
        text = response.choices[0].message.content
    assert time.monotonic() - started < 5  # not the 120 s wait for a decision nobody can send

    first, second = [r.json for r in openai_server.requests if r.path.endswith("chat/completions")]
    # Offered as on every transport: the model knows the action exists...
    assert "cancel_order" in [t["function"]["name"] for t in first["tools"]]
    # ...and reads that it cannot be approved from here, and was not carried out.
    result = json.loads(second["messages"][-1]["content"])
    assert second["messages"][-1]["tool_call_id"] == "c1" and result["error"] == "approval_unavailable"
    assert "not carried out" in result["message"] and text == "Not done: " + result["message"]
    order.refresh_from_db()
    assert order.status == Order.Status.PROCESSING
    # Saved and traced as any failed call; nothing was left pending.
    invocation = ToolInvocation.objects.get()
    assert (invocation.status, invocation.error["code"], invocation.requires_confirmation) == (
        "error", "approval_unavailable", True)
    answer = Message.objects.get(role="assistant")
    assert answer.status == "complete" and answer.content == text
    [traced] = answer.trace.data["tools"]
    assert traced["status"] == "error" and traced["error"]["code"] == "approval_unavailable"
    assert "wait_ms" not in traced and "approval_wait_ms" not in answer.trace.data


# --- who may call -----------------------------------------------------------------------------


def test_wrong_revoked_and_expired_keys_are_refused(server, user, django_user_model, product_corpus):
    revoked, revoked_key = ApiKey.create_key(user, "revoked")
    revoked.revoke()
    expired_key = ApiKey.create_key(user, "expired", expires_at=timezone.now() - timedelta(seconds=1))[1]
    inactive = django_user_model.objects.create_user("carol", is_active=False)
    inactive_key = ApiKey.create_key(inactive)[1]
    for key, message in ((ApiKey.generate(), "Incorrect API key provided."),
                         (revoked_key, "This API key has been revoked."),
                         (expired_key, "This API key has expired."),
                         (inactive_key, "Incorrect API key provided.")):
        for call in (lambda c: c.models.list(),
                     lambda c: c.chat.completions.create(model="default", messages=ask(QUESTION))):
            with pytest.raises(openai.AuthenticationError) as raised:
                call(client_for(server, key))
            assert raised.value.status_code == 401
            assert (raised.value.body["code"], raised.value.body["message"]) == ("invalid_api_key", message)
    with httpx.Client(timeout=10) as http:  # no credentials at all
        response = http.get(f"{server.url}/openai/v1/models")
        assert response.status_code == 401 and response.json()["error"]["code"] == "not_authenticated"
        response = http.get(f"{server.url}/openai/v1/models", headers={"Authorization": "Basic dXNlcjpwdw=="})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert not Message.objects.exists() and not Conversation.objects.exists()


def test_a_key_records_its_last_use(server, user, key):
    assert ApiKey.objects.get().last_used_at is None
    client_for(server, key).models.list()
    used = ApiKey.objects.get().last_used_at
    assert used is not None and timezone.now() - used < timedelta(seconds=30)


def test_a_signed_in_session_works_with_its_csrf_token(server, user, product_corpus):
    caller = caller_for(user)
    url = f"{server.url}/openai/v1"
    with httpx.Client(cookies=caller.cookies, timeout=20) as http:
        assert [m["id"] for m in http.get(f"{url}/models").json()["data"]] == MODELS
        body = {"model": "default", "messages": ask(QUESTION)}
        refused = http.post(f"{url}/chat/completions", json=body)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "csrf_failed"
        assert not Message.objects.exists()
        answered = http.post(f"{url}/chat/completions", json=body, headers={"X-CSRFToken": caller.csrftoken})
        assert answered.status_code == 200 and "$699" in answered.json()["choices"][0]["message"]["content"]
    assert Conversation.objects.get().owner == user


# --- limits -----------------------------------------------------------------------------------


def test_the_turn_rate_limit_is_429_with_retry_after(server, key, product_corpus):
    client = client_for(server, key)
    for _ in range(25):  # TURNS_PER_MINUTE in tests/live_settings.py
        client.chat.completions.create(model="default", messages=ask(QUESTION))
    with pytest.raises(openai.RateLimitError) as raised:
        client.chat.completions.create(model="default", messages=ask(QUESTION))
    assert raised.value.body["code"] == "rate_limited" and raised.value.body["type"] == "requests"
    assert 1 <= int(raised.value.response.headers["retry-after"]) <= 71  # the sliding window: until the 25 turns' oldest bucket has (nearly) left it, 70.4 s at most
    assert Message.objects.count() == 50


def test_concurrent_streams_past_the_limit_are_429(server, key, product_corpus, openai_server):
    openai_server.when("", words(20))
    openai_server.hold_streams(after_tokens=1)
    client = client_for(server, key)
    streams = []
    try:
        for _ in range(3):  # MAX_CONCURRENT_STREAMS in tests/live_settings.py
            stream = client.chat.completions.create(model="fake", messages=ask(QUESTION), stream=True)
            next(iter(stream))  # the role chunk: the turn has started
            streams.append(stream)
        with pytest.raises(openai.RateLimitError) as raised:
            client.chat.completions.create(model="fake", messages=ask(QUESTION), stream=True)
        assert raised.value.body["code"] == "too_many_streams"
        assert int(raised.value.response.headers["retry-after"]) >= 1
    finally:
        openai_server.release_streams()
        for stream in streams:
            list(stream)
    assert Conversation.objects.count() == 3  # the refused request created none


# --- stopping and failing ---------------------------------------------------------------------


def test_a_cancelled_stream_saves_the_partial_answer_as_incomplete(server, key, product_corpus, openai_server):
    openai_server.token_delay = 0.02
    openai_server.when("", words(300))
    stream = client_for(server, key).chat.completions.create(model="fake", messages=ask(QUESTION), stream=True)
    received = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received.append(chunk.choices[0].delta.content)
            if len(received) == 3:
                break
    stream.close()  # the client goes away mid-answer
    answer = wait_for(lambda: Message.objects.filter(role="assistant").exclude(status="streaming").first())
    assert answer.status == "incomplete"
    assert answer.content.startswith("".join(received)) and len(answer.content.split()) < 300
    assert answer.trace.data["cancelled"]


def test_a_model_failing_mid_stream_ends_the_stream_with_an_error(server, key, product_corpus, openai_server):
    openai_server.script(words(30))
    openai_server.fail_next("cut_stream", after_tokens=4, path="chat/completions")
    received = []
    with pytest.raises(openai.APIError) as raised:
        for chunk in client_for(server, key).chat.completions.create(model="fake", messages=ask(QUESTION),
                                                                     stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                received.append(chunk.choices[0].delta.content)
    assert raised.value.body["code"] == "stream_interrupted" and raised.value.body["conversation"]
    answer = Message.objects.get(role="assistant")
    assert (answer.status, answer.content) == ("error", "".join(received)) and received


def test_a_model_failing_a_whole_answer_is_a_502(server, key, product_corpus, openai_server):
    openai_server.fail_next("server_error", times=5, path="chat/completions")
    with pytest.raises(openai.InternalServerError) as raised:
        client_for(server, key).chat.completions.create(model="fake", messages=ask(QUESTION))
    assert raised.value.status_code == 502 and raised.value.body["code"] == "model_unavailable"
    conversation_id = raised.value.response.headers["x-ragchat-conversation"]
    assert Message.objects.get(role="assistant", conversation_id=conversation_id).status == "error"


# --- bad requests -----------------------------------------------------------------------------


BAD_BODIES = [
    (b"not json", "parse_error", None),
    (b"[1, 2]", "invalid_type", None),
    (b"[" * 40_000 + b"]" * 40_000, "parse_error", None),
    ({"messages": ask(QUESTION)}, "missing_required_parameter", "model"),
    ({"model": 3, "messages": ask(QUESTION)}, "invalid_type", "model"),
    ({"model": "default"}, "missing_required_parameter", "messages"),
    ({"model": "default", "messages": []}, "invalid_type", "messages"),
    ({"model": "default", "messages": "hi"}, "invalid_type", "messages"),
    ({"model": "default", "messages": [{"role": "assistant", "content": "Hi"}]}, "last_message_not_user", "messages"),
    ({"model": "default", "messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]}, "unsupported_role",
     "messages.[0].role"),
    ({"model": "default", "messages": [{"role": "wizard", "content": "Hi"}]}, "invalid_value", "messages.[0].role"),
    ({"model": "default", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}]}, "unsupported_content",
     "messages.[0].content"),
    ({"model": "default", "messages": ["Hi"]}, "invalid_type", "messages.[0]"),
    ({"model": "default", "messages": [{"role": "user", "content": ""}]}, "empty", "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user", "content": "\u200b"}]}, "empty", "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user", "content": 42}]}, "invalid_type", "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user"}]}, "invalid_type", "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user", "content": "x" * 16_001}]}, "too_long",
     "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user", "content": "NUL \x00"}]}, "invalid_characters",
     "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "user", "content": "a\x00"}, {"role": "assistant", "content": "b"},
                                       {"role": "user", "content": "c"}]}, "invalid_characters", "messages.[0].content"),
    ({"model": "default", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a"},
                                       {"role": "assistant", "content": "b"}, {"role": "user", "content": " "}]},
     "empty", "messages.[3].content"),
    ({"model": "default", "messages": ask(QUESTION), "n": 2}, "invalid_value", "n"),
    # OpenAI's sampling parameters are checked as OpenAI checks them (then left to the profile).
    *[({"model": "default", "messages": ask(QUESTION), name: value}, code, name) for name, value, code in [
        ("temperature", "hot", "invalid_type"), ("temperature", True, "invalid_type"),
        ("temperature", 2.5, "invalid_value"), ("temperature", -0.1, "invalid_value"),
        ("top_p", 1.5, "invalid_value"), ("top_p", [1], "invalid_type"),
        ("presence_penalty", -3, "invalid_value"), ("frequency_penalty", 2.01, "invalid_value"),
        ("frequency_penalty", "0", "invalid_type"),
        ("max_tokens", 0, "invalid_value"), ("max_tokens", 10.5, "invalid_type"), ("max_tokens", "10", "invalid_type"),
        ("max_completion_tokens", -5, "invalid_value"), ("max_completion_tokens", False, "invalid_type"),
        ("seed", 1.5, "invalid_type"), ("seed", "42", "invalid_type"),
        ("stop", 3, "invalid_type"), ("stop", ["end", 3], "invalid_type"), ("stop", {"a": "b"}, "invalid_type"),
        ("user", 7, "invalid_type"), ("user", {"id": "u"}, "invalid_type"),
        ("n", "1", "invalid_type"), ("n", True, "invalid_type"), ("n", 0, "invalid_value"),
    ]],
    ({"model": "default", "messages": ask(QUESTION), "stream": "yes"}, "invalid_type", "stream"),
    ({"model": "default", "messages": ask(QUESTION), "stream_options": {"include_usage": True}}, "invalid_value",
     "stream_options"),
    ({"model": "default", "messages": ask(QUESTION), "tools": [{"type": "function", "function": {"name": "f"}}]},
     "unsupported_parameter", "tools"),
    ({"model": "default", "messages": ask(QUESTION), "conversation": 7}, "invalid_type", "conversation"),
    # An object without its "id" started a new conversation (an outside probe): refused.
    ({"model": "default", "messages": ask(QUESTION), "conversation": {"uuid": "x"}}, "invalid_value", "conversation"),
]


def test_a_body_is_read_in_its_declared_charset_and_must_be_json(server, key, product_corpus):
    body = json.dumps({"model": "default", "messages": ask("Crème brûlée?")}, ensure_ascii=False).encode("iso-8859-1")
    with httpx.Client(timeout=20, headers={"Authorization": f"Bearer {key}"}) as http:
        url = f"{server.url}/openai/v1/chat/completions"
        for content_type, status in [("application/json", 400), ("application/json; charset=base64", 400),
                                     ("application/json; charset=bogus-xyz", 400),  # no codec: not read as UTF-8
                                     ("application/json; charset=iso-8859-1", 200)]:
            response = http.post(url, content=body, headers={"Content-Type": content_type})
            assert response.status_code == status, (content_type, response.text)
            if status == 400:
                assert response.json()["error"]["code"] == "parse_error"
        for content_type in ("application/x-www-form-urlencoded", "text/plain"):  # 415, as on the REST API
            response = http.post(url, content=body, headers={"Content-Type": content_type})
            error = response.json()["error"]
            assert (response.status_code, error["code"], error["type"]) == (415, "unsupported_media_type",
                                                                           "invalid_request_error"), content_type
    assert Message.objects.get(role="user").content == "Crème brûlée?"


def test_bad_bodies_are_400_and_save_nothing(server, key):
    with httpx.Client(timeout=20, headers={"Authorization": f"Bearer {key}"}) as http:
        url = f"{server.url}/openai/v1/chat/completions"
        for body, code, param in BAD_BODIES:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            response = http.post(url, content=content, headers={"Content-Type": "application/json"})
            error = response.json()["error"]
            assert (response.status_code, error["code"], error["param"]) == (400, code, param), (body, error)
            assert error["type"] == "invalid_request_error" and error["message"]
            if body == {"model": "default", "messages": [{"role": "user"}]}:  # as on the other transports
                assert error["message"] == "The message (content) is required and must be a string."
        response = http.post(url, json={"model": "gpt-4o", "messages": ask(QUESTION)})
        assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
        assert http.get(url).status_code == 405
        response = http.post(f"{server.url}/openai/v1/embeddings", json={"input": "x"})
        assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"
    assert not Message.objects.exists() and not Conversation.objects.exists()


def test_valid_sampling_parameters_and_unknown_keys_are_accepted(server, key, product_corpus):
    """In range, ``null``, or integers where a number is asked: answered, whatever the profile's
    own model settings. Keys the endpoint does not read (OpenAI's others, unknown ones) are ignored."""
    sampling = [
        {"temperature": 0, "top_p": 1, "max_tokens": 50, "max_completion_tokens": 1, "n": 1, "stream": False,
         "stop": "\n\n", "presence_penalty": -2, "frequency_penalty": 2.0, "seed": -7, "user": "patient-42"},
        {"temperature": 2.0, "top_p": 0.0, "stop": ["END", "STOP"], "presence_penalty": 1.5, "seed": 2**40},
        {"temperature": None, "top_p": None, "max_tokens": None, "stop": None, "seed": None, "user": None, "n": None,
         "stop_sequences": 3, "logit_bias": {"50256": -100}, "response_format": {"type": "text"}, "hotness": "very"},
    ]
    with httpx.Client(timeout=20, headers={"Authorization": f"Bearer {key}"}) as http:
        for extra in sampling:
            response = http.post(f"{server.url}/openai/v1/chat/completions",
                                 json={"model": "default", "messages": ask(QUESTION), **extra})
            assert response.status_code == 200, (extra, response.text)
            assert "$699" in response.json()["choices"][0]["message"]["content"]


def test_the_openai_client_reports_a_bad_request_as_bad_request_error(server, key):
    with pytest.raises(openai.BadRequestError) as raised:
        client_for(server, key).chat.completions.create(model="default", messages=[
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}])
    assert raised.value.body["code"] == "unsupported_content"
    started = time.monotonic()
    assert not Message.objects.exists() and time.monotonic() - started < 5
