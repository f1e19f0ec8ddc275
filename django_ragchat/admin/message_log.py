"""The message log, read-only: messages, their sources and tool calls, turn traces and feedback."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import BooleanField, ExpressionWrapper, OuterRef, Q, Subquery
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from django_ragchat.access import principals_of_user_id
from django_ragchat.admin import views as admin_views
from django_ragchat.admin.base import ProfileFilter, ReadOnlyAdmin, admin_link, profile_shown, short, user_link
from django_ragchat.models import (
    ENDING_STAGES,
    LABEL_CHARS,
    Feedback,
    Message,
    MessageSource,
    ToolInvocation,
    TurnTrace,
)
from django_ragchat.text import shorten

# --- A source's passage: shown while the asker and the member of staff looking may read it ------


def readable_sources(queryset, request):
    """``queryset`` of ``MessageSource`` with ``chunk_readable`` (may the member of staff looking
    read the chunk now) and ``saved_readable`` (the access saved with the answer, for a chunk gone
    since); the asker is checked too, by ``_withheld``."""
    viewer = principals_of_user_id(request.user.pk)
    return queryset.select_related("message__conversation").annotate(
        chunk_readable=ExpressionWrapper(Q(chunk__access__visible_to=viewer), output_field=BooleanField()),
        saved_readable=ExpressionWrapper(Q(access__visible_to=viewer), output_field=BooleanField()))


def _asker(message: Message):
    """The principals of the message's asker, read once per message object."""
    principals = getattr(message, "_ragchat_asker", None)
    if principals is None:
        principals = message._ragchat_asker = principals_of_user_id(message.conversation.owner_id)
    return principals


#: What the admin shows in place of a source the asker or the member of staff may not read now
#: (one of them, not both: an outside trial read "not readable by the asker or by you" as both
#: for a customer's own order; the transcript's words).
NOT_READABLE = "(hidden: the asker or you may not read it)"


def _withheld(source: MessageSource) -> bool:
    """Whether the asker or the member of staff looking may not read ``source``'s chunk now, or,
    once it is gone (a customer's booking cancelled), may not read what its saved access let
    read: its document's name, heading and passage are then shown nowhere."""
    if source.chunk is None:
        return not getattr(source, "saved_readable", False) or not _asker(source.message).may_read(source.access)
    return not getattr(source, "chunk_readable", False) or not _asker(source.message).may_read(source.chunk.access)


def source_chunk_text(source: MessageSource, attribute: str) -> str:
    """The chunk's ``attribute`` (heading, text) if both may read it now, else why not."""
    if source.chunk is None:
        return "(chunk replaced since)"
    return NOT_READABLE if _withheld(source) else getattr(source.chunk, attribute)


def source_document(source: MessageSource) -> str:
    """The document ``source`` names, as saved with the answer (kept when its chunk is replaced
    since), unless its chunk is there and the asker or the member of staff may not read it."""
    return NOT_READABLE if _withheld(source) else source.title or source.source or f"chunk {source.chunk_id}"


class SourceChangeList(ChangeList):
    """Reads each listed asker's principals once (one query an asker), not once a row."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        askers = {}
        for source in self.result_list:
            owner = source.message.conversation.owner_id
            if owner not in askers:
                askers[owner] = principals_of_user_id(owner)
            source.message._ragchat_asker = askers[owner]


class SourceInline(admin.TabularInline):
    model = MessageSource
    extra = 0
    can_delete = False
    fields = ("rank", "document", "heading", "fusion_score", "cited")
    readonly_fields = fields
    verbose_name_plural = "documents the model saw"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return readable_sources(super().get_queryset(request).select_related("chunk").defer("chunk__embedding"),
                                request)

    @admin.display(description="document")
    def document(self, obj):
        return source_document(obj)

    @admin.display(description="heading")
    def heading(self, obj):
        return source_chunk_text(obj, "heading")

    @admin.display(description="score")
    def fusion_score(self, obj):
        return f"{obj.score:.4f}"


def tool_call_time(call: ToolInvocation) -> str:
    """How long the call ran, rounded as people read it ("4.1 ms", "1,235 ms"); "—" for a call
    that has not run (awaiting approval, rejected, abandoned: its ``ms`` is the default 0)."""
    if not call.ms and call.status not in (ToolInvocation.Status.DONE, ToolInvocation.Status.ERROR):
        return "—"
    return f"{call.ms:.1f} ms" if call.ms < 100 else f"{call.ms:,.0f} ms"


def breakable_name(name: str) -> str:
    """A tool's snake_case name that may wrap after each underscore (it is one long word)."""
    return format_html_join(mark_safe("_<wbr>"), "{}", ((part,) for part in name.split("_")))


class ToolCallInline(admin.TabularInline):
    model = ToolInvocation
    extra = 0
    can_delete = False
    fields = ("step", "name", "arguments_shown", "status", "result_shown", "time_taken", "decided_at")
    readonly_fields = fields
    verbose_name_plural = "tool calls"

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="arguments")
    def arguments_shown(self, obj):
        return format_html('<pre class="ragchat-text">{}</pre>', admin_views.pretty_json(obj.parsed_arguments))

    @admin.display(description="result")
    def result_shown(self, obj):
        text = obj.content if not obj.error else f"{obj.error.get('code')}: {obj.error.get('message')}"
        return format_html('<div class="ragchat-text">{}</div>', short(text, 400))

    @admin.display(description="time")
    def time_taken(self, obj):
        return tool_call_time(obj)


@admin.register(ToolInvocation)
class ToolInvocationAdmin(ReadOnlyAdmin):
    """Every tool call the assistant made or asked to make: who asked, what, what came of it."""

    # Short headers and values (a tool's name wraps at its underscores, the time is rounded), so
    # the list fits a 1280 px window beside the filters (docs/admin.md).
    list_display = ("tool_name", "status", "message_link", "step", "time_taken", "asks_first", "created_at")
    list_filter = ("status", "name", "requires_confirmation", ("created_at", admin.DateFieldListFilter))
    search_fields = ("name", "arguments", "content", "message__conversation__owner__username")
    list_select_related = ("message",)
    fields = ("message_link", "step", "index", "call_id", "name", "label", "arguments_shown", "status", "content",
              "error", "requires_confirmation", "decided_by", "decided_at", "ms", "token_count", "created_at")
    readonly_fields = fields

    @admin.display(description="tool", ordering="name")
    def tool_name(self, obj):
        return breakable_name(obj.name)

    @admin.display(description="message", ordering="message")
    def message_link(self, obj):
        return admin_link(obj.message)

    @admin.display(description="time", ordering="ms")
    def time_taken(self, obj):
        return tool_call_time(obj)

    @admin.display(description="needs approval", boolean=True, ordering="requires_confirmation")
    def asks_first(self, obj):
        """Whether the call waits for the user's approval (``requires_confirmation``)."""
        return obj.requires_confirmation

    @admin.display(description="arguments")
    def arguments_shown(self, obj):
        return format_html('<pre class="ragchat-text">{}</pre>', admin_views.pretty_json(obj.parsed_arguments))


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    # No seq column: the row's own label says it ("assistant #12: …").
    list_display = ("__str__", "conversation_link", "role", "status", "created_at", "trace_link")
    list_filter = ("role", "status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("content", "conversation__title")
    fields = ("conversation_link", "seq", "role", "status", "text", "searched_query", "token_count", "prompt_tokens",
              "completion_tokens", "error", "feedback_given", "trace_link", "created_at")
    readonly_fields = fields
    inlines = [SourceInline, ToolCallInline]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("conversation").annotate(
            _trace=Subquery(TurnTrace.objects.filter(message=OuterRef("pk")).values("pk")[:1]))

    @admin.display(description="conversation", ordering="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.conversation)

    @admin.display(description="content")
    def text(self, obj):
        return format_html('<div class="ragchat-text">{}</div>', obj.content)

    @admin.display(description="query searched")
    def searched_query(self, obj):
        """The question as retrieval saw it (rewritten for a follow-up), from the answer's trace."""
        data = TurnTrace.objects.filter(message=obj).values_list("data", flat=True).first()
        queries = data.get("queries") if isinstance(data, dict) else None
        return (queries.get("final") or "—") if isinstance(queries, dict) else "—"

    @admin.display(description="error")
    def error(self, obj):
        error = obj.metadata.get("error") if isinstance(obj.metadata, dict) else None
        return admin_views.pretty_json(error) if error else "—"

    @admin.display(description="feedback")
    def feedback_given(self, obj):
        rows = obj.feedback.select_related("user")
        return format_html_join(mark_safe("<br>"), "{} — {} {}", (
            (f.rating, f.user or "anonymous", f.comment) for f in rows)) or "—"

    @admin.display(description="trace")
    def trace_link(self, obj):
        if not obj._trace:
            return "—"
        url = reverse("admin:django_ragchat_turntrace_change", args=[obj._trace])
        return format_html('<a href="{}">trace</a>', url)


@admin.register(MessageSource)
class MessageSourceAdmin(ReadOnlyAdmin):
    # The row's own link first ("[1] title"): a first column that is itself a link (the message)
    # would be wrapped in the row's link, and a click would open the message. It names the
    # document, so the document has no column of its own.
    list_display = ("label", "message_link", "conversation_link", "heading", "fusion_score", "cited")
    list_filter = ("cited",)
    ordering = ("-message", "rank")  # the latest answers first, each one's sources in their order
    search_fields = ("title", "source")
    fields = ("message_link", "rank", "document", "source_path", "heading", "fusion_score", "cited", "chunk_text")
    readonly_fields = fields

    def get_changelist(self, request, **kwargs):
        return SourceChangeList

    def get_queryset(self, request):
        return readable_sources(super().get_queryset(request).select_related("message__conversation", "chunk")
                                .defer("chunk__embedding"), request)

    def get_search_results(self, request, queryset, search_term):
        # A search by title must not tell which unreadable documents exist: it finds only the
        # sources whose chunk the member of staff may read (or, gone since, could read).
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        if search_term:
            queryset = queryset.filter(Q(chunk__isnull=True, saved_readable=True) | Q(chunk_readable=True))
        return queryset, duplicates

    @admin.display(description="source", ordering="rank")
    def label(self, obj):
        return f"[{obj.rank}] {source_document(obj)}"

    @admin.display(description="message", ordering="message")
    def message_link(self, obj):
        return admin_link(obj.message)

    @admin.display(description="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.message.conversation)

    @admin.display(description="document", ordering="title")
    def document(self, obj):
        return source_document(obj)

    @admin.display(description="source")
    def source_path(self, obj):
        return NOT_READABLE if _withheld(obj) else obj.source

    @admin.display(description="heading")
    def heading(self, obj):
        return source_chunk_text(obj, "heading")

    @admin.display(description="fusion score", ordering="score")
    def fusion_score(self, obj):
        return f"{obj.score:.4f}"

    @admin.display(description="text")
    def chunk_text(self, obj):
        text = source_chunk_text(obj, "text")
        return text if obj.chunk is None or not obj.chunk_readable else format_html(
            '<div class="ragchat-text">{}</div>', text)


#: How the admin names a turn no stage ended early (``TurnTrace.ended_by`` is "").
RAN_TO_THE_END = "none (ran to the end)"


class EndedByFilter(admin.SimpleListFilter):
    """The stage that ended the turn early, or none: every stage that may (``ENDING_STAGES``),
    then any other name stored (by an older version). Its column shows the same words."""

    title = "ended early by"
    parameter_name = "ended_by"

    def lookups(self, request, model_admin):
        stored = set(TurnTrace.objects.exclude(ended_by="").values_list("ended_by", flat=True).distinct())
        names = [*ENDING_STAGES, *sorted(stored - set(ENDING_STAGES))]
        return [("none", RAN_TO_THE_END), *((name, name) for name in names)]

    def queryset(self, request, queryset):
        value = self.value()
        if value:
            return queryset.filter(ended_by="" if value == "none" else value)
        return queryset


@admin.register(TurnTrace)
class TurnTraceAdmin(ReadOnlyAdmin):
    # "Trace of assistant #12" links to the trace; the message's link beside it (not wrapped in it).
    list_display = ("__str__", "message_link", "conversation_link", "profile_title", "ended_early_by", "total_time",
                    "created_at")
    list_filter = (ProfileFilter, EndedByFilter, ("created_at", admin.DateFieldListFilter))
    search_fields = ("message__content", "message__conversation__title")
    fields = ("message_link", "conversation_link", "profile_title", "ended_early_by", "total_time", "created_at")

    @admin.display(description="profile", ordering="profile")
    def profile_title(self, obj):
        return profile_shown(obj.profile)

    def get_search_fields(self, request):
        return (*self.search_fields, f"message__conversation__owner__{get_user_model().USERNAME_FIELD}")

    def get_search_results(self, request, queryset, search_term):
        # A conversation's full id finds its traces (within the filters already applied).
        filtered = queryset
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        if search_term.strip():
            try:
                queryset |= filtered.filter(message__conversation_id=search_term.strip())
            except ValidationError:
                pass
        return queryset, duplicates
    readonly_fields = fields
    change_form_template = "admin/django_ragchat/turntrace/change_form.html"

    def get_queryset(self, request):
        # The list never loads the (large) trace data.
        return super().get_queryset(request).select_related("message__conversation").defer("data")

    @admin.display(description="answer", ordering="message")
    def message_link(self, obj):
        # The answer's words: its role and number are the row's own name ("Trace of assistant #4").
        return admin_link(obj.message, shorten(obj.message.content, LABEL_CHARS))

    @admin.display(description="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.message.conversation)

    @admin.display(description="total", ordering="total_ms")
    def total_time(self, obj):
        return f"{obj.total_ms:,.1f} ms"  # "12.619" read as seconds or as a count

    @admin.display(description="ended early by", ordering="ended_by")
    def ended_early_by(self, obj):
        return obj.ended_by or RAN_TO_THE_END

    def change_view(self, request, object_id, form_url="", extra_context=None):
        trace = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if trace is not None and self.has_view_permission(request, trace):
            sources = list(trace.message.sources.all())
            chunks = admin_views.load_chunks(admin_views.trace_chunk_ids(trace.data or {}),
                                             principals_of_user_id(trace.message.conversation.owner_id),
                                             principals_of_user_id(request.user.pk))
            extra_context.update(
                trace_view=admin_views.build_trace_view(trace.data, chunks, sources),
                feedback=list(trace.message.feedback.select_related("user")),
            )
        return super().change_view(request, object_id, form_url, extra_context)


@admin.register(Feedback)
class FeedbackAdmin(ReadOnlyAdmin):
    """Ratings users gave answers: read-only, filterable by thumbs up or down."""

    list_display = ("rating", "message_link", "conversation_link", "rater", "short_comment", "updated_at")
    list_filter = ("rating", ("updated_at", admin.DateFieldListFilter))
    search_fields = ("comment", "message__content")
    fields = ("rating", "message_link", "conversation_link", "rater", "comment_text", "created_at", "updated_at")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("message__conversation", "user")

    def get_search_fields(self, request):
        return (*self.search_fields, f"user__{get_user_model().USERNAME_FIELD}")

    @admin.display(description="answer", ordering="message")
    def message_link(self, obj):
        return admin_link(obj.message)

    @admin.display(description="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.message.conversation)

    @admin.display(description="by", ordering="user")
    def rater(self, obj):
        return user_link(obj.user) if obj.user_id else "anonymous visitor"

    @admin.display(description="comment")
    def short_comment(self, obj):
        return short(obj.comment)

    @admin.display(description="comment")
    def comment_text(self, obj):
        return format_html('<div class="ragchat-text">{}</div>', obj.comment)


# --- Memory -----------------------------------------------------------------------------------
