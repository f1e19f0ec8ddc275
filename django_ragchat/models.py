"""Conversations, their append-only message log, documents and chunks, and long-term memory.

The message log is the source of truth: messages are appended (with a per-conversation
sequence number allocated under a row lock) and never rewritten by memory; what the model sees
is computed over the log by a memory strategy. The user's original words are stored, never
the prompt augmented with retrieved text: the chunks an answer used are referenced through
``MessageSource`` rows. ``ApiKey`` rows let a user's tools call the OpenAI-compatible endpoint
as that user.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models, transaction
from django.db.models import Exists, F, OuterRef, Q, Value
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from django_ragchat.conf import ragchat_settings
from django_ragchat.fields import AccessField, EmbeddingField
from django_ragchat.text import shorten

#: Characters of a message's or memory record's text in its label (``str()``: admin links, lists).
LABEL_CHARS = 60

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
    # When someone asked the answer being written to stop (``turn.stops.request_stop``: a Stop
    # from another tab, a page opened again, the REST API): its worker, wherever it runs,
    # stops it when it reads this (at once in the same process, else at its next heartbeat).
    stop_requested_at = models.DateTimeField(null=True, blank=True)
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
        return f"{self.role} #{self.seq}: {shorten(self.content, LABEL_CHARS)}"


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


class ToolInvocation(models.Model):
    """One tool call of an assistant message: what the model asked, whether it ran, its result.

    Saved with the answer (``persistence.finish_turn``), in the order the model asked:
    ``step`` counts the model's rounds of calls from 1, ``index`` the calls within a round.
    A call that needs the user's approval is saved at once as ``pending``; the decision
    (``decide_tool_call``: the websocket frame, the API endpoint, the widget's buttons) makes it
    ``approved`` or ``rejected``, and nobody deciding in time makes it ``abandoned``.
    ``content`` is the result as the model read it (``error`` says why it is an error); memory
    sends the calls and results back to the model on later turns.
    """

    class Status(models.TextChoices):
        PENDING = "pending", _("awaiting the user's approval")
        APPROVED = "approved", _("approved, running")
        DONE = "done", _("done")
        ERROR = "error", _("error")
        REJECTED = "rejected", _("rejected by the user")
        ABANDONED = "abandoned", _("abandoned (no decision in time)")
        CANCELLED = "cancelled", _("cancelled (the answer was stopped)")

    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="tool_invocations")
    call_id = models.CharField(max_length=200, help_text="The model's id for the call, echoed with its result.")
    step = models.PositiveSmallIntegerField(default=1)
    index = models.PositiveSmallIntegerField(default=0)
    name = models.CharField(max_length=100)
    # What the user was shown while it ran ("Looking up order ORD-17…").
    label = models.CharField(max_length=300, blank=True, default="")
    # As the model wrote them (JSON text, maybe malformed: that is an error to record too); for a
    # call that needed approval, as the user was shown and approved them (an advisor around the
    # call may have changed the model's).
    arguments = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    content = models.TextField(blank=True, default="")
    error = models.JSONField(null=True, blank=True)
    requires_confirmation = models.BooleanField(default=False)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    # The call's own time, without its wait for the user's decision (``decided_at``,
    # ``created_at`` and the trace's ``wait_ms`` tell that).
    ms = models.FloatField(default=0)
    # Tokens of the call and its result as memory counts them against the history budget.
    token_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["message", "step", "index"]
        constraints = [
            models.UniqueConstraint(fields=["message", "step", "index"], name="ragchat_tool_call_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.status}) in message {self.message_id}"

    @property
    def parsed_arguments(self):
        """The arguments as a dict, or the text as written when it is not a JSON object."""
        try:
            value = json.loads(self.arguments or "{}")
        except ValueError:
            return self.arguments
        return value if isinstance(value, dict) else self.arguments

    def payload(self) -> dict:
        """The JSON form clients receive (in a message's ``tool_calls``)."""
        return {
            "id": self.call_id, "name": self.name, "label": self.label, "arguments": self.parsed_arguments,
            "step": self.step, "status": self.status, "content": self.content, "error": self.error,
            "ms": round(self.ms, 3), "confirmation_id": self.pk if self.requires_confirmation else None,
        }


class Document(models.Model):
    """An ingested source (a file path, an upload, or one object of a model source); its text
    lives in its chunks.

    ``origin`` names the model source (``django_ragchat.sources``) that indexed it, with the
    object's primary key in ``object_pk``; both are empty for files and uploads. ``access`` is
    who may read it (``django_ragchat.access``); its chunks carry the same list.
    """

    source = models.CharField(max_length=1000, unique=True)
    title = models.CharField(max_length=500, blank=True, default="")
    checksum = models.CharField(max_length=64, help_text="sha256 of the source's bytes (of a model object: of its "
                                                         "text, title, URL and metadata)")
    content_type = models.CharField(max_length=32, blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)
    access = AccessField(blank=True, help_text="Principal tokens that may read it: public, authenticated, staff, "
                                               "user:<pk>, group:<pk>, perm:<app_label.codename>.")
    origin = models.CharField(max_length=100, blank=True, default="", db_index=True,
                              help_text="The model source that indexed it (empty for files and uploads).")
    object_pk = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    # Indexed: the in-process vector index and the subject index watch its maximum (an
    # access change updates no chunk id, but always this).
    updated_at = models.DateTimeField(auto_now=True, db_index=True)

    class Meta:
        ordering = ["source"]
        constraints = [
            models.UniqueConstraint(fields=["origin", "object_pk"], condition=~Q(origin=""),
                                    name="ragchat_document_object_unique"),
        ]

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
    # The document's access, copied onto each chunk so a search filters without a join.
    access = AccessField(blank=True)
    # The extractive answerer's reading of the text (sentences, names, stems, and the vectors of
    # its sentences), made once at ingestion and fetched with the chunk by the search
    # query; null when the profile's answerer reads none. See django_ragchat.answerer.stored.
    analysis = models.BinaryField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["document", "ordinal"]
        constraints = [
            models.UniqueConstraint(fields=["document", "space", "ordinal"], name="ragchat_chunk_unique"),
        ]
        indexes = [models.Index(fields=["space", "id"], name="ragchat_chunk_space_id")]

    def __str__(self) -> str:
        # What a person recognises (its heading), not "16#0"; no query for the document's title.
        where = shorten(self.heading, 60) if self.heading else f"Document {self.document_id}"
        return f"{where}, part {self.ordinal + 1}"


class SourceState(models.Model):
    """What the last runs of one model source did (``ragchat_sync``, live sync), for the admin."""

    name = models.CharField(max_length=100, unique=True)
    last_sync_started_at = models.DateTimeField(null=True, blank=True)
    last_sync_finished_at = models.DateTimeField(null=True, blank=True)
    # The counts of the last full or --since run (created, updated, access_updated, unchanged,
    # removed, failed) and its kind.
    last_sync = models.JSONField(default=dict, blank=True)
    last_live_sync_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["name"]
        verbose_name = _("model source")

    def __str__(self) -> str:
        return self.name


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
    # Who could read the chunk when the answer was saved: once the chunk is gone (a customer's
    # booking cancelled), its saved title is shown only to staff that access lets read it.
    # Its database default too: a worker still running the release before 0011 saves answers
    # with no access (named to no one once the chunk is gone) rather than failing the turn.
    access = AccessField(blank=True, default=list, db_default=Value([], output_field=models.JSONField()))

    class Meta:
        ordering = ["message", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["message", "rank"], name="ragchat_source_rank_unique"),
        ]

    def __str__(self) -> str:
        # No document title: this string heads the admin's pages (breadcrumbs, inline rows), where
        # a source whose chunk the member of staff may not read must not name its document.
        return f"[{self.rank}] of message {self.message_id}"


#: The stages that may end a turn early (``turn.pipeline._end``), in the order they run: the
#: values of ``TurnTrace.ended_by`` ("" when the turn ran to the end). The admin filters by them.
ENDING_STAGES = ("input_guardrails", "query_transformers", "query_expanders", "prompt", "advisors",
                 "output_guardrails")


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
        # Numbered as the answer's own label is ("assistant #12"), not by the message's primary key.
        return f"Trace of {self.message.role} #{self.message.seq}"


#: The stage whose refusal keeps a question from naming its conversation (``naming_questions``).
REFUSED_INPUT_STAGE = ENDING_STAGES[0]


def naming_questions() -> models.QuerySet:
    """The user messages that may name their conversation (its title; untitled, the label the
    API, the chat page and the admin list it by): all but those an input guardrail refused.

    A refused message stays in the log with its trace (docs/plugins.md), but what it says (a
    password pasted by mistake, an injection) must not stand where the conversation is listed.
    Its turn's answer is the next message (``persistence.begin_turn`` saves both), whose trace
    says who ended it. Filter on ``conversation`` (an ``OuterRef`` in a subquery)."""
    refused = TurnTrace.objects.filter(message__conversation=OuterRef("conversation"),
                                       message__seq=OuterRef("seq") + 1, ended_by=REFUSED_INPUT_STAGE)
    return Message.objects.filter(role=Message.Role.USER).exclude(Exists(refused))


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
        return f"{self.kind}: {shorten(self.content, LABEL_CHARS)}"


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


class ApiKeyQuerySet(models.QuerySet):
    def usable(self, now=None):
        """Keys that authenticate now: not revoked, not expired, their user active."""
        now = now or timezone.now()
        return self.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now), revoked_at__isnull=True,
                           user__is_active=True)


class ApiKey(models.Model):
    """A user's key for the OpenAI-compatible endpoint (``Authorization: Bearer <key>``).

    The key itself is shown once, when it is created (``ApiKey.create_key``, the admin's add
    page, ``manage.py ragchat_apikey``), and never stored: the row keeps its SHA-256 digest
    (keys are 256 random bits, so a fast digest is as safe as a slow password hash and costs
    nothing per request) and its first characters, which identify it in lists. A request with
    a key acts as the key's user: that user's conversations, permissions and limits.
    """

    #: Every key starts with this, so a leaked one is recognisable (secret scanners, logs).
    PREFIX = "rck-"
    #: How many characters of the key are kept to tell keys apart.
    SHOWN_CHARS = 12
    #: ``last_used_at`` is written at most this often per key (seconds): not a write per request.
    LAST_USED_PRECISION = 60

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ragchat_api_keys")
    name = models.CharField(max_length=100, blank=True, default="", help_text=_("What the key is for, e.g. the tool using it."))
    prefix = models.CharField(max_length=16, editable=False, help_text=_("The key's first characters."))
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(null=True, blank=True, help_text=_("Empty: the key never expires."))
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = _("API key")
        verbose_name_plural = _("API keys")

    def __str__(self) -> str:
        return f"{self.name or _('API key')} ({self.prefix}…)"

    @staticmethod
    def digest_of(key: str) -> str:
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()

    @classmethod
    def generate(cls) -> str:
        """A new key: the prefix and 256 random bits, URL-safe."""
        return cls.PREFIX + secrets.token_urlsafe(32)

    def set_key(self, key: str) -> None:
        self.digest = self.digest_of(key)
        self.prefix = key[: self.SHOWN_CHARS]

    @classmethod
    def create_key(cls, user, name: str = "", *, expires_at=None) -> tuple[ApiKey, str]:
        """Create a key for ``user``: the saved row and the key, which is never shown again."""
        key = cls.generate()
        api_key = cls(user=user, name=name, expires_at=expires_at)
        api_key.set_key(key)
        api_key.save()
        return api_key, key

    @property
    def status(self) -> str:
        """One of "active", "revoked" and "expired"."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= timezone.now():
            return "expired"
        return "active"

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            ApiKey.objects.filter(pk=self.pk, revoked_at__isnull=True).update(revoked_at=self.revoked_at)

    def touch(self, now=None) -> None:
        """Record a use, at most once per ``LAST_USED_PRECISION`` seconds."""
        now = now or timezone.now()
        if self.last_used_at is None or (now - self.last_used_at).total_seconds() >= self.LAST_USED_PRECISION:
            self.last_used_at = now
            ApiKey.objects.filter(pk=self.pk).update(last_used_at=now)
