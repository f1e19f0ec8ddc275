"""A turn's work before its model, made cheaper without changing what it reads and saves (issue
27, 100 clients over 5 s): a message frame's session check and conversation read in one thread
hop, the limits' cache work in place when it waits on nothing, and the statements of every turn
(the session, the conversation with its pending flag, the two messages) written as SQL once per
process instead of built by the ORM on every turn. Each read or write here is compared with the
ORM's."""

from __future__ import annotations

import asyncio
import contextlib
import datetime

import pytest
from asgiref.sync import SyncToAsync, async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.sessions.models import Session
from django.db import connection
from django.db.models.sql.compiler import SQLCompiler, SQLInsertCompiler, SQLUpdateCompiler
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from django_ragchat.models import Conversation, Message, MessageSource, TurnTrace
from django_ragchat.transport.consumers import ChatConsumer, session_is_current
from django_ragchat.turn import limits, persistence
from tests.test_turn_queries import _session

REDIS_CACHE = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": "redis://127.0.0.1:6379/0"}}


@contextlib.contextmanager
def no_orm_queries():
    """Building an ORM query (SELECT or INSERT) in the block fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("an ORM query was built")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SQLCompiler, "as_sql", refuse)
        patch.setattr(SQLInsertCompiler, "as_sql", refuse)
        yield


@pytest.mark.django_db
def test_the_session_read_as_sql_says_what_the_session_store_says(user, other_user):
    session = _session(user)
    corrupted = _session(user)
    Session.objects.filter(pk=corrupted.session_key).update(session_data="not signed")
    expired = _session(user)
    Session.objects.filter(pk=expired.session_key).update(expire_date=timezone.now() - datetime.timedelta(seconds=1))
    deleted = _session(user)
    deleted.delete()

    class Malformed:
        session_key = "short"  # under Django's 8 characters: never stored

    cases = [(user, session, True), (other_user, session, False), (user, corrupted, False),
             (user, expired, False), (user, deleted, False), (user, Malformed(), False)]
    expected = [session_is_current(u, s) for u, s, _ in cases]  # through the ORM...
    assert expected == [want for *_, want in cases]
    with no_orm_queries(), CaptureQueriesContext(connection) as queries:
        assert [session_is_current(u, s) for u, s, _ in cases] == expected  # ...and as SQL
    assert len(queries) == 5  # one statement a check (none for the malformed key)


@pytest.mark.django_db
def test_a_conversation_read_as_sql_is_the_orms_with_its_pending_flag(user):
    conversation = Conversation.objects.create(owner=user, title="Phones", metadata={"tags": ["a", 1]}, last_seq=2)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="hi", client_id="sent")
    streaming = Message.objects.create(conversation=conversation, seq=2, role="assistant", status="streaming")

    def both(client_id: str) -> tuple[Conversation, Conversation]:
        orm = persistence.with_pending(Conversation.objects, client_id).get(pk=conversation.pk)
        return orm, persistence.conversation_with_pending(conversation.pk, client_id)

    for client_id, pending in (("", True), ("other", True), ("sent", True)):
        orm, read = both(client_id)
        assert [getattr(read, f.attname) for f in Conversation._meta.concrete_fields] == [
            getattr(orm, f.attname) for f in Conversation._meta.concrete_fields]
        assert isinstance(read.created_at, datetime.datetime) and read.metadata == {"tags": ["a", 1]}
        assert not read._state.adding and read._state.db == "default"
        assert read.__dict__[persistence.PENDING] == bool(orm.__dict__[persistence.PENDING]) == pending
        assert read.__dict__[persistence.PENDING_FOR] == client_id
    streaming.status = "complete"
    streaming.save()
    assert both("")[1].__dict__[persistence.PENDING] is False  # nothing streams, no client_id
    assert both("other")[1].__dict__[persistence.PENDING] is False
    assert both("sent")[1].__dict__[persistence.PENDING] is True  # that client_id was used here
    conversation.delete()
    assert persistence.conversation_with_pending(conversation.pk, "") is None


@pytest.mark.django_db
def test_a_conversation_is_opened_for_a_message_without_building_an_orm_query(user):
    from django_ragchat.transport import turns

    conversation = Conversation.objects.create(owner=user)
    with no_orm_queries():
        opened, may_send = turns.open_conversation_sync(user, str(conversation.pk), None, True, "c1")
    assert opened == conversation and may_send
    assert not persistence.pending_possible(opened, "c1")


@pytest.mark.django_db
def test_the_turns_two_messages_inserted_as_sql_are_the_orms(user):
    conversation = Conversation.objects.create(owner=user)
    with no_orm_queries():
        user_message, assistant = persistence.begin_turn(conversation.pk, "How much is the Aurora X2?", "c1")
    for message in (user_message, assistant):
        assert message.pk is not None and not message._state.adding and message._state.db == "default"
    fields = [f.attname for f in Message._meta.concrete_fields]
    saved = {m.pk: m for m in Message.objects.filter(conversation=conversation)}
    for message in (user_message, assistant):
        assert [getattr(saved[message.pk], f) for f in fields] == [getattr(message, f) for f in fields]
    assert (user_message.seq, user_message.role, user_message.client_id, user_message.token_count > 0) == (
        1, "user", "c1", True)
    assert (assistant.seq, assistant.status, assistant.metadata, assistant.content) == (2, "streaming", {}, "")
    assert assistant.lease_expires_at > timezone.now() and assistant.lease_holder
    assert user_message.created_at is not None and user_message.updated_at is not None


def test_the_limits_wait_on_nothing_without_a_limit_or_with_a_local_cache(ragchat_settings_override):
    ragchat_settings_override(TURNS_PER_MINUTE=5, MAX_CONCURRENT_STREAMS=2)
    assert limits.cache_is_local() and not limits.admission_blocks()  # the tests' local-memory cache
    with override_settings(CACHES=REDIS_CACHE):
        assert not limits.cache_is_local() and limits.admission_blocks()  # a network round trip
        ragchat_settings_override(TURNS_PER_MINUTE=0, MAX_CONCURRENT_STREAMS=0)
        assert not limits.admission_blocks()  # nothing to read or write


@pytest.mark.django_db(transaction=True)
def test_a_message_reaches_its_ack_in_two_thread_hops(product_corpus, user, ragchat_settings_override, monkeypatch):
    """The session check and the conversation's read in one hop, the limits in place (a local
    cache), the messages saved in another: two before the ``ack`` (five before)."""
    ragchat_settings_override(TURNS_PER_MINUTE=30, MAX_CONCURRENT_STREAMS=3)
    session = _session(user)
    conversation = Conversation.objects.create(owner=user)
    hops: list[str] = []
    original = SyncToAsync.__call__
    loops = []

    async def counted(self, *args, **kwargs):
        # This test's loop only: an earlier test's turn still waiting for a tool decision on
        # another thread's loop polls its row (``_current_status``) now and then.
        if asyncio.get_running_loop() in loops:
            hops.append(getattr(self.func, "__name__", repr(self.func)))
        return await original(self, *args, **kwargs)

    async def run():
        loops.append(asyncio.get_running_loop())
        socket = WebsocketCommunicator(ChatConsumer.as_asgi(), "/ws/ragchat/")
        socket.scope.update(user=user, session=session)
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from(10))["type"] == "ready"
        monkeypatch.setattr(SyncToAsync, "__call__", counted)
        await socket.send_json_to({"type": "message", "content": "How much does the Aurora X2 cost?",
                                   "conversation_id": str(conversation.pk), "client_id": "c1"})
        frame = await socket.receive_json_from(20)
        monkeypatch.setattr(SyncToAsync, "__call__", original)
        while (await socket.receive_json_from(20))["type"] not in ("done", "error"):
            pass
        await socket.disconnect()
        return frame

    assert async_to_sync(run)()["type"] == "ack"
    # Not even channels' per-frame connection cleanup (its test communicator's no_op): a
    # message's lane cleans up its own connections.
    assert hops[:2] == ["_open_for_message", "_begin_turn"], hops


@pytest.mark.django_db
def test_the_streaming_answers_read_as_sql_are_the_orms(user):
    conversation = Conversation.objects.create(owner=user)
    Message.objects.create(conversation=conversation, seq=1, role="user", content="hi")
    Message.objects.create(conversation=conversation, seq=2, role="assistant", status="streaming",
                           lease_holder="host/1", lease_expires_at=timezone.now())
    Message.objects.create(conversation=conversation, seq=4, role="assistant", status="streaming")
    orm = list(Message.objects.filter(conversation=conversation, status="streaming")
               .values_list("pk", "lease_holder", "lease_expires_at", "updated_at"))
    with no_orm_queries():
        read = persistence._streaming_answers(str(conversation.pk))
    assert sorted(read, key=str) == sorted(orm, key=str) and len(read) == 2
    assert isinstance(read[0][3], datetime.datetime)


def test_the_traces_components_are_read_from_the_registry_once_per_profile(monkeypatch):
    from django_ragchat.profiles import get_profile
    from django_ragchat.turn import pipeline
    from django_ragchat.turn.context import components_for

    components = components_for(get_profile("default"))
    first = pipeline._components_trace(components)
    monkeypatch.setattr(pipeline, "get_registry", lambda: pytest.fail("the registry was read again"))
    again = pipeline._components_trace(components)
    assert again == first and again is not first and again[0] is not first[0]  # each turn its own rows
    assert [row["stage"] for row in first] == [c.kind for c in components.each()]


@pytest.mark.django_db(transaction=True)
def test_begin_turn_asks_whether_an_answer_streams_in_its_own_statements(user):
    """SQLite: the UPDATE says; PostgreSQL: the INSERT, read after the UPDATE's lock (it used to
    be a SELECT of its own between them). Then, on both, what streams is settled as before."""
    conversation = Conversation.objects.create(owner=user)
    with CaptureQueriesContext(connection) as queries:
        persistence.begin_turn(conversation.pk, "first", "c1")
    statements = [q["sql"].split()[0].upper() for q in queries]
    assert [s for s in statements if s in ("SELECT", "UPDATE", "INSERT")] == ["UPDATE", "INSERT"], statements
    with pytest.raises(persistence.TurnInProgress):  # the first answer's lease is alive
        persistence.begin_turn(conversation.pk, "second", "c2")
    with pytest.raises(persistence.DuplicateMessage):  # a resend while it streams
        persistence.begin_turn(conversation.pk, "first", "c1")
    Message.objects.filter(status="streaming").update(lease_expires_at=timezone.now() - datetime.timedelta(seconds=1))
    _, assistant = persistence.begin_turn(conversation.pk, "third", "c3")  # the expired one is closed
    assert list(Message.objects.filter(conversation=conversation).order_by("seq").values_list("seq", "status")) == [
        (1, "complete"), (2, "interrupted"), (3, "complete"), (4, "streaming")]  # the refused took none
    assert assistant.seq == 4 and not Message.objects.filter(content__in=["second"]).exists()


@pytest.mark.django_db
def test_an_answers_update_sources_and_trace_written_as_sql_are_the_orms(user):
    """``finish_turn``'s three statements (the answer's row, its sources, its trace), written
    once per process (``_update_answer``, ``_insert_rows``), save what the ORM saves."""
    conversation = Conversation.objects.create(owner=user)
    _, by_orm = persistence.begin_turn(conversation.pk, "How much is the Aurora X2?")
    Message.objects.filter(pk=by_orm.pk).update(status=Message.Status.COMPLETE)  # no answer streams now
    _, by_sql = persistence.begin_turn(conversation.pk, "And the Zephyr Buds?")
    now = timezone.now()
    for message in (by_orm, by_sql):
        message.content, message.status, message.token_count = "It costs $699 [1].", "complete", 6
        message.prompt_tokens, message.completion_tokens = 120, None
        message.metadata = {"citations": [1], "note": "é \u2014 ok", "nested": {"a": [1.5, None, True]}}
        message.lease_expires_at, message.updated_at = None, now

    def sources(message):
        return [MessageSource(message=message, chunk_id=None, rank=rank, score=0.25 * rank, cited=rank == 1,
                              source=f"doc-{rank}.md", title=f"Doc {rank}") for rank in (1, 2, 3)]

    def trace(message):
        return TurnTrace(message=message, profile="default", ended_by="", total_ms=12.5,
                         data={"timings": {"total": 12.5}, "stages": ["retrieval"], "text": "ünïcode"})

    Message.objects.filter(pk=by_orm.pk).update(**{f: getattr(by_orm, f) for f in persistence._ANSWER_FIELDS})
    MessageSource.objects.bulk_create(sources(by_orm))
    TurnTrace.objects.create(**{f.name: getattr(trace(by_orm), f.name) for f in TurnTrace._meta.concrete_fields
                                if not f.primary_key and f.name != "created_at"})
    with no_orm_queries(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(SQLUpdateCompiler, "as_sql", SQLCompiler.as_sql)  # refused too
        assert persistence._update_answer(by_sql) == 1
        persistence._insert_rows(MessageSource, sources(by_sql))
        persistence._insert_rows(TurnTrace, [trace(by_sql)])
        persistence._insert_rows(MessageSource, [])  # no rows, no statement

    def row(model, exclude, **where):
        fields = [f.attname for f in model._meta.concrete_fields if f.attname not in exclude]
        return [[getattr(o, f) for f in fields] for o in model.objects.filter(**where).order_by("pk")]

    assert row(Message, {"id", "seq", "created_at"}, pk=by_sql.pk) == row(Message, {"id", "seq", "created_at"},
                                                                              pk=by_orm.pk)
    assert row(Message, {"id", "seq", "content", "created_at"}, pk=by_sql.pk)[0][0] == conversation.pk
    assert row(MessageSource, {"id", "message_id"}, message=by_sql) == row(MessageSource, {"id", "message_id"},
                                                                            message=by_orm)
    assert len(row(MessageSource, {"id"}, message=by_sql)) == 3
    saved = TurnTrace.objects.get(message=by_sql)
    assert row(TurnTrace, {"id", "message_id", "created_at"}, message=by_sql) == row(
        TurnTrace, {"id", "message_id", "created_at"}, message=by_orm)
    assert saved.created_at is not None and saved.data["text"] == "ünïcode"
    Message.objects.filter(pk=by_sql.pk).delete()
    assert persistence._update_answer(by_sql) == 0  # gone: finish_turn raises ConversationGone
