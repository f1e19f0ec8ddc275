"""Admin: staff read conversations with their turn traces, correct memory, and manage documents.

* Conversations list their owner, profile, first question, size, last activity and feedback;
  a conversation's page shows its transcript as a conversation, each answer with its trace
  (collapsed) rendered for people, paginated past ``admin_views.TRANSCRIPT_PAGE_SIZE`` messages.
* The message log is append-only: messages, sources, traces and feedback are read-only here
  (no Save button, no bulk delete); they go with their conversation or with "erase a user's
  chat data".
* Memory records (summaries and facts the model is shown) are editable, which is the point of them.
* Documents are added by uploading a file, which runs ingestion; chunks are never added by hand.
* "User chat data" (a link on the conversation list, an action on the user admin) exports one
  user's chat data as JSON and erases it after a page counting what will go.

Every list runs a fixed number of queries whatever its page size (tests/test_admin.py asserts it).
All text shown comes from users, models or documents and is escaped (``format_html``, templates).
See docs/admin.md.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Exists, IntegerField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce, Substr
from django.http import Http404, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.text import capfirst

from django_ragchat import admin_views
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

# --- Helpers ----------------------------------------------------------------------------------


def admin_link(obj, text=None, *, site_name: str = "admin") -> str:
    """A link to ``obj``'s admin page (escaped text), or the text alone when it has none."""
    if obj is None:
        return "—"
    text = str(obj) if text is None else text
    try:
        url = reverse(f"{site_name}:{obj._meta.app_label}_{obj._meta.model_name}_change", args=[obj.pk])
    except NoReverseMatch:
        return format_html("{}", text)
    return format_html('<a href="{}">{}</a>', url, text)


def short(text: str, limit: int = 80) -> str:
    return admin_views.snippet(text, limit)


def _count_subquery(queryset, field: str):
    """``Count`` of ``queryset`` rows per ``field`` as a correlated subquery (0 when none).

    Several counts joined into one query would multiply each other; subqueries don't.
    """
    counted = queryset.order_by().values(field).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


class RagchatAdmin(admin.ModelAdmin):
    """Every django-ragchat admin: loads the app's admin stylesheet (transcripts, traces, text)."""

    class Media:
        css = {"all": ["django_ragchat/admin.css"]}


def deletion_summary(request, objs, model, related_counts: dict) -> tuple:
    """``get_deleted_objects`` that counts related rows instead of listing each of them.

    Django's confirmation page lists every row a delete cascades to: thousands of chunks or
    messages. ``related_counts`` maps each related model to the number of rows that go.
    """
    counts = {model: len(objs), **{m: n for m, n in related_counts.items() if n}}
    perms_needed = {
        m._meta.verbose_name for m in counts
        if not request.user.has_perm(f"{m._meta.app_label}.delete_{m._meta.model_name}")
    }
    model_count = {capfirst(m._meta.verbose_name_plural): n for m, n in counts.items()}
    return [admin_link(o) for o in objs], model_count, perms_needed, []


class ReadOnlyAdmin(RagchatAdmin):
    """For the append-only log: view pages without Save buttons, no add, no bulk delete.

    Delete permission is left to the model's permission because deleting a conversation (or
    erasing a user's data) cascades here and Django checks it for each related model; this
    admin's own delete page is closed.
    """

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    actions = None  # no bulk delete (and nothing else to do in bulk with a log)

    def delete_view(self, request, object_id, extra_context=None):
        raise PermissionDenied

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = {**(extra_context or {}), "show_delete": False}
        return super().change_view(request, object_id, form_url, extra_context)


# --- Conversations ----------------------------------------------------------------------------


class OwnerFilter(admin.SimpleListFilter):
    """Signed-in or anonymous, the 20 owners with most conversations, or one owner by id (the
    filter link beside each owner in the list)."""

    title = "owner"
    parameter_name = "owner"

    def lookups(self, request, model_admin):
        User = get_user_model()
        top = (User.objects.annotate(_n=Count("ragchat_conversations")).filter(_n__gt=0)
               .order_by("-_n", "pk")[:20])
        choices = [("signed_in", "Signed in"), ("anonymous", "Anonymous")]
        choices += [(str(u.pk), str(u)) for u in top]
        value = self.value()
        if value and value.isdigit() and value not in {c[0] for c in choices}:
            chosen = User.objects.filter(pk=value).first()
            if chosen is not None:
                choices.append((value, str(chosen)))
        return choices

    def queryset(self, request, queryset):
        value = self.value()
        if value == "signed_in":
            return queryset.filter(owner__isnull=False)
        if value == "anonymous":
            return queryset.filter(owner__isnull=True)
        if value and value.isdigit():
            return queryset.filter(owner_id=int(value))
        return queryset


class LastAnswerStatusFilter(admin.SimpleListFilter):
    title = "status of the last answer"
    parameter_name = "last_answer"

    def lookups(self, request, model_admin):
        return list(Message.Status.choices) + [("none", "no answer yet")]

    def queryset(self, request, queryset):
        value = self.value()
        if value == "none":
            return queryset.filter(_last_status__isnull=True)
        if value in Message.Status.values:
            return queryset.filter(_last_status=value)
        return queryset


class NegativeFeedbackFilter(admin.SimpleListFilter):
    title = "negative feedback"
    parameter_name = "thumbs_down"

    def lookups(self, request, model_admin):
        return [("yes", "Has a thumbs down"), ("no", "Has none")]

    def queryset(self, request, queryset):
        down = Exists(Feedback.objects.filter(message__conversation=OuterRef("pk"), rating=Feedback.Rating.DOWN))
        if self.value() == "yes":
            return queryset.filter(down)
        if self.value() == "no":
            return queryset.exclude(down)
        return queryset


class LastActivityFilter(admin.DateFieldListFilter):
    """The date filter on ``updated_at``, titled as the list's column is."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.title = "last activity"


class MemoryInline(admin.StackedInline):
    """The conversation's own memory records (its summary), editable on its page."""

    model = MemoryRecord
    extra = 0
    fields = ("kind", "content", "covers_until_seq", "user")
    raw_id_fields = ("user",)
    verbose_name_plural = "memory of this conversation"


@admin.register(Conversation)
class ConversationAdmin(RagchatAdmin):
    list_display = ("display_title", "owner_link", "profile", "message_count", "last_activity", "feedback_counts")
    list_filter = ("profile", OwnerFilter, LastAnswerStatusFilter, ("updated_at", LastActivityFilter),
                   NegativeFeedbackFilter)
    readonly_fields = ("id", "owner_link", "session_key", "profile", "created_at", "updated_at", "user_data_link")
    fieldsets = [
        (None, {"fields": ("title", "owner_link", "user_data_link", "profile", "created_at", "updated_at")}),
        ("Details", {"fields": ("id", "session_key", "metadata"), "classes": ["collapse"]}),
    ]
    inlines = [MemoryInline]
    change_form_template = "admin/django_ragchat/conversation/change_form.html"
    change_list_template = "admin/django_ragchat/conversation/change_list.html"

    def get_search_fields(self, request):
        User = get_user_model()
        fields = ["title", "messages__content", f"owner__{User.USERNAME_FIELD}"]
        email = getattr(User, "EMAIL_FIELD", None)
        if email and email != User.USERNAME_FIELD and any(f.name == email for f in User._meta.fields):
            fields.append(f"owner__{email}")
        return fields

    def get_search_results(self, request, queryset, search_term):
        # A conversation's full id finds it too (within the filters already applied).
        filtered = queryset
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip()
        if term:
            try:
                queryset |= filtered.filter(pk=term)
            except ValidationError:
                pass
        return queryset, duplicates

    def get_queryset(self, request):
        messages_of = Message.objects.filter(conversation=OuterRef("pk"))
        feedback_of = Feedback.objects.filter(message__conversation=OuterRef("pk"))
        return super().get_queryset(request).select_related("owner").annotate(
            _messages=_count_subquery(messages_of, "conversation"),
            _first_question=Subquery(messages_of.filter(role=Message.Role.USER).order_by("seq")
                                     .values_list(Substr("content", 1, 120))[:1]),
            _last_status=Subquery(messages_of.filter(role=Message.Role.ASSISTANT).order_by("-seq")
                                  .values("status")[:1]),
            _up=_count_subquery(feedback_of.filter(rating=Feedback.Rating.UP), "message__conversation"),
            _down=_count_subquery(feedback_of.filter(rating=Feedback.Rating.DOWN), "message__conversation"),
        )

    def has_add_permission(self, request):
        return False  # conversations start in the chat

    def get_deleted_objects(self, objs, request):
        objs = list(objs)
        return deletion_summary(request, objs, Conversation, {
            Message: Message.objects.filter(conversation__in=objs).count(),
            MessageSource: MessageSource.objects.filter(message__conversation__in=objs).count(),
            TurnTrace: TurnTrace.objects.filter(message__conversation__in=objs).count(),
            Feedback: Feedback.objects.filter(message__conversation__in=objs).count(),
            MemoryRecord: MemoryRecord.objects.filter(conversation__in=objs).count(),
        })

    @admin.display(description="conversation", ordering="title")
    def display_title(self, obj):
        if obj.title:
            return short(obj.title)
        question = getattr(obj, "_first_question", None)
        if question:
            return format_html('<span class="ragchat-untitled">{}</span>', short(question))
        return str(obj)

    @admin.display(description="owner", ordering="owner")
    def owner_link(self, obj):
        if obj.owner is None:
            return "anonymous"
        return format_html('{} <a class="ragchat-filter-link" href="?owner={}" title="Only this owner\'s">⌕</a>',
                           admin_link(obj.owner), obj.owner_id)

    @admin.display(description="messages", ordering="_messages")
    def message_count(self, obj):
        return obj._messages

    @admin.display(description="last activity", ordering="updated_at")
    def last_activity(self, obj):
        return obj.updated_at

    @admin.display(description="feedback")
    def feedback_counts(self, obj):
        if not (obj._up or obj._down):
            return "—"
        return format_html('<span title="thumbs up">👍 {}</span> <span title="thumbs down" class="{}">👎 {}</span>',
                           obj._up, "ragchat-negative" if obj._down else "", obj._down)

    @admin.display(description="chat data")
    def user_data_link(self, obj):
        if obj.owner_id is None:
            return "—"
        url = reverse("admin:django_ragchat_user_data", args=[obj.owner_id])
        return format_html('<a href="{}">Export or erase this user\'s chat data</a>', url)

    def get_urls(self):
        # Also here: the site's URLs are built after every app registered its admin, so the user
        # admin exists now even when django_ragchat comes before django.contrib.auth.
        add_user_admin_action(self.admin_site)
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/trace/<int:message_id>.json", wrap(self.trace_json_view),
                 name="django_ragchat_trace_json"),
            path("user-data/", wrap(self.user_data_search_view), name="django_ragchat_user_data_search"),
            path("user-data/<str:user_id>/", wrap(self.user_data_view), name="django_ragchat_user_data"),
            path("user-data/<str:user_id>/export.json", wrap(self.user_data_export_view),
                 name="django_ragchat_user_data_export"),
            *super().get_urls(),
        ]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        conversation = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if conversation is not None and self.has_view_or_change_permission(request, conversation):
            page, turns = admin_views.transcript(conversation, request.GET.get("page") or 1)
            extra_context.update(transcript_page=page, turns=turns,
                                 page_range=page.paginator.get_elided_page_range(page.number))
            if not conversation.title:  # the first question says more than "Conversation 63da9061"
                first = next((t.message.content for t in turns if t.message.role == Message.Role.USER), "")
                if first and page.number == 1:
                    extra_context["subtitle"] = short(first)
        return super().change_view(request, object_id, form_url, extra_context)

    def trace_json_view(self, request, object_id, message_id):
        """The raw trace of one answer, for those who want every field."""
        conversation = self.get_object(request, object_id)
        if conversation is None:
            raise Http404
        if not self.has_view_or_change_permission(request, conversation):
            raise PermissionDenied
        trace = get_object_or_404(TurnTrace, message_id=message_id, message__conversation=conversation)
        return JsonResponse(trace.data, safe=False, json_dumps_params={"indent": 2, "ensure_ascii": False})

    # User chat data: export and erase.

    def _user_or_404(self, user_id):
        User = get_user_model()
        try:
            return User.objects.get(pk=user_id)
        except (User.DoesNotExist, ValueError, ValidationError):
            raise Http404("No such user.") from None

    def _can_export(self, request) -> bool:
        return all(request.user.has_perm(f"django_ragchat.view_{m}")
                   for m in ("conversation", "message", "memoryrecord", "feedback"))

    def _can_erase(self, request) -> bool:
        return all(request.user.has_perm(f"django_ragchat.delete_{m}")
                   for m in ("conversation", "message", "messagesource", "turntrace", "memoryrecord", "feedback"))

    def user_data_search_view(self, request):
        if not self._can_export(request):
            raise PermissionDenied
        User = get_user_model()
        term = request.GET.get("q", "").strip()
        users = []
        if term:
            lookup = {f"{User.USERNAME_FIELD}__icontains": term}
            users = list(User.objects.filter(**lookup).annotate(conversation_count=Count("ragchat_conversations"))
                         .order_by(User.USERNAME_FIELD)[:50])
        context = {**self.admin_site.each_context(request), "opts": self.opts, "term": term, "users": users,
                   "title": "User chat data"}
        return TemplateResponse(request, "admin/django_ragchat/user_data_search.html", context)

    def user_data_view(self, request, user_id):
        """Counts of what the user left in the chat, with Export and Erase (POST) buttons."""
        if not self._can_export(request):
            raise PermissionDenied
        user = self._user_or_404(user_id)
        data = admin_views.UserChatData(user)
        can_erase = self._can_erase(request)
        if request.method == "POST":
            if not can_erase:
                raise PermissionDenied
            if request.POST.get("confirm") == "yes":
                erased = data.erase()
                summary = ", ".join(f"{n} {kind}" for kind, n in erased.items())
                # On the user's history in the admin: who erased what, when.
                self.log_change(request, user, f"Erased the django-ragchat chat data: {summary}.")
                self.message_user(request, f"Erased the chat data of {user}: {summary}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:django_ragchat_conversation_changelist"))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "subject": user,
            "subject_link": admin_link(user), "counts": data.counts(), "can_erase": can_erase,
            "title": f"Chat data of {user}",
        }
        return TemplateResponse(request, "admin/django_ragchat/user_data.html", context)

    def user_data_export_view(self, request, user_id):
        if not self._can_export(request):
            raise PermissionDenied
        user = self._user_or_404(user_id)
        response = HttpResponse(admin_views.UserChatData(user).export_json(), content_type="application/json")
        response["Content-Disposition"] = f'attachment; filename="ragchat-user-{user.pk}.json"'
        return response

    @admin.action(description="Export or erase the owner's chat data")
    def owner_chat_data(self, request, queryset):
        owners = set(queryset.exclude(owner=None).values_list("owner_id", flat=True)[:2])
        if len(owners) != 1:
            self.message_user(request, "Select conversations of exactly one signed-in owner.", messages.WARNING)
            return None
        return HttpResponseRedirect(reverse("admin:django_ragchat_user_data", args=[owners.pop()]))

    actions = ["owner_chat_data"]


@admin.action(description="Export or erase their chat data (django-ragchat)")
def user_chat_data_action(modeladmin, request, queryset):
    """For the site's user admin: open the chat-data page of the one selected user."""
    ids = list(queryset.values_list("pk", flat=True)[:2])
    if len(ids) != 1:
        modeladmin.message_user(request, "Select exactly one user.", messages.WARNING)
        return None
    return HttpResponseRedirect(reverse("admin:django_ragchat_user_data", args=[ids[0]]))


def add_user_admin_action(site=admin.site) -> None:
    """Offer ``user_chat_data_action`` on ``site``'s user admin, if it has one (idempotent)."""
    user_admin = site._registry.get(get_user_model())
    if user_admin is None:
        return
    actions = list(user_admin.actions or [])
    if user_chat_data_action not in actions:
        user_admin.actions = [*actions, user_chat_data_action]


add_user_admin_action()


# --- Messages, sources, traces, feedback: read-only ------------------------------------------


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
        return super().get_queryset(request).select_related("chunk").defer("chunk__embedding")

    @admin.display(description="document")
    def document(self, obj):
        return obj.title or obj.source

    @admin.display(description="heading")
    def heading(self, obj):
        return obj.chunk.heading if obj.chunk else "(chunk replaced since)"

    @admin.display(description="score")
    def fusion_score(self, obj):
        return f"{obj.score:.4f}"


@admin.register(Message)
class MessageAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "conversation_link", "seq", "role", "status", "created_at", "trace_link")
    list_filter = ("role", "status", ("created_at", admin.DateFieldListFilter))
    search_fields = ("content", "conversation__title")
    fields = ("conversation_link", "seq", "role", "status", "text", "searched_query", "token_count", "prompt_tokens",
              "completion_tokens", "error", "feedback_given", "trace_link", "created_at")
    readonly_fields = fields
    inlines = [SourceInline]

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
    list_display = ("message_link", "rank", "document", "heading", "fusion_score", "cited")
    list_filter = ("cited",)
    search_fields = ("title", "source")
    fields = ("message_link", "rank", "document", "source", "heading", "fusion_score", "cited", "chunk_text")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("message", "chunk").defer("chunk__embedding")

    @admin.display(description="message", ordering="message")
    def message_link(self, obj):
        return admin_link(obj.message)

    @admin.display(description="document", ordering="title")
    def document(self, obj):
        return obj.title or obj.source

    @admin.display(description="heading")
    def heading(self, obj):
        return obj.chunk.heading if obj.chunk else "(chunk replaced since)"

    @admin.display(description="score", ordering="score")
    def fusion_score(self, obj):
        return f"{obj.score:.4f}"

    @admin.display(description="text")
    def chunk_text(self, obj):
        if obj.chunk is None:
            return "(chunk replaced since)"
        return format_html('<div class="ragchat-text">{}</div>', obj.chunk.text)


@admin.register(TurnTrace)
class TurnTraceAdmin(ReadOnlyAdmin):
    list_display = ("message_link", "conversation_link", "profile", "ended_by", "total_ms", "created_at")
    list_filter = ("profile", "ended_by", ("created_at", admin.DateFieldListFilter))
    search_fields = ("message__content", "message__conversation__title")
    fields = ("message_link", "conversation_link", "profile", "ended_by", "total_ms", "created_at")

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
        return admin_link(obj.message)

    @admin.display(description="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.message.conversation)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        trace = self.get_object(request, object_id)
        extra_context = dict(extra_context or {})
        if trace is not None and self.has_view_permission(request, trace):
            sources = list(trace.message.sources.all())
            chunks = admin_views.load_chunks(admin_views.trace_chunk_ids(trace.data or {}))
            extra_context.update(
                trace_view=admin_views.build_trace_view(trace.data, chunks, sources),
                raw_json=admin_views.pretty_json(trace.data),
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
        return admin_link(obj.user) if obj.user_id else "anonymous visitor"

    @admin.display(description="comment")
    def short_comment(self, obj):
        return short(obj.comment)

    @admin.display(description="comment")
    def comment_text(self, obj):
        return format_html('<div class="ragchat-text">{}</div>', obj.comment)


# --- Memory -----------------------------------------------------------------------------------


class MemoryRecordForm(forms.ModelForm):
    class Meta:
        model = MemoryRecord
        fields = ("kind", "user", "conversation", "content", "covers_until_seq", "metadata")

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("user") and not cleaned.get("conversation"):
            # On the field, not the form: a field with an error is left out of the model's own
            # validation, so the database constraint's raw message is not shown beside this one.
            self.add_error("user", ValidationError(
                "A memory record is about a user or a conversation: choose at least one of them.",
                code="no_scope",
            ))
        return cleaned


@admin.register(MemoryRecord)
class MemoryRecordAdmin(RagchatAdmin):
    """Summaries and facts the model is shown. Staff correct them here; see docs/admin.md for the
    permissions that takes (``ragchat_admin_group`` creates a group with them)."""

    form = MemoryRecordForm
    list_display = ("kind", "short_content", "user_link", "conversation_link", "covers_until_seq", "updated_at")
    list_filter = ("kind", ("user", admin.RelatedOnlyFieldListFilter), ("conversation", admin.EmptyFieldListFilter))
    search_fields = ("content", "conversation__title")
    raw_id_fields = ("user", "conversation")

    def get_search_fields(self, request):
        return (*self.search_fields, f"user__{get_user_model().USERNAME_FIELD}")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "conversation")

    def lookup_allowed(self, lookup, value, request=None):
        # The conversation page links here with ?conversation__id__exact=<id>.
        if lookup in ("conversation__id__exact", "conversation_id__exact", "user__id__exact"):
            return True
        if request is None:  # Django < 5.0 signature
            return super().lookup_allowed(lookup, value)
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description="content")
    def short_content(self, obj):
        return short(obj.content)

    @admin.display(description="user", ordering="user")
    def user_link(self, obj):
        return admin_link(obj.user) if obj.user_id else "—"

    @admin.display(description="conversation", ordering="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.conversation) if obj.conversation_id else "—"


# --- Documents and chunks ---------------------------------------------------------------------


class DocumentChangeList(ChangeList):
    """Adds each listed document's chunk count per embedding space, in one more query."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        spaces: dict[int, dict[str, int]] = {}
        rows = (Chunk.objects.filter(document__in=[d.pk for d in self.result_list]).order_by()
                .values_list("document_id", "space").annotate(n=Count("pk")))
        for document_id, space, n in rows:
            spaces.setdefault(document_id, {})[space] = n
        for document in self.result_list:
            document._spaces = spaces.get(document.pk, {})


class DocumentUploadForm(forms.Form):
    """The "add document" page: a file, ingested like ``POST /api/ragchat/documents/``."""

    file = forms.FileField(help_text="Markdown, reStructuredText, HTML or plain text, UTF-8.")
    source = forms.CharField(required=False, max_length=1000,
                             help_text="The document's unique name; default upload/<file name>. "
                                       "Uploading the same source again replaces the document.")
    title = forms.CharField(required=False, max_length=500, help_text="Overrides the title found in the text.")
    content_type = forms.ChoiceField(
        required=False, choices=[("", "from the file's extension"), ("markdown", "Markdown"),
                                 ("rst", "reStructuredText"), ("html", "HTML"), ("text", "plain text")])
    profile = forms.CharField(required=False, max_length=100,
                              help_text="Embed with this profile's embedder (default profile if empty).")

    max_upload_bytes = 10 * 1024 * 1024

    def clean(self):
        from pathlib import Path

        from django_ragchat.ingestion.loaders import content_type_for

        cleaned = super().clean()
        upload = cleaned.get("file")
        if upload is None:
            return cleaned
        if upload.size > self.max_upload_bytes:
            raise ValidationError(f"The file is larger than {self.max_upload_bytes // (1024 * 1024)} MB.")
        content_type = cleaned.get("content_type") or content_type_for(Path(upload.name))
        if not content_type:
            raise ValidationError("Unknown file type: choose the content type.")
        raw = upload.read()
        try:
            cleaned["text"] = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValidationError("The file is not UTF-8 text.") from None
        cleaned["content_type"] = content_type
        cleaned["source"] = cleaned.get("source") or f"upload/{upload.name}"
        return cleaned


@admin.register(Document)
class DocumentAdmin(RagchatAdmin):
    list_display = ("__str__", "source", "content_type", "chunk_count", "embedding_spaces", "updated_at")
    list_filter = ("content_type",)
    search_fields = ("title", "source")
    fields = ("title", "source", "content_type", "checksum", "chunks_by_space", "metadata", "created_at", "updated_at")
    readonly_fields = fields
    actions = ["reingest", "delete_selected"]

    def get_changelist(self, request, **kwargs):
        return DocumentChangeList

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(
            _chunks=_count_subquery(Chunk.objects.filter(document=OuterRef("pk")), "document"))

    def has_change_permission(self, request, obj=None):
        return False  # a document changes by ingesting it again

    @admin.display(description="chunks", ordering="_chunks")
    def chunk_count(self, obj):
        url = reverse("admin:django_ragchat_chunk_changelist") + f"?document__id__exact={obj.pk}"
        return format_html('<a href="{}">{}</a>', url, obj._chunks)

    @admin.display(description="embedding spaces")
    def embedding_spaces(self, obj):
        spaces = getattr(obj, "_spaces", {})
        return format_html_join(", ", "{} ({})", sorted(spaces.items())) or "—"

    @admin.display(description="chunks by embedding space")
    def chunks_by_space(self, obj):
        rows = obj.chunks.order_by("space").values_list("space", flat=False).annotate(n=Count("pk"))
        return format_html_join(mark_safe("<br>"), "{}: {}", rows) or "no chunks"

    def get_deleted_objects(self, objs, request):
        objs = list(objs)
        return deletion_summary(request, objs, Document, {Chunk: Chunk.objects.filter(document__in=objs).count()})

    def add_view(self, request, form_url="", extra_context=None):
        """Upload a file and ingest it (parse, chunk, embed, store), like the documents API."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        from django_ragchat.ingestion.loaders import DocumentLoadError
        from django_ragchat.ingestion.pipeline import ingest_text
        from django_ragchat.profiles import UnknownProfile

        form = DocumentUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            if self._ingest_in_background(request, data):
                return HttpResponseRedirect(reverse("admin:django_ragchat_document_changelist"))
            try:
                result = ingest_text(data["source"], data["text"], title=data["title"],
                                     content_type=data["content_type"], profile=data["profile"] or None)
            except (DocumentLoadError, UnknownProfile) as exc:
                form.add_error(None, getattr(exc, "reason", None) or str(exc))
            except Exception as exc:  # the embedder or the database failed: nothing stored is lost
                form.add_error(None, f"The document could not be embedded or stored ({type(exc).__name__}); "
                                     "what was stored before is kept.")
            else:
                if result.status == "failed":
                    form.add_error(None, f"Ingestion failed: {result.reason}")
                else:
                    self.message_user(request, f"Ingested {data['source']}: {result.status}, {result.chunks} chunks.",
                                      messages.SUCCESS)
                    return HttpResponseRedirect(reverse("admin:django_ragchat_document_change",
                                                        args=[result.document_id]))
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "form": form,
            "title": "Upload a document", "media": self.media + form.media,
            "has_view_permission": self.has_view_permission(request),
        }
        return TemplateResponse(request, "admin/django_ragchat/document/upload.html", context)

    def _ingest_in_background(self, request, data) -> bool:
        """Queue a large upload for the task worker, as the documents API does (docs/tasks.md).

        Only when the site runs tasks in a worker and the file is larger than
        ``RAGCHAT["BACKGROUND_INGEST_BYTES"]``; otherwise (the default) it is ingested right away.
        """
        try:
            from django_ragchat import tasks
            from django_ragchat.conf import ragchat_settings

            threshold = ragchat_settings.BACKGROUND_INGEST_BYTES
        except (ImportError, AttributeError):  # a version without background tasks
            return False
        if data["file"].size <= threshold or not tasks.runs_in_background():
            return False
        tasks.enqueue(tasks.ingest_upload, data["source"], data["text"], data["title"], data["content_type"],
                      data["profile"] or None)
        self.message_user(request, f"Queued {data['source']}: it appears here once the task worker "
                                   "has ingested it.", messages.SUCCESS)
        return True

    @admin.action(description="Re-ingest from source (files readable on the server)", permissions=["add"])
    def reingest(self, request, queryset):
        """Ingest again each selected document whose source is a file the server can read.

        Unchanged files are left alone; uploaded documents (``upload/...``) have no file to read
        again: upload them again.
        """
        from pathlib import Path

        from django_ragchat.ingestion.pipeline import ingest_paths

        readable, unreadable = [], []
        for document in queryset.only("source"):
            (readable if Path(document.source).is_file() else unreadable).append(document.source)
        if readable:
            report = ingest_paths(readable)
            by_status: dict[str, int] = {}
            for result in report.results:
                by_status[result.status] = by_status.get(result.status, 0) + 1
                if result.status == "failed":
                    self.message_user(request, f"{result.source}: {result.reason}", messages.ERROR)
            summary = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items()))
            self.message_user(request, f"Re-ingested {len(readable)} document(s): {summary}.", messages.SUCCESS)
        if unreadable:
            self.message_user(request, "No file to read again for: " + ", ".join(unreadable[:10])
                              + ("…" if len(unreadable) > 10 else "") + " (upload these again).", messages.WARNING)


@admin.register(Chunk)
class ChunkAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "document_link", "ordinal", "space", "heading", "short_text")
    list_filter = ("space",)
    search_fields = ("text", "heading", "document__title", "document__source")
    fields = ("document_link", "ordinal", "space", "heading", "chunk_text", "token_count", "metadata")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("document").defer("embedding")

    def lookup_allowed(self, lookup, value, request=None):
        if lookup == "document__id__exact":  # the document list's chunk counts link here
            return True
        if request is None:
            return super().lookup_allowed(lookup, value)
        return super().lookup_allowed(lookup, value, request)

    @admin.display(description="document", ordering="document")
    def document_link(self, obj):
        return admin_link(obj.document)

    @admin.display(description="text")
    def short_text(self, obj):
        return short(obj.text)

    @admin.display(description="text")
    def chunk_text(self, obj):
        return format_html('<div class="ragchat-text">{}</div>', obj.text)
