"""What every django-ragchat admin shares: links, snippets, counts, read-only pages."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin import widgets
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, Subquery, Value
from django.db.models.functions import Coalesce
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from django_ragchat.admin import views as admin_views
from django_ragchat.profiles import profile_title

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


def user_link(user, *, site_name: str = "admin") -> str:
    """A user's name linked to their chat data page (``user_data_view``): the page about them
    that anyone reading conversations may open. The site's user admin needs ``auth``
    permissions that chat reviewers do not have, so it is not linked from the chat's lists."""
    if user is None:
        return "—"
    try:
        url = reverse(f"{site_name}:django_ragchat_user_data", args=[user.pk])
    except NoReverseMatch:
        return format_html("{}", str(user))
    return format_html('<a href="{}" title="Their chat data">{}</a>', url, str(user))


def may_open_user_admin(user) -> bool:
    """Whether ``user`` may open the site's user admin (chat reviewers may not: their group has
    the chat's permissions only). Links to it are shown only to those who may follow them."""
    opts = get_user_model()._meta
    return any(user.has_perm(f"{opts.app_label}.{action}_{opts.model_name}") for action in ("view", "change"))


class UserIdWidget(widgets.ForeignKeyRawIdWidget):
    """The raw-id input of a user field, for staff who may not open the user admin: its label
    links to the user's chat data page and there is no lookup (both would answer 403)."""

    def __init__(self, rel, admin_site, attrs=None, using=None, *, user_admin: bool = True):
        super().__init__(rel, admin_site, attrs, using)
        self.user_admin = user_admin

    def get_context(self, name, value, attrs):
        context = super().get_context(name, value, attrs)
        if not self.user_admin:
            context["related_url"] = None
        return context

    def label_and_url_for_value(self, value):
        label, url = super().label_and_url_for_value(value)
        if self.user_admin or not label:
            return label, url
        try:
            return label, reverse(f"{self.admin_site.name}:django_ragchat_user_data", args=[value])
        except NoReverseMatch:
            return label, ""


class UserFieldsMixin:
    """Admin classes with raw-id user fields: ``UserIdWidget`` for staff without the user admin."""

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name in self.raw_id_fields and db_field.related_model is get_user_model() \
                and not may_open_user_admin(request.user):
            kwargs["widget"] = UserIdWidget(db_field.remote_field, self.admin_site, using=kwargs.get("using"),
                                            user_admin=False)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


def profile_shown(name: str) -> str:
    """A profile as staff read it: its title, and its name (the key of the settings, the API and
    the filter's URL) beside it when they differ: "Customer support (support)"."""
    title = profile_title(name)
    return name if title == name else f"{title} ({name})"


class ProfileFilter(admin.SimpleListFilter):
    """The profiles of the rows (a conversation's, a trace's), each as ``profile_shown``."""

    title = "profile"
    parameter_name = "profile"

    def lookups(self, request, model_admin):
        names = model_admin.model.objects.order_by("profile").values_list("profile", flat=True).distinct()
        return [(name, profile_shown(name)) for name in names]

    def queryset(self, request, queryset):
        return queryset.filter(profile=self.value()) if self.value() else queryset


def short(text: str, limit: int = 80) -> str:
    return admin_views.snippet(text, limit)


def count_subquery(queryset, field: str):
    """``Count`` of ``queryset`` rows per ``field`` as a correlated subquery (0 when none).

    Several counts joined into one query would multiply each other; subqueries don't.
    """
    counted = queryset.order_by().values(field).annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


class RagchatAdmin(admin.ModelAdmin):
    """Every django-ragchat admin: loads the app's admin stylesheet (transcripts, traces, text)."""

    class Media:
        css = {"all": ["django_ragchat/admin.css"]}

    def get_changelist_instance(self, request):
        # A NUL character in a filter's or the search's value reached the database, which
        # PostgreSQL refuses in text: a 500 (an outside probe). Answered as Django answers
        # lookups it cannot use: the list without them, with "?e=1".
        if any("\x00" in key or any("\x00" in value for value in values) for key, values in request.GET.lists()):
            raise IncorrectLookupParameters("A query parameter holds a NUL character.")
        return super().get_changelist_instance(request)


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
