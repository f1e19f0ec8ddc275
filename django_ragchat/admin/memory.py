"""Long-term memory: the summaries and facts the model is shown, which staff correct."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join

from django_ragchat.admin.base import RagchatAdmin, UserFieldsMixin, admin_link, short, user_link
from django_ragchat.models import (
    MemoryRecord,
)


class MemoryRecordForm(forms.ModelForm):
    class Meta:
        model = MemoryRecord
        # Not the metadata: the summary memory writes it (model, messages folded); staff read it.
        fields = ("kind", "user", "conversation", "content", "covers_until_seq")

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
class MemoryRecordAdmin(UserFieldsMixin, RagchatAdmin):
    """Summaries and facts the model is shown. Staff correct them here; see docs/admin.md for the
    permissions that takes (``ragchat_admin_group`` creates a group with them)."""

    form = MemoryRecordForm
    list_display = ("kind", "short_content", "user_link", "conversation_link", "covers_until_seq", "updated_at")
    list_filter = ("kind", ("user", admin.RelatedOnlyFieldListFilter), ("conversation", admin.EmptyFieldListFilter))
    search_fields = ("content", "conversation__title")
    raw_id_fields = ("user", "conversation")
    readonly_fields = ("details",)

    @admin.display(description="written by")
    def details(self, obj):
        """The record's metadata as lines of text ("folded messages: 6"), never as markup."""
        if not obj.metadata:
            return "—"
        if not isinstance(obj.metadata, dict):  # written by code of a site's own
            return json.dumps(obj.metadata, ensure_ascii=False)
        rows = ((key.replace("_", " "), value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
                for key, value in sorted(obj.metadata.items()))
        return format_html('<dl class="ragchat-details">{}</dl>',
                           format_html_join("", "<dt>{}</dt><dd>{}</dd>", rows))

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
        return user_link(obj.user) if obj.user_id else "—"

    @admin.display(description="conversation", ordering="conversation")
    def conversation_link(self, obj):
        return admin_link(obj.conversation) if obj.conversation_id else "—"


# --- Documents and chunks ---------------------------------------------------------------------
