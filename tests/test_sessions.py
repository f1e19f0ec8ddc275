"""Sessions, origins, idempotent sends and conversations that go away under a turn.

* an open websocket checks its session before each turn and closes (4401) after a logout;
* the websocket Origin must match scheme, host and port;
* an anonymous visitor's conversations become theirs when they sign in;
* a resend with the same ``client_id`` returns the first attempt's result (REST, SSE, websocket);
* a conversation deleted while its answer streams ends the turn with ``conversation_deleted``;
* a refused websocket turn without a conversation creates none; Retry-After tells the truth.
"""

from __future__ import annotations

import pickle
import time

import httpx
import pytest
import redis
import websockets
from django.contrib.sessions.backends.db import SessionStore
from django.test import Client
from websockets.exceptions import InvalidStatus

from django_ragchat.models import Conversation, Message
from django_ragchat.transport import origins
from django_ragchat.turn import persistence
from tests.live_servers import (
    REDIS_URL,
    caller_for,
    frames_until,
    open_socket,
    parse_sse,
    rate_counted,
    read_turn,
    receive,
    send,
    sse_headers,
    sse_url,
    words,
)

QUESTION = "How much does the Aurora X2 cost?"
API = "/api/ragchat"


def sse_post(server, caller, conversation_id, body: dict) -> tuple[int, list[dict], dict]:
    with httpx.Client(cookies=caller.cookies, timeout=30) as client:
        with client.stream("POST", sse_url(server, conversation_id), json=body,
                           headers=sse_headers(caller)) as response:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                return response.status_code, parse_sse(response.iter_lines()), dict(response.headers)
            response.read()
            return response.status_code, [response.json()], dict(response.headers)


# --- sessions ---------------------------------------------------------------------------------


def log_out(server, caller) -> None:
    """A real logout (Django's LogoutView flushes the session), from another tab."""
    with httpx.Client(cookies=caller.cookies, timeout=10) as client:
        response = client.post(f"{server.url}/accounts/logout/", headers={"X-CSRFToken": caller.csrftoken})
        assert response.status_code in (200, 302), response.text[:300]
    assert not SessionStore().exists(caller.sessionid)


def assert_closed_for_the_session(ws) -> None:
    """The socket says ``session_ended`` (and nothing else), then is closed with 4401."""
    frame = receive(ws, 5)
    assert (frame["type"], frame["code"]) == ("error", "session_ended"), frame
    with pytest.raises(websockets.ConnectionClosed) as closed:
        receive(ws, 5)
    assert closed.value.rcvd.code == 4401


def test_a_socket_closes_with_4401_when_its_session_logs_out(asgi, user, product_corpus):
    caller = caller_for(user)
    with open_socket(asgi, caller) as ws:
        send(ws, type="message", content=QUESTION, client_id="before")
        assert read_turn(ws)[-1]["type"] == "done"
        log_out(asgi, caller)
        assert_closed_for_the_session(ws)
        with pytest.raises(websockets.ConnectionClosed):
            send(ws, type="message", content=QUESTION, client_id="after")
    assert Message.objects.filter(role="user").count() == 1  # the second message was never taken


def test_a_logout_closes_the_sessions_sockets_at_once(asgi, user, conversation, product_corpus):
    """Alice signed in twice (two browsers), a tab of each on the same conversation: the one she
    logs out of is closed at once, before it hears anything of the other's next turn."""
    phone, laptop = caller_for(user), caller_for(user)
    path = f"/ws/ragchat/conversations/{conversation.pk}/"
    with open_socket(asgi, phone, path) as on_phone, open_socket(asgi, laptop, path) as on_laptop:
        log_out(asgi, phone)
        assert_closed_for_the_session(on_phone)  # without sending anything
        send(on_laptop, type="message", content=QUESTION, client_id="laptop")
        assert read_turn(on_laptop)[-1]["type"] == "done"
        send(on_laptop, type="ping")
        assert receive(on_laptop)["type"] == "pong"


def test_a_socket_whose_session_is_gone_relays_nothing_and_answers_nothing(asgi, user, conversation,
                                                                           product_corpus):
    """A session that ends without a logout (expired, deleted from the store): the socket finds
    out at its next frame, its own or a turn's, and relays none of it."""
    phone, laptop = caller_for(user), caller_for(user)
    path = f"/ws/ragchat/conversations/{conversation.pk}/"
    with open_socket(asgi, phone, path) as on_phone, open_socket(asgi, laptop, path) as on_laptop:
        SessionStore(session_key=phone.sessionid).delete()
        send(on_laptop, type="message", content=QUESTION, client_id="laptop")
        assert read_turn(on_laptop)[-1]["type"] == "done"
        assert_closed_for_the_session(on_phone)  # the turn's ack found the session gone
    again = caller_for(user)
    with open_socket(asgi, again, path) as ws:
        SessionStore(session_key=again.sessionid).delete()
        send(ws, type="ping", client_id="p")
        assert_closed_for_the_session(ws)


@pytest.mark.django_db
def test_anonymous_conversations_follow_the_visitor_when_they_sign_in(django_user_model, ragchat_settings_override):
    ragchat_settings_override(ALLOW_ANONYMOUS=True)
    django_user_model.objects.create_user("carol", password="a long secret")
    visitor, stranger = Client(), Client()
    for client in (visitor, stranger):
        response = client.post(f"{API}/conversations/", {"title": "before signing in"}, content_type="application/json")
        assert response.status_code == 201
    mine = Conversation.objects.get(session_key=visitor.cookies["sessionid"].value)
    theirs = Conversation.objects.get(session_key=stranger.cookies["sessionid"].value)

    response = visitor.post("/accounts/login/", {"username": "carol", "password": "a long secret"})
    assert response.status_code == 302
    assert visitor.cookies["sessionid"].value != mine.session_key  # login changed the session key
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert mine.owner.username == "carol" and mine.session_key == ""
    assert theirs.owner is None and theirs.session_key  # someone else's stays theirs
    listed = visitor.get(f"{API}/conversations/").json()["results"]
    assert [c["id"] for c in listed] == [str(mine.pk)]


# --- origins ----------------------------------------------------------------------------------


def test_the_websocket_origin_must_match_scheme_host_and_port(asgi, user):
    caller = caller_for(user)
    with open_socket(asgi, caller, origin=f"http://127.0.0.1:{asgi.port}"):
        pass
    for origin in (f"http://127.0.0.1:{asgi.port + 1}", f"https://127.0.0.1:{asgi.port}", "http://127.0.0.1",
                   f"http://localhost.evil.example:{asgi.port}", "null"):
        with pytest.raises(InvalidStatus) as refused:
            open_socket(asgi, caller, origin=origin)
        assert refused.value.response.status_code == 403, origin


def scope(origin: str | None, host: str = "chat.example.com", scheme: str = "wss", **headers) -> dict:
    pairs = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin else [])
    pairs += [(name.replace("_", "-").encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "scheme": scheme, "headers": pairs}


def test_origin_rules(settings):
    settings.ALLOWED_HOSTS = ["chat.example.com"]
    settings.CSRF_TRUSTED_ORIGINS = ["https://*.partner.example"]
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    assert origins.origin_allowed(scope("https://chat.example.com"))
    assert origins.origin_allowed(scope("https://chat.example.com:443"))
    assert not origins.origin_allowed(scope("http://chat.example.com"))  # scheme
    assert not origins.origin_allowed(scope("https://chat.example.com:8443"))  # port
    assert not origins.origin_allowed(scope("https://chat.example.com", host="other.example.com"))  # not allowed
    assert not origins.origin_allowed(scope(None))
    assert not origins.origin_allowed(scope("https://chat.example.com/path"))
    assert origins.origin_allowed(scope("https://app.partner.example"))  # trusted
    assert not origins.origin_allowed(scope("http://app.partner.example"))
    # Behind a TLS-terminating proxy the socket arrives as ws: the proxy header says https.
    assert not origins.origin_allowed(scope("https://chat.example.com", scheme="ws"))
    assert origins.origin_allowed(scope("https://chat.example.com", scheme="ws", x_forwarded_proto="https"))


# --- idempotent sends -------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_rest_resend_returns_the_first_attempts_messages(user, conversation, product_corpus):
    client = Client()
    client.force_login(user)
    url = f"{API}/conversations/{conversation.pk}/messages/"
    first = client.post(url, {"content": QUESTION, "client_id": "tab1-1"}, content_type="application/json")
    again = client.post(url, {"content": QUESTION, "client_id": "tab1-1"}, content_type="application/json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    assert conversation.messages.count() == 2
    other = client.post(url, {"content": QUESTION, "client_id": "tab1-2"}, content_type="application/json")
    assert other.status_code == 201 and conversation.messages.count() == 4
    bad = client.post(url, {"content": QUESTION, "client_id": 7}, content_type="application/json")
    assert (bad.status_code, bad.json()["code"]) == (400, "invalid_client_id")
    assert conversation.messages.count() == 4


@pytest.mark.django_db
def test_a_resend_while_the_first_answer_streams_is_refused_not_saved(user, conversation, product_corpus):
    persistence.begin_turn(conversation.pk, QUESTION, "tab1-1")
    with pytest.raises(persistence.DuplicateMessage) as duplicate:
        persistence.begin_turn(conversation.pk, QUESTION, "tab1-1")
    assert duplicate.value.assistant_message.status == "streaming"
    client = Client()
    client.force_login(user)
    response = client.post(f"{API}/conversations/{conversation.pk}/messages/",
                           {"content": QUESTION, "client_id": "tab1-1"}, content_type="application/json")
    assert (response.status_code, response.json()["code"]) == (409, "turn_in_progress")
    assert response["Retry-After"] == "1"
    assert conversation.messages.count() == 2


def test_an_sse_resend_replays_the_first_attempt(asgi, user, conversation, product_corpus):
    caller = caller_for(user)
    status, first, _ = sse_post(asgi, caller, conversation.pk, {"content": QUESTION, "client_id": "once"})
    assert status == 200 and first[-1]["type"] == "done"
    status, again, _ = sse_post(asgi, caller, conversation.pk, {"content": QUESTION, "client_id": "once"})
    assert status == 200 and [e["type"] for e in again] == ["ack", "done"]
    assert again[0] == {**first[0], "replayed": True} and again[-1]["message"]["id"] == first[-1]["message"]["id"]
    assert again[-1]["message"]["content"] == first[-1]["message"]["content"]
    assert conversation.messages.count() == 2


def test_a_websocket_resend_after_reconnecting_replays_the_first_attempt(asgi, user, product_corpus):
    caller = caller_for(user)
    with open_socket(asgi, caller) as ws:  # no conversation yet: the message starts one
        send(ws, type="message", content=QUESTION, client_id="first-message")
        first = read_turn(ws)
    with open_socket(asgi, caller) as ws:  # the ack was lost: the client sends again
        send(ws, type="message", content=QUESTION, client_id="first-message")
        # Watching the conversation now, the socket may first get frames of the first attempt
        # (relayed to the conversation's group in batches, so possibly all of them, its own
        # ack included); the replay's ack says it is one.
        before_ack = frames_until(ws, lambda f: f["type"] == "ack" and f.get("replayed"))
        again = before_ack[-1:] + read_turn(ws)
    assert all(f["client_id"] == "first-message" for f in before_ack)
    assert [f["type"] for f in again] == ["ack", "done"]
    assert again[0]["user_message_id"] == first[0]["user_message_id"]
    assert again[-1]["message"] == first[-1]["message"]
    assert Conversation.objects.filter(owner=user).count() == 1
    assert Message.objects.filter(conversation__owner=user).count() == 2


@pytest.mark.django_db(transaction=True)  # the server is chosen at run time, after the database
@pytest.mark.parametrize("server_kind", ["asgi", "wsgi"])
def test_an_sse_first_message_sent_twice_starts_one_conversation(request, server_kind, user, product_corpus,
                                                                 openai_server):
    """``POST <prefix>/stream/`` without a conversation, sent again with the same client_id
    (its response was lost): the first attempt's conversation answers it with a replay."""
    server = request.getfixturevalue(server_kind)
    caller = caller_for(user)
    new_url = f"{server.url}/chat/stream/"
    with httpx.Client(cookies=caller.cookies, timeout=30) as client:
        answers = []
        for _ in range(3):
            with client.stream("POST", new_url, json={"content": QUESTION, "client_id": "first-of-all"},
                               headers=sse_headers(caller)) as response:
                assert response.status_code == 200, response.read()
                answers.append(parse_sse(response.iter_lines()))
    first, *again = answers
    assert first[-1]["type"] == "done" and not first[0].get("replayed")
    for events in again:
        assert [e["type"] for e in events] == ["ack", "done"] and events[0]["replayed"]
        assert events[0]["conversation_id"] == first[0]["conversation_id"]
        assert events[-1]["message"] == first[-1]["message"]
    assert Conversation.objects.filter(owner=user).count() == 1
    assert Message.objects.filter(conversation__owner=user, role="user").count() == 1


def test_resends_count_against_no_limit_on_any_transport(asgi, user, product_corpus, live_prefix):
    """Thirty sends of one message (TURNS_PER_MINUTE is 25 on the live servers): one turn is
    counted, each resend replays, and the next new message is not refused."""
    caller = caller_for(user)
    sse_conversation, ws_conversation = (Conversation.objects.create(owner=user) for _ in range(2))
    for _ in range(30):
        status, events, _ = sse_post(asgi, caller, sse_conversation.pk, {"content": QUESTION, "client_id": "once"})
        assert status == 200 and events[-1]["type"] == "done", events
    with open_socket(asgi, caller) as ws:
        for _ in range(30):
            send(ws, type="message", content=QUESTION, conversation_id=str(ws_conversation.pk), client_id="ws-once")
            frames = frames_until(ws, lambda f: f["type"] in ("done", "error") and f.get("client_id") == "ws-once")
            assert frames[-1]["type"] == "done", frames[-1]
    client = Client()
    client.force_login(user)
    url = f"{API}/conversations/{sse_conversation.pk}/messages/"
    for _ in range(30):
        response = client.post(url, {"content": QUESTION, "client_id": "once"}, content_type="application/json")
        assert response.status_code == 200, response.json()
    assert rate_counted(live_prefix, user) == 2
    status, events, _ = sse_post(asgi, caller, sse_conversation.pk, {"content": "And the 256 GB model?"})
    assert status == 200 and events[-1]["type"] == "done"
    assert Message.objects.filter(conversation__owner=user).count() == 6


@pytest.mark.django_db
def test_refusals_for_a_turn_in_progress_count_against_no_limit(user, conversation, product_corpus,
                                                               ragchat_settings_override):
    """While an answer is being written, every message refused ``turn_in_progress`` leaves the
    caller's limits untouched: a retry loop does not lock them out."""
    from django.core.cache import cache

    cache.clear()  # counters of earlier tests' users (ids are reused)
    ragchat_settings_override(TURNS_PER_MINUTE=2, MAX_CONCURRENT_STREAMS=1)
    client = Client()
    client.force_login(user)
    url = f"{API}/conversations/{conversation.pk}/messages/"
    _, streaming = persistence.begin_turn(conversation.pk, QUESTION)  # another tab's answer
    for i in range(5):
        response = client.post(url, {"content": QUESTION, "client_id": f"retry-{i}"}, content_type="application/json")
        assert (response.status_code, response.json()["code"]) == (409, "turn_in_progress")
    Message.objects.filter(pk=streaming.pk).update(status="complete", lease_expires_at=None)
    for i in range(2):
        response = client.post(url, {"content": QUESTION, "client_id": f"now-{i}"}, content_type="application/json")
        assert response.status_code == 201, response.json()


# --- a conversation deleted under its turn ----------------------------------------------------


@pytest.fixture
def slow_conversation(user, product_corpus, openai_server):
    openai_server.token_delay = 0.02
    openai_server.when("", words(80))
    return Conversation.objects.create(owner=user, profile="fake")


def test_a_websocket_turn_ends_with_an_error_when_its_conversation_is_deleted(asgi, user, slow_conversation):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(slow_conversation.pk), client_id="c")
        while receive(ws)["type"] != "delta":
            pass
        slow_conversation.delete()
        final = read_turn(ws)[-1]
        assert (final["type"], final["code"], final["client_id"]) == ("error", "conversation_deleted", "c")
        send(ws, type="ping", client_id="still-open")
        assert receive(ws)["type"] == "pong"
    assert not Message.objects.exists()


def test_an_sse_turn_ends_with_an_error_event_when_its_conversation_is_deleted(asgi, user, slow_conversation):
    caller = caller_for(user)
    events = []
    with httpx.Client(cookies=caller.cookies, timeout=30) as client:
        with client.stream("POST", sse_url(asgi, slow_conversation.pk), json={"content": QUESTION},
                           headers=sse_headers(caller)) as response:
            lines = []
            for line in response.iter_lines():
                lines.append(line)
                if not line:
                    events.extend(parse_sse(lines))
                    lines = []
                    if events[-1]["type"] == "delta" and Conversation.objects.filter(pk=slow_conversation.pk).exists():
                        slow_conversation.delete()
    assert events[-1]["type"] == "error" and events[-1]["code"] == "conversation_deleted"


# --- refusals create nothing; Retry-After ----------------------------------------------------


def hold_slots_elsewhere(live_prefix, user, n: int, seconds: float = 30.0) -> None:
    """The user's stream slots taken by answers written on another worker (as the cache holds them)."""
    client = redis.Redis.from_url(REDIS_URL)
    for i in range(n):
        client.set(f"{live_prefix}:1:ragchat:slot:u{user.pk}:{i}",
                   pickle.dumps(("another-worker", time.time() + seconds)), ex=int(seconds))
    client.close()


def test_refused_websocket_turns_without_a_conversation_create_none(asgi, user, live_prefix):
    hold_slots_elsewhere(live_prefix, user, 3)  # MAX_CONCURRENT_STREAMS of tests/live_settings.py
    with open_socket(asgi, caller_for(user)) as ws:
        for i in range(10):
            send(ws, type="message", content=QUESTION, client_id=str(i))
        refusals = [receive(ws) for _ in range(10)]
    assert {(f["type"], f["code"]) for f in refusals} == {("error", "too_many_streams")}
    # The slots were just renewed: each frees when its answer ends, any moment now, not when its
    # lease runs out in 30 s.
    assert all(f["retry_after"] == 1 for f in refusals)
    assert not Conversation.objects.filter(owner=user).exists()


def test_sse_retry_after_is_when_the_first_abandoned_slot_expires(asgi, user, conversation, live_prefix):
    # Slots nobody renewed for 18 s (their workers likely gone): they free when they expire.
    hold_slots_elsewhere(live_prefix, user, 3, seconds=12)
    status, (body,), headers = sse_post(asgi, caller_for(user), conversation.pk, {"content": QUESTION})
    assert (status, body["code"]) == (429, "too_many_streams")
    assert 8 <= int(headers["retry-after"]) <= 12
    assert not conversation.messages.exists()

