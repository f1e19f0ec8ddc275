"""The server-sent events endpoint under a real WSGI server (gunicorn, threads) and a real ASGI
server (uvicorn): the same events as the websocket, streamed as they are produced, the same
refusals as HTTP statuses, and a client that goes away leaves its partial answer saved."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async

from django_ragchat.events import StageChanged
from django_ragchat.models import Conversation, Message
from django_ragchat.transport.sse import AsyncEventBody
from django_ragchat.turn.sync_bridge import ThreadedStream
from tests.live_servers import (
    anonymous_caller,
    caller_for,
    post_stream,
    sse_headers,
    sse_url,
    unknown_id,
    wait_for,
    words,
)

# Committed data: the servers are other processes (the ``server`` fixture is chosen at run
# time, too late for pytest-django to see that it needs a transactional database).
pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How much does the Aurora X2 cost?"



@pytest.fixture(params=["wsgi", "asgi"])
def server(request):
    """Each test runs once under gunicorn (WSGI) and once under uvicorn (ASGI)."""
    return request.getfixturevalue(request.param)


def test_the_turn_streams_as_server_sent_events(server, product_corpus, user, conversation):
    response, events = post_stream(server, caller_for(user), conversation.pk, QUESTION)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-ragchat-protocol"] == "1"
    types = [e["type"] for e in events]
    assert types[:4] == ["ack", "status", "sources", "status"] and types[-1] == "done"
    deltas = [e for e in events if e["type"] == "delta"]
    assert [d["index"] for d in deltas] == list(range(len(deltas))) and deltas
    done = events[-1]["message"]
    assert "".join(d["text"] for d in deltas) == done["content"]
    assert "$699" in done["content"] and done["citations"] and done["status"] == "complete"
    assert list(conversation.messages.values_list("role", "status", "content")) == [
        ("user", "complete", QUESTION), ("assistant", "complete", done["content"])]


def test_events_arrive_as_the_model_writes_them(server, user, product_corpus, openai_server):
    """Not buffered: the first tokens reach the client while the model is still writing (the
    model server holds the rest of the stream until the client has seen them)."""
    conversation = Conversation.objects.create(owner=user, profile="fake")
    openai_server.script(words(30))
    openai_server.hold_streams(after_tokens=3)
    caller = caller_for(user)
    kinds, text = [], ""
    try:
        with httpx.Client(cookies=caller.cookies, timeout=20) as client:
            with client.stream("POST", sse_url(server, conversation.pk), json={"content": QUESTION},
                               headers=sse_headers(caller)) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        kinds.append(event["type"])
                        text += event.get("text", "") if event["type"] == "delta" else ""
                        if len(text.split()) == 3:
                            # Three tokens arrived (one delta may carry the pieces the model
                            # wrote together) and the model has not written the fourth.
                            assert "done" not in kinds
                            openai_server.release_streams()
    finally:
        openai_server.release_streams()
    assert kinds[-1] == "done" and text == words(30), kinds


def test_refusals_are_http_statuses_with_the_error_event_as_body(server, product_corpus, user, other_user,
                                                                 reviewer, conversation):
    caller = caller_for(user)
    theirs = Conversation.objects.create(owner=other_user)
    not_found = []
    for conversation_id in (theirs.pk, unknown_id(), "not-a-uuid"):
        response, events = post_stream(server, caller, conversation_id, QUESTION)
        assert (response.status_code, events) == (404, [])
        not_found.append(response.json())
    assert not_found[0] == not_found[1] == not_found[2]
    assert not_found[0]["type"] == "error" and not_found[0]["code"] == "not_found"

    response, _ = post_stream(server, caller_for(reviewer), conversation.pk, QUESTION)
    assert (response.status_code, response.json()["code"]) == (403, "forbidden")

    with httpx.Client(cookies=caller.cookies) as client:
        url = sse_url(server, conversation.pk)
        for body, status, code in [
            (b"not json", 400, "parse_error"),
            (b"[" * 40_000 + b"]" * 40_000, 400, "parse_error"),
            (b"[1, 2]", 400, "invalid_type"),
            (b'{"text": "hi"}', 400, "invalid_type"),
            (b"{}", 400, "invalid_type"),
            (b'{"content": ""}', 400, "empty"),
            (json.dumps({"content": "NUL \x00"}).encode(), 400, "invalid_characters"),
            (b'{"content": "lone \\ud800"}', 400, "invalid_characters"),
            (json.dumps({"content": "x" * 16_001}).encode(), 413, "too_long"),
            (json.dumps({"content": "x" * 100_000}).encode(), 413, "too_long"),  # as on REST
            # Over DATA_UPLOAD_MAX_MEMORY_SIZE, as on REST: read to its end and dropped, so the
            # connection serves the next request (test_a_body_too_large_leaves_the_connection_usable).
            (b"x" * 3_000_000, 413, "too_large"),
        ]:
            response = client.post(url, content=body, headers={**sse_headers(caller), "Content-Type": "application/json"})
            assert (response.status_code, response.json()["code"]) == (status, code), body[:40]
            if body in (b'{"text": "hi"}', b"{}"):  # the same words as the REST API and the websocket
                assert response.json()["message"] == "The message (content) is required and must be a string."
        # No body at all: the REST API's code and words (a council site's trial saw "The body is
        # not valid JSON (Expecting value...)" here and "The request has no body" there).
        for headers in ({"Content-Type": "application/json"}, {}):
            response = client.post(url, content=b"", headers={**sse_headers(caller), **headers})
            refusal = response.json()
            assert (response.status_code, refusal["type"], refusal["code"], refusal["message"]) == (
                400, "error", "parse_error", "The request has no body: send a JSON object."), refusal
            rest = client.post(f"{server.url}/api/ragchat/conversations/{conversation.pk}/messages/", content=b"",
                               headers={"X-CSRFToken": caller.csrftoken, **headers})
            assert (rest.status_code, rest.json()["code"], rest.json()["detail"]) == (
                400, "parse_error", "The request has no body: send a JSON object."), rest.text
        # Session authentication: without the CSRF token the request is refused
        # (test_a_csrf_failure_is_the_json_error_event).
        assert client.post(url, json={"content": QUESTION}).status_code == 403
        # A GET is the same JSON error too (it was require_POST's empty 405; a dental site's trial).
        got = client.get(url)
        assert (got.status_code, got.json()["code"], got.headers["Allow"]) == (405, "method_not_allowed", "POST")
    assert not Message.objects.exists()


def test_a_csrf_failure_is_the_json_error_event(server, product_corpus, user, conversation):
    """Without the CSRF token (or with a wrong one, or from a foreign origin) the endpoint
    answers 403 with the ``error`` event as JSON, code ``csrf_failed`` (the OpenAI-compatible
    endpoint's code for the same cause), like its other refusals, not Django's HTML page; the
    rest of the site keeps its own CSRF failure page."""
    caller, visitor = caller_for(user), anonymous_caller()
    for who, url in [(caller, sse_url(server, conversation.pk)), (caller, f"{server.url}/chat/stream/"),
                     (visitor, f"{server.url}/chat/stream/")]:
        with httpx.Client(cookies=who.cookies, timeout=20) as client:
            for headers in [{}, {"X-CSRFToken": "x" * 32}, {**sse_headers(who), "Origin": "https://elsewhere.example"}]:
                response = client.post(url, json={"content": QUESTION}, headers=headers)
                assert response.status_code == 403, (url, headers)
                assert response.headers["content-type"] == "application/json", (url, headers)
                refusal = response.json()
                assert (refusal["type"], refusal["code"]) == ("error", "csrf_failed"), refusal
                assert refusal["message"].startswith("CSRF check failed (") and "X-CSRFToken" in refusal["message"]
    with httpx.Client(cookies=caller.cookies, timeout=20) as client:  # the site's own page elsewhere
        response = client.post(f"{server.url}/accounts/logout/")
        assert response.status_code == 403 and response.headers["content-type"].startswith("text/html")
    assert not Message.objects.exists() and Conversation.objects.get() == conversation
    response, events = post_stream(server, caller, conversation.pk, QUESTION)  # with the token: answered
    assert response.status_code == 200 and events[-1]["type"] == "done"


def test_a_body_is_read_in_its_declared_charset_and_must_be_json(server, product_corpus, user, conversation):
    caller = caller_for(user)
    body = json.dumps({"content": "Crème brûlée?"}, ensure_ascii=False).encode("iso-8859-1")
    with httpx.Client(cookies=caller.cookies, timeout=20) as client:
        url = sse_url(server, conversation.pk)
        for content_type, status in [("application/json", 400), ("application/json; charset=base64", 400),
                                     ("application/json; charset=bogus-xyz", 400),  # no codec: not read as UTF-8
                                     ("application/json; charset=iso-8859-1", 200)]:
            response = client.post(url, content=body, headers={**sse_headers(caller), "Content-Type": content_type})
            assert response.status_code == status, content_type
            if status == 400:  # the same code and words as the REST API (a helpdesk trial found vaguer ones)
                rest = client.post(f"{server.url}/api/ragchat/conversations/{conversation.pk}/messages/", content=body,
                                   headers={"X-CSRFToken": caller.csrftoken, "Content-Type": content_type})
                assert (response.json()["code"], response.json()["message"]) == ("parse_error", rest.json()["detail"])
                assert rest.json()["code"] == "parse_error"
        # A body that is not declared JSON is 415, as on the REST API.
        for content_type in ("application/x-www-form-urlencoded", "text/plain"):
            response = client.post(url, content=b"content=hi", headers={**sse_headers(caller), "Content-Type": content_type})
            assert (response.status_code, response.json()["code"]) == (415, "unsupported_media_type"), content_type
    assert conversation.messages.get(role="user").content == "Crème brûlée?"


def test_anonymous_sessions_stream_in_their_own_conversations_only(server, product_corpus):
    alice, mallory = anonymous_caller(), anonymous_caller()
    conversation = Conversation.objects.create(session_key=alice.sessionid)
    response, events = post_stream(server, alice, conversation.pk, QUESTION)
    assert response.status_code == 200 and events[-1]["type"] == "done"
    response, events = post_stream(server, mallory, conversation.pk, QUESTION)
    assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert conversation.messages.count() == 2


def test_one_turn_at_a_time_and_the_limits(server, user, product_corpus, openai_server):
    caller = caller_for(user)
    conversations = [Conversation.objects.create(owner=user, profile="fake") for _ in range(4)]
    openai_server.token_delay = 0.05
    openai_server.when("", words(200))  # every answer
    clients, streams, lines = [], [], []
    try:
        for conversation in conversations[:3]:  # MAX_CONCURRENT_STREAMS answers being written
            client = httpx.Client(cookies=caller.cookies, timeout=20)
            clients.append(client)
            stream = client.stream("POST", sse_url(server, conversation.pk), json={"content": QUESTION},
                                   headers=sse_headers(caller))
            response = stream.__enter__()
            streams.append(stream)
            assert response.status_code == 200
            # Kept: dropping a line iterator closes the connection, which stops the answer.
            lines.append(response.iter_lines())
            assert next(lines[-1]) == "event: ack"
        response, _ = post_stream(server, caller, conversations[0].pk, QUESTION)
        assert response.status_code in (409, 429)  # the slot is checked first
        response, _ = post_stream(server, caller, conversations[3].pk, QUESTION)
        assert response.status_code == 429 and response.json()["code"] == "too_many_streams"
        assert int(response.headers["retry-after"]) >= 1
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    wait_for(lambda: not Message.objects.filter(status="streaming").exists())
    # With a free slot, a second message in a conversation whose answer is still being
    # written is refused with 409.
    openai_server.token_delay = 0.02
    with httpx.Client(cookies=caller.cookies, timeout=20) as client:
        with client.stream("POST", sse_url(server, conversations[0].pk), json={"content": QUESTION},
                           headers=sse_headers(caller)) as first:
            first_lines = first.iter_lines()
            assert next(first_lines) == "event: ack"
            response, _ = post_stream(server, caller, conversations[0].pk, "And now?")
            assert response.status_code == 409 and response.json()["code"] == "turn_in_progress"
    assert not conversations[3].messages.exists()


def test_the_turn_rate_limit_is_429_with_retry_after(server, user, product_corpus, conversation):
    caller = caller_for(user)
    for _ in range(25):  # TURNS_PER_MINUTE in tests/live_settings.py
        response, events = post_stream(server, caller, conversation.pk, QUESTION)
        assert events[-1]["type"] == "done"
    response, _ = post_stream(server, caller, conversation.pk, QUESTION)
    assert response.status_code == 429 and response.json()["code"] == "rate_limited"
    assert 1 <= int(response.headers["retry-after"]) <= 71  # the sliding window: until the 25 turns' oldest bucket has (nearly) left it, 70.4 s at most
    assert conversation.messages.count() == 50


def test_a_client_that_goes_away_leaves_its_partial_answer_saved(server, user, product_corpus, openai_server):
    conversation = Conversation.objects.create(owner=user, profile="fake")
    openai_server.token_delay = 0.02
    openai_server.when("", words(300))  # every answer
    caller = caller_for(user)
    seen = []
    with httpx.Client(cookies=caller.cookies, timeout=20) as client:
        with client.stream("POST", sse_url(server, conversation.pk), json={"content": QUESTION},
                           headers=sse_headers(caller)) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    seen.append(json.loads(line[6:]))
                    if sum(e["type"] == "delta" for e in seen) == 3:
                        break  # leaving the block closes the connection mid-answer
    ack = seen[0]
    answer = wait_for(lambda: Message.objects.filter(pk=ack["assistant_message_id"]).exclude(status="streaming").first())
    assert answer.status == "incomplete"
    assert answer.content.startswith("word0 word1 word2") and len(answer.content.split()) < 300
    # The conversation is free again.
    openai_server.token_delay = 0
    response, events = post_stream(server, caller, conversation.pk, "Again")
    assert events[-1]["type"] == "done"


def test_the_model_failing_mid_stream_ends_with_an_error_event(server, user, product_corpus, openai_server):
    conversation = Conversation.objects.create(owner=user, profile="fake")
    openai_server.script(words(30))
    openai_server.fail_next("cut_stream", after_tokens=4, path="chat/completions")
    response, events = post_stream(server, caller_for(user), conversation.pk, QUESTION)
    assert response.status_code == 200
    failed = events[-1]
    assert failed["type"] == "error" and failed["code"] == "stream_interrupted"
    streamed = "".join(e["text"] for e in events if e["type"] == "delta")
    assert failed["assistant_message"]["status"] == "error" and failed["assistant_message"]["content"] == streamed
    assert streamed.split() == ["word0", "word1", "word2", "word3"]


# --- ThreadedStream ---------------------------------------------------------------------------


def test_threaded_stream_hands_over_each_item_as_it_is_produced():
    produced = threading.Event()

    async def items():
        yield 1
        await asyncio.get_running_loop().run_in_executor(None, produced.wait, 5)
        yield 2

    stream = ThreadedStream(items)
    assert next(stream) == 1  # while the producer is still waiting for its second item
    produced.set()
    assert list(stream) == [2]


def test_threaded_stream_raises_the_iterators_exception():
    async def items():
        yield "a"
        raise KeyError("boom")

    stream = ThreadedStream(items)
    assert next(stream) == "a"
    with pytest.raises(KeyError):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)


def test_closing_a_threaded_stream_cancels_it_and_waits_for_its_cleanup():
    cleaned = []

    async def items():
        try:
            yield "first"
            await asyncio.sleep(30)
            yield "never"
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # cleanup that awaits, like saving a partial answer
            cleaned.append("cancelled")
            raise

    stream = ThreadedStream(items)
    assert next(stream) == "first"
    started = time.monotonic()
    stream.close()
    assert cleaned == ["cancelled"] and time.monotonic() - started < 5
    with pytest.raises(StopIteration):
        next(stream)


def blocking_turn(cleaned: list):
    """A stand-in turn: one event, then it waits; its cleanup awaits, like saving a partial answer."""

    async def events():
        try:
            yield StageChanged(stage="retrieving")
            await asyncio.sleep(30)
            yield StageChanged(stage="never")
        finally:
            await asyncio.sleep(0.01)
            cleaned.append("closed")

    return events


def test_the_asgi_body_stops_the_turn_when_django_cancels_the_response():
    cleaned = []

    async def scenario():
        body = AsyncEventBody(blocking_turn(cleaned))
        assert b"retrieving" in await anext(body)
        reading = asyncio.ensure_future(anext(body))
        await asyncio.sleep(0.05)
        reading.cancel()  # what Django's ASGIHandler does when the client disconnects
        await asyncio.wait([reading])
        return list(cleaned)

    assert async_to_sync(scenario)() == ["closed"]


def test_the_asgi_body_stops_the_turn_when_django_closes_the_response():
    """A client that leaves while Django writes an event: Django calls ``close()`` from a
    worker thread, which stops the turn and waits for its cleanup."""
    cleaned = []

    async def scenario():
        body = AsyncEventBody(blocking_turn(cleaned))
        assert b"retrieving" in await anext(body)
        await sync_to_async(body.close)()
        await sync_to_async(body.close)()  # closing twice is harmless
        return list(cleaned)

    assert async_to_sync(scenario)() == ["closed"]


def test_an_event_the_asgi_body_waited_for_reaches_it_in_one_loop_iteration_with_the_keepalive_timer():
    """The keep-alive's timer (``STREAM_HEARTBEAT_SECONDS``, which ``stream_view`` passes) adds no
    step between the turn's event and the response: on Python 3.11 ``asyncio.wait_for`` ran the
    queue's ``get`` in a task of its own, so each event the body waited for (every token of a
    model slower than the worker) reached it two event-loop iterations later, each as long as
    the other turns' work queued on the loop (issue 27's re-measure, 6 December)."""

    async def scenario(keepalive):
        put = asyncio.Event()

        async def events():
            for stage in ("retrieving", "generating", "done"):
                await put.wait()
                put.clear()
                yield StageChanged(stage=stage)

        loop, ticks = asyncio.get_running_loop(), [0]

        def tick():
            ticks[0] += 1
            loop.call_soon(tick)

        loop.call_soon(tick)
        body = AsyncEventBody(lambda: events(), keepalive=keepalive)
        iterations = []
        for _ in range(3):
            reading = asyncio.ensure_future(anext(body))
            await asyncio.sleep(0.01)  # the body waits on an empty queue
            assert not reading.done()
            put.set()
            started = ticks[0]
            await reading
            iterations.append(ticks[0] - started)
        return iterations

    assert async_to_sync(scenario)(None) == async_to_sync(scenario)(10.0), "the keep-alive's timer costs iterations"


def test_the_asgi_body_sends_a_keepalive_comment_after_each_silence_then_the_event():
    gate = asyncio.Event()

    async def events():
        await gate.wait()
        yield StageChanged(stage="retrieving")

    async def scenario():
        body = AsyncEventBody(lambda: events(), keepalive=0.05)
        sent = [await anext(body), await anext(body)]  # two silences, a comment each
        gate.set()
        sent.append(await anext(body))
        with pytest.raises(StopAsyncIteration):
            await anext(body)
        return sent

    first, second, event = async_to_sync(scenario)()
    assert first == second == b": keep-alive\n\n" and b"retrieving" in event


def test_a_new_conversation_starts_with_the_profile_its_message_names(server, product_corpus, user):
    """The widget's ``profile`` option: a message that starts a conversation says its profile; a
    name that is no profile is refused as the REST API refuses it, and nothing is created."""
    caller = caller_for(user)

    def start(**body):
        with httpx.Client(cookies=caller.cookies, timeout=20) as client:
            response = client.post(f"{server.url}/chat/stream/", json={"content": QUESTION, **body},
                                   headers=sse_headers(caller))
        return response

    response = start(profile="shouting")
    assert response.status_code == 200, response.text
    assert Conversation.objects.get().profile == "shouting"
    for wrong in ("nope", 5, ["shouting"]):
        refused = start(profile=wrong)
        assert (refused.status_code, refused.json()["code"]) == (400, "unknown_profile"), refused.text
    refused = start(profile="nope", content="")  # the message is checked first, on every transport
    assert (refused.status_code, refused.json()["code"]) == (400, "empty"), refused.text
    assert Conversation.objects.count() == 1
    # A conversation keeps its profile: a message to it names none that counts.
    conversation = Conversation.objects.get()
    response, events = post_stream(server, caller, conversation.pk, "Does it have a warranty?")
    assert events[-1]["type"] == "done" and Conversation.objects.get().profile == "shouting"


def _exchange(sock, request: bytes) -> tuple[int, bytes]:
    """Send one HTTP/1.1 request on ``sock`` and read its whole response: (status, body)."""
    sock.sendall(request)
    reader = sock.makefile("rb")
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, reader.read(length)


def test_a_body_too_large_leaves_the_connection_usable(server, product_corpus, user, conversation):
    """A new user's trial (gunicorn): a body over DATA_UPLOAD_MAX_MEMORY_SIZE was answered 413 with
    "Connection: keep-alive", and the client's next message on that connection found it closed
    (Django refuses such a body unread). Now it is read and dropped: the same connection answers
    the next request, on the server-sent events endpoint and the REST API alike."""
    import socket
    from urllib.parse import urlsplit

    caller = caller_for(user)
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    common = (f"Host: {host}:{port}\r\nCookie: {caller.cookie_header}\r\nX-CSRFToken: {caller.csrftoken}\r\n"
              "Content-Type: application/json\r\n")
    big = b"x" * 3_000_000
    for path in (f"/chat/conversations/{conversation.pk}/stream/", f"/api/ragchat/conversations/{conversation.pk}/messages/"):
        with socket.create_connection((host, port), timeout=20) as sock:
            status, body = _exchange(sock, f"POST {path} HTTP/1.1\r\n{common}Content-Length: {len(big)}\r\n\r\n"
                                     .encode() + big)
            assert (status, json.loads(body)["code"]) == (413, "too_large"), path
            status, _ = _exchange(sock, f"GET /api/ragchat/conversations/ HTTP/1.1\r\n{common}\r\n".encode())
            assert status == 200, path  # the same connection, still usable
    assert not Message.objects.exists()
