"""The websocket protocol against a real ASGI server (uvicorn, in-memory channel layer), with a
real websocket client: the turn's events, malformed frames, isolation, limits, cancel,
disconnect, model failures and concurrency. See docs/protocol.md."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import websockets
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from websockets.exceptions import InvalidStatus

from django_ragchat.models import Conversation, Message
from tests.live_servers import (
    anonymous_caller,
    caller_for,
    frames_until,
    open_socket,
    read_turn,
    receive,
    send,
    unknown_id,
    wait_for,
    words,
)

QUESTION = "How much does the Aurora X2 cost?"
FINAL = ("done", "error")



def assert_turn_shape(frames: list[dict]) -> None:
    """ack, status retrieving, sources, status generating, deltas (consecutive), done."""
    types = [f["type"] for f in frames]
    assert types[:4] == ["ack", "status", "sources", "status"], types
    assert [f["stage"] for f in frames if f["type"] == "status"] == ["retrieving", "generating"]
    assert types[-1] == "done" and set(types[4:-1]) <= {"delta"}, types
    deltas = [f for f in frames if f["type"] == "delta"]
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    assert "".join(d["text"] for d in deltas) == frames[-1]["message"]["content"]


def test_a_turn_streams_its_events_in_order(asgi, product_corpus, user, conversation):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk), client_id="q1")
        frames = read_turn(ws)
    assert_turn_shape(frames)
    assert all(f["conversation_id"] == str(conversation.pk) and f["client_id"] == "q1" for f in frames)
    ack, sources, done = frames[0], frames[2], frames[-1]["message"]
    assert "$699" in done["content"] and "[1]" in done["content"]
    assert done["status"] == "complete" and done["citations"]
    assert [s["index"] for s in sources["sources"]] == list(range(1, len(sources["sources"]) + 1))
    assert {c["chunk_id"] for c in done["citations"]} <= {s["chunk_id"] for s in sources["sources"]}
    saved = list(conversation.messages.values_list("id", "seq", "role", "status", "content"))
    assert saved == [(ack["user_message_id"], 1, "user", "complete", QUESTION),
                     (ack["assistant_message_id"], 2, "assistant", "complete", done["content"])]


def test_streamed_response_augmenters_run_on_each_delta_before_it_is_relayed(asgi, product_corpus, user):
    conversation = Conversation.objects.create(owner=user, profile="shouting")
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk))
        frames = read_turn(ws)
    assert_turn_shape(frames)
    content = frames[-1]["message"]["content"]
    assert "$699" in content and content == content.upper() and "AURORA X2" in content
    assert frames[-1]["message"]["citations"]  # the citations augmenter still ran on the whole answer


def test_a_message_without_conversation_starts_one_that_the_socket_keeps(asgi, product_corpus, user):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION)
        first = read_turn(ws)
        send(ws, type="message", content="Does it have a warranty?")
        second = read_turn(ws)
    assert first[-1]["type"] == second[-1]["type"] == "done"
    conversation = Conversation.objects.get()
    assert conversation.owner == user
    assert first[0]["conversation_id"] == second[0]["conversation_id"] == str(conversation.pk)
    assert conversation.messages.count() == 4


def test_a_message_without_conversation_may_name_its_profile(asgi, product_corpus, user):
    with open_socket(asgi, caller_for(user)) as ws:
        for wrong in ("nope", 5):
            send(ws, type="message", content=QUESTION, profile=wrong)
            assert receive(ws)["code"] == "unknown_profile"  # as over server-sent events and REST
        send(ws, type="message", content="", profile="nope")
        assert receive(ws)["code"] == "empty"  # the message is checked first, as over server-sent events
        assert not Conversation.objects.exists()
        send(ws, type="message", content=QUESTION, profile="shouting")
        frames = read_turn(ws)
    assert frames[-1]["type"] == "done" and frames[-1]["message"]["content"].isupper()
    assert Conversation.objects.get().profile == "shouting"


def test_ping(asgi, user):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="ping", client_id="p")
        assert receive(ws) == {"type": "pong", "client_id": "p"}


def _closes_cleaning_up(user, frames: list[dict], monkeypatch) -> tuple[list[dict], bool]:
    """Open a socket (in process), send ``frames``, read an answer to each, close it: (the
    answers, whether the close ran channels' cleanup of the shared thread's connections)."""
    from channels.generic import websocket as channels_websocket
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from django_ragchat.transport.consumers import ChatConsumer

    cleanups = []

    async def counted():
        cleanups.append(1)

    monkeypatch.setattr(channels_websocket, "aclose_old_connections", counted)  # what websocket_disconnect calls
    session = SessionStore()
    session.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                    HASH_SESSION_KEY: user.get_session_auth_hash()})
    session.create()

    async def run():
        socket = WebsocketCommunicator(ChatConsumer.as_asgi(), "/ws/ragchat/")
        socket.scope.update(user=user, session=session)
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from(10))["type"] == "ready"
        answers = []
        for frame in frames:
            await socket.send_json_to(frame)
            answers.append(await socket.receive_json_from(10))
        await socket.disconnect()
        return answers

    return async_to_sync(run)(), bool(cleanups)


@pytest.mark.django_db(transaction=True)
def test_a_socket_closes_without_the_shared_threads_cleanup_unless_it_worked_there(user, monkeypatch,
                                                                                 ragchat_settings_override):
    """Channels' cleanup of the database connections of the thread the consumers share (a thread
    hop) runs at a socket's close only when the socket's work ran there: its ping, or a message
    whose checks ran there (no lanes); not for a socket whose work all ran on lanes."""
    empty = {"type": "message", "content": "   ", "client_id": "e"}
    assert _closes_cleaning_up(user, [], monkeypatch) == ([], False)
    answers, cleaned = _closes_cleaning_up(user, [empty], monkeypatch)
    assert [a["code"] for a in answers] == ["empty"] and not cleaned
    answers, cleaned = _closes_cleaning_up(user, [{"type": "ping"}], monkeypatch)
    assert answers == [{"type": "pong"}] and cleaned
    ragchat_settings_override(DATABASE_THREADS=1)  # no lanes: the message's checks on the shared thread
    answers, cleaned = _closes_cleaning_up(user, [empty], monkeypatch)
    assert [a["code"] for a in answers] == ["empty"] and cleaned


MALFORMED = [
    ("not json", "parse_error"),
    # JSON but no object: invalid_type, as REST and server-sent events answer such a body (an
    # HR intranet's trial: the websocket said invalid_frame, one cause and two codes).
    ("[1, 2, 3]", "invalid_type"),
    ('"message"', "invalid_type"),
    ('{"content": "no type"}', "unknown_type"),
    ('{"type": 5}', "unknown_type"),
    ('{"type": "subscribe"}', "unknown_type"),
    ('{"type": "ping", "client_id": ["x"]}', "invalid_client_id"),  # as REST and server-sent events say it
    ('{"type": "message", "content": 42}', "invalid_type"),
    ('{"type": "message"}', "invalid_type"),
    ('{"type": "message", "content": "   "}', "empty"),
    ('{"type": "message", "content": "\\u200b\\u2060"}', "empty"),
    ('{"type": "message", "content": "hi", "conversation_id": {"x": 1}}', "not_found"),
    ("[" * 40_000 + "]" * 40_000, "parse_error"),
    ("x" * 3_000_000, "too_large"),  # over DATA_UPLOAD_MAX_MEMORY_SIZE, as the REST API refuses a body
    # A message of 100,000 characters is too long, as on REST and server-sent events (a new
    # user's trial: the websocket and server-sent events had called it too_large).
    ('{"type": "message", "content": "' + "a" * 100_000 + '"}', "too_long"),
    ('{"type": "message", "content": "' + "a" * 3_000_000 + '"}', "too_large"),
]


def test_malformed_frames_get_an_error_and_the_connection_stays_usable(asgi, product_corpus, user, conversation):
    with open_socket(asgi, caller_for(user)) as ws:
        for text, code in MALFORMED:
            ws.send(text)
            frame = receive(ws)
            assert (frame["type"], frame["code"]) == ("error", code), text[:60]
            assert frame["message"]
            if text == '{"type": "message"}':  # the same words as the REST API and server-sent events
                assert frame["message"] == "The message (content) is required and must be a string."
        ws.send(b"\x00\x01binary")
        assert receive(ws)["code"] == "invalid_frame"
        # Still the same connection, still answering.
        send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk))
        assert read_turn(ws)[-1]["type"] == "done"
    assert conversation.messages.count() == 2


@pytest.mark.parametrize("content, code", [
    ("NUL \x00 inside", "invalid_characters"),
    ("lone surrogate \ud800 inside", "invalid_characters"),
    ("x" * 16_001, "too_long"),
])
def test_unstorable_or_oversized_content_is_rejected_and_nothing_saved(asgi, user, conversation, content, code):
    with open_socket(asgi, caller_for(user)) as ws:
        # json.dumps escapes the surrogate as \ud800, which is how it arrives from a client.
        ws.send(json.dumps({"type": "message", "content": content, "conversation_id": str(conversation.pk)}))
        frame = receive(ws)
        assert (frame["type"], frame["code"]) == ("error", code)
        send(ws, type="ping")
        assert receive(ws)["type"] == "pong"
    assert not Message.objects.exists()


# --- isolation --------------------------------------------------------------------------------


def test_another_users_conversation_is_indistinguishable_from_an_unknown_one(asgi, user, other_user):
    theirs = Conversation.objects.create(owner=other_user)
    answers = []
    with open_socket(asgi, caller_for(user)) as ws:
        for conversation_id in (str(theirs.pk), unknown_id(), "not-a-uuid"):
            send(ws, type="message", content="Show me", conversation_id=conversation_id)
            answers.append(receive(ws))
            send(ws, type="cancel", conversation_id=conversation_id)
            answers.append(receive(ws))
    assert all(a == {**answers[0]} for a in answers), answers
    assert answers[0]["code"] == "not_found"
    for path in (f"/ws/ragchat/conversations/{theirs.pk}/", f"/ws/ragchat/conversations/{unknown_id()}/",
                 "/ws/ragchat/conversations/not-a-uuid/", "/ws/ragchat/nope/",
                 f"/ws/ragchat/conversations/{theirs.pk}/extra/",  # malformed or unrouted: not_found, never a 500
                 "/ws/ragchat", "/", "/chat/", "/ws/other/"):  # outside ours: docs/deployment.md's `unrouted`
        with open_socket(asgi, caller_for(user), path, ready=False) as ws:
            assert receive(ws)["code"] == "not_found"
            with pytest.raises(websockets.ConnectionClosed) as closed:
                ws.recv(timeout=5)
            assert closed.value.rcvd.code == 4404
    assert not Message.objects.exists()


def test_frames_sent_before_an_unknown_conversations_refusal_start_nothing(transactional_db, user, other_user):
    # An outside user's trial: a message sent straight after opening a socket on another user's
    # (or an unknown) conversation was read once the refusal was sent, as a message without a
    # conversation, and started one of the sender's own (its answer left "streaming"). In
    # process, so that the frame surely arrives after the refusal and before the disconnect.
    from tests.asgi import application

    theirs = Conversation.objects.create(owner=other_user)
    caller = caller_for(user)

    async def probe(conversation_id: str) -> None:
        communicator = WebsocketCommunicator(application, f"/ws/ragchat/conversations/{conversation_id}/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"), (b"cookie", caller.cookie_header.encode()),
        ])
        await communicator.connect()
        assert (await communicator.receive_json_from())["code"] == "not_found"
        assert await communicator.receive_output() == {"type": "websocket.close", "code": 4404}
        await communicator.send_json_to({"type": "message", "content": "probe"})
        assert await communicator.receive_nothing(timeout=1)
        await communicator.disconnect()

    for conversation_id in (str(theirs.pk), unknown_id()):
        async_to_sync(probe)(conversation_id)
    assert list(Conversation.objects.values_list("owner", flat=True)) == [other_user.pk]
    assert not Message.objects.exists()


def test_anonymous_sessions_only_see_their_own_conversations(asgi, product_corpus):
    alice, mallory = anonymous_caller(), anonymous_caller()
    with open_socket(asgi, alice) as ws:
        send(ws, type="message", content=QUESTION)
        conversation_id = read_turn(ws)[0]["conversation_id"]
    assert Conversation.objects.get(pk=conversation_id).session_key == alice.sessionid
    with open_socket(asgi, mallory) as ws:
        send(ws, type="message", content="What did she ask?", conversation_id=conversation_id)
        assert receive(ws)["code"] == "not_found"
    assert Message.objects.count() == 2


def test_reviewers_may_watch_anothers_conversation_but_not_send_to_it(asgi, product_corpus, user, reviewer,
                                                                      conversation):
    path = f"/ws/ragchat/conversations/{conversation.pk}/"
    with open_socket(asgi, caller_for(reviewer), path) as staff, open_socket(asgi, caller_for(user), path) as owner:
        send(staff, type="message", content=QUESTION)
        assert receive(staff)["code"] == "forbidden"
        send(staff, type="cancel")
        assert receive(staff)["code"] == "forbidden"
        send(owner, type="message", content=QUESTION)
        assert read_turn(staff)[-1]["type"] == "done"  # watching works
        assert read_turn(owner)[-1]["type"] == "done"
    assert conversation.messages.count() == 2


def test_the_handshake_is_refused_for_a_foreign_origin_and_without_a_session(asgi, user):
    with pytest.raises(InvalidStatus) as refused:
        open_socket(asgi, caller_for(user), origin="http://evil.example")
    assert refused.value.response.status_code == 403
    with pytest.raises(InvalidStatus) as refused:
        open_socket(asgi, None)
    assert refused.value.response.status_code == 403


@pytest.mark.django_db
def test_anonymous_sockets_are_refused_when_anonymous_chat_is_off(ragchat_settings_override):
    from tests.asgi import application

    ragchat_settings_override(ALLOW_ANONYMOUS=False)
    caller = anonymous_caller()

    async def handshake():
        communicator = WebsocketCommunicator(application, "/ws/ragchat/", headers=[
            (b"origin", b"http://testserver"), (b"host", b"testserver"),
            (b"cookie", caller.cookie_header.encode()),
        ])
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(handshake)() is False


# --- one turn at a time, cancel, disconnect, failures -----------------------------------------


@pytest.fixture
def slow_conversation(user, product_corpus, openai_server):
    """A conversation whose answers come from the loopback model server, 20 ms a token."""
    openai_server.token_delay = 0.02
    openai_server.when("", words(100))  # every answer
    return Conversation.objects.create(owner=user, profile="fake")


def deltas_until(ws, count: int) -> list[dict]:
    frames = []
    while sum(f["type"] == "delta" for f in frames) < count:
        frames.append(receive(ws))
        assert frames[-1]["type"] not in FINAL, frames[-1]
    return frames


def test_a_second_message_while_one_streams_is_refused(asgi, user, slow_conversation):
    caller = caller_for(user)
    key = str(slow_conversation.pk)
    with open_socket(asgi, caller) as ws, open_socket(asgi, caller) as other:
        send(ws, type="message", content=QUESTION, conversation_id=key, client_id="first")
        deltas_until(ws, 1)
        send(ws, type="message", content="And another", conversation_id=key, client_id="second")
        send(other, type="message", content="From another tab", conversation_id=key, client_id="third")
        refused_here = frames_until(ws, lambda f: f.get("client_id") == "second")[-1]
        refused_there = frames_until(other, lambda f: f.get("client_id") == "third")[-1]
        for refusal in (refused_here, refused_there):
            assert (refusal["type"], refusal["code"]) == ("error", "turn_in_progress"), refusal
            assert refusal["assistant_message"] is None
        rest = frames_until(ws, lambda f: f["type"] in FINAL)
        assert rest[-1]["type"] == "done" and rest[-1]["client_id"] == "first"
    assert list(slow_conversation.messages.values_list("seq", "role", "status")) == [
        (1, "user", "complete"), (2, "assistant", "complete")]


def test_cancel_stops_the_answer_and_saves_it_as_incomplete(asgi, user, slow_conversation, openai_server):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(slow_conversation.pk), client_id="c")
        frames = deltas_until(ws, 3)
        send(ws, type="cancel")
        frames += frames_until(ws, lambda f: f["type"] in FINAL)
        stopped = frames[-1]
        assert (stopped["type"], stopped["code"], stopped["client_id"]) == ("error", "cancelled", "c")
        streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
        saved = stopped["assistant_message"]
        assert saved["status"] == "incomplete" and saved["content"] == streamed
        assert 3 <= len(streamed.split()) < 100
        # The socket goes on: the next turn in the same conversation is answered in full.
        openai_server.token_delay = 0
        send(ws, type="message", content="Again, please", client_id="d")
        assert read_turn(ws)[-1]["type"] == "done"
    statuses = list(slow_conversation.messages.values_list("role", "status"))
    assert statuses == [("user", "complete"), ("assistant", "incomplete"), ("user", "complete"), ("assistant", "complete")]
    assert Message.objects.get(pk=saved["id"]).content == streamed


def test_cancel_right_after_the_ack_leaves_the_conversation_usable(asgi, user, slow_conversation, openai_server):
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(slow_conversation.pk))
        assert receive(ws)["type"] == "ack"
        send(ws, type="cancel")
        stopped = frames_until(ws, lambda f: f["type"] in FINAL)[-1]
        assert stopped["code"] == "cancelled" and stopped["assistant_message"]["status"] == "incomplete"
        openai_server.token_delay = 0
        send(ws, type="message", content="Again, please")
        assert read_turn(ws)[-1]["type"] == "done"


def test_a_disconnect_saves_the_partial_answer_as_incomplete(asgi, user, slow_conversation, openai_server):
    caller = caller_for(user)
    logged = asgi.log.stat().st_size
    with open_socket(asgi, caller) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(slow_conversation.pk))
        ack = receive(ws)
        deltas_until(ws, 3)
    answer = wait_for(lambda: Message.objects.filter(pk=ack["assistant_message_id"]).exclude(status="streaming").first())
    assert answer.status == "incomplete"
    # A client that leaves is no server error: no traceback per frame that found it gone (an
    # outside probe counted about three a disconnect).
    with asgi.log.open("rb") as log:
        log.seek(logged)
        assert b"Traceback" not in log.read(), asgi.log_tail()
    assert 3 <= len(answer.content.split()) < 100 and answer.content.startswith("word0 word1 word2")
    openai_server.token_delay = 0
    with open_socket(asgi, caller) as ws:
        # With client_id: the first turn's "stopped" frame, relayed to the conversation's
        # sockets once its answer is saved, may reach this new socket too (it watches the
        # conversation); this turn's own frames are the ones carrying its client_id.
        send(ws, type="message", content="Again, please", conversation_id=str(slow_conversation.pk), client_id="again")
        last = frames_until(ws, lambda f: f["type"] in FINAL and f.get("client_id") == "again")[-1]
        assert last["type"] == "done", last


def test_a_client_that_leaves_mid_answer_is_no_server_error_in_the_log(asgi, user, product_corpus):
    """An outside probe: a socket closed right after an answer's first delta (the offline
    answerer writes the rest at once) logged about three tracebacks per disconnect ("could not
    relay a turn's frame": uvicorn's ClientDisconnected), cleanly closed or cut."""
    caller, logged = caller_for(user), asgi.log.stat().st_size
    question = "I want to know about the warranty. " * 130 + QUESTION  # a long one, as the probe's
    for cut in (False, True) * 2:
        conversation = Conversation.objects.create(owner=user)
        with open_socket(asgi, caller) as ws:
            send(ws, type="message", content=question, conversation_id=str(conversation.pk))
            while receive(ws)["type"] != "delta":
                pass
            if cut:
                ws.socket.shutdown(socket.SHUT_RDWR)
        wait_for(lambda c=conversation: c.messages.filter(role="assistant").exclude(status="streaming").first())
    with asgi.log.open("rb") as log:
        log.seek(logged)
        written = log.read()
    assert b"Traceback" not in written and b"could not relay" not in written, written[-3000:]


def test_the_model_failing_mid_stream_is_an_error_event_and_the_socket_goes_on(asgi, user, product_corpus, openai_server):
    conversation = Conversation.objects.create(owner=user, profile="fake")
    openai_server.script(words(30), words(5))
    openai_server.fail_next("cut_stream", after_tokens=4, path="chat/completions")
    with open_socket(asgi, caller_for(user)) as ws:
        send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk))
        frames = read_turn(ws)
        failed = frames[-1]
        assert failed["type"] == "error" and failed["code"] == "stream_interrupted", failed
        streamed = "".join(f["text"] for f in frames if f["type"] == "delta")
        assert streamed.split() == ["word0", "word1", "word2", "word3"]
        assert failed["assistant_message"]["status"] == "error"
        assert failed["assistant_message"]["content"] == streamed
        send(ws, type="message", content="Try again")
        assert read_turn(ws)[-1]["message"]["content"] == words(5)
    assert list(conversation.messages.values_list("status", flat=True)) == ["complete", "error", "complete", "complete"]


# --- limits -----------------------------------------------------------------------------------


def test_the_turn_rate_limit_is_an_error_event_with_retry_after(asgi, user, product_corpus, conversation):
    with open_socket(asgi, caller_for(user)) as ws:
        for _ in range(25):  # TURNS_PER_MINUTE in tests/live_settings.py
            send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk))
            assert read_turn(ws)[-1]["type"] == "done"
        send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk), client_id="26")
        refused = receive(ws)
    assert (refused["type"], refused["code"], refused["client_id"]) == ("error", "rate_limited", "26")
    assert 0 < refused["retry_after"] <= 70.5  # the sliding window: until the 25 turns' oldest bucket has (nearly) left it, 70.4 s at most
    assert conversation.messages.count() == 50


def test_concurrent_answers_per_user_are_limited(asgi, user, slow_conversation):
    conversations = [slow_conversation] + [Conversation.objects.create(owner=user, profile="fake") for _ in range(3)]
    with open_socket(asgi, caller_for(user)) as ws:
        for i, conversation in enumerate(conversations[:3]):  # MAX_CONCURRENT_STREAMS
            send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk), client_id=str(i))
        acked = set()
        while len(acked) < 3:  # the three turns run concurrently: their acks come in any order
            frame = receive(ws)
            assert frame["type"] not in FINAL, frame
            acked |= {frame["client_id"]} if frame["type"] == "ack" else set()
        send(ws, type="message", content=QUESTION, conversation_id=str(conversations[3].pk), client_id="4th")
        refused = frames_until(ws, lambda f: f.get("client_id") == "4th")[-1]
        assert (refused["type"], refused["code"]) == ("error", "too_many_streams")
        assert refused["retry_after"] > 0
    assert not conversations[3].messages.exists()


# --- concurrency ------------------------------------------------------------------------------


def test_twenty_concurrent_turns_and_five_racing_sends(asgi, product_corpus, django_user_model):
    users = [django_user_model.objects.create_user(f"user{i}") for i in range(20)]
    conversations = [Conversation.objects.create(owner=u) for u in users]
    callers = [caller_for(u) for u in users]
    racing_conversation = conversations[0]

    async def one_turn(caller, conversation_id, content):
        headers = {"Cookie": caller.cookie_header}
        # The racing sockets share a conversation and see each other's turns: each reads up to
        # the end of its own (by client_id), else it could leave on another's "done" and stop
        # its own turn, which started meanwhile.
        client_id = content
        async with websockets.connect(f"{asgi.ws_url}/ws/ragchat/", origin=asgi.url, additional_headers=headers) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"
            await ws.send(json.dumps({"type": "message", "content": content, "conversation_id": conversation_id,
                                      "client_id": client_id}))
            frames = []
            while not frames or frames[-1]["type"] not in FINAL:
                frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if frame.get("client_id") == client_id:
                    frames.append(frame)
            return frames

    async def everything():
        parallel = [one_turn(c, str(conv.pk), f"{QUESTION} ({i})") for i, (c, conv) in enumerate(zip(callers, conversations))]
        results = await asyncio.gather(*parallel)
        racing = [one_turn(callers[0], str(racing_conversation.pk), f"Racing {i}: {QUESTION}") for i in range(5)]
        return results, await asyncio.gather(*racing)

    results, racing = asyncio.run(everything())
    for frames in results:
        assert_turn_shape(frames)
    for conversation in conversations[1:]:
        assert list(conversation.messages.values_list("seq", "role", "status")) == [
            (1, "user", "complete"), (2, "assistant", "complete")]
    answered = [frames for frames in racing if frames[-1]["type"] == "done"]
    refused = [frames[-1]["code"] for frames in racing if frames[-1]["type"] == "error"]
    assert answered and len(answered) + len(refused) == 5
    assert set(refused) <= {"turn_in_progress", "too_many_streams"}
    rows = list(racing_conversation.messages.order_by("seq").values_list("seq", "role", "status", "content"))
    # The first turn plus each answered racing turn: user then assistant, numbered 1..n, no gaps.
    assert [r[:3] for r in rows] == [
        (seq, role, "complete") for i in range(1 + len(answered))
        for seq, role in ((2 * i + 1, "user"), (2 * i + 2, "assistant"))]
    assert {r[3] for r in rows if r[1] == "assistant"} >= {f[-1]["message"]["content"] for f in answered}
