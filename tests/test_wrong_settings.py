"""A wrong ``RAGCHAT`` setting on a running server, which runs no system check (``ragchat.E007``
is ``manage.py check``'s): a new user's trial under gunicorn, with TURNS_PER_MINUTE="thirty" or
MAX_CONCURRENT_STREAMS="3", failed every message with a TypeError inside the limits (an HTML
500 page, a traceback), and TURNS_PER_MINUTE=-1 refused every one as "at most -1 a minute".
Now every transport refuses the message alike, 500 ``settings_invalid``, nothing saved, the
setting, its value and what it takes in the log. And ALLOW_ANONYMOUS="no", a truthy string,
turned anonymous chat on: a flag that is not a bool now reads as False."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.test import Client

from django_ragchat.exceptions import SettingsInvalid
from django_ragchat.models import ApiKey, Conversation, Message
from tests.asgi import application
from tests.live_servers import caller_for
from tests.test_api import API, client_for, post_json
from tests.test_openai_api_keys import complete

QUESTION = "How much does the Aurora X2 cost?"
REFUSED = {"code": "settings_invalid", "message": SettingsInvalid.default_message}


def said(event: dict) -> dict:
    return {"code": event["code"], "message": event["message"]}


def over_the_socket(user) -> dict:
    """The first frame the websocket answers a message with."""
    cookie = caller_for(user).cookie_header.encode()

    async def send():
        communicator = WebsocketCommunicator(application, "/ws/ragchat/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)])
        assert (await communicator.connect())[0]
        await communicator.receive_json_from(timeout=10)  # ready
        await communicator.send_json_to({"type": "message", "content": QUESTION, "client_id": "c1"})
        frame = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()
        return frame

    return async_to_sync(send)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("key, value, takes", [
    ("TURNS_PER_MINUTE", "thirty", "a whole number, 0 or more"),  # a TypeError in the rate limit
    ("MAX_CONCURRENT_STREAMS", "3", "a whole number, 0 or more"),  # a TypeError in the stream slots
    ("TURNS_PER_MINUTE", -1, "a whole number, 0 or more"),  # "at most -1 a minute", every time
    ("MAX_MESSAGE_CHARS", "big", "a whole number, 1 or more"),  # a TypeError measuring the message
    ("STREAM_LEASE_SECONDS", "30", "a number of seconds above 0"),  # a TypeError taking the lease
])
def test_a_wrong_setting_every_turn_reads_refuses_the_message_alike_on_every_transport(
        ragchat_settings_override, user, product_corpus, caplog, key, value, takes):
    ragchat_settings_override(**{key: value})
    conversation = Conversation.objects.create(owner=user)

    rest = post_json(client_for(user), f"{API}/conversations/{conversation.pk}/messages/", {"content": QUESTION})
    assert (rest.status_code, rest.json()) == (500, {"code": "settings_invalid", "detail": REFUSED["message"]})

    browser = Client()
    browser.force_login(user)
    sse = browser.post("/chat/stream/", data=json.dumps({"content": QUESTION}), content_type="application/json")
    assert sse.status_code == 500 and said(json.loads(sse.content)) == REFUSED

    frame = over_the_socket(user)
    assert (frame["type"], frame["client_id"], said(frame)) == ("error", "c1", REFUSED)

    openai = complete(Client(), ApiKey.create_key(user)[1], {"model": "default", "messages": [
        {"role": "user", "content": QUESTION}]})
    assert openai.status_code == 500
    assert openai.json()["error"] | {"message": None} == {"code": "settings_invalid", "type": "server_error",
                                                          "param": None, "message": None}

    assert list(Conversation.objects.all()) == [conversation] and not Message.objects.exists()
    assert f"RAGCHAT[{key!r}] must be {takes}, not {value!r}" in caplog.text
    assert "ragchat.E007" in caplog.text and "Traceback" not in caplog.text and "TypeError" not in caplog.text


@pytest.mark.django_db(transaction=True)
def test_once_the_setting_is_fixed_the_same_message_is_answered(ragchat_settings_override, user, product_corpus):
    ragchat_settings_override(MAX_CONCURRENT_STREAMS="3")
    conversation = Conversation.objects.create(owner=user)
    url = f"{API}/conversations/{conversation.pk}/messages/"
    assert post_json(client_for(user), url, {"content": QUESTION, "client_id": "c1"}).status_code == 500
    ragchat_settings_override(MAX_CONCURRENT_STREAMS=3)
    assert post_json(client_for(user), url, {"content": QUESTION, "client_id": "c1"}).status_code == 201


# --- flags: anything but True reads as False --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_allow_anonymous_no_keeps_anonymous_chat_off_on_every_transport(ragchat_settings_override, product_corpus,
                                                                        caplog):
    """The trial's ALLOW_ANONYMOUS="no", a truthy string, turned anonymous chat on."""
    from rest_framework.test import APIClient

    from tests.live_servers import anonymous_caller

    ragchat_settings_override(ALLOW_ANONYMOUS="no")
    visitor = APIClient()
    assert post_json(visitor, f"{API}/conversations/", {}).status_code == 403
    sse = Client().post("/chat/stream/", data=json.dumps({"content": QUESTION}), content_type="application/json")
    assert (sse.status_code, json.loads(sse.content)["code"]) == (403, "not_authenticated")
    page = Client().get("/chat/")
    assert page.status_code == 302 and "login" in page["Location"]  # to sign in, not to an anonymous chat
    cookie = anonymous_caller().cookie_header.encode()

    async def handshake():
        communicator = WebsocketCommunicator(application, "/ws/ragchat/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", cookie)])
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(handshake)() is False
    assert not Conversation.objects.exists()
    assert "RAGCHAT['ALLOW_ANONYMOUS'] must be True or False, not 'no': read as False" in caplog.text


@pytest.mark.django_db
@pytest.mark.parametrize("setting", ["yes", "", None])  # "" and None showed every passage
def test_cited_sources_only_of_a_wrong_value_shows_the_cited_passages_only(rf, user, ragchat_settings_override,
                                                                            setting):
    from django.contrib.auth.models import AnonymousUser
    from django.contrib.sessions.backends.db import SessionStore

    from tests.test_widget import render_tag, widget_config

    ragchat_settings_override(CITED_SOURCES_ONLY=setting, ALLOW_ANONYMOUS=True)
    for caller in (AnonymousUser(), user):
        request = rf.get("/products/")
        request.user, request.session = caller, SessionStore()
        assert widget_config(render_tag(request))["citedSourcesOnly"] is True
