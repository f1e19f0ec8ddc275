"""Conversations, their append-only message log, documents and chunks, and long-term memory.

The message log is the source of truth: messages are appended (with a per-conversation
sequence number allocated under a row lock) and never rewritten by memory; what the model sees
is computed over the log by a memory strategy. The user's original words are stored, never
the prompt augmented with retrieved text: the chunks an answer used are referenced through
``MessageSource`` rows.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_ragchat.conf import ragchat_settings
from django_ragchat.fields import EmbeddingField


class Conversation(models.Model):
    """A chat between one owner (or one anonymous session) and one profile."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="ragchat_conversations",
    )
    # Anonymous conversations are bound to the Django session that created them.
    session_key = models.CharField(max_length=64, blank=True, default="", db_index=True)
    profile = models.CharField(max_length=100, default="default")
    title = models.CharField(max_length=200, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    # The sequence number of the last message: the allocator behind Message.seq.
    last_seq = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["owner", "-updated_at"], name="ragchat_conv_owner_recent")]

    def __str__(self) -> str:
        return self.title or f"Conversation {str(self.id)[:8]}"

    def save(self, *args, **kwargs):
        # ``last_seq`` is advanced only by atomic UPDATEs (persistence.begin_turn). Saving an
        # instance loaded before a turn must not write its stale counter back.
        if not self._state.adding and kwargs.get("update_fields") is None and not kwargs.get("force_insert"):
            kwargs["update_fields"] = [
                f.name for f in self._meta.concrete_fields if not f.primary_key and f.name != "last_seq"
            ]
        super().save(*args, **kwargs)


class Message(models.Model):
    class Role(models.TextChoices):
        USER = "user", _("user")
        ASSISTANT = "assistant", _("assistant")
        TOOL = "tool", _("tool")

    class Status(models.TextChoices):
        COMPLETE = "complete", _("complete")
        STREAMING = "streaming", _("streaming")
        # Stopped before the end (cancelled, client gone): the partial text is kept.
        INCOMPLETE = "incomplete", _("incomplete")
        # The model or a component failed: the partial text is kept, metadata["error"] says why.
        ERROR = "error", _("error")
        # Its worker died (the lease expired without a heartbeat, or its process is gone): the
        # text of the last heartbeat is kept.
        INTERRUPTED = "interrupted", _("interrupted")

    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    seq = models.PositiveIntegerField(editable=False)
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.COMPLETE)
    # Tokens of ``content`` as the memory strategy counts them (computed once, on save).
    token_count = models.PositiveIntegerField(default=0)
    # What the model server reported for the call that produced this message.
    prompt_tokens = models.PositiveIntegerField(null=True, blank=True)
    completion_tokens = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # The sender's idempotency key (a user message's ``client_id``): a resend with the same key
    # in the same conversation returns the first attempt's messages instead of a new turn.
    client_id = models.CharField(max_length=100, blank=True, default="")
    # While "streaming": the answer's worker renews this (persistence.Heartbeat) with the
    # partial text; once it is past, the worker is taken to be dead (see persistence.begin_turn).
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # The worker process that renews the lease (``turn.workers.identity``): a lease whose
    # worker is known to be dead is closed at once instead of at its expiry.
    lease_holder = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["conversation", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["conversation", "seq"], name="ragchat_message_seq_unique"),
            models.UniqueConstraint(fields=["conversation", "client_id"], condition=~Q(client_id=""),
                                    name="ragchat_message_client_id_unique"),
        ]
        indexes = [
            # The sweep's lookup: answers still "streaming" (few) by lease.
            models.Index(fields=["lease_expires_at"], condition=Q(status="streaming"),
                         name="ragchat_message_streaming"),
        ]

    def __str__(self) -> str:
        return f"{self.role} #{self.seq}: {self.content[:60]}"


def append_message(conversation_id, **fields) -> Message:
    """Append a message to a conversation's log with the next sequence number.

    The conversation row's counter is incremented and read inside one transaction: on
    PostgreSQL the UPDATE takes the row lock, on SQLite the write lock, so concurrent appends
    to one conversation get distinct, ordered numbers (the unique constraint is the backstop).
    Three queries whatever the log's length.
    """
    with transaction.atomic():
        Conversation.objects.filter(pk=conversation_id).update(
            last_seq=F("last_seq") + 1, updated_at=timezone.now()
        )
        seq = Conversation.objects.filter(pk=conversation_id).values_list("last_seq", flat=True).get()
        return Message.objects.create(conversation_id=conversation_id, seq=seq, **fields)


class Document(models.Model):
    """An ingested source (file path or URL); its text lives in its chunks."""

    source = models.CharField(max_length=1000, unique=True)
    title = models.CharField(max_length=500, blank=True, default="")
    checksum = models.CharField(max_length=64, help_text="sha256 of the source's bytes")
    content_type = models.CharField(max_length=32, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["source"]

    def __str__(self) -> str:
        return self.title or self.source


class Chunk(models.Model):
    """A passage of a document with its embedding in one embedding space."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    ordinal = models.PositiveIntegerField()
    text = models.TextField()
    heading = models.CharField(max_length=1000, blank=True, default="")
    # The embedding space: which model (and dimension) produced ``embedding``, e.g.
    # "hashing-384" or "openai/text-embedding-3-small-1536". Queries are only ever compared
    # with vectors of their own space.
    space = models.CharField(max_length=200, db_index=True)
    embedding = EmbeddingField(null=True, blank=True)
    token_count = models.PositiveIntegerField(default=0)
    # The document's metadata merged with the chunk's own: what retriever filters match on.
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["document", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["document", "space", "ordinal"], name="ragchat_chunk_unique"),
        ]
        indexes = [models.Index(fields=["space", "id"], name="ragchat_chunk_space_id")]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.ordinal}"


class MessageSource(models.Model):
    """A chunk an assistant message was given as context, its rank and whether it was cited."""

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="sources")
    # Kept when a re-ingest replaces the chunk; the label fields keep the reference readable.
    chunk = models.ForeignKey(Chunk, null=True, on_delete=models.SET_NULL, related_name="+")
    rank = models.PositiveIntegerField(help_text="1-based: the [n] the model saw")
    score = models.FloatField()
    cited = models.BooleanField(default=False)
    source = models.CharField(max_length=1000, blank=True, default="")
    title = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["message", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["message", "rank"], name="ragchat_source_rank_unique"),
        ]

    def __str__(self) -> str:
        return f"[{self.rank}] {self.title or self.source or self.chunk_id}"


class TurnTrace(models.Model):
    """What happened in the turn that produced an assistant message.

    ``data`` holds: the original, transformed and expanded queries, each retriever's hits with
    scores, the final documents, the prompt's size, stage timings in milliseconds, the model,
    its token usage, and, when a stage ended the turn early, which one and why. Kept beside the
    message (not in it) so listing messages never loads traces.
    """

    message = models.OneToOneField(Message, on_delete=models.CASCADE, related_name="trace")
    profile = models.CharField(max_length=100)
    ended_by = models.CharField(max_length=64, blank=True, default="")
    total_ms = models.FloatField(default=0)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"Trace of message {self.message_id}"


#: The longest memory record a person may write (a fact, a corrected summary).
MEMORY_MAX_CHARS = 20_000


class MemoryRecord(models.Model):
    """Long-term memory: a rolling summary or a fact, about a user or a conversation.

    Staff can read and correct these in the admin; memory strategies prepend them to what the
    model sees. Summaries never delete messages: ``covers_until_seq`` says which part of the log
    a summary stands for.
    """

    class Kind(models.TextChoices):
        SUMMARY = "summary", _("summary")
        FACT = "fact", _("fact")

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="ragchat_memories",
    )
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.CASCADE, related_name="memories"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices)
    # Capped where people write it (the admin's form, the REST API), not in the database.
    content = models.TextField(max_length=MEMORY_MAX_CHARS)
    covers_until_seq = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(user__isnull=False) | Q(conversation__isnull=False),
                name="ragchat_memory_has_scope",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind}: {self.content[:60]}"


def expired_conversations(now=None):
    """Conversations past their retention period (see ANONYMOUS/USER_RETENTION_DAYS)."""

    now = now or timezone.now()
    condition = Q(pk__in=[])
    if ragchat_settings.ANONYMOUS_RETENTION_DAYS is not None:
        cutoff = now - timedelta(days=ragchat_settings.ANONYMOUS_RETENTION_DAYS)
        condition |= Q(owner__isnull=True, updated_at__lt=cutoff)
    if ragchat_settings.USER_RETENTION_DAYS is not None:
        cutoff = now - timedelta(days=ragchat_settings.USER_RETENTION_DAYS)
        condition |= Q(owner__isnull=False, updated_at__lt=cutoff)
    return Conversation.objects.filter(condition)


class Feedback(models.Model):
    """A user's rating of an assistant message (thumbs up or down, and an optional comment).

    One per message and user; an anonymous visitor's feedback is keyed by their session instead.
    Rating again updates the existing row.
    """

    class Rating(models.TextChoices):
        UP = "up", _("up")
        DOWN = "down", _("down")

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="ragchat_feedback",
    )
    session_key = models.CharField(max_length=64, blank=True, default="")
    rating = models.CharField(max_length=8, choices=Rating.choices)
    comment = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        constraints = [
            models.UniqueConstraint(fields=["message", "user"], condition=Q(user__isnull=False),
                                    name="ragchat_feedback_user_unique"),
            models.UniqueConstraint(fields=["message", "session_key"], condition=Q(user__isnull=True),
                                    name="ragchat_feedback_session_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.rating} on message {self.message_id}"
