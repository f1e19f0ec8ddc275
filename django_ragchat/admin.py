"""Admin: staff read conversations and traces, and read and edit long-term memory.

The message log is append-only, so messages, sources and traces are read-only here; memory
records (summaries and facts the model is shown) are editable, which is the point of them.
"""

from django.contrib import admin
from django.db.models import Count

from django_ragchat.models import (
    Chunk,
    Conversation,
    Document,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
    TurnTrace,
)


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class MessageInline(ReadOnlyInline):
    model = Message
    fields = ("seq", "role", "status", "content", "token_count", "created_at")
    readonly_fields = fields
    ordering = ("seq",)


class MemoryInline(admin.StackedInline):
    model = MemoryRecord
    extra = 0
    fields = ("kind", "content", "covers_until_seq", "user")
    raw_id_fields = ("user",)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("__str__", "owner", "profile", "message_count", "updated_at")
    list_filter = ("profile",)
    search_fields = ("title", "id", "owner__username")
    raw_id_fields = ("owner",)
    readonly_fields = ("id", "last_seq", "created_at", "updated_at")
    inlines = [MemoryInline, MessageInline]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("owner").annotate(_messages=Count("messages"))

    @admin.display(ordering="_messages", description="messages")
    def message_count(self, obj):
        return obj._messages


class SourceInline(ReadOnlyInline):
    model = MessageSource
    fields = ("rank", "score", "cited", "source", "title", "chunk")
    readonly_fields = fields


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("conversation", "seq", "role", "status", "short_content", "created_at")
    list_filter = ("role", "status")
    search_fields = ("content",)
    list_select_related = ("conversation",)
    inlines = [SourceInline]

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(TurnTrace)
class TurnTraceAdmin(admin.ModelAdmin):
    list_display = ("message", "profile", "ended_by", "total_ms", "created_at")
    list_filter = ("profile", "ended_by")
    list_select_related = ("message",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False


@admin.register(MemoryRecord)
class MemoryRecordAdmin(admin.ModelAdmin):
    list_display = ("kind", "user", "conversation", "short_content", "updated_at")
    list_filter = ("kind",)
    search_fields = ("content", "user__username")
    raw_id_fields = ("user", "conversation")

    @admin.display(description="content")
    def short_content(self, obj):
        return obj.content[:80]


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    list_display = ("title", "source", "content_type", "chunk_count", "updated_at")
    search_fields = ("title", "source")
    readonly_fields = ("checksum", "created_at", "updated_at")

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(_chunks=Count("chunks"))

    @admin.display(ordering="_chunks", description="chunks")
    def chunk_count(self, obj):
        return obj._chunks


@admin.register(Chunk)
class ChunkAdmin(admin.ModelAdmin):
    list_display = ("document", "ordinal", "space", "heading")
    list_filter = ("space",)
    search_fields = ("text", "heading")
    list_select_related = ("document",)
    exclude = ("embedding",)

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields if f.name != "embedding"]


@admin.register(Feedback)
class FeedbackAdmin(admin.ModelAdmin):
    """Ratings users gave answers: read-only, filterable by thumbs up or down."""

    list_display = ("rating", "message", "user", "short_comment", "updated_at")
    list_filter = ("rating",)
    search_fields = ("comment", "user__username")
    list_select_related = ("message", "user")
    raw_id_fields = ("message", "user")

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    @admin.display(description="comment")
    def short_comment(self, obj):
        return obj.comment[:80]
