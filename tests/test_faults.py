"""Crash safety with real server processes: a worker killed (SIGKILL) or stopped (SIGTERM) while
it writes several answers at once (docs/architecture.md, "Crash safety").

The servers run ``tests.fault_settings``: heartbeats every 0.2 s and leases of 5 s, so what a
dead worker leaves behind expires within about five seconds. The model is the loopback
OpenAI-compatible server with a token delay, so every answer is still being written when the
worker dies. The waits poll for a state (bounded by the lease), never for a fixed time.
"""

from __future__ import annotations

import io
import signal
import threading
from datetime import timedelta

import httpx
import pytest
import redis
from django.core.management import call_command
from django.utils import timezone

from django_ragchat.models import Conversation, Message
from tests.live_servers import (
    REDIS_URL,
    caller_for,
    daphne,
    gunicorn,
    open_socket,
    parse_sse,
    receive,
    send,
    sse_headers,
    sse_url,
    uvicorn,
    wait_for,
    words,
)

QUESTION = "Tell me everything about the Aurora X2."
# The model's answer is cut at 1024 tokens (max_tokens): at 0.05 s a token, 50 s of writing, so
# every answer is still being written when the worker dies.
LONG = words(1100)
DELAY = 0.05


SERVERS = {"uvicorn": uvicorn, "daphne": daphne, "gunicorn": gunicorn}


@pytest.fixture
def fault_server(request, live_env, transactional_db, live_cache, openai_server, tmp_path):
    """A server process of its own (uvicorn unless parametrized), for this test to kill."""
    kind = getattr(request, "param", "uvicorn")
    server = SERVERS[kind](f"{kind}-faults", {**live_env, "DJANGO_SETTINGS_MODULE": "tests.fault_settings"})
    server.kind = kind
    server.log = tmp_path / "uvicorn.log"
    server.start()
    yield server
    server.stop()


def slot_keys(live_prefix) -> list[bytes]:
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.scan_iter(match=f"{live_prefix}:*:ragchat:slot:*", count=1000))
    finally:
        client.close()


class Streams:
    """Websocket turns of several users at once, their frames gathered by ``client_id``."""

    def __init__(self):
        self.sockets = []
        self.frames: dict[str, list[dict]] = {}

    def start(self, server, user, conversations, prefix: str):
        ws = open_socket(server, caller_for(user))
        self.sockets.append(ws)
        for i, conversation in enumerate(conversations):
            client_id = f"{prefix}{user.pk}-{i}"
            self.frames[client_id] = []
            send(ws, type="message", content=QUESTION, conversation_id=str(conversation.pk), client_id=client_id)

    def pump(self, timeout: float = 0.05) -> None:
        """Read what has arrived (on open sockets), a bounded batch from each: the streams go on
        while we read."""
        for ws in self.sockets:
            for _ in range(1000):
                try:
                    frame = receive(ws, timeout)
                except TimeoutError:
                    break
                except Exception:  # closed (the worker died)
                    break
                if frame.get("client_id") in self.frames:
                    self.frames[frame["client_id"]].append(frame)

    def text(self, client_id: str) -> str:
        return "".join(f["text"] for f in self.frames[client_id] if f["type"] == "delta")

    def of_type(self, client_id: str, kind: str) -> list[dict]:
        return [f for f in self.frames[client_id] if f["type"] == kind]

    def close(self) -> None:
        for ws in self.sockets:
            ws.close()


def users_with_conversations(django_user_model, n_users: int, per_user: int, prefix: str):
    users = [django_user_model.objects.create_user(f"{prefix}{i}") for i in range(n_users)]
    return [(u, [Conversation.objects.create(owner=u, profile="fake") for _ in range(per_user)]) for u in users]


@pytest.mark.pairwise  # a crash of real server processes: each Django version and database once
def test_sigkill_mid_stream_loses_no_heartbeat_and_blocks_nothing(
        fault_server, openai_server, product_corpus, django_user_model, live_prefix):
    openai_server.token_delay = DELAY
    openai_server.script(*[LONG] * 6)
    people = users_with_conversations(django_user_model, 3, 2, "killed")  # 2 = MAX_CONCURRENT_STREAMS
    streams = Streams()
    for user, conversations in people:
        streams.start(fault_server, user, conversations, "k")

    def every_answer_has_a_heartbeat():
        streams.pump()
        return (all(streams.of_type(c, "delta") for c in streams.frames)
                and Message.objects.filter(role="assistant", status="streaming").exclude(content="").count() == 6)

    try:
        wait_for(every_answer_has_a_heartbeat, timeout=30)
    except AssertionError as exc:
        raise AssertionError((
            {c: [f["type"] for f in frames][:5] for c, frames in streams.frames.items()},
            [(r, s, len(c)) for r, s, c in Message.objects.values_list("role", "status", "content")],
            fault_server.log_tail())) from exc
    seen = dict(Message.objects.filter(role="assistant").values_list("pk", "content"))
    assert slot_keys(live_prefix), "the worker holds its users' stream slots"

    fault_server.process.kill()
    fault_server.process.wait(10)
    streams.pump()
    streams.close()

    saved = {m.pk: m for m in Message.objects.filter(role="assistant")}
    assert len(saved) == 6
    for pk, text in seen.items():
        assert saved[pk].status == "streaming"  # nobody has closed it yet
        assert saved[pk].content.startswith(text)  # nothing older than the last heartbeat lost
    for client_id in streams.frames:
        (ack,) = streams.of_type(client_id, "ack")
        received, kept = streams.text(client_id), saved[ack["assistant_message_id"]].content
        assert kept and (received.startswith(kept) or kept.startswith(received))

    # The dead worker's leases and stream slots run out by themselves (5 s here).
    wait_for(lambda: not slot_keys(live_prefix), timeout=20)
    wait_for(lambda: not Message.objects.filter(status="streaming", lease_expires_at__gt=timezone.now()).exists(),
             timeout=20)

    fault_server.start()
    openai_server.reset()
    openai_server.script(*["Answered after the restart."] * 6)
    again = Streams()
    for user, conversations in people:  # both slots of every user at once: none stayed taken
        again.start(fault_server, user, conversations, "r")
    wait_for(lambda: again.pump() or all(again.of_type(c, "done") for c in again.frames), timeout=30)
    again.close()
    for client_id in again.frames:
        assert not again.of_type(client_id, "error"), again.frames[client_id]
        assert again.of_type(client_id, "done")[0]["message"]["content"] == "Answered after the restart."
    for pk, before in saved.items():
        message = Message.objects.get(pk=pk)
        assert message.status == "interrupted" and message.metadata["error"]["code"] == "interrupted"
        assert message.content == before.content and message.lease_expires_at is None
    for _, conversations in people:
        for conversation in conversations:
            assert list(conversation.messages.values_list("role", "status")) == [
                ("user", "complete"), ("assistant", "interrupted"), ("user", "complete"), ("assistant", "complete")]


@pytest.mark.pairwise  # a crash of real server processes: each Django version and database once
@pytest.mark.parametrize("fault_server", ["uvicorn", "daphne", "gunicorn"], indirect=True)
def test_sigterm_saves_every_answer_incomplete_and_tells_every_client(
        fault_server, openai_server, product_corpus, django_user_model):
    """Two answers per user: over a websocket and server-sent events (both over SSE under
    gunicorn, which serves WSGI)."""
    openai_server.token_delay = DELAY
    openai_server.script(*[LONG] * 6)
    people = users_with_conversations(django_user_model, 3, 2, "stopped")
    streams = Streams()
    sse_events: dict[int, list[dict]] = {}
    readers = []

    def read_sse(user, conversation):
        caller = caller_for(user)
        events = sse_events.setdefault(conversation.pk, [])
        with httpx.Client(cookies=caller.cookies, timeout=60) as client:
            with client.stream("POST", sse_url(fault_server, conversation.pk), json={"content": QUESTION},
                               headers=sse_headers(caller)) as response:
                assert response.status_code == 200
                lines = []
                for line in response.iter_lines():
                    lines.append(line)
                    if not line:
                        events.extend(parse_sse(lines))
                        lines = []

    for user, (first, second) in people:
        over_sse = [first, second]
        if fault_server.kind != "gunicorn":
            streams.start(fault_server, user, [over_sse.pop(0)], "t")
        for conversation in over_sse:
            reader = threading.Thread(target=read_sse, args=(user, conversation), daemon=True)
            reader.start()
            readers.append(reader)

    def all_writing():
        streams.pump()
        return (all(streams.of_type(c, "delta") for c in streams.frames) and len(sse_events) == len(readers)
                and all(any(e["type"] == "delta" for e in list(events)) for events in sse_events.values()))

    wait_for(all_writing, timeout=30)
    fault_server.process.send_signal(signal.SIGTERM)

    wait_for(lambda: streams.pump() or all(streams.of_type(c, "error") for c in streams.frames), timeout=20)
    for reader in readers:
        reader.join(20)
        assert not reader.is_alive()
    assert fault_server.process.wait(20) is not None  # the server went on to exit
    streams.close()

    finals = {}
    for client_id in streams.frames:
        (error,) = streams.of_type(client_id, "error")
        finals[error["assistant_message"]["id"]] = (error, streams.text(client_id))
    for events in sse_events.values():
        assert events[0]["type"] == "ack" and events[-1]["type"] == "error"
        finals[events[-1]["assistant_message"]["id"]] = (
            events[-1], "".join(e["text"] for e in events if e["type"] == "delta"))
    assert len(finals) == 6
    for message_id, (error, received) in finals.items():
        assert error["code"] == "server_shutdown" and error["retry_after"] > 0
        message = Message.objects.get(pk=message_id)
        assert message.status == "incomplete" and message.metadata["error"]["code"] == "server_shutdown"
        assert error["assistant_message"]["status"] == "incomplete"
        assert error["assistant_message"]["content"] == message.content
        assert received and message.content.startswith(received)  # nothing the client saw is lost
    assert not Message.objects.filter(status="streaming").exists()


def test_the_sweep_closes_leases_nobody_will_renew(db, conversation):
    now = timezone.now()
    dead = Message.objects.create(conversation=conversation, seq=1, role="assistant", status="streaming",
                                  content="The part saved by the last heartbeat",
                                  lease_expires_at=now - timedelta(seconds=1))
    alive = Message.objects.create(conversation=conversation, seq=2, role="assistant", status="streaming",
                                   lease_expires_at=now + timedelta(seconds=30))
    call_command("ragchat_purge", "--leases-only", stdout=io.StringIO())
    dead.refresh_from_db()
    alive.refresh_from_db()
    assert (dead.status, dead.content, dead.metadata["error"]["code"]) == (
        "interrupted", "The part saved by the last heartbeat", "interrupted")
    assert alive.status == "streaming"



def test_stream_slots_are_leases(db, user, ragchat_settings_override):
    from django.core.cache import cache

    from django_ragchat.turn import limits

    ragchat_settings_override(MAX_CONCURRENT_STREAMS=2, STREAM_LEASE_SECONDS=20)
    first, second = limits.StreamSlot(user).acquire(), limits.StreamSlot(user).acquire()
    with pytest.raises(limits.LimitExceeded) as refused:
        limits.StreamSlot(user).acquire()
    # Retry soon: an answer ending frees its slot at once, long before the 20 s lease runs out.
    assert refused.value.code == "too_many_streams" and refused.value.retry_after <= 1
    # A holder that stops renewing (its worker died) loses the slot when the key expires.
    cache.delete(first.key)
    third = limits.StreamSlot(user).acquire()
    first.release()  # too late: the slot is someone else's now, and stays theirs
    with pytest.raises(limits.LimitExceeded):
        limits.StreamSlot(user).acquire()
    for slot in (second, third):
        slot.renew()
        slot.release()
    assert limits.StreamSlot(user).acquire().key is not None


def test_a_lease_shorter_than_two_heartbeats_is_a_check_error(ragchat_settings_override):
    from django_ragchat.checks import check_settings

    ragchat_settings_override(STREAM_HEARTBEAT_SECONDS=5, STREAM_LEASE_SECONDS=6)
    assert [e.id for e in check_settings()] == ["ragchat.E007"]
    ragchat_settings_override(STREAM_HEARTBEAT_SECONDS=0, STREAM_LEASE_SECONDS=30)
    assert [e.id for e in check_settings()] == ["ragchat.E007"]
