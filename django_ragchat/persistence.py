"""Reading and writing a turn's rows: the only place the pipeline touches the database
besides memory and retrieval. Each function is synchronous (called through ``sync_to_async``)
and issues a fixed number of queries, whatever the conversation's length."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_ragchat.conf import ragchat_settings
from django_ragchat.exceptions import TurnInProgress
from django_ragchat.models import Conversation, Message, MessageSource, TurnTrace
from django_ragchat.tokens import count_tokens
from django_ragchat.types import Answer

if TYPE_CHECKING:
    from django_ragchat.context import TurnContext


def begin_turn(conversation_id, text: str) -> tuple[Message, Message]:
    """Save the user's message and an empty assistant message with status "streaming".

    One transaction: the UPDATE of the conversation's sequence counter takes its row lock, so
    the "no other turn is streaming" check and the two inserts cannot interleave with another
    turn's. A streaming message older than ``STALE_STREAM_SECONDS`` belongs to a worker that
    died: it is marked as an error here instead of blocking the conversation forever.
    """
    now = timezone.now()
    stale_before = now - timedelta(seconds=ragchat_settings.STALE_STREAM_SECONDS)
    with transaction.atomic():
        updated = Conversation.objects.filter(pk=conversation_id).update(
            last_seq=F("last_seq") + 2, updated_at=now
        )
        if not updated:
            raise Conversation.DoesNotExist(f"No conversation {conversation_id}")
        streaming = Message.objects.filter(conversation_id=conversation_id, status=Message.Status.STREAMING)
        if streaming.filter(updated_at__gte=stale_before).exists():
            raise TurnInProgress()
        streaming.update(status=Message.Status.ERROR, metadata={"error": {"code": "abandoned"}})
        last_seq = Conversation.objects.filter(pk=conversation_id).values_list("last_seq", flat=True).get()
        user = Message(conversation_id=conversation_id, seq=last_seq - 1, role=Message.Role.USER,
                       content=text, token_count=count_tokens(text))
        assistant = Message(conversation_id=conversation_id, seq=last_seq, role=Message.Role.ASSISTANT,
                            content="", status=Message.Status.STREAMING)
        Message.objects.bulk_create([user, assistant])
    return user, assistant


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
    with transaction.atomic():
        message.save(update_fields=[
            "content", "status", "token_count", "prompt_tokens", "completion_tokens", "metadata", "updated_at",
        ])
        MessageSource.objects.bulk_create([
            MessageSource(message=message, chunk_id=doc.chunk_id, rank=rank, score=doc.score,
                          cited=doc.chunk_id in cited, source=doc.source[:1000], title=doc.title[:500])
            for rank, doc in documents
        ])
        TurnTrace.objects.create(
            message=message, profile=turn.profile.name,
            ended_by=(turn.trace.get("ended_by") or {}).get("stage", ""),
            total_ms=turn.trace["timings"].get("total", 0.0), data=turn.trace,
        )
    return message


def stored_sources(answer: Answer | None, documents) -> list[tuple[int, Any]]:
    """(prompt index, document) of the documents saved as the message's sources: all of the
    prompt's, or the subset a response augmenter chose (``Answer.sources``)."""
    indexed = list(enumerate(documents, start=1))
    if answer is None or answer.sources is None:
        return indexed
    keep = {d.chunk_id for d in answer.sources}
    return [(i, d) for i, d in indexed if d.chunk_id in keep]


def message_payload(message: Message, answer: Answer | None = None, documents=()) -> dict[str, Any]:
    """The JSON form of an assistant message that the ``done`` and ``error`` events carry."""
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
    }
