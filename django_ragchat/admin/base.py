"""What every django-ragchat admin shares: links, snippets, counts, read-only pages."""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import Count, IntegerField, Subquery, Value
from django.db.models.functions import Coalesce
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.text import capfirst

from django_ragchat.admin import views as admin_views

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
