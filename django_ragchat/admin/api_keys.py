"""API keys of the OpenAI-compatible endpoint: staff create them for users and revoke them.

A key is shown once, on the page that follows its creation, and never stored (the row keeps a
digest and the first characters, which identify it in the list). The page is rendered in the
response itself, not through the messages framework: a message may be kept in a cookie.
Revoking keeps the row (its last use stays readable); deleting removes it.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from django_ragchat.admin.base import RagchatAdmin, admin_link
from django_ragchat.models import ApiKey


class ApiKeyForm(forms.ModelForm):
    """The add and change form; ``revoke`` (change only) revokes the key for good."""

    revoke = forms.BooleanField(required=False, help_text="Revoke the key: requests with it are refused from now on. "
                                                          "A revoked key cannot be restored; create a new one.")

    class Meta:
        model = ApiKey
        fields = ("user", "name", "expires_at")


@admin.register(ApiKey)
class ApiKeyAdmin(RagchatAdmin):
    form = ApiKeyForm
    list_display = ("__str__", "user_link", "status_badge", "created_at", "last_used_at", "expires_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), ("expires_at", admin.EmptyFieldListFilter))
    search_fields = ("name", "prefix")
    raw_id_fields = ("user",)
    readonly_fields = ("prefix", "status_badge", "created_at", "last_used_at", "revoked_at")
    actions = ("revoke_keys",)

    def get_search_fields(self, request):
        return (*self.search_fields, f"user__{get_user_model().USERNAME_FIELD}")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("user", "name", "expires_at")
        fields = ["user", "name", "prefix", "status_badge", "created_at", "last_used_at", "expires_at", "revoked_at"]
        return fields if obj.revoked_at else [*fields, "revoke"]

    def get_readonly_fields(self, request, obj=None):
        # A key belongs to its user for good: a key moved to someone else would act as them.
        return (*self.readonly_fields, "user") if obj is not None else ()

    @admin.display(description="user")
    def user_link(self, obj):
        return admin_link(obj.user)

    @admin.display(description="status")
    def status_badge(self, obj):
        return format_html('<span class="ragchat-badge ragchat-key-{}">{}</span>', obj.status, obj.status)

    def save_model(self, request, obj, form, change):
        if not change:
            obj._new_key = ApiKey.generate()
            obj.set_key(obj._new_key)
        elif form.cleaned_data.get("revoke") and obj.revoked_at is None:
            obj.revoked_at = timezone.now()
        super().save_model(request, obj, form, change)

    def response_add(self, request, obj, post_url_continue=None):
        """The page showing the new key, once: its only appearance anywhere."""
        context = {**self.admin_site.each_context(request), "opts": self.opts, "api_key": obj,
                   "key": obj._new_key, "title": "API key created"}
        response = TemplateResponse(request, "admin/django_ragchat/apikey/created.html", context)
        response["Cache-Control"] = "no-store"  # not kept by the browser or a proxy
        return response

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke_keys(self, request, queryset):
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} API key{'s' if count != 1 else ''}.", messages.SUCCESS)
