"""The websocket consumer and its channel layer, under a real ASGI server (uvicorn):

- without a channel layer it chats on its own (a turn, a cancel, a ping);
- with a channel layer that fails (Redis at a port where nothing listens) the socket stays
  open and the turn is answered and saved whole;
- with the Redis layer configured as docs/deployment.md writes it, a socket idle for longer
  than the layer's 5-second blocking read still answers, and the server logs no read timeout.
"""

from __future__ import annotations

import time

import pytest

from django_ragchat.models import Conversation, Message
from tests.live_servers import (
    caller_for,
    frames_until,
    free_port,
    open_socket,
    read_turn,
    receive,
    running,
    send,
    settle,
    uvicorn,
    words,
)

QUESTION = "How much does the Aurora X2 cost?"

# Heavy (real uvicorn processes) and alike whatever the Django version or the database: each once.
pytestmark = pytest.mark.pairwise


@pytest.fixture(scope="module")
def layerless_server(live_env):
    with running(uvicorn("uvicorn-no-layer", {**live_env, "RAGCHAT_LIVE_CHANNEL_LAYER": "none"})) as (server,):
        yield server


@pytest.fixture(scope="module")
def broken_layer_server(live_env):
    env = {**live_env, "RAGCHAT_LIVE_CHANNEL_LAYER": "broken-redis", "RAGCHAT_LIVE_DEAD_PORT": str(free_port())}
    with running(uvicorn("uvicorn-broken-layer", env)) as (server,):
        yield server


@pytest.fixture(scope="module")
def redis_layer_server(live_env):
    with running(uvicorn("uvicorn-redis-layer", {**live_env, "RAGCHAT_LIVE_CHANNEL_LAYER": "redis"})) as (server,):
        yield server


@pytest.fixture
def cleanup(transactional_db, live_cache):
    yield
    settle()


def answer_over(server, user, conversation) -> list[dict]:
    with open_socket(server, caller_for(user), f"/ws/ragchat/conversations/{conversation.pk}/") as ws:
        send(ws, type="message", content=QUESTION, client_id="q")
        frames = read_turn(ws)
        send(ws, type="ping")
        assert receive(ws)["type"] == "pong"  # the socket is still open and answering
    return frames


def assert_answered_and_saved(frames: list[dict], conversation) -> None:
    assert frames[-1]["type"] == "done", frames[-1]
    assert "$699" in frames[-1]["message"]["content"]
    assert list(conversation.messages.values_list("role", "status")) == [
        ("user", "complete"), ("assistant", "complete")]


def test_without_a_channel_layer_a_socket_chats_on_its_own(layerless_server, cleanup, product_corpus, user):
    conversation = Conversation.objects.create(owner=user)
    assert_answered_and_saved(answer_over(layerless_server, user, conversation), conversation)


def test_without_a_channel_layer_cancel_still_stops_this_sockets_turn(
        layerless_server, cleanup, product_corpus, user, openai_server):
    conversation = Conversation.objects.create(owner=user, profile="fake")
    openai_server.token_delay = 0.02
    openai_server.when("", words(100))
    with open_socket(layerless_server, caller_for(user), f"/ws/ragchat/conversations/{conversation.pk}/") as ws:
        send(ws, type="message", content="Tell me everything.")
        frames_until(ws, lambda f: f["type"] == "delta")
        send(ws, type="cancel")
        final = frames_until(ws, lambda f: f["type"] in ("done", "error"))[-1]
    assert final["type"] == "error" and final["code"] == "cancelled"
    assert Message.objects.get(pk=final["assistant_message"]["id"]).status == "incomplete"


def test_a_failing_channel_layer_neither_drops_the_socket_nor_loses_the_turn(
        broken_layer_server, cleanup, product_corpus, user):
    conversation = Conversation.objects.create(owner=user)
    assert_answered_and_saved(answer_over(broken_layer_server, user, conversation), conversation)
    # The failure is logged (anywhere in the log: each entry carries redis-py's traceback, whose
    # length depends on its version).
    assert "ragchat: channel layer group_add failed" in broken_layer_server.log_tail(100_000)


def test_an_idle_socket_on_the_documented_redis_layer_still_answers(redis_layer_server, cleanup, product_corpus, user):
    conversation = Conversation.objects.create(owner=user)
    with open_socket(redis_layer_server, caller_for(user), f"/ws/ragchat/conversations/{conversation.pk}/") as ws:
        time.sleep(7)  # idle longer than channels-redis's 5-second blocking read (BZPOPMIN)
        send(ws, type="message", content=QUESTION)
        frames = read_turn(ws)
    assert_answered_and_saved(frames, conversation)
    log = redis_layer_server.log_tail(500)
    assert "Timeout reading" not in log and "channel layer" not in log, log



class StalledRedis:
    """A server where Redis would be that takes connections and never answers (Redis stopped
    with SIGSTOP, a network that drops replies): every call to the layer waits."""

    def __init__(self):
        import socket
        import threading

        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)

    def close(self):
        self.listener.close()
        for connection in self.connections:
            connection.close()


def test_sigterm_ends_the_process_within_the_grace_period_whatever_the_layer_does(
        live_env, cleanup, user, conversation):
    """The layer is Redis configured as docs/deployment.md writes it (socket_timeout 30) but
    does not answer: sockets are stuck in it (joining the conversation's group) when SIGTERM
    comes. The process still ends within SHUTDOWN_GRACE_SECONDS (5 in tests.recovery_settings)."""
    import signal

    stalled = StalledRedis()
    env = {**live_env, "RAGCHAT_LIVE_CHANNEL_LAYER": "broken-redis", "RAGCHAT_LIVE_DEAD_PORT": str(stalled.port),
           "DJANGO_SETTINGS_MODULE": "tests.recovery_settings"}
    server = uvicorn("uvicorn-stalled-layer", env).start()
    sockets = []
    try:
        for _ in range(3):
            sockets.append(open_socket(server, caller_for(user), f"/ws/ragchat/conversations/{conversation.pk}/",
                                       ready=False))
        time.sleep(1)  # each socket is in the layer now
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(30)
        finally:
            took = time.monotonic() - started
        assert took < 5 + 2, f"the process took {took:.1f} s to stop:\n{server.log_tail()}"
    finally:
        for ws in sockets:
            ws.close()
        server.stop()
        stalled.close()
