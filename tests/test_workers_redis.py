"""Several workers: two real ASGI server processes (daphne and uvicorn) sharing the Redis
channel layer and the database. A socket on one worker sees every event of a turn that runs on
the other, in order, and can stop it."""

from __future__ import annotations

import pytest

from django_ragchat.models import Conversation, Message
from tests.live_servers import (
    caller_for,
    frames_until,
    open_socket,
    read_turn,
    receive,
    send,
    wait_for,
    words,
)

QUESTION = "How much does the Aurora X2 cost?"
FINAL = ("done", "error")


# Heavy (two real server processes) and alike whatever the Django version or the database: each once.
pytestmark = pytest.mark.pairwise


@pytest.fixture
def tabs(redis_workers, user, product_corpus):
    """The same user's conversation open in two tabs: tab A on worker 1, tab B on worker 2."""
    conversation = Conversation.objects.create(owner=user, profile="fake")
    caller = caller_for(user)
    path = f"/ws/ragchat/conversations/{conversation.pk}/"
    worker_1, worker_2 = redis_workers
    with open_socket(worker_1, caller, path) as tab_a, open_socket(worker_2, caller, path) as tab_b:
        yield conversation, tab_a, tab_b


def test_a_turn_on_one_worker_streams_to_a_tab_on_the_other(tabs, openai_server):
    conversation, tab_a, tab_b = tabs
    openai_server.when("", words(200))  # streamed with no delay between tokens
    send(tab_a, type="message", content=QUESTION, client_id="from-a")
    seen_by_a = read_turn(tab_a)
    seen_by_b = read_turn(tab_b)
    assert seen_by_b == seen_by_a  # every frame, in the same order
    deltas = [f for f in seen_by_b if f["type"] == "delta"]
    # Deltas that pile up while the relay is behind go out as one (transport.relay): at most
    # one frame per token, numbered without a gap, spelling the answer.
    assert 0 < len(deltas) <= 200 and [d["index"] for d in deltas] == list(range(len(deltas)))
    assert "".join(d["text"] for d in deltas) == words(200) == seen_by_b[-1]["message"]["content"]
    assert [f["type"] for f in seen_by_b[:4]] == ["ack", "status", "sources", "status"]

    # And the other way round: tab B's turn runs on worker 2, tab A watches from worker 1.
    send(tab_b, type="message", content="And the 256 GB model?", client_id="from-b")
    seen_by_b = read_turn(tab_b)
    assert read_turn(tab_a) == seen_by_b and seen_by_b[-1]["type"] == "done"
    assert list(conversation.messages.values_list("seq", "status")) == [
        (1, "complete"), (2, "complete"), (3, "complete"), (4, "complete")]


def test_a_tab_on_one_worker_stops_a_turn_running_on_the_other(tabs, openai_server):
    _, tab_a, tab_b = tabs
    openai_server.token_delay = 0.02
    openai_server.when("", words(200))
    send(tab_a, type="message", content=QUESTION)
    ack = receive(tab_b)
    assert ack["type"] == "ack"
    frames_until(tab_b, lambda f: f["type"] == "delta" and f["index"] == 2)
    send(tab_b, type="cancel")  # tab B's worker does not run the turn: the group carries it
    stopped_a = frames_until(tab_a, lambda f: f["type"] in FINAL)[-1]
    stopped_b = frames_until(tab_b, lambda f: f["type"] in FINAL)[-1]
    assert stopped_a == stopped_b
    assert stopped_b["code"] == "cancelled" and stopped_b["assistant_message"]["status"] == "incomplete"
    answer = wait_for(lambda: Message.objects.filter(pk=ack["assistant_message_id"]).exclude(status="streaming").first())
    assert answer.status == "incomplete" and answer.content == stopped_b["assistant_message"]["content"]
    assert 3 <= len(answer.content.split()) < 200


def test_an_idle_socket_outlives_redis_py_s_default_socket_timeout(tabs):
    """redis-py 8 defaults ``socket_timeout`` to 5 s, no longer than the channel layer's
    blocking receive (BZPOPMIN, 5 s): unless the layer's hosts set a longer ``socket_timeout``
    (tests/live_settings.py, as docs/deployment.md), every socket idle for 5 s is closed."""
    import time

    _, tab_a, tab_b = tabs
    time.sleep(7)  # idle past one whole blocking receive on each worker
    for tab in (tab_a, tab_b):
        send(tab, type="ping")
        assert receive(tab)["type"] == "pong"


def test_a_logout_on_one_worker_closes_the_sessions_socket_on_the_other(redis_workers, user):
    import httpx
    import websockets
    from django.contrib.sessions.backends.db import SessionStore

    worker_1, worker_2 = redis_workers
    caller = caller_for(user)
    with open_socket(worker_2, caller) as ws:
        with httpx.Client(cookies=caller.cookies, timeout=10) as client:
            response = client.post(f"{worker_1.url}/accounts/logout/", headers={"X-CSRFToken": caller.csrftoken})
            assert response.status_code in (200, 302)
        assert not SessionStore().exists(caller.sessionid)
        frame = receive(ws, 5)  # at once, not at the socket's next frame
        assert (frame["type"], frame["code"]) == ("error", "session_ended")
        try:
            receive(ws, 5)
            raise AssertionError("the socket stayed open")
        except websockets.ConnectionClosed as closed:
            assert closed.rcvd.code == 4401
