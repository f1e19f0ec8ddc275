"""Conversations: the list, the transcript page with each answer's trace, and one user's chat data."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count, Exists, OuterRef, Subquery
from django.db.models.functions import Substr
from django.http import Http404, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from django_ragchat.access import principals_of_user_id
from django_ragchat.admin import views as admin_views
from django_ragchat.admin.base import (
    ProfileFilter,
    RagchatAdmin,
    UserFieldsMixin,
    admin_link,
    count_subquery,
    deletion_summary,
    may_open_user_admin,
    profile_shown,
    short,
    user_link,
)
from django_ragchat.models import (
    REFUSED_INPUT_STAGE,
    Conversation,
    Feedback,
    MemoryRecord,
    Message,
    MessageSource,
    TurnTrace,
    naming_questions,
)
from django_ragchat.turn.confirmations import MAX_ID


def refused(turn) -> bool:
    """Whether ``turn`` (of ``admin_views.transcript``) is an answer an input guardrail gave
    instead of answering: its question does not name the conversation (``naming_questions``)."""
    if turn is None or turn.message.role != Message.Role.ASSISTANT:
        return False
    try:
        return turn.message.trace.ended_by == REFUSED_INPUT_STAGE  # loaded with the message
    except TurnTrace.DoesNotExist:
        return False


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
        if self._owner_id(value) is not None and value not in {c[0] for c in choices}:
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
            owner_id = self._owner_id(value)
            return queryset.none() if owner_id is None else queryset.filter(owner_id=owner_id)
        return queryset

    @staticmethod
    def _owner_id(value) -> int | None:
        """``value`` as a user id a row can have: ASCII digits ("¹" passes isdigit() but not int())
        and at most 64 bits (the database refuses larger numbers in a query)."""
        if not (value and value.isascii() and value.isdigit()):
            return None
        return int(value) if int(value) <= MAX_ID else None


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


class MemoryInline(UserFieldsMixin, admin.StackedInline):
    """The conversation's own memory records (its summary), editable on its page."""

    model = MemoryRecord
    extra = 0
    fields = ("kind", "content", "covers_until_seq", "user")
    raw_id_fields = ("user",)
    verbose_name_plural = "memory of this conversation"

    def get_fields(self, request, obj=None):
        if may_open_user_admin(request.user):
            return self.fields
        # Shown read-only (a conversation's page is read-only to chat reviewers), the user
        # field would link to the user admin: to the user's chat data page instead. The record's
        # own page still sets the user.
        return ("kind", "content", "covers_until_seq", "user_chat_data")

    def get_readonly_fields(self, request, obj=None):
        return (*super().get_readonly_fields(request, obj), "user_chat_data")

    @admin.display(description="user")
    def user_chat_data(self, obj):
        return user_link(obj.user) if obj.user_id else "—"


@admin.register(Conversation)
class ConversationAdmin(RagchatAdmin):
    list_display = ("display_title", "owner_link", "profile_title", "message_count", "last_activity",
                    "feedback_counts")
    list_filter = (ProfileFilter, OwnerFilter, LastAnswerStatusFilter, ("updated_at", LastActivityFilter),
                   NegativeFeedbackFilter)
    readonly_fields = ("id", "owner_link", "session_key", "profile_title", "created_at", "updated_at",
                       "user_data_link")
    fieldsets = [
        (None, {"fields": ("title", "owner_link", "user_data_link", "profile_title", "created_at", "updated_at")}),
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
            _messages=count_subquery(messages_of, "conversation"),
            # Not a question an input guardrail refused (a password pasted by mistake).
            _first_question=Subquery(naming_questions().filter(conversation=OuterRef("pk")).order_by("seq")
                                     .values_list(Substr("content", 1, 120))[:1]),
            _last_status=Subquery(messages_of.filter(role=Message.Role.ASSISTANT).order_by("-seq")
                                  .values("status")[:1]),
            _up=count_subquery(feedback_of.filter(rating=Feedback.Rating.UP), "message__conversation"),
            _down=count_subquery(feedback_of.filter(rating=Feedback.Rating.DOWN), "message__conversation"),
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

    @admin.display(description="profile", ordering="profile")
    def profile_title(self, obj):
        return profile_shown(obj.profile)

    @admin.display(description="owner", ordering="owner")
    def owner_link(self, obj):
        if obj.owner is None:
            return "anonymous"
        return format_html('{} <a class="ragchat-filter-link" href="?owner={}" title="Only this owner\'s">⌕</a>',
                           user_link(obj.owner), obj.owner_id)

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
            page, turns = admin_views.transcript(conversation, request.GET.get("page") or 1,
                                                 viewer=principals_of_user_id(request.user.pk))
            extra_context.update(transcript_page=page, turns=turns,
                                 page_range=page.paginator.get_elided_page_range(page.number))
            if not conversation.title and page.number == 1:
                # The first question says more than "Conversation 63da9061", as on the list:
                # not one an input guardrail refused, which the transcript shows, not the heading.
                first = next((t.message.content for t, reply in zip(turns, [*turns[1:], None], strict=False)
                              if t.message.role == Message.Role.USER and not refused(reply)), "")
                if first:
                    extra_context["subtitle"] = short(first)
        return super().change_view(request, object_id, form_url, extra_context)

    def trace_json_view(self, request, object_id, message_id):
        """The raw trace of one answer, for those who want every field."""
        conversation = self.get_object(request, object_id)
        if conversation is None:
            raise Http404
        if not self.has_view_or_change_permission(request, conversation):
            raise PermissionDenied
        if message_id > MAX_ID:  # <int:> takes any digits; the database refuses past 64 bits
            raise Http404
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
                   for m in ("conversation", "message", "messagesource", "toolinvocation", "turntrace", "memoryrecord",
                             "feedback", "apikey"))

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
                summary = admin_views.counted(data.erase())
                # On the user's history in the admin: who erased what, when.
                self.log_change(request, user, f"Erased the django-ragchat chat data: {summary}.")
                self.message_user(request, f"Erased the chat data of {user}: {summary}.", messages.SUCCESS)
                return HttpResponseRedirect(reverse("admin:django_ragchat_conversation_changelist"))
        counts = data.counts()
        # The site's user admin, for those who may open it (chat reviewers need not).
        user_opts = user._meta
        may_see_user = request.user.has_perm(f"{user_opts.app_label}.view_{user_opts.model_name}") or \
            request.user.has_perm(f"{user_opts.app_label}.change_{user_opts.model_name}")
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "subject": user,
            "subject_link": admin_link(user) if may_see_user else str(user), "counts": counts,
            "counted": admin_views.counted(counts),
            "can_erase": can_erase, "documents_kept": data.documents_kept(), "user_token": f"user:{user.pk}",
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
