"""The SQL of a websocket message, counted: from the ``message`` frame to the ``done`` event, in
the consumer itself (channels' ``WebsocketCommunicator``, in this process, so every statement
runs on the test's connection). A fixed number whatever the conversation's length; these tests
fail when a statement comes back (issue 27: a turn's work before its model is mostly its
statements)."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.db import DEFAULT_DB_ALIAS, connections
from django.test.utils import CaptureQueriesContext

from django_ragchat.models import Conversation, Message
from django_ragchat.transport.consumers import ChatConsumer

QUESTION = "How much does the Aurora X2 cost?"


def _session(user) -> SessionStore:
    session = SessionStore()
    session.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
                    HASH_SESSION_KEY: user.get_session_auth_hash()})
    session.create()
    return session


def _queries_of_a_message(user, frame: dict) -> tuple[int, dict]:
    """(statements from sending ``frame`` to the turn's ``done``, that ``done``)."""

    session = _session(user)
    # This thread's connection: the consumer's database work runs here (the outer async_to_sync).
    queries = CaptureQueriesContext(connections[DEFAULT_DB_ALIAS])

    async def run():
        socket = WebsocketCommunicator(ChatConsumer.as_asgi(), "/ws/ragchat/")
        socket.scope.update(user=user, session=session)
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from(10))["type"] == "ready"
        await sync_to_async(queries.__enter__)()
        await socket.send_json_to(frame)
        while (event := await socket.receive_json_from(20))["type"] not in ("done", "error"):
            pass
        await sync_to_async(queries.__exit__)(None, None, None)
        await socket.disconnect()
        return event

    done = async_to_sync(run)()
    return len(queries), done


def _history(conversation: Conversation, n: int) -> None:
    Message.objects.bulk_create([
        Message(conversation=conversation, seq=i + 1, role="user" if i % 2 == 0 else "assistant",
                content=f"Earlier message {i} about phones and tablets.", token_count=8) for i in range(n)])
    conversation.last_seq = n
    conversation.save(update_fields=["last_seq"])


@pytest.mark.django_db(transaction=True)
def test_a_websocket_message_issues_the_same_statements_whatever_the_history(product_corpus, user,
                                                                            ragchat_settings_override):
    ragchat_settings_override(DATABASE_THREADS=1)  # no lanes: every statement on this thread's connection
    warm = Conversation.objects.create(owner=user)
    for text in ("warm up the vector index", "and the subject names?"):
        _queries_of_a_message(user, {"type": "message", "content": text, "conversation_id": str(warm.pk)})
    counts = {}
    for n in (0, 2, 200):
        conversation = Conversation.objects.create(owner=user)
        _history(conversation, n)
        counts[n], done = _queries_of_a_message(
            user, {"type": "message", "content": QUESTION, "conversation_id": str(conversation.pk), "client_id": "c1"})
        assert done["type"] == "done" and done["message"]["status"] == "complete", done
    assert counts[2] == counts[200], counts
    # Before the model: the session, the conversation (with whether a turn is pending there), the
    # asker's principals, begin_turn (its UPDATE returning the new sequence number, then the
    # INSERT; on SQLite, its BEGIN counted and the UPDATE also saying whether an answer is
    # streaming, which on PostgreSQL the INSERT says), the history, the corpus's stamp, the chunks.
    # Then the answer saved. Issue 27 cut 5 on SQLite (20 before: the pending check, the
    # streaming answers and the sequence number read after the UPDATE, a second stamp, the
    # principals' second query) and 3 on PostgreSQL (19 before); then PostgreSQL's read of the
    # streaming answers went into the INSERT (16 -> 15).
    assert counts[2] <= 15, counts
    # A conversation's first message reads no history (20 and 19 before, too).
    assert counts[0] == counts[2] - 1, counts
