"""``Idempotency-Key`` on the OpenAI-compatible endpoint, with the real ``openai`` client against
uvicorn and gunicorn: a request sent again with its key (a client's retry) is answered with the
first attempt's answer and runs no second turn."""

from __future__ import annotations

import threading

import openai
import pytest

from django_ragchat.models import ApiKey, Conversation, Message
from tests.live_servers import words
from tests.test_openai_endpoint import QUESTION, ask, client_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=["asgi", "wsgi"])
def server(request):
    return request.getfixturevalue(request.param)


@pytest.fixture
def key(user) -> str:
    return ApiKey.create_key(user, "tests")[1]


def with_key(value: str) -> dict:
    return {"extra_headers": {"Idempotency-Key": value}}


def test_a_whole_answer_sent_again_with_its_key_is_the_first_answer(server, key, product_corpus):
    client = client_for(server, key)
    first = client.chat.completions.create(model="default", messages=ask(QUESTION), **with_key("k-1"))
    again = client.chat.completions.create(model="default", messages=ask(QUESTION), **with_key("k-1"))
    assert "$699" in first.choices[0].message.content
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.model_extra["conversation"] == first.model_extra["conversation"]
    assert Conversation.objects.count() == 1 and Message.objects.count() == 2
    # Another key, or none, is another turn.
    client.chat.completions.create(model="default", messages=ask(QUESTION), **with_key("k-2"))
    client.chat.completions.create(model="default", messages=ask(QUESTION))
    assert Conversation.objects.count() == 3 and Message.objects.count() == 6


def test_a_streamed_answer_sent_again_is_replayed_without_asking_the_model(server, key, product_corpus,
                                                                           openai_server):
    openai_server.script(words(12))
    client = client_for(server, key)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="fake", messages=ask(QUESTION), stream=True, **with_key("s-1")) if c.choices)
    calls = openai_server.count()
    replayed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="fake", messages=ask(QUESTION), stream=True, **with_key("s-1")) if c.choices)
    assert streamed == words(12) and replayed == streamed
    assert openai_server.count() == calls and Message.objects.count() == 2


def test_a_retry_while_the_answer_is_written_waits_for_it(server, key, product_corpus, openai_server):
    """The first attempt's client gave up (a timeout) while the model was still writing: the
    openai client's own retry gets 409 ``turn_in_progress`` with ``Retry-After``, waits, and
    then receives the first attempt's answer."""
    openai_server.when("", words(20))
    openai_server.hold_streams(after_tokens=1)
    client = client_for(server, key)
    first = client.chat.completions.create(model="fake", messages=ask(QUESTION), stream=True, **with_key("r-1"))
    next(iter(first))  # the turn has started
    with pytest.raises(openai.ConflictError) as raised:
        client.chat.completions.create(model="fake", messages=ask(QUESTION), **with_key("r-1"))
    assert raised.value.body["code"] == "turn_in_progress" and raised.value.response.headers["retry-after"] == "1"
    release = threading.Timer(0.5, openai_server.release_streams)
    release.start()
    try:
        retrying = openai.OpenAI(base_url=f"{server.url}/openai/v1", api_key=key, max_retries=5, timeout=20)
        retried = retrying.chat.completions.create(
            model="fake", messages=ask(QUESTION), **with_key("r-1"))
    finally:
        release.join()
        list(first)
    assert retried.choices[0].message.content == words(20)
    assert Conversation.objects.count() == 1 and Message.objects.count() == 2
    assert openai_server.count() == 1


def test_keys_are_each_users_own(server, key, other_user, product_corpus):
    theirs = ApiKey.create_key(other_user, "theirs")[1]
    mine = client_for(server, key).chat.completions.create(model="default", messages=ask(QUESTION), **with_key("same"))
    other = client_for(server, theirs).chat.completions.create(model="default", messages=ask("What is the return policy?"),
                                                               **with_key("same"))
    assert other.model_extra["conversation"] != mine.model_extra["conversation"]
    assert other.choices[0].message.content != mine.choices[0].message.content
    assert Conversation.objects.filter(owner=other_user).count() == 1 and Message.objects.count() == 4


def test_a_key_too_long_is_400_and_saves_nothing(server, key):
    with pytest.raises(openai.BadRequestError) as raised:
        client_for(server, key).chat.completions.create(model="default", messages=ask(QUESTION), **with_key("k" * 101))
    assert raised.value.body["code"] == "invalid_client_id" and raised.value.body["param"] == "Idempotency-Key"
    assert not Message.objects.exists() and not Conversation.objects.exists()
