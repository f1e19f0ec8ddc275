"""The API's JSON shapes. A message serialises like the ``message`` of the ``done`` event
(``persistence.message_payload``), with its sources read back from ``MessageSource`` rows."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Subquery
from django.db.models.functions import Substr
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from django_ragchat.conf import ragchat_settings
from django_ragchat.models import (
    MEMORY_MAX_CHARS,
    Conversation,
    Document,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
    ToolInvocation,
    naming_questions,
)
from django_ragchat.permissions import can_use_profile
from django_ragchat.plugins import PIPELINE_ORDER
from django_ragchat.profiles import UnknownProfile, get_profile, profile_names
from django_ragchat.text import is_blank, question_label
from django_ragchat.transport.turns import NOT_A_PROFILE_NAME


class StrictCharField(serializers.CharField):
    """A ``CharField`` that refuses numbers and booleans instead of turning them into text.
    (NUL characters and lone surrogates are refused by ``CharField`` itself.)"""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class TitleField(StrictCharField):
    """A conversation's title: one that shows nothing (zero-width or other format characters
    only) is no title, as such a message is no message: the conversation is untitled and goes by
    its first question (an outside probe made its entry in the list invisible)."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        return "" if is_blank(value) else value


class ErrorSerializer(serializers.Serializer):
    """Every error answer: a short stable ``code`` and a ``detail`` safe to show."""

    code = serializers.CharField()
    detail = serializers.CharField()
    errors = serializers.DictField(required=False, help_text="Per-field messages (validation errors only).")


class ConversationSerializer(serializers.ModelSerializer):
    last_seq = serializers.IntegerField(
        read_only=True,
        help_text="Sequence number of the last message; the log is append-only, so also its length.",
    )
    label = serializers.SerializerMethodField(
        help_text="What to call it: its title, or, untitled, its first question shortened at a word "
                  "boundary (at most 80 characters and \"…\"), never one an input guardrail refused; "
                  "empty when it has neither.",
    )

    class Meta:
        model = Conversation
        fields = ["id", "title", "label", "profile", "last_seq", "created_at", "updated_at"]
        read_only_fields = ["id", "profile", "created_at", "updated_at"]

    def get_label(self, obj: Conversation) -> str:
        if obj.title:
            return obj.title
        # Annotated by the list (one query for the page); looked up for one conversation.
        question = obj.first_question if hasattr(obj, "first_question") else first_question(obj)
        return question_label(question or "")


def first_question_subquery(length: int = 400):
    """The first user message of each conversation that may name it (``naming_questions``: not
    one an input guardrail refused; its first ``length`` characters, enough for a label), for
    ``.annotate(first_question=...)``."""
    return Subquery(naming_questions().filter(conversation=OuterRef("pk"))
                    .order_by("seq").values_list(Substr("content", 1, length))[:1])


def first_question(conversation: Conversation) -> str:
    return (naming_questions().filter(conversation=conversation).order_by("seq")
            .values_list(Substr("content", 1, 400), flat=True).first() or "")


def profile_name(value: str | None) -> str:
    """The name of the profile ``value`` names (the default for ``None``), or a validation error."""
    try:
        return get_profile(value).name
    except UnknownProfile:
        raise serializers.ValidationError(f"There is no profile named {value!r}.", code="unknown_profile") from None


class ProfileNameField(serializers.ChoiceField):
    """A profile name: refused with the same message and code as before it was a choice."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            # As the websocket and server-sent events say it (transport.turns.new_conversation_options):
            # the same cause, the same code, not DRF's '"['default']" is not a valid choice.'
            raise serializers.ValidationError(NOT_A_PROFILE_NAME, code="unknown_profile")
        if data not in self.choices:
            raise serializers.ValidationError(f"There is no profile named {data!r}.", code="unknown_profile")
        return data


class ConversationCreateSerializer(serializers.Serializer):
    title = TitleField(max_length=200, required=False, allow_blank=True, default="")
    profile = StrictCharField(max_length=100, required=False, allow_null=True, default=None,
                              help_text="A profile name from RAGCHAT['PROFILES']; the default profile if omitted.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The schema lists the site's profiles (they are settings, known when it is generated).

        self.fields["profile"] = ProfileNameField(choices=profile_names(), required=False, allow_null=True,
                                                  default=None, help_text=self.fields["profile"].help_text)

    def validate_profile(self, value: str | None) -> str:
        name = profile_name(value)
        request = self.context.get("request")
        if request is not None and not can_use_profile(request.user, name):
            # Answered as an unknown name: which profiles others may use is not the caller's business.
            raise serializers.ValidationError(f"There is no profile named {value!r}.", code="unknown_profile")
        return name


class ConversationRenameSerializer(serializers.ModelSerializer):
    title = TitleField(max_length=200, allow_blank=True)

    class Meta:
        model = Conversation
        fields = ["title"]


def _readable_chunk(obj: MessageSource):
    """The source's chunk when the caller may read it now (``views.messages_with_sources``
    annotates ``chunk_readable``; a source not annotated shows no passage)."""
    return obj.chunk if obj.chunk is not None and getattr(obj, "chunk_readable", False) else None


class SourceSerializer(serializers.Serializer):
    """A passage the answer was given, numbered as the model saw it ([1] is index 1). Its
    heading and snippet are shown only while the caller may read the chunk."""

    index = serializers.IntegerField(source="rank")
    chunk_id = serializers.IntegerField(allow_null=True, help_text="Null once the chunk was re-ingested away.")
    document_id = serializers.SerializerMethodField()
    source = serializers.CharField()
    title = serializers.CharField()
    heading = serializers.SerializerMethodField()
    score = serializers.FloatField()
    snippet = serializers.SerializerMethodField()
    cited = serializers.BooleanField(help_text="Whether the answer cites it.")

    def get_document_id(self, obj: MessageSource) -> int | None:
        chunk = _readable_chunk(obj)
        return chunk.document_id if chunk else None

    def get_heading(self, obj: MessageSource) -> str:
        chunk = _readable_chunk(obj)
        return chunk.heading if chunk else ""

    def get_snippet(self, obj: MessageSource) -> str:
        chunk = _readable_chunk(obj)
        return chunk.text[:300] if chunk else ""


class CitationSerializer(serializers.Serializer):
    index = serializers.IntegerField(source="rank")
    chunk_id = serializers.IntegerField(allow_null=True)
    source = serializers.CharField()
    title = serializers.CharField()


class MessageErrorSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField(required=False)


TOOL_STATUS_HELP = "One of: " + ", ".join(f"`{value}` ({label})" for value, label in ToolInvocation.Status.choices)


class ToolCallSerializer(serializers.Serializer):
    """A tool call of an answer, as the ``done`` event's ``message.tool_calls`` carries it."""

    id = serializers.CharField(help_text="The model's id of the call (the protocol's tool_call/tool_result id).")
    name = serializers.CharField()
    label = serializers.CharField(help_text="What the user was shown while it ran.")
    arguments = serializers.JSONField(help_text="As the model wrote them: an object, or the text when it is not one.")
    step = serializers.IntegerField()
    # Text, not an enum: the schema's enum names would collide with the message's status.
    status = serializers.CharField(help_text=TOOL_STATUS_HELP)
    content = serializers.CharField(help_text="The result the model read.")
    error = serializers.JSONField(allow_null=True, help_text='{"code", "message"} when it did not run or failed.')
    ms = serializers.FloatField()
    confirmation_id = serializers.IntegerField(
        allow_null=True, help_text="Set when the call needed the user's approval: its id in tool-calls/{id}/.")


class PendingToolCallSerializer(ToolCallSerializer):
    """A call of the answer being written that waits for the user's approval."""

    decision_url = serializers.URLField(help_text='Where its owner decides it: POST {"approve": true | false}.')


class AnswerInProgressSerializer(serializers.Serializer):
    """The answer being written in a conversation: what a client that opens the conversation
    meanwhile (another tab, a page left and opened again) needs to act on it."""

    assistant_message_id = serializers.IntegerField()
    pending_tool_calls = PendingToolCallSerializer(
        many=True, help_text="Its calls waiting for the user's approval, in the order the model made them.")
    cancel_url = serializers.URLField(help_text="Where its owner stops it: POST, no body.")


def answer_in_progress(conversation: Conversation, request) -> dict[str, Any] | None:
    """``AnswerInProgressSerializer``'s data for the conversation, ``None`` when no answer is
    being written there (two queries)."""
    answer = conversation.messages.filter(status=Message.Status.STREAMING).values_list("pk", flat=True).first()
    if answer is None:
        return None

    def url(name: str, key) -> str:
        namespace = request.resolver_match.namespace if request.resolver_match else None
        return request.build_absolute_uri(reverse(f"ragchat_api:{name}", args=[key], current_app=namespace))

    pending = ToolInvocation.objects.filter(message_id=answer, status=ToolInvocation.Status.PENDING)
    return {"assistant_message_id": answer, "cancel_url": url("conversation-cancel", conversation.pk),
            "pending_tool_calls": [{**call.payload(), "decision_url": url("tool-call-decision", call.pk)}
                                   for call in pending]}


class ConversationDetailSerializer(ConversationSerializer):
    """A conversation as ``GET conversations/{id}/`` shows it: with the answer being written."""

    answer_in_progress = serializers.SerializerMethodField(
        help_text="The answer being written in it (another tab's, or one its page left), with its calls "
                  "awaiting the user's approval and where to decide them or stop it; null when none is.")

    class Meta(ConversationSerializer.Meta):
        fields = [*ConversationSerializer.Meta.fields, "answer_in_progress"]

    @extend_schema_field(AnswerInProgressSerializer(allow_null=True))
    def get_answer_in_progress(self, obj: Conversation) -> dict[str, Any] | None:
        return answer_in_progress(obj, self.context["request"])


class ToolInvocationSerializer(serializers.ModelSerializer):
    """A tool call as a resource (``tool-calls/{id}/``): the call with its decision."""

    conversation_id = serializers.UUIDField(source="message.conversation_id", read_only=True)
    arguments = serializers.JSONField(source="parsed_arguments", read_only=True)
    status = serializers.CharField(read_only=True, help_text=TOOL_STATUS_HELP)

    class Meta:
        model = ToolInvocation
        fields = ["id", "call_id", "message", "conversation_id", "step", "index", "name", "label", "arguments",
                  "status", "content", "error", "requires_confirmation", "decided_at", "ms", "created_at"]
        read_only_fields = fields


class CancelSerializer(serializers.Serializer):
    assistant_message_id = serializers.IntegerField(help_text="The answer asked to stop.")


class ToolDecisionSerializer(serializers.Serializer):
    approve = serializers.BooleanField(help_text="true runs the call, false rejects it.")

    def to_internal_value(self, data):
        if isinstance(data, dict) and not isinstance(data.get("approve"), bool):
            raise serializers.ValidationError({"approve": ["Must be true or false."]}, code="invalid")
        return super().to_internal_value(data)


class MessageSerializer(serializers.ModelSerializer):
    """A message of the log. Expects ``sources`` and ``tool_invocations`` prefetched (see
    ``views.messages_with_sources``)."""

    conversation_id = serializers.UUIDField(read_only=True)
    sources = SourceSerializer(many=True, read_only=True)
    citations = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    tool_calls = serializers.SerializerMethodField()

    class Meta:
        model = Message
        fields = ["id", "conversation_id", "seq", "role", "content", "status", "citations", "sources",
                  "error", "tool_calls", "created_at"]
        read_only_fields = fields

    @extend_schema_field(ToolCallSerializer(many=True))
    def get_tool_calls(self, obj: Message) -> list[dict[str, Any]]:
        return [t.payload() for t in obj.tool_invocations.all()]

    @extend_schema_field(CitationSerializer(many=True))
    def get_citations(self, obj: Message) -> list[dict[str, Any]]:
        return CitationSerializer([s for s in obj.sources.all() if s.cited], many=True).data

    @extend_schema_field(MessageErrorSerializer(allow_null=True))
    def get_error(self, obj: Message) -> dict[str, Any] | None:
        return obj.metadata.get("error")


class MessageCreateSerializer(serializers.Serializer):
    """The request body; the content is checked by ``pipeline.validate_user_message``."""

    # The view validates with ``pipeline.validate_user_message`` (the same rule on every
    # transport); these constraints only tell the schema what that rule accepts.
    CONTENT = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
    CONTENT_HELP = ("The user's message: not only white space, no NUL characters, at most "
                    "RAGCHAT['MAX_MESSAGE_CHARS'] characters (longer: 413 `too_long`).")
    content = serializers.RegexField(CONTENT, min_length=1, help_text=CONTENT_HELP)
    client_id = serializers.RegexField(
        r"^[^\u0000]*$", required=False, allow_null=True, max_length=100,
        help_text="Your idempotency key for this message (at most 100 characters, no NUL; null: none): a resend with "
                  "the same client_id in the same conversation answers 200 with the first attempt's "
                  "messages instead of a new turn (409 while its answer is still being written).")

    def get_fields(self):
        fields = super().get_fields()
        # The limit is a setting: the field (its validator, the schema's maxLength) is made
        # with the value of the moment.
        fields["content"] = serializers.RegexField(self.CONTENT, min_length=1, help_text=self.CONTENT_HELP,
                                                   max_length=ragchat_settings.MAX_MESSAGE_CHARS)
        return fields


class TurnSerializer(serializers.Serializer):
    user_message = MessageSerializer()
    assistant_message = MessageSerializer()


class TurnFailedSerializer(TurnSerializer):
    """The turn failed after the user's message was saved: both messages are returned, the
    assistant's with status "error" and whatever partial text it had."""

    code = serializers.CharField()
    detail = serializers.CharField()


class FeedbackSerializer(serializers.ModelSerializer):
    message_id = serializers.IntegerField(read_only=True)
    comment = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")

    class Meta:
        model = Feedback
        fields = ["id", "message_id", "rating", "comment", "created_at", "updated_at"]
        read_only_fields = ["id", "message_id", "created_at", "updated_at"]


class MemoryRecordSerializer(serializers.ModelSerializer):
    user_id = serializers.IntegerField(read_only=True, allow_null=True)
    conversation_id = serializers.UUIDField(read_only=True, allow_null=True)
    content = StrictCharField(max_length=MEMORY_MAX_CHARS)

    class Meta:
        model = MemoryRecord
        fields = ["id", "kind", "content", "user_id", "conversation_id", "covers_until_seq",
                  "created_at", "updated_at"]
        read_only_fields = ["id", "kind", "covers_until_seq", "created_at", "updated_at"]


class DocumentSerializer(serializers.ModelSerializer):
    chunk_count = serializers.IntegerField(read_only=True)
    metadata = serializers.JSONField(read_only=True)

    class Meta:
        model = Document
        fields = ["id", "source", "title", "content_type", "checksum", "metadata", "access", "origin", "object_pk",
                  "chunk_count", "created_at", "updated_at"]
        read_only_fields = fields


class DocumentUploadSerializer(serializers.Serializer):
    file = serializers.FileField(help_text="UTF-8 text: Markdown, reStructuredText, HTML or plain text.")
    source = serializers.CharField(max_length=1000, required=False,
                                   help_text="The document's unique source name; uploading the same "
                                             "source again replaces it. Default: upload/<file name>.")
    title = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    content_type = serializers.ChoiceField(
        choices=["markdown", "rst", "html", "text"], required=False,
        help_text="Default: from the file name's extension.",
    )
    profile = serializers.CharField(max_length=100, required=False, allow_null=True, default=None,
                                    help_text="Embed with this profile's embedder; the default profile if omitted.")

    def validate_profile(self, value: str | None) -> str:
        return profile_name(value)


class IngestResultSerializer(serializers.Serializer):
    document = DocumentSerializer()
    outcome = serializers.CharField()


class IngestTaskSerializer(serializers.Serializer):
    """A queued ingestion (``tasks.ingest_upload``)."""

    id = serializers.CharField()
    status = serializers.ChoiceField(choices=["READY", "RUNNING", "SUCCESSFUL", "FAILED"])
    url = serializers.URLField(help_text="Where to read this status again.")
    enqueued_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    result = serializers.DictField(allow_null=True, help_text='When SUCCESSFUL: {"document_id", "outcome"}.')
    error = serializers.CharField(allow_null=True, help_text="When FAILED: the exception's class.")


class IngestQueuedSerializer(serializers.Serializer):
    task = IngestTaskSerializer()


class PluginSerializer(serializers.Serializer):
    name = serializers.CharField()
    hooks = serializers.ListField(child=serializers.CharField())
    version = serializers.CharField(allow_null=True)
    builtin = serializers.BooleanField()


class ComponentSerializer(serializers.Serializer):
    kind = serializers.CharField()
    name = serializers.CharField()
    plugin = serializers.CharField()
    order = serializers.IntegerField()
    enabled_by_default = serializers.BooleanField()
    path = serializers.CharField(help_text="Dotted path of the component class.")


class ToolSerializer(serializers.Serializer):
    name = serializers.CharField()
    plugin = serializers.CharField(help_text="The plugin that registered it (register_tools).")
    label = serializers.CharField(allow_null=True, help_text="What the user sees while it runs (a template).")
    description = serializers.CharField(help_text="What the model is told the tool does.")
    requires_confirmation = serializers.BooleanField(help_text="Whether the user approves each call first.")


ProfileComponentsSerializer = type("ProfileComponentsSerializer", (serializers.Serializer,), {
    "__doc__": "The components a profile runs: each stage's registered names, in call order.",
    **{field: serializers.ListField(child=serializers.CharField()) for field in PIPELINE_ORDER},
})


class ProfileRunsSerializer(serializers.Serializer):
    name = serializers.CharField()
    title = serializers.CharField(help_text="What people see for it: its title setting, else its name.")
    components = ProfileComponentsSerializer(allow_null=True, help_text="By stage, in the order the turn runs "
                                             "them; null when the profile cannot be built (see error).")
    tools = serializers.ListField(child=serializers.CharField(), help_text="The tools it offers, by name.")
    error = serializers.CharField(allow_null=True, help_text="Why the profile cannot be built, or null.")


class PluginListingSerializer(serializers.Serializer):
    plugins = PluginSerializer(many=True)
    components = ComponentSerializer(many=True, help_text="Every registered component, by kind, in call order.")
    tools = ToolSerializer(many=True, help_text="Every registered tool, by name.")
    profiles = ProfileRunsSerializer(many=True, help_text="Each profile: what it runs and the tools it offers.")
    errors = serializers.ListField(child=serializers.CharField(), help_text="Plugin load and registration errors.")

