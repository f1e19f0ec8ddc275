"""Reading and writing a turn's rows: the only place the pipeline touches the database
besides memory and retrieval. Each function is synchronous (called through ``sync_to_async``)
and issues a fixed number of queries, whatever the conversation's length."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import IntegrityError, connections, router, transaction
from django.db.models import BooleanField, CharField, F, Q, Value
from django.db.models.expressions import RawSQL
from django.utils import timezone

from django_ragchat.conf import ragchat_settings
from django_ragchat.exceptions import RagchatError, TurnInProgress
from django_ragchat.models import (
    REFUSED_INPUT_STAGE,
    Chunk,
    Conversation,
    Message,
    MessageSource,
    ToolInvocation,
    TurnTrace,
)
from django_ragchat.text import question_label
from django_ragchat.tokens import count_tokens
from django_ragchat.turn import limits, stops, workers
from django_ragchat.types import Answer

if TYPE_CHECKING:
    from django_ragchat.turn.context import TurnContext
    from django_ragchat.turn.tools import ToolRun

logger = logging.getLogger(__name__)


class DuplicateMessage(Exception):
    """A message with this ``client_id`` was already sent to the conversation: the resend is
    answered with the first attempt's messages, nothing new is saved."""

    code = "duplicate"

    def __init__(self, user_message: Message, assistant_message: Message | None):
        super().__init__(f"Message {user_message.pk} was already sent with this client_id.")
        self.user_message = user_message
        self.assistant_message = assistant_message


class ConversationGone(RagchatError):
    """The conversation (and so the answer being written) was deleted during the turn."""

    code = "conversation_deleted"
    http_status = 410
    default_message = "This conversation was deleted while the answer was being written."


INTERRUPTED_ERROR = {"code": "interrupted",
                     "message": "The server writing this answer stopped; the text saved before it stopped is kept."}


def lease_deadline(now=None):
    """When a lease taken or renewed ``now`` expires."""
    return (now or timezone.now()) + timedelta(seconds=ragchat_settings.STREAM_LEASE_SECONDS)


def _unexpired(now) -> Q:
    # Rows written before leases existed have no lease: their last write stands for it.
    return Q(lease_expires_at__gt=now) | Q(
        lease_expires_at__isnull=True,
        updated_at__gt=now - timedelta(seconds=ragchat_settings.STREAM_LEASE_SECONDS))


def _is_unexpired(lease_expires_at, updated_at, now) -> bool:
    """``_unexpired(now)`` for a row already read."""
    if lease_expires_at is not None:
        return lease_expires_at > now
    return updated_at > now - timedelta(seconds=ragchat_settings.STREAM_LEASE_SECONDS)


def _any_alive(holders) -> bool:
    """Whether any of these unexpired leases' holders may still be writing (``workers.is_dead``:
    a holder known to be dead does not block the conversation)."""
    return any(not workers.is_dead(holder) for holder in holders)


def _close(queryset, now) -> int:
    return queryset.update(status=Message.Status.INTERRUPTED, lease_expires_at=None,
                           metadata={"error": INTERRUPTED_ERROR}, updated_at=now)


def _duplicate(conversation_id, client_id: str) -> DuplicateMessage | None:
    user = Message.objects.filter(conversation_id=conversation_id, role=Message.Role.USER,
                                  client_id=client_id).first()
    if user is None:
        return None
    assistant = Message.objects.filter(conversation_id=conversation_id, seq=user.seq + 1,
                                       role=Message.Role.ASSISTANT).first()
    return DuplicateMessage(user, assistant)


def _advance(conversation_id, now) -> tuple[int, list[tuple] | None]:
    """Take two sequence numbers of the conversation (its row locked until the transaction
    ends): its new ``last_seq``, and its streaming answers (pk, holder, lease expiry, last
    update), read after the lock is taken. Where the database returns rows from an UPDATE, the
    new ``last_seq`` comes with it (``_advance_returning``), and on SQLite also whether any
    answer is streaming: usually none, and then nothing else is read. On PostgreSQL ``None``:
    the INSERT that follows asks (``_insert_messages``)."""
    returned = _advance_returning(conversation_id, now)
    if returned is None:
        if not Conversation.objects.filter(pk=conversation_id).update(last_seq=F("last_seq") + 2, updated_at=now):
            raise Conversation.DoesNotExist(f"No conversation {conversation_id}")
        returned = (Conversation.objects.filter(pk=conversation_id).values_list("last_seq", flat=True).get(), True)
    last_seq, any_streaming = returned
    if any_streaming is None:  # to be asked by the INSERT (begin_turn)
        return last_seq, None
    return last_seq, _streaming_answers(conversation_id) if any_streaming else []


def _columns(connection, model, names: list[str]) -> tuple[str, list[tuple]]:
    """The select list of ``model``'s fields ``names`` (its table's name, quoted, before each
    column) and each column's converters, what the ORM's compiler applies to what it reads."""
    qn, table = connection.ops.quote_name, model._meta.db_table
    columns = [model._meta.get_field(name).get_col(table) for name in names]
    select = ", ".join(f"{qn(table)}.{qn(column.target.column)}" for column in columns)
    return select, [(c, [*connection.ops.get_db_converters(c), *c.get_db_converters(connection)]) for c in columns]


def _converted(row, converters: list[tuple], connection) -> list:
    """A row as the ORM reads it (``_columns``' converters; the columns after them as they are)."""
    values = list(row)
    for i, (column, functions) in enumerate(converters):
        for function in functions:
            values[i] = function(values[i], column, connection)
    return values


_statements: dict[tuple, tuple] = {}  # SQL made once per process: (what, database, shape) -> (sql, ...)


def _streaming_answers(conversation_id) -> list[tuple]:
    """(pk, holder, lease expiry, last update) of the conversation's streaming answers: the
    ORM's ``values_list`` query as SQL, made once per process (on PostgreSQL every turn reads
    them, after its UPDATE)."""
    connection = connections[router.db_for_read(Message)]
    key = ("streaming", connection.alias)
    if key not in _statements:
        qn, field = connection.ops.quote_name, Message._meta.get_field
        select, converters = _columns(connection, Message, ["id", "lease_holder", "lease_expires_at", "updated_at"])
        _statements[key] = (f"SELECT {select} FROM {qn(Message._meta.db_table)} WHERE "
                            f"{qn(field('conversation').column)} = %s AND {qn(field('status').column)} = %s"), converters
    sql, converters = _statements[key]
    pk = Conversation._meta.pk
    with connection.cursor() as cursor:
        cursor.execute(sql, [pk.get_db_prep_value(pk.to_python(conversation_id), connection),
                             Message.Status.STREAMING.value])
        return [tuple(_converted(row, converters, connection)) for row in cursor.fetchall()]


def _advance_returning(conversation_id, now) -> tuple[int, bool | None] | None:
    """``_advance``'s UPDATE with ``RETURNING``: the new ``last_seq`` and whether an answer is
    streaming (``None``: not asked); ``None`` where the database cannot return rows from an UPDATE.

    Only SQLite answers the second in the same statement: a writer there holds the database's
    one write lock from this statement on, so the statement reads what every earlier turn
    committed. On PostgreSQL an UPDATE that waited for the row's lock still reads the other
    tables as they were when it started (read committed), so a turn that committed meanwhile
    would be missed: there the next statement, the INSERT, asks (``_insert_messages``)."""
    connection = connections[router.db_for_write(Conversation)]
    if not connection.features.can_return_columns_from_insert:  # RETURNING: PostgreSQL, SQLite 3.35+
        return None
    qn, meta, field = connection.ops.quote_name, Conversation._meta, Message._meta.get_field
    pk = meta.pk.get_db_prep_value(meta.pk.to_python(conversation_id), connection)
    seq, params = qn(meta.get_field("last_seq").column), [meta.get_field("updated_at").get_db_prep_value(now, connection), pk]
    streaming = "1"  # not asked here (PostgreSQL): the INSERT after the lock asks
    if connection.vendor == "sqlite":
        streaming = (f"EXISTS (SELECT 1 FROM {qn(Message._meta.db_table)} WHERE {qn(field('conversation').column)} "
                     f"= %s AND {qn(field('status').column)} = %s)")
        params += [pk, Message.Status.STREAMING.value]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {qn(meta.db_table)} SET {seq} = {seq} + 2, {qn(meta.get_field('updated_at').column)} "
                       f"= %s WHERE {qn(meta.pk.column)} = %s RETURNING {seq}, {streaming}", params)
        row = cursor.fetchone()
    if row is None:
        raise Conversation.DoesNotExist(f"No conversation {conversation_id}")
    return row[0], bool(row[1]) if connection.vendor == "sqlite" else None


def _insert_messages(messages: list[Message], streaming_in=None) -> bool:
    """``Message.objects.bulk_create(messages)``: where the database returns the new rows' ids
    from an INSERT (PostgreSQL, SQLite 3.35+, as the ORM relies on), the same statement, its text
    made once per process, database and number of rows, each value prepared as the ORM's
    compiler prepares it (``pre_save``, ``get_db_prep_save``). Building the ORM's INSERT cost
    three times its statement, on every turn before its ``ack``.

    ``streaming_in`` (a conversation's id): the statement also says whether an answer was
    streaming there, which it reads with a snapshot taken as it starts (after ``_advance``'s
    lock), without the rows it inserts. The answer; False when not asked."""
    alias = router.db_for_write(Message)
    connection = connections[alias]
    if not connection.features.can_return_rows_from_bulk_insert:
        Message.objects.bulk_create(messages)
        return bool(streaming_in is not None and _streaming_answers(streaming_in))
    sql, fields = _insert_sql(connection, len(messages), streaming_in is not None)
    params = [f.get_db_prep_save(f.pre_save(m, True), connection) for m in messages for f in fields]
    if streaming_in is not None:
        pk = Conversation._meta.pk
        params += [pk.get_db_prep_value(pk.to_python(streaming_in), connection), Message.Status.STREAMING.value]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    for message, row in zip(messages, rows, strict=True):
        message.pk = row[0]
        message._state.adding, message._state.db = False, alias
    return streaming_in is not None and bool(rows[0][1])


def _insert_sql(connection, count: int, asking: bool) -> tuple[str, list]:
    """``_insert_messages``' statement for ``count`` rows (``asking``: whether an answer streams)."""
    key = ("insert", connection.alias, count, asking)
    if key not in _statements:
        qn, meta, field = connection.ops.quote_name, Message._meta, Message._meta.get_field
        fields = [f for f in meta.concrete_fields if not f.primary_key]  # the id is the database's
        row = f"({', '.join(['%s'] * len(fields))})"
        returning = qn(meta.pk.column)
        if asking:
            returning += (f", EXISTS (SELECT 1 FROM {qn(meta.db_table)} m WHERE m.{qn(field('conversation').column)} "
                          f"= %s AND m.{qn(field('status').column)} = %s)")
        _statements[key] = (f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
                            f"VALUES {', '.join([row] * count)} RETURNING {returning}"), fields
    return _statements[key]


def _settle_streaming(conversation_id, client_id: str, streaming: list[tuple], now) -> None:
    """Before a turn's messages are saved, the conversation's other streaming answers (pk,
    holder, lease expiry, last update): ``TurnInProgress`` while one's lease is alive
    (``DuplicateMessage`` for a resend), else those of workers that are gone are closed."""
    if _any_alive(holder for _, holder, expires, updated in streaming if _is_unexpired(expires, updated, now)):
        duplicate = _duplicate(conversation_id, client_id) if client_id else None
        if duplicate is not None:
            raise duplicate
        raise TurnInProgress()
    if streaming:  # expired, or held by a worker that is gone
        _close(Message.objects.filter(pk__in=[pk for pk, *_ in streaming], status=Message.Status.STREAMING), now)


def begin_turn(conversation_id, text: str, client_id: str = "") -> tuple[Message, Message]:
    """Save the user's message and an empty assistant message with status "streaming" and a
    lease (``STREAM_LEASE_SECONDS``) that the turn's ``Heartbeat`` renews.

    One transaction: the UPDATE of the conversation's sequence counter takes its row lock, so
    the "no other turn is streaming" check and the two inserts cannot interleave with another
    turn's. A streaming answer whose lease has expired, or whose worker is known to be gone
    (``workers.is_dead``: a process of this machine that no longer runs), belongs to a worker
    that died: it is marked "interrupted" (keeping the text of its last heartbeat) instead of
    blocking the conversation; one whose lease is alive raises ``TurnInProgress``.

    With a ``client_id`` already used by a user message of this conversation, nothing is saved
    and ``DuplicateMessage`` carries the first attempt's messages. Found through the unique
    constraint, so a send without a duplicate costs no extra query.
    """
    now = timezone.now()
    try:
        with transaction.atomic():
            last_seq, streaming = _advance(conversation_id, now)
            if streaming is not None:
                _settle_streaming(conversation_id, client_id, streaming, now)
            user = Message(conversation_id=conversation_id, seq=last_seq - 1, role=Message.Role.USER,
                           content=text, token_count=count_tokens(text), client_id=client_id or "")
            assistant = Message(conversation_id=conversation_id, seq=last_seq, role=Message.Role.ASSISTANT,
                                content="", status=Message.Status.STREAMING, lease_expires_at=lease_deadline(now),
                                lease_holder=workers.identity())
            if _insert_messages([user, assistant], conversation_id if streaming is None else None):
                # Another answer streams (PostgreSQL, asked by the INSERT): refused as above, the
                # rows just inserted rolled back; the client_id was new (no unique violation).
                others = [row for row in _streaming_answers(conversation_id) if row[0] != assistant.pk]
                _settle_streaming(conversation_id, "", others, now)
    except IntegrityError:
        duplicate = _duplicate(conversation_id, client_id) if client_id else None
        if duplicate is None:
            raise
        raise duplicate from None
    return user, assistant


#: What ``renew_lease`` found: the lease renewed, a stop asked for, the answer no longer streaming.
RENEWED, STOP_REQUESTED, GONE = "renewed", "stop_requested", "gone"


def renew_lease(message_id: int, text: str | None) -> str:
    """Extend a streaming answer's lease, saving its partial ``text`` (unless ``None``):
    ``RENEWED``; ``STOP_REQUESTED`` when someone asked it to stop (``stops.request_stop``, maybe
    from another process: the turn stops now, the lease is left as it is); ``GONE`` when the
    answer is no longer streaming or no longer exists. One query, two when not renewed."""
    now = timezone.now()
    fields: dict[str, Any] = {"lease_expires_at": lease_deadline(now), "updated_at": now}
    if text is not None:
        fields["content"] = text
    streaming = Message.objects.filter(pk=message_id, status=Message.Status.STREAMING)
    if streaming.filter(stop_requested_at__isnull=True).update(**fields):
        return RENEWED
    return STOP_REQUESTED if streaming.exists() else GONE


def close_expired_leases(now=None, exclude=()) -> int:
    """Mark every "streaming" answer whose lease has expired, or whose worker on this machine is
    gone (``workers.is_dead``), "interrupted" (its text is that of its last heartbeat); the
    number closed. The sweep: run by ``ragchat_purge`` and, at most
    once per lease period, by each process writing answers (``exclude``: its own)."""
    now = now or timezone.now()
    streaming = Message.objects.filter(status=Message.Status.STREAMING).exclude(pk__in=exclude)
    stale = ~_unexpired(now)
    if workers.machine():
        # Answers of this machine's workers that are gone: closed now, not at their expiry.
        here = streaming.filter(lease_holder__startswith=workers.machine() + "/").filter(_unexpired(now))
        dead = [pk for pk, holder in here.values_list("pk", "lease_holder") if workers.is_dead(holder)]
        if dead:
            stale |= Q(pk__in=dead)
    return _close(streaming.filter(stale), now)


#: The annotations ``with_pending`` adds to a conversation read: whether ``check_pending`` could
#: find anything there, and for which ``client_id``.
PENDING, PENDING_FOR = "ragchat_pending", "ragchat_pending_for"


def with_pending(queryset, client_id: str = ""):
    """``queryset`` (conversations) annotated with ``PENDING``: whether an answer is streaming in
    the conversation or ``client_id`` was used there, read with the conversation in the same
    query; when false, ``pending_possible`` spares the turn ``check_pending``'s query. Written as
    SQL: the ORM's ``Exists`` cost as much to build as the query it replaces."""
    pending, params = _pending_sql(connections[queryset.db].ops.quote_name, client_id)
    return queryset.annotate(**{PENDING: RawSQL(pending, params, output_field=BooleanField()),
                                PENDING_FOR: Value(client_id, output_field=CharField())})


def _pending_sql(qn, client_id: str) -> tuple[str, list]:
    """The ``EXISTS`` of ``with_pending`` and its parameters (the conversation's table unaliased)."""
    field = Message._meta.get_field
    wanted, params = f"m.{qn(field('status').column)} = %s", [Message.Status.STREAMING.value]
    if client_id:
        wanted, params = f"({wanted} OR m.{qn(field('client_id').column)} = %s)", [*params, client_id]
    return (f"EXISTS (SELECT 1 FROM {qn(Message._meta.db_table)} m WHERE m.{qn(field('conversation').column)} = "
            f"{qn(Conversation._meta.db_table)}.{qn(Conversation._meta.pk.column)} AND {wanted})"), params


def _conversation_read(connection, with_client_id: bool) -> tuple[str, list[str], list[tuple]]:
    """The SQL reading one conversation with its ``PENDING`` flag, its fields' names and their
    converters, made once per process, database and shape."""
    key = ("conversation", connection.alias, with_client_id)
    if key not in _statements:
        qn, meta = connection.ops.quote_name, Conversation._meta
        names = [field.attname for field in meta.concrete_fields]
        select, converters = _columns(connection, Conversation, [field.name for field in meta.concrete_fields])
        pending, _ = _pending_sql(qn, "x" if with_client_id else "")
        _statements[key] = (f"SELECT {select}, {pending} FROM {qn(meta.db_table)} "
                            f"WHERE {qn(meta.db_table)}.{qn(meta.pk.column)} = %s"), names, converters
    return _statements[key]


def conversation_with_pending(conversation_id: uuid.UUID, client_id: str = "") -> Conversation | None:
    """``with_pending(Conversation.objects, client_id).filter(pk=conversation_id).first()``: the
    same statement, written as SQL once per process (``_conversation_read``). Building the ORM's
    query cost 0.6 ms of CPU on every message, five times the statement."""
    alias = router.db_for_read(Conversation)
    connection = connections[alias]
    sql, names, converters = _conversation_read(connection, bool(client_id))
    _, params = _pending_sql(connection.ops.quote_name, client_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, Conversation._meta.pk.get_db_prep_value(conversation_id, connection)])
        row = cursor.fetchone()
    if row is None:
        return None
    conversation = Conversation.from_db(alias, names, _converted(row, converters, connection)[:-1])
    conversation.__dict__.update({PENDING: bool(row[-1]), PENDING_FOR: client_id or ""})
    return conversation


class PendingLookup:
    """What ``permissions.get_conversation_for`` looks a conversation up in (its ``queryset``),
    answering its ``.filter(pk=...).first()`` with ``conversation_with_pending``."""

    def __init__(self, client_id: str = ""):
        self.client_id = client_id
        self.pk: uuid.UUID | None = None

    def filter(self, *, pk: uuid.UUID) -> PendingLookup:
        self.pk = pk
        return self

    def first(self) -> Conversation | None:
        return conversation_with_pending(self.pk, self.client_id)


def pending_possible(conversation: Conversation, client_id: str = "") -> bool:
    """Whether ``check_pending(conversation.pk, client_id)`` may find something: false only for a
    conversation read through ``with_pending`` for this ``client_id`` that had nothing pending
    then (``begin_turn`` checks again under the conversation's lock, so a turn that started
    since is still refused). Read once: a conversation object kept for a later message is
    checked by a query again."""
    pending, asked = conversation.__dict__.pop(PENDING, True), conversation.__dict__.pop(PENDING_FOR, None)
    return bool(pending) or asked != (client_id or "")


def check_pending(conversation_id, client_id: str = "") -> None:
    """Before a turn is admitted (and counted against the caller's limits): raise
    ``DuplicateMessage`` for a resend of a message already in the conversation, or
    ``TurnInProgress`` while another answer is being written there. One query (two for a
    resend). ``begin_turn`` checks both again under the conversation's lock, so this is only
    a way to answer without taking a stream slot or counting the turn."""
    now = timezone.now()
    # The leases are compared here rather than in SQL: a simpler query to build, per turn.
    wanted = Q(status=Message.Status.STREAMING)
    if client_id:
        wanted |= Q(client_id=client_id)
    rows = list(Message.objects.filter(wanted, conversation_id=conversation_id)
                .values_list("role", "client_id", "status", "lease_holder", "lease_expires_at", "updated_at"))
    if client_id and any(role == Message.Role.USER and sent == client_id for role, sent, *_ in rows):
        duplicate = _duplicate(conversation_id, client_id)
        if duplicate is not None:
            raise duplicate
    if _any_alive(holder for role, _, status, holder, expires, updated in rows
                  if role == Message.Role.ASSISTANT and status == Message.Status.STREAMING
                  and _is_unexpired(expires, updated, now)):
        raise TurnInProgress()


def settle(duplicate: DuplicateMessage) -> DuplicateMessage:
    """``duplicate`` with its answer closed ("interrupted") if the worker writing it is gone or
    its lease expired, so that a resend after a crash is answered at once with what was saved.
    An answer still being written stays "streaming"."""
    assistant = duplicate.assistant_message
    if assistant is None or assistant.status != Message.Status.STREAMING:
        return duplicate
    now = timezone.now()
    expired = assistant.lease_expires_at is not None and assistant.lease_expires_at <= now
    if expired or workers.is_dead(assistant.lease_holder):
        _close(Message.objects.filter(pk=assistant.pk, status=Message.Status.STREAMING), now)
        assistant.refresh_from_db()
    return duplicate


_last_sweep = 0.0
# The answers this process is writing (their heartbeats run here): never swept from here, even
# when a busy moment delayed their heartbeat past their lease.
_writing: set[int] = set()


def _beat(message_id: int, text: str | None, writing: tuple[int, ...]) -> str:
    global _last_sweep
    found = renew_lease(message_id, text)
    now = time.monotonic()
    if now - _last_sweep >= ragchat_settings.STREAM_LEASE_SECONDS:
        _last_sweep = now
        close_expired_leases(exclude=writing)
    return found


class Heartbeat:
    """Renews a streaming answer's lease every ``STREAM_HEARTBEAT_SECONDS`` while its turn
    runs, saving the partial text so far (``partial()``, the text the client was given) and
    renewing the caller's stream slots (``limits.renew_held_slots``).

    A worker killed mid-answer loses at most the text of one heartbeat interval, and its
    answer stops blocking the conversation one lease after its last heartbeat. ``lost`` turns
    true when the answer was deleted (with its conversation) or closed by someone else. A stop
    asked for in another process (``stops.request_stop``) is read here: the turn is stopped.
    """

    def __init__(self, message: Message, partial: Callable[[], str]):
        self.message = message
        self.partial = partial
        self.lost = False
        self._task: asyncio.Task | None = None

    def start(self) -> Heartbeat:
        _writing.add(self.message.pk)
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    async def stop(self) -> None:
        _writing.discard(self.message.pk)
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        saved = ""
        while True:
            await asyncio.sleep(ragchat_settings.STREAM_HEARTBEAT_SECONDS)
            text = self.partial()
            try:
                found = await sync_to_async(_beat)(self.message.pk, text if text != saved else None,
                                                  tuple(_writing))
                await sync_to_async(limits.renew_held_slots, thread_sensitive=False)()
            except Exception:  # a database hiccup: the next beat tries again
                logger.warning("ragchat: could not renew the lease of message %s", self.message.pk, exc_info=True)
                continue
            if found == STOP_REQUESTED:
                stops.stop_here(self.message.conversation_id)
                return
            if found == GONE:
                self.lost = True
                return
            saved = text


def finish_turn(turn: TurnContext, answer: Answer, status: str, error: dict[str, Any] | None = None) -> Message:
    """Save the assistant message's final text and status, its sources and the trace."""
    message = turn.assistant_message
    message.content = answer.text
    message.status = status
    message.token_count = count_tokens(answer.text)
    usage = turn.usage
    message.prompt_tokens = usage.prompt_tokens if usage else None
    message.completion_tokens = usage.completion_tokens if usage else None
    metadata = dict(message.metadata)
    if error:
        metadata["error"] = error
    if answer.metadata:
        metadata.update(answer.metadata)
    message.metadata = metadata
    cited = {c.chunk_id for c in answer.citations}
    documents = stored_sources(answer, turn.prompt.documents if turn.prompt else ())
    message.lease_expires_at = None
    message.updated_at = timezone.now()
    sources = [MessageSource(message=message, chunk_id=doc.chunk_id, rank=rank, score=doc.score,
                             cited=doc.chunk_id in cited, source=doc.source[:1000], title=doc.title[:500],
                             access=list(doc.access))
               for rank, doc in documents]
    try:
        _save_answer(turn, message, sources)
    except IntegrityError:
        # A source's chunk was replaced while the answer was written (its object saved again: a
        # tool that changed it, an edit in the admin), and the row's link to it failed at commit.
        # Saved again without the links that are gone, as a replaced chunk's sources keep only
        # their names (``MessageSource.chunk``); the common path pays no query for the check.
        if not _unlink_replaced_chunks(sources):
            raise
        _save_answer(turn, message, sources)
    return message


def release_answer(turn: TurnContext, text: str, error: dict[str, Any]) -> Message:
    """The last resort when a failed turn's answer cannot be saved (``finish_turn`` raised: a
    component's trace or metadata that is not JSON, the database refusing a row): its text as an
    ``error`` answer with no sources or trace, in one statement, then its tool runs if they can
    be saved (a tool that cancelled an order did so: its row says it). Without it the answer kept
    its lease, and the conversation refused messages until the lease expired."""
    message = turn.assistant_message
    message.content, message.status, message.token_count = text, Message.Status.ERROR, count_tokens(text)
    message.prompt_tokens = message.completion_tokens = None
    message.metadata = {"error": error}
    message.lease_expires_at = None
    message.updated_at = timezone.now()
    if not _update_answer(message):
        raise ConversationGone()
    if turn.tool_runs:
        try:
            with transaction.atomic():
                save_tool_runs(message.pk, turn.tool_runs)
        except Exception:  # noqa: BLE001  (the answer is saved and released: that comes first)
            logger.exception("ragchat could not save the tool runs of message %s", message.pk)
    return message


def redact_user_message(turn: TurnContext, typed: str, by: str) -> None:
    """An input guardrail replaced the question (``pipeline.redact_question``): the user's
    message row keeps ``turn.question`` instead of ``typed`` (its text and token count; its
    metadata's ``redacted_by`` names the guardrails), and a title a client made from ``typed``
    is made from the new text. A title of the user's own choosing stays. One transaction, two
    queries."""
    message, text = turn.user_message, turn.question
    message.content, message.token_count = text, count_tokens(text)
    message.metadata = {**message.metadata, "redacted_by": [*message.metadata.get("redacted_by", ()), by]}
    title, retitled = question_label(typed), question_label(text)
    with transaction.atomic():
        Message.objects.filter(pk=message.pk).update(content=message.content, token_count=message.token_count,
                                                     metadata=message.metadata, updated_at=timezone.now())
        if title and title != retitled and Conversation.objects.filter(
                pk=turn.conversation.pk, title=title).update(title=retitled):
            turn.conversation.title = retitled


def _untitle_refused(turn: TurnContext) -> None:
    """A conversation named after the question an input guardrail has just refused loses that
    name: what the question says (a password pasted by mistake) must not stand where the
    conversation is listed (``models.naming_questions``): a client may have named it after the
    question before sending it. A title of the user's own choosing stays. One query."""
    question = turn.user_message.content if turn.user_message is not None else turn.question
    title = question_label(question)
    if title and Conversation.objects.filter(pk=turn.conversation.pk, title=title).update(title=""):
        turn.conversation.title = ""


def _unlink_replaced_chunks(sources: list[MessageSource]) -> bool:
    """Clear the chunk of each source whose chunk no longer exists; whether any was."""
    linked = {source.chunk_id for source in sources if source.chunk_id is not None}
    existing = set(Chunk.objects.filter(pk__in=linked).values_list("pk", flat=True))
    for source in sources:
        if source.chunk_id not in existing:
            source.chunk_id = None
    return linked != existing


def _save_answer(turn: TurnContext, message: Message, sources: list[MessageSource]) -> None:
    """The answer's row, its sources, trace and tool runs, in one transaction."""
    with transaction.atomic():
        if not _update_answer(message):
            raise ConversationGone()
        _insert_rows(MessageSource, sources)
        ended_by = (turn.trace.get("ended_by") or {}).get("stage", "")
        _insert_rows(TurnTrace, [TurnTrace(
            message=message, profile=turn.profile.name, ended_by=ended_by,
            total_ms=turn.trace["timings"].get("total", 0.0), data=turn.trace,
        )])
        if ended_by == REFUSED_INPUT_STAGE:
            _untitle_refused(turn)
        if turn.tool_runs:
            save_tool_runs(message.pk, turn.tool_runs)


#: What ``finish_turn`` writes over the assistant message's row.
_ANSWER_FIELDS = ("content", "status", "token_count", "prompt_tokens", "completion_tokens", "metadata",
                  "lease_expires_at", "updated_at")


def _update_answer(message: Message) -> int:
    """``Message.objects.filter(pk=message.pk).update(...)`` of the ``_ANSWER_FIELDS``, the
    statement written once per process and database, each value prepared as the ORM's update
    prepares it (``get_db_prep_save``): the rows updated."""
    alias = router.db_for_write(Message)
    connection = connections[alias]
    key = ("answer", alias)
    if key not in _statements:
        qn, meta = connection.ops.quote_name, Message._meta
        fields = [meta.get_field(name) for name in _ANSWER_FIELDS]
        _statements[key] = (f"UPDATE {qn(meta.db_table)} SET {', '.join(f'{qn(f.column)} = %s' for f in fields)} "
                            f"WHERE {qn(meta.pk.column)} = %s"), fields
    sql, fields = _statements[key]
    pk = Message._meta.pk
    params = [f.get_db_prep_save(getattr(message, f.attname), connection) for f in fields]
    params.append(pk.get_db_prep_value(message.pk, connection))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def _insert_rows(model, objects: list) -> None:
    """``model.objects.bulk_create(objects)`` for rows whose ids are not read back (an answer's
    sources and trace): the INSERT written once per process, database and number of rows, each
    value prepared as the ORM's compiler prepares it (``pre_save``, ``get_db_prep_save``). No
    statement for no rows, as ``bulk_create``; the ORM's own for more values than a statement
    of SQLite's takes."""
    if not objects:
        return
    alias = router.db_for_write(model)
    connection = connections[alias]
    meta = model._meta
    fields = [f for f in meta.concrete_fields if not f.primary_key]  # the id is the database's
    if len(objects) * len(fields) > 900:
        model.objects.using(alias).bulk_create(objects)
        return
    key = ("rows", alias, meta.label, len(objects))
    if key not in _statements:
        qn = connection.ops.quote_name
        row = f"({', '.join(['%s'] * len(fields))})"
        _statements[key] = (f"INSERT INTO {qn(meta.db_table)} ({', '.join(qn(f.column) for f in fields)}) "
                            f"VALUES {', '.join([row] * len(objects))}",)
    params = [f.get_db_prep_save(f.pre_save(o, True), connection) for o in objects for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(_statements[key][0], params)
    for o in objects:
        o._state.adding, o._state.db = False, alias


# --- Tool calls -------------------------------------------------------------------------------

#: What an answer's end writes over a tool call's row (the decision, made by the user, stays).
_TOOL_RUN_FIELDS = ("call_id", "name", "label", "arguments", "status", "content", "error", "requires_confirmation",
                    "ms", "token_count", "updated_at")


def _invocation(message_id: int, run: ToolRun) -> ToolInvocation:
    call = run.shown  # as the user approved it, when they were asked
    result = run.result
    return ToolInvocation(
        message_id=message_id, call_id=run.call.id[:200], step=run.step, index=run.index, name=call.name[:100],
        label=run.label[:300], arguments=call.arguments, requires_confirmation=run.requires_confirmation,
        status=result.status if result else ToolInvocation.Status.PENDING,
        content=result.content if result else "", error=result.error if result else None,
        ms=result.ms if result else 0.0, token_count=run.token_count,
    )


def save_pending_tool_call(message_id: int, run: ToolRun) -> int:
    """Save a call that awaits the user's approval (``ToolInvocation`` ``pending``); its id.
    One query."""
    return ToolInvocation.objects.create(**{
        f.attname: getattr(_invocation(message_id, run), f.attname)
        for f in ToolInvocation._meta.concrete_fields if not f.primary_key
    }).pk


def save_tool_runs(message_id: int, runs: list[ToolRun]) -> None:
    """Save an answer's tool calls with their results; a row saved earlier (a pending call)
    is updated, its decision kept. One query."""
    now = timezone.now()
    rows = []
    for run in runs:
        row = _invocation(message_id, run)
        row.created_at = row.updated_at = now
        rows.append(row)
    ToolInvocation.objects.bulk_create(rows, update_conflicts=True, unique_fields=["message", "step", "index"],
                                       update_fields=list(_TOOL_RUN_FIELDS))


def stored_sources(answer: Answer | None, documents) -> list[tuple[int, Any]]:
    """(prompt index, document) of the documents saved as the message's sources: all of the
    prompt's, or the subset a response augmenter chose (``Answer.sources``)."""
    indexed = list(enumerate(documents, start=1))
    if answer is None or answer.sources is None:
        return indexed
    keep = {d.chunk_id for d in answer.sources}
    return [(i, d) for i, d in indexed if d.chunk_id in keep]


def message_payload(message: Message, answer: Answer | None = None, documents=(),
                    tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON form of an assistant message that the ``done`` and ``error`` events carry
    (``tool_calls``: its tool calls' payloads, ``ToolInvocation.payload``)."""
    sources = stored_sources(answer, documents)
    by_chunk = {d.chunk_id: (i, d) for i, d in sources}
    citations = []
    for citation in (answer.citations if answer else ()):
        _, doc = by_chunk.get(citation.chunk_id, (None, None))
        if doc is None:
            continue  # not stored as a source, so the REST API will not list it either
        citations.append({
            "index": citation.index, "chunk_id": citation.chunk_id,
            "source": doc.source if doc else "", "title": doc.title if doc else "",
        })
    return {
        "id": message.pk,
        "conversation_id": str(message.conversation_id),
        "seq": message.seq,
        "role": message.role,
        "content": message.content,
        "status": message.status,
        "citations": citations,
        "sources": [d.as_source(i) for i, d in sources],
        "error": message.metadata.get("error"),
        "usage": usage_of(message),
        "tool_calls": tool_calls or [],
    }


def usage_of(message: Message) -> dict[str, int]:
    """The tokens the answer cost, as the model reported them; when no model call reported any
    (a turn ended before the model), no prompt tokens and the answer's own count."""
    completion = message.completion_tokens if message.completion_tokens is not None else message.token_count
    return {"prompt_tokens": message.prompt_tokens or 0, "completion_tokens": completion}


def saved_payload(message_id: int) -> dict[str, Any] | None:
    """``message_payload`` of a saved assistant message, its sources and citations read back
    from its ``MessageSource`` rows and its tool calls from its ``ToolInvocation`` rows (a
    resend's replay, a stopped turn's ``error``); ``None`` when the message no longer exists.
    Three queries."""
    message = Message.objects.filter(pk=message_id).first()
    if message is None:
        return None
    payload = message_payload(message)
    rows = list(MessageSource.objects.filter(message_id=message_id).select_related("chunk").order_by("rank"))
    payload["sources"] = [{
        "index": row.rank, "chunk_id": row.chunk_id,
        "document_id": row.chunk.document_id if row.chunk else None,
        "source": row.source, "title": row.title,
        "heading": row.chunk.heading if row.chunk else "",
        "score": round(float(row.score), 6),
        "snippet": row.chunk.text[:300] if row.chunk else "",
    } for row in rows]
    payload["citations"] = [{"index": row.rank, "chunk_id": row.chunk_id, "source": row.source, "title": row.title}
                            for row in rows if row.cited]
    payload["tool_calls"] = [t.payload() for t in ToolInvocation.objects.filter(message_id=message_id)]
    return payload
